#include "transport/verbs/verbs_transport.h"

#include <endian.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <chrono>
#include <thread>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <random>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace slotrpc::transport::verbs {
namespace {

// wr_id layout: generation (16) | table index (16) | receive bit | value (31).
// value: a receive buffer index, or for a signaled send the number of send
// requests it retires (itself and the unsignaled ones before it).
constexpr uint64_t kRecvBit = 1ull << 31;
constexpr uint32_t kValueMask = 0x7fff'ffffu;
// A send value with this bit is the memory-window bind (it retires the rest).
constexpr uint32_t kBindBit = 1u << 30;
// Receives from the shared receive queue: this table index (never a link's).
constexpr uint16_t kSrqIndex = 0xffff;

uint64_t make_wr_id(uint16_t gen, uint16_t index, bool recv, uint32_t value) {
  return uint64_t{gen} << 48 | uint64_t{index} << 32 | (recv ? kRecvBit : 0) | (value & kValueMask);
}

// epoll tags: the completion channel, the async fd, or a link's control
// connection (index and generation, so a stale event cannot reach a new link).
constexpr uint64_t kTagChannel = 1;
constexpr uint64_t kTagAsync = 2;
constexpr uint64_t kTagLink = 1ull << 63;

constexpr size_t kMaxLinks = kSrqIndex;  // indices 0 .. 0xfffe
constexpr int kInitialCq = 1024;
constexpr size_t kReadyReserve = 1024;
constexpr size_t kBacklogReserve = 64;
// A bind is local work: it completes in microseconds, or the device is stuck.
constexpr auto kBindTimeout = std::chrono::seconds(5);

void put16(std::byte* p, uint16_t v) {
  for (int i = 0; i < 2; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
void put32(std::byte* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
void put64(std::byte* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
uint16_t get16(const std::byte* p) {
  return static_cast<uint16_t>(uint16_t(p[0]) | uint16_t(p[1]) << 8);
}
uint32_t get32(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(p[i]) << (8 * i);
  return v;
}
uint64_t get64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}

std::string errno_text(const char* what, int err) {
  return fmt::format("{}: {}", what, std::strerror(err));
}

uint32_t random_psn() {
  thread_local std::mt19937 gen{std::random_device{}()};
  return gen() & 0xffffffu;
}

bool set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  return flags >= 0 && ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

}  // namespace

// ------------------------------------------------------------------ QpInfo
//
//   0  u32 magic "SRPV"     4 u16 version 1     6 u8 mtu (enum ibv_mtu)
//   7  u8 link layer        8 u32 qpn          12 u32 psn
//  16  16 B gid            32 u16 lid          34 u16 zero
//  36  u32 ring rkey       40 u64 ring address
//  48  u32 slot_count      52 u32 slot_size    56 8 B zero

void encode_qp_info(const QpInfo& info, std::byte* out) {
  std::memset(out, 0, kQpInfoSize);
  put32(out + 0, kQpInfoMagic);
  put16(out + 4, kQpInfoVersion);
  out[6] = static_cast<std::byte>(info.mtu);
  out[7] = static_cast<std::byte>(info.link_layer);
  put32(out + 8, info.qpn);
  put32(out + 12, info.psn);
  std::memcpy(out + 16, info.gid.raw, 16);
  put16(out + 32, info.lid);
  put32(out + 36, info.ring_rkey);
  put64(out + 40, info.ring_addr);
  put32(out + 48, info.slot_count);
  put32(out + 52, info.slot_size);
}

Result<QpInfo> decode_qp_info(std::span<const std::byte> in) {
  auto bad = [](std::string why) {
    return Status(StatusCode::kUnavailable, "handshake failed: verbs extension: " + std::move(why));
  };
  if (in.size() != kQpInfoSize)
    return bad(fmt::format("{} bytes, expected {}", in.size(), kQpInfoSize));
  const std::byte* p = in.data();
  if (get32(p) != kQpInfoMagic) return bad("bad magic");
  if (get16(p + 4) != kQpInfoVersion)
    return bad(fmt::format("version {}, this end speaks {}", get16(p + 4), kQpInfoVersion));
  QpInfo info;
  info.mtu = std::to_integer<uint8_t>(p[6]);
  info.link_layer = std::to_integer<uint8_t>(p[7]);
  info.qpn = get32(p + 8);
  info.psn = get32(p + 12);
  std::memcpy(info.gid.raw, p + 16, 16);
  info.lid = get16(p + 32);
  info.ring_rkey = get32(p + 36);
  info.ring_addr = get64(p + 40);
  info.slot_count = get32(p + 48);
  info.slot_size = get32(p + 52);
  if (mtu_bytes(info.mtu) == 0) return bad(fmt::format("unknown path MTU code {}", info.mtu));
  if (info.qpn == 0 || info.qpn > 0xffffffu) return bad(fmt::format("invalid QP number {}", info.qpn));
  if (info.psn > 0xffffffu) return bad(fmt::format("PSN {} exceeds 24 bits", info.psn));
  if (info.ring_addr == 0) return bad("no receive ring address");
  return info;
}

// --------------------------------------------------------------- VerbsLink

VerbsLink::VerbsLink(VerbsTransport& owner, std::string description)
    : owner_(owner), description_(std::move(description)) {
  ++owner_.live_links_;
}

VerbsLink::~VerbsLink() {
  owner_.forget(this);
  if (in_epoll_) ::epoll_ctl(owner_.epoll_fd_, EPOLL_CTL_DEL, fd_, nullptr);
  // Not failed: the fd may still serve someone else (never shut it down here).
  if (fd_ >= 0) ::close(fd_);
  // The QP goes first: after ibv_destroy_qp the NIC touches none of the
  // memory below.  CQEs it left in the shared CQ carry our old generation
  // and are dropped by lookup().
  if (qp_ != nullptr) {
    if (ibv_destroy_qp(qp_) != 0)
      spdlog::error("slotrpc: ibv_destroy_qp ({}): {}", description_, std::strerror(errno));
    // SRQ completions are matched by queue-pair number, which the device
    // may hand to the next queue pair: ours leave the CQ now (their
    // buffers go back to the SRQ; the messages are dropped).
    if (srq_budget_ != 0) owner_.drain_cq();
  }
  for (Window& w : windows_)
    if (w.mw != nullptr) ibv_dealloc_mw(w.mw);
  if (!mrs_.empty()) {
    spdlog::warn("slotrpc: {} destroyed with {} memory region(s) still registered", description_,
                 mrs_.size());
    for (ibv_mr* mr : mrs_) ibv_dereg_mr(mr);
  }
  own_rq_.reset();
  ctrl_bufs_ = RegisteredBuffer{};  // before the PD it is registered in
  if (owns_pd_ && pd_ != nullptr && ibv_dealloc_pd(pd_) != 0)
    spdlog::error("slotrpc: ibv_dealloc_pd ({}): {}", description_, std::strerror(errno));
  owner_.srq_committed_ -= srq_budget_;
  owner_.cq_committed_ -= cq_budget_;
  --owner_.live_links_;
}

Status VerbsLink::setup(uint32_t slot_count) {
  const Device& dev = owner_.device();
  const Config& cfg = owner_.config_;
  ibv_context* ctx = dev.context();
  const uint32_t max_wr = static_cast<uint32_t>(std::max(dev.attr().max_qp_wr, 1));
  created_slots_ = slot_count;
  // Send: a flush posts at most one message per slot plus control
  // messages; more simply waits in the backlog.  Receive: one per slot
  // message and per control message the peer can have in flight (grants
  // and cancels are bounded by the slots, pings by time) — see
  // docs/design.md, "No RNR".
  sq_depth_ = std::min<uint32_t>(2 * slot_count + 32, max_wr);
  const uint32_t want_rq = 3 * slot_count + 16;
  const bool use_srq = owner_.srq_ != nullptr &&
                       uint64_t{owner_.srq_committed_} + want_rq <= owner_.srq_->depth();
  if (use_srq) {
    rq_depth_ = want_rq;
  } else {
    rq_depth_ = std::min<uint32_t>(want_rq, max_wr);
    if (rq_depth_ < want_rq) {
      spdlog::warn("slotrpc: {} allows {} receive requests per QP; {} slots want {}: a burst of "
                   "control messages could meet receiver-not-ready",
                   dev.name(), max_wr, slot_count, want_rq);
    }
    if (owner_.srq_ != nullptr && !owner_.srq_full_logged_) {
      owner_.srq_full_logged_ = true;
      spdlog::info("slotrpc: {}: the shared receive queue ({} requests, {} reserved) cannot take "
                   "a session of {} slots more; such sessions get receive queues of their own "
                   "(raise SLOTRPC_SRQ_DEPTH)", dev.name(), owner_.srq_->depth(),
                   owner_.srq_committed_, slot_count);
    }
  }
  signal_every_ = std::clamp<uint32_t>(sq_depth_ / 4, 1, 64);

  // The completion queue is shared by every link of this reactor: it must
  // hold all of their completions at once.
  cq_budget_ = static_cast<int>(sq_depth_ + rq_depth_);
  const int need = owner_.cq_committed_ + cq_budget_;
  if (need > owner_.cq_capacity_) {
    const int max_cqe = dev.attr().max_cqe;
    const int want = std::min(std::max(owner_.cq_capacity_ * 2, need + 64), max_cqe);
    if (want < need) {
      cq_budget_ = 0;
      return Status(StatusCode::kResourceExhausted,
                    fmt::format("{}: the completion queue of this event loop would need {} entries, "
                                "the device allows {} (fewer sessions per loop, fewer slots, or more "
                                "reactor_threads)", dev.name(), need, max_cqe));
    }
    if (const int rc = ibv_resize_cq(owner_.cq_, want); rc != 0) {
      cq_budget_ = 0;
      return Status(StatusCode::kResourceExhausted,
                    fmt::format("ibv_resize_cq to {} entries: {}", want, std::strerror(rc)));
    }
    owner_.cq_capacity_ = owner_.cq_->cqe;
  }
  owner_.cq_committed_ += cq_budget_;

  if (owner_.pd_ != nullptr) {
    pd_ = owner_.pd_;
  } else {
    pd_ = ibv_alloc_pd(ctx);
    if (pd_ == nullptr) return Status(StatusCode::kUnavailable, errno_text("ibv_alloc_pd", errno));
    owns_pd_ = true;
  }
  if (use_srq) {
    rq_ = owner_.srq_.get();
    srq_budget_ = want_rq;
    owner_.srq_committed_ += want_rq;
  } else {
    auto q = ReceiveQueue::create_private(pd_, rq_depth_);
    if (!q.ok()) return q.status();
    own_rq_ = std::move(q.value());
    rq_ = own_rq_.get();
  }

  // The real max_inline_data: ask for the configured size, halve until the
  // device agrees (0 always works).
  uint32_t inline_want = cfg.inline_bytes;
  for (;;) {
    ibv_qp_init_attr a{};
    a.send_cq = owner_.cq_;
    a.recv_cq = owner_.cq_;
    a.qp_type = IBV_QPT_RC;
    a.sq_sig_all = 0;
    a.srq = rq_->srq();  // nullptr: a receive queue of its own
    a.cap.max_send_wr = sq_depth_;
    a.cap.max_recv_wr = use_srq ? 0 : rq_depth_;
    a.cap.max_send_sge = 1;
    a.cap.max_recv_sge = use_srq ? 0 : 1;
    a.cap.max_inline_data = inline_want;
    qp_ = ibv_create_qp(pd_, &a);
    if (qp_ != nullptr) {
      max_inline_ = a.cap.max_inline_data;
      break;
    }
    const int err = errno;
    if (inline_want == 0) {
      return Status(StatusCode::kUnavailable,
                    fmt::format("ibv_create_qp (send {} / receive {} requests): {}", sq_depth_,
                                rq_depth_, std::strerror(err)));
    }
    inline_want = inline_want < 16 ? 0 : inline_want / 2;
  }
  if (max_inline_ < cfg.inline_bytes) {
    spdlog::debug("slotrpc: {}: inline_bytes {} not supported, using {}", dev.name(),
                  cfg.inline_bytes, max_inline_);
  }
  // An attribute "no more than asked" keeps the documented meaning of
  // inline_bytes even when the device rounds up.
  max_inline_ = std::min(max_inline_, cfg.inline_bytes);

  ibv_qp_attr at{};
  at.qp_state = IBV_QPS_INIT;
  at.pkey_index = 0;
  at.port_num = dev.port();
  at.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  if (const int rc = ibv_modify_qp(qp_, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                                 IBV_QP_ACCESS_FLAGS);
      rc != 0) {
    return Status(StatusCode::kUnavailable, errno_text("ibv_modify_qp to INIT", rc));
  }
  psn_ = random_psn();
  if (use_srq) owner_.by_qpn_[qp_->qp_num] = index_;

  if (max_inline_ < core::kHeaderSize) {
    auto b = RegisteredBuffer::create(pd_, size_t{sq_depth_} * core::kHeaderSize, 0, "control buffers");
    if (!b.ok()) return b.status();
    ctrl_bufs_ = std::move(b.value());
  }

  wr_.resize(sq_depth_);
  sge_.resize(sq_depth_);
  backlog_.reserve(kBacklogReserve);

  // A queue of its own: every receive is posted now (allowed in INIT), as
  // one chain.  The SRQ's were posted when the transport was created.
  if (own_rq_ != nullptr) {
    own_rq_->set_queue_pair(qp_);
    own_rq_->set_tag(make_wr_id(gen_, index_, true, 0));
    if (const int rc = own_rq_->post_all(); rc != 0)
      return Status(StatusCode::kUnavailable, errno_text("ibv_post_recv", rc));
  }
  stats_.max_inline = max_inline_;
  return {};
}

Result<MemoryRegion> VerbsLink::register_memory(std::span<std::byte> memory, Access access) {
  if (pd_ == nullptr) return Status(StatusCode::kInternal, "verbs link has no protection domain");
  // Remote write only for the receive ring, never remote read or atomics;
  // send rings are read by the NIC only.  In its own PD the ring is
  // registered REMOTE_WRITE; in the shared PD the MR allows no remote
  // access at all and a type-2 window bound to this link's queue pair
  // grants the write (bind_ring_window).
  const bool window = access == Access::kRemoteWrite && !owns_pd_;
  int flags = 0;
  if (access == Access::kRemoteWrite)
    flags = IBV_ACCESS_LOCAL_WRITE | (window ? IBV_ACCESS_MW_BIND : IBV_ACCESS_REMOTE_WRITE);
  if (owner_.device().relaxed_ordering()) flags |= IBV_ACCESS_RELAXED_ORDERING;
  ibv_mr* mr = ibv_reg_mr(pd_, memory.data(), memory.size(), flags);
  if (mr == nullptr) {
    const int err = errno;
    return Status(StatusCode::kResourceExhausted,
                  fmt::format("ibv_reg_mr of {} bytes: {}{}", memory.size(), std::strerror(err),
                              err == ENOMEM || err == EPERM || err == EFAULT
                                  ? " (locked-memory limit too low? see ulimit -l)"
                                  : ""));
  }
  MemoryRegion r;
  r.base = memory.data();
  r.length = memory.size();
  r.lkey = mr->lkey;
  r.rkey = mr->rkey;
  r.handle = mr;
  if (window) {
    ibv_mw* mw = ibv_alloc_mw(pd_, IBV_MW_TYPE_2);
    if (mw == nullptr) {
      const int err = errno;
      ibv_dereg_mr(mr);
      return Status(StatusCode::kUnavailable,
                    fmt::format("ibv_alloc_mw (type 2): {} (SLOTRPC_SRQ=off uses a protection "
                                "domain per session instead)", std::strerror(err)));
    }
    // The peer learns this key now; the bind in connect() gives it to the
    // window.
    const uint32_t rkey = ibv_inc_rkey(mw->rkey);
    windows_.push_back(Window{mr, mw, rkey});
    r.rkey = rkey;
  }
  mrs_.push_back(mr);
  return r;
}

void VerbsLink::deregister(MemoryRegion& region) {
  auto* mr = static_cast<ibv_mr*>(region.handle);
  auto it = std::find(mrs_.begin(), mrs_.end(), mr);
  if (mr == nullptr || it == mrs_.end()) {
    region = MemoryRegion{};
    return;
  }
  // Memory must not vanish under work the NIC may still do: a live link
  // stops first (sessions close their link before this anyway).
  if (!down_ && connected_) fail("memory deregistered while the link was up");
  // A window goes before its MR (an MR with a bound window cannot go).
  for (auto w = windows_.begin(); w != windows_.end(); ++w) {
    if (w->mr != mr) continue;
    if (w->mw == ring_window_.mw) ring_window_ = Window{};
    if (ibv_dealloc_mw(w->mw) != 0)
      spdlog::error("slotrpc: ibv_dealloc_mw ({}): {}", description_, std::strerror(errno));
    windows_.erase(w);
    break;
  }
  mrs_.erase(it);
  if (ibv_dereg_mr(mr) != 0)
    spdlog::error("slotrpc: ibv_dereg_mr ({}): {}", description_, std::strerror(errno));
  region = MemoryRegion{};
}

bool VerbsLink::owns_region(const MemoryRegion& r) const {
  return r.handle != nullptr &&
         std::find(mrs_.begin(), mrs_.end(), static_cast<ibv_mr*>(r.handle)) != mrs_.end();
}

Status VerbsLink::attach(const MemoryRegion& receive_ring, const MemoryRegion& send_ring,
                         uint32_t slot_count, uint32_t slot_size, void* context) {
  if (attached_) return Status(StatusCode::kInvalidArgument, "verbs link already attached");
  if (slot_count == 0 || slot_count > created_slots_ || slot_count > 0x10000u)
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("slot count {} outside 1..{} (the queues were sized for {})",
                              slot_count, std::min<uint32_t>(created_slots_, 0x10000u),
                              created_slots_));
  if (slot_size == 0) return Status(StatusCode::kInvalidArgument, "slot size is 0");
  const uint64_t need = uint64_t{slot_count} * slot_size;
  if (!owns_region(receive_ring) || !owns_region(send_ring))
    return Status(StatusCode::kInvalidArgument,
                  "verbs link: both rings must be registered through this link");
  if (need > receive_ring.length || need > send_ring.length)
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("rings of {} / {} bytes cannot hold {} slots of {}",
                              receive_ring.length, send_ring.length, slot_count, slot_size));
  if (!owns_pd_) {
    for (const Window& w : windows_)
      if (w.mr == receive_ring.handle) ring_window_ = w;
    if (ring_window_.mw == nullptr)
      return Status(StatusCode::kInvalidArgument,
                    "verbs link: the receive ring must be registered for remote write");
  }
  ring_ = receive_ring;
  send_base_ = send_ring.base;
  send_len_ = send_ring.length;
  send_lkey_ = send_ring.lkey;
  slot_count_ = slot_count;
  slot_size_ = slot_size;
  context_ = context;
  size_arming(slot_count);
  attached_ = true;
  return {};
}

QpInfo VerbsLink::local_info() const {
  const Device& dev = owner_.device();
  QpInfo info;
  info.qpn = qp_num();
  info.psn = psn_;
  info.gid = dev.gid();
  info.lid = dev.lid();
  info.mtu = static_cast<uint8_t>(dev.active_mtu());
  info.link_layer = dev.link_layer();
  info.ring_addr = reinterpret_cast<uintptr_t>(ring_.base);
  info.ring_rkey = ring_.rkey;
  info.slot_count = slot_count_;
  info.slot_size = slot_size_;
  return info;
}

Status VerbsLink::connect(const QpInfo& peer, int control_fd, const std::string& peer_name) {
  auto refuse = [](std::string why) { return Status(StatusCode::kUnavailable, std::move(why)); };
  if (down_) return refuse("verbs link is down: " + down_reason_);
  if (!attached_) return refuse("verbs link: connect before attach");
  if (connected_) return refuse("verbs link already connected");
  if (peer.slot_count != slot_count_ || peer.slot_size != slot_size_)
    return refuse(fmt::format("peer's ring is {} slots of {} bytes, ours {} of {}", peer.slot_count,
                              peer.slot_size, slot_count_, slot_size_));
  const Device& dev = owner_.device();
  if (peer.link_layer != dev.link_layer())
    return refuse(fmt::format("peer's port has link layer {}, {} has {}", peer.link_layer,
                              dev.name(), dev.link_layer()));
  const Config& cfg = owner_.config_;
  const ibv_mtu mtu = static_cast<ibv_mtu>(std::min<int>(peer.mtu, dev.active_mtu()));

  ibv_qp_attr at{};
  at.qp_state = IBV_QPS_RTR;
  at.path_mtu = mtu;
  at.dest_qp_num = peer.qpn;
  at.rq_psn = peer.psn;
  at.max_dest_rd_atomic = 1;
  at.min_rnr_timer = static_cast<uint8_t>(cfg.min_rnr_timer);
  at.ah_attr.port_num = dev.port();
  at.ah_attr.sl = static_cast<uint8_t>(cfg.service_level);
  at.ah_attr.src_path_bits = 0;
  if (dev.ethernet()) {
    // RoCE: always routed by GID (the GRH carries traffic class and TTL).
    at.ah_attr.is_global = 1;
    at.ah_attr.grh.dgid = peer.gid;
    at.ah_attr.grh.sgid_index = dev.gid_index();
    at.ah_attr.grh.hop_limit = 64;
    at.ah_attr.grh.traffic_class = static_cast<uint8_t>(cfg.traffic_class);
    at.ah_attr.grh.flow_label = 0;
  } else {
    // InfiniBand inside one subnet: by LID, no GRH (traffic_class unused).
    at.ah_attr.is_global = 0;
    at.ah_attr.dlid = peer.lid;
  }
  if (const int rc = ibv_modify_qp(qp_, &at, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                                                 IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                                 IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
      rc != 0) {
    return refuse(errno_text("ibv_modify_qp to RTR", rc));
  }
  at = ibv_qp_attr{};
  at.qp_state = IBV_QPS_RTS;
  at.timeout = static_cast<uint8_t>(cfg.qp_timeout);
  at.retry_cnt = static_cast<uint8_t>(cfg.retry_count);
  at.rnr_retry = static_cast<uint8_t>(cfg.rnr_retry);
  at.sq_psn = psn_;
  at.max_rd_atomic = 1;
  if (const int rc = ibv_modify_qp(qp_, &at, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                                 IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                                 IBV_QP_MAX_QP_RD_ATOMIC);
      rc != 0) {
    return refuse(errno_text("ibv_modify_qp to RTS", rc));
  }

  // The window must be bound before the peer can write: the server answers
  // the handshake only after this returns, and a client's bind completes
  // before its first request goes out.
  if (ring_window_.mw != nullptr) {
    if (Status st = bind_ring_window(); !st.ok()) return st;
  }

  if (control_fd >= 0) {
    if (!set_nonblocking(control_fd)) return refuse(errno_text("fcntl(O_NONBLOCK)", errno));
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = kTagLink | uint64_t{gen_} << 16 | index_;
    if (::epoll_ctl(owner_.epoll_fd_, EPOLL_CTL_ADD, control_fd, &ev) != 0)
      return refuse(errno_text("epoll_ctl", errno));
    fd_ = control_fd;
    in_epoll_ = true;
  }
  peer_ring_ = peer.ring_addr;
  peer_rkey_ = peer.ring_rkey;
  connected_ = true;
  description_ = fmt::format("verbs {}:{} qp {} -> {} qp {} (MTU {})", dev.name(),
                             unsigned{dev.port()}, qp_num(), peer_name, peer.qpn, mtu_bytes(mtu));
  flush_backlog();
  return {};
}

Status VerbsLink::bind_ring_window() {
  ibv_send_wr& w = wr_[0];
  w = ibv_send_wr{};
  w.opcode = IBV_WR_BIND_MW;
  w.send_flags = IBV_SEND_SIGNALED;
  w.wr_id = make_wr_id(gen_, index_, false, kBindBit | (unsignaled_ + 1));
  unsignaled_ = 0;
  w.bind_mw.mw = ring_window_.mw;
  w.bind_mw.rkey = ring_window_.rkey;
  w.bind_mw.bind_info.mr = ring_window_.mr;
  w.bind_mw.bind_info.addr = reinterpret_cast<uintptr_t>(ring_.base);
  w.bind_mw.bind_info.length = uint64_t{slot_count_} * slot_size_;
  w.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
  ++send_seq_;
  ibv_send_wr* bad = nullptr;
  if (const int rc = ibv_post_send(qp_, &w, &bad); rc != 0) {
    w = ibv_send_wr{};
    return Status(StatusCode::kUnavailable, errno_text("ibv_post_send (bind memory window)", rc));
  }
  w = ibv_send_wr{};
  ++sq_outstanding_;  // not in the message counters (doorbells, signaled)
  const auto give_up = std::chrono::steady_clock::now() + kBindTimeout;
  while (!bound_ && !down_) {
    if (owner_.poll_into_ready() == 0) {
      if (std::chrono::steady_clock::now() > give_up) {
        fail("binding the memory window timed out");
        break;
      }
      std::this_thread::yield();
    }
  }
  if (!bound_) return Status(StatusCode::kUnavailable, "memory window bind failed: " + down_reason_);
  return {};
}

void VerbsLink::post(std::span<const Outgoing> batch) {
  if (down_ || batch.empty()) return;
  size_t i = 0;
  if (connected_ && backlog_head_ == backlog_.size()) {
    // The common case: everything fits the send queue, one doorbell.
    const size_t n = std::min<size_t>(sq_depth_ - sq_outstanding_, batch.size());
    for (size_t j = 0; j < n; ++j)
      if (!prepare(j, batch[j])) return;
    if (n != 0 && !ring_doorbell(n)) return;
    i = n;
  }
  // The rest waits for completions (or for connect()), in order.
  for (; i < batch.size(); ++i) {
    const Outgoing& o = batch[i];
    Pending& p = backlog_.emplace_back();
    p.out = o;
    if (o.lane == Lane::kControl) {
      if (o.data == nullptr || o.length != core::kHeaderSize) {
        backlog_.pop_back();
        return fail(fmt::format("post: control message of {} bytes, expected {}", o.length,
                                core::kHeaderSize));
      }
      // The caller may reuse its 32 bytes once post() returns.
      std::memcpy(p.control.data(), o.data, core::kHeaderSize);
    }
    ++stats_.backlogged;
  }
}

bool VerbsLink::prepare(size_t i, const Outgoing& o) {
  ibv_send_wr& w = wr_[i];
  ibv_sge& s = sge_[i];
  if (o.data == nullptr || o.length == 0) {
    fail(fmt::format("post: invalid message of {} bytes", o.length));
    return false;
  }
  w.next = nullptr;
  w.sg_list = &s;
  w.num_sge = 1;
  w.send_flags = 0;
  s.addr = reinterpret_cast<uintptr_t>(o.data);
  s.length = o.length;
  const uint64_t seq = send_seq_++;
  if (o.lane == Lane::kControl) {
    if (o.length != core::kHeaderSize) {
      fail(fmt::format("post: control message of {} bytes, expected {}", o.length,
                       core::kHeaderSize));
      return false;
    }
    w.opcode = IBV_WR_SEND;
    if (core::kHeaderSize <= max_inline_) {
      w.send_flags = IBV_SEND_INLINE;
      s.lkey = 0;
      ++stats_.inline_sends;
    } else {
      // Buffer seq % depth is free: request seq - depth has completed, or
      // the send queue could not have taken this one.
      std::byte* buf = ctrl_bufs_.data() + (seq % sq_depth_) * core::kHeaderSize;
      std::memcpy(buf, o.data, core::kHeaderSize);
      s.addr = reinterpret_cast<uintptr_t>(buf);
      s.lkey = ctrl_bufs_.lkey();
      ++stats_.noninline_sends;
    }
    ++stats_.control_sends;
  } else {
    const uint16_t slot = core::imm_slot(o.imm);
    if (slot >= slot_count_ || o.length > slot_size_) {
      fail(fmt::format("post: {} bytes into slot {} of a ring of {} slots of {}", o.length, slot,
                       slot_count_, slot_size_));
      return false;
    }
    w.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    w.imm_data = htobe32(o.imm);
    w.wr.rdma.remote_addr = peer_ring_ + uint64_t{slot} * slot_size_;
    w.wr.rdma.rkey = peer_rkey_;
    if (o.length <= max_inline_) {
      w.send_flags = IBV_SEND_INLINE;
      s.lkey = 0;
      ++stats_.inline_sends;
    } else {
      if (o.data < send_base_ || o.data + o.length > send_base_ + send_len_) {
        fail("post: message outside the registered send ring");
        return false;
      }
      s.lkey = send_lkey_;
      ++stats_.noninline_sends;
    }
    ++stats_.slot_sends;
  }
  // Selective signaling: every signal_every_-th request reports, and
  // retires itself and the unsignaled ones before it.
  if (++unsignaled_ >= signal_every_) {
    w.send_flags |= IBV_SEND_SIGNALED;
    w.wr_id = make_wr_id(gen_, index_, false, unsignaled_);
    unsignaled_ = 0;
    ++stats_.signaled;
  } else {
    w.wr_id = make_wr_id(gen_, index_, false, 0);
  }
  return true;
}

bool VerbsLink::ring_doorbell(size_t n) {
  for (size_t j = 0; j + 1 < n; ++j) wr_[j].next = &wr_[j + 1];
  wr_[n - 1].next = nullptr;
  ibv_send_wr* bad = nullptr;
  if (const int rc = ibv_post_send(qp_, wr_.data(), &bad); rc != 0) {
    fail(errno_text("ibv_post_send", rc));
    return false;
  }
  sq_outstanding_ += static_cast<uint32_t>(n);
  ++stats_.doorbells;
  return true;
}

void VerbsLink::flush_backlog() {
  flush_queued_ = false;
  if (down_ || !connected_) return;
  if (backlog_head_ < backlog_.size()) {
    const size_t n = std::min<size_t>(sq_depth_ - sq_outstanding_, backlog_.size() - backlog_head_);
    for (size_t j = 0; j < n; ++j) {
      Pending& p = backlog_[backlog_head_ + j];
      if (p.out.lane == Lane::kControl) p.out.data = p.control.data();
      if (!prepare(j, p.out)) return;
    }
    if (n != 0) {
      if (!ring_doorbell(n)) return;
      backlog_head_ += n;
    }
  }
  if (backlog_head_ == backlog_.size()) {
    backlog_.clear();  // keeps capacity
    backlog_head_ = 0;
  }
}

void VerbsLink::on_send_done(uint32_t retired) {
  sq_outstanding_ -= std::min(retired, sq_outstanding_);
  if (backlog_head_ < backlog_.size() && !flush_queued_) {
    flush_queued_ = true;
    owner_.flush_list_.push_back(this);
  }
}

void VerbsLink::repost() {
  if (down_ || own_rq_ == nullptr) return;
  if (const int rc = own_rq_->post_consumed(); rc != 0) fail(errno_text("ibv_post_recv", rc));
}

bool VerbsLink::on_receive(const ibv_wc& wc, const std::byte* buffer, Completion* out) {
  switch (wc.opcode) {
    case IBV_WC_RECV_RDMA_WITH_IMM: {
      const uint32_t imm = be32toh(wc.imm_data);
      const uint16_t slot = core::imm_slot(imm);
      // The bytes are already in the ring; these checks keep a misbehaving
      // peer's message from reaching the core.
      if (slot >= slot_count_) {
        fail(fmt::format("peer wrote slot {} outside the ring of {}", slot, slot_count_));
        return false;
      }
      if (wc.byte_len == 0 || wc.byte_len > slot_size_) {
        fail(fmt::format("peer wrote {} bytes into a slot of {}", wc.byte_len, slot_size_));
        return false;
      }
      if (!take_armed(slot)) {
        fail(fmt::format("peer wrote slot {} which was not armed", slot));
        return false;
      }
      out->kind = Completion::Kind::kMessage;
      out->slot = slot;
      out->length = wc.byte_len;
      out->imm = imm;
      out->context = context_;
      out->link = this;
      return true;
    }
    case IBV_WC_RECV: {
      if (wc.byte_len != core::kHeaderSize) {
        fail(fmt::format("control message of {} bytes, expected {}", wc.byte_len,
                         core::kHeaderSize));
        return false;
      }
      out->kind = Completion::Kind::kControl;
      out->slot = 0;
      out->length = wc.byte_len;
      out->imm = (wc.wc_flags & IBV_WC_WITH_IMM) != 0 ? be32toh(wc.imm_data) : 0;
      out->context = context_;
      out->link = this;
      std::memcpy(out->control.data(), buffer, core::kHeaderSize);
      return true;
    }
    default:
      fail(fmt::format("unexpected receive completion (opcode {})", static_cast<int>(wc.opcode)));
      return false;
  }
}

void VerbsLink::on_control_fd(uint32_t events) {
  if (down_ || fd_ < 0) return;
  char buf[64];
  const ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
  if (n == 0) return fail("peer closed the connection");
  if (n > 0) {
    return fail(fmt::format("peer sent {} unexpected byte(s) on the control connection", n));
  }
  const int err = errno;
  if (err != EAGAIN && err != EWOULDBLOCK && err != EINTR) return fail(errno_text("control connection", err));
  if ((events & (EPOLLHUP | EPOLLERR | EPOLLRDHUP)) != 0) fail("control connection hung up");
}

void VerbsLink::fail_from_wc(const ibv_wc& wc) {
  const bool recv = (wc.wr_id & kRecvBit) != 0;
  fail(fmt::format("{} completion failed: {} (status {}, vendor error 0x{:x}){}",
                   recv ? "receive" : "send", ibv_wc_status_str(wc.status),
                   static_cast<int>(wc.status), wc.vendor_err,
                   wc.status == IBV_WC_WR_FLUSH_ERR ? "; the queue pair is in the error state" : ""));
}

void VerbsLink::close(std::string reason) { fail(std::move(reason)); }

void VerbsLink::fail(std::string reason) {
  if (down_) return;
  down_ = true;
  down_reason_ = std::move(reason);
  spdlog::debug("slotrpc: {} down: {}", description_, down_reason_);
  if (qp_ != nullptr) {
    // Outstanding work flushes (those completions are ignored); the peer
    // learns from the control connection closing.
    ibv_qp_attr at{};
    at.qp_state = IBV_QPS_ERR;
    ibv_modify_qp(qp_, &at, IBV_QP_STATE);
  }
  if (fd_ >= 0) {
    if (in_epoll_) ::epoll_ctl(owner_.epoll_fd_, EPOLL_CTL_DEL, fd_, nullptr);
    in_epoll_ = false;
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    fd_ = -1;
  }
  backlog_.clear();
  backlog_head_ = 0;
  Completion c;
  c.kind = Completion::Kind::kLinkDown;
  c.context = context_;
  c.link = this;
  owner_.push_completion(c);
}

LinkStats VerbsLink::stats() const {
  LinkStats s = stats_;
  s.max_inline = max_inline_;
  s.shared_receive_queue = shared_receive_queue();
  s.memory_window = memory_window();
  return s;
}

Status VerbsLink::post_raw_write(const std::byte* local, uint32_t length, uint64_t remote_addr,
                                 uint32_t rkey, uint32_t imm) {
  if (down_ || !connected_) return Status(StatusCode::kUnavailable, "link not connected");
  if (sq_outstanding_ >= sq_depth_) return Status(StatusCode::kResourceExhausted, "send queue full");
  if (local < send_base_ || local + length > send_base_ + send_len_)
    return Status(StatusCode::kInvalidArgument, "local bytes outside the send ring");
  ibv_send_wr& w = wr_[0];
  ibv_sge& s = sge_[0];
  s.addr = reinterpret_cast<uintptr_t>(local);
  s.length = length;
  s.lkey = send_lkey_;
  w = ibv_send_wr{};
  w.sg_list = &s;
  w.num_sge = 1;
  w.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  w.imm_data = htobe32(imm);
  w.wr.rdma.remote_addr = remote_addr;
  w.wr.rdma.rkey = rkey;
  ++send_seq_;
  w.send_flags = IBV_SEND_SIGNALED;
  w.wr_id = make_wr_id(gen_, index_, false, unsignaled_ + 1);
  unsignaled_ = 0;
  if (!ring_doorbell(1)) return Status(StatusCode::kUnavailable, down_reason_);
  return {};
}

// ---------------------------------------------------------- VerbsTransport

Result<std::unique_ptr<VerbsTransport>> VerbsTransport::create(const Config& config) {
  auto dev = Device::open(config);
  if (!dev.ok()) return dev.status();
  std::unique_ptr<VerbsTransport> t(new VerbsTransport);
  t->config_ = config;
  t->device_ = std::move(dev.value());
  ibv_context* ctx = t->device_->context();

  t->channel_ = ibv_create_comp_channel(ctx);
  if (t->channel_ == nullptr)
    return Status(StatusCode::kUnavailable, errno_text("ibv_create_comp_channel", errno));
  if (!set_nonblocking(t->channel_->fd) || !set_nonblocking(ctx->async_fd))
    return Status(StatusCode::kUnavailable, errno_text("fcntl(O_NONBLOCK)", errno));
  const int cqe = std::min(kInitialCq, std::max(t->device_->attr().max_cqe, 1));
  t->cq_ = ibv_create_cq(ctx, cqe, nullptr, t->channel_, 0);
  if (t->cq_ == nullptr) return Status(StatusCode::kUnavailable, errno_text("ibv_create_cq", errno));
  t->cq_capacity_ = t->cq_->cqe;

  t->epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (t->epoll_fd_ < 0) return Status(StatusCode::kInternal, errno_text("epoll_create1", errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kTagChannel;
  if (::epoll_ctl(t->epoll_fd_, EPOLL_CTL_ADD, t->channel_->fd, &ev) != 0)
    return Status(StatusCode::kInternal, errno_text("epoll_ctl", errno));
  ev.data.u64 = kTagAsync;
  if (::epoll_ctl(t->epoll_fd_, EPOLL_CTL_ADD, ctx->async_fd, &ev) != 0)
    return Status(StatusCode::kInternal, errno_text("epoll_ctl", errno));

  // Receive queues and ring protection (see verbs_transport.h).
  const ibv_device_attr& a = t->device_->attr();
  const bool has_windows = (a.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B) != 0 && a.max_mw > 0;
  const bool has_srq = a.max_srq > 0 && a.max_srq_wr > 0;
  bool shared = false;
  switch (config.srq) {
    case SharedReceiveQueue::kOff:
      break;
    case SharedReceiveQueue::kAuto:
      shared = has_windows && has_srq;
      break;
    case SharedReceiveQueue::kOn:
      if (!has_windows || !has_srq) {
        return Status(StatusCode::kUnavailable,
                      fmt::format("SLOTRPC_SRQ=on: {} has {}{}{}; use auto or off", t->device_->name(),
                                  has_srq ? "" : "no shared receive queues",
                                  !has_srq && !has_windows ? " and " : "",
                                  has_windows ? "" : "no type-2 memory windows"));
      }
      shared = true;
      break;
  }
  if (shared) {
    t->pd_ = ibv_alloc_pd(ctx);
    if (t->pd_ == nullptr) return Status(StatusCode::kUnavailable, errno_text("ibv_alloc_pd", errno));
    const uint32_t depth = std::min<uint32_t>(config.srq_depth, static_cast<uint32_t>(a.max_srq_wr));
    auto q = ReceiveQueue::create_shared(t->pd_, depth);
    if (!q.ok()) return q.status();
    t->srq_ = std::move(q.value());
    t->srq_->set_tag(make_wr_id(0, kSrqIndex, true, 0));
    if (const int rc = t->srq_->post_all(); rc != 0)
      return Status(StatusCode::kUnavailable, errno_text("ibv_post_srq_recv", rc));
  }

  t->wc_.resize(std::max<uint32_t>(config.poll_batch, 1));
  t->scratch_.resize(t->wc_.size());
  t->ready_.reserve(kReadyReserve);
  t->repost_list_.reserve(64);
  t->flush_list_.reserve(64);
  spdlog::debug("slotrpc: verbs transport on {} (CQ of {} entries; {})", t->device_->describe(),
                t->cq_capacity_,
                shared ? fmt::format("shared receive queue of {}, rings behind type-2 memory windows",
                                     t->srq_->depth())
                       : std::string("a protection domain and receive queue per session"));
  return t;
}

VerbsTransport::~VerbsTransport() {
  assert(live_links_ == 0 && "destroy every VerbsLink before its VerbsTransport");
  srq_.reset();  // after every queue pair, before the PD and the CQ
  if (pd_ != nullptr && ibv_dealloc_pd(pd_) != 0)
    spdlog::error("slotrpc: ibv_dealloc_pd: {}", std::strerror(errno));
  if (cq_ != nullptr && ibv_destroy_cq(cq_) != 0)
    spdlog::error("slotrpc: ibv_destroy_cq: {}", std::strerror(errno));
  if (channel_ != nullptr) ibv_destroy_comp_channel(channel_);
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
  device_.reset();
}

Result<std::unique_ptr<VerbsLink>> VerbsTransport::create_link(std::string description,
                                                               uint32_t slot_count) {
  if (slot_count == 0 || slot_count > 0x10000u)
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("slot count {} outside 1..65536", slot_count));
  uint16_t index;
  if (!free_entries_.empty()) {
    index = free_entries_.back();
    free_entries_.pop_back();
  } else if (table_.size() < kMaxLinks) {
    index = static_cast<uint16_t>(table_.size());
    table_.emplace_back();
  } else {
    return Status(StatusCode::kResourceExhausted, "too many verbs links on one event loop");
  }
  std::unique_ptr<VerbsLink> link(new VerbsLink(*this, std::move(description)));
  link->index_ = index;
  link->gen_ = table_[index].gen;
  table_[index].link = link.get();
  Status st = link->setup(slot_count);
  if (!st.ok()) return st;  // ~VerbsLink releases what was made
  return link;
}

VerbsLink* VerbsTransport::lookup(uint64_t wr_id) const {
  const auto index = static_cast<uint16_t>(wr_id >> 32);
  const auto gen = static_cast<uint16_t>(wr_id >> 48);
  if (index >= table_.size()) return nullptr;
  const Entry& e = table_[index];
  return e.gen == gen ? e.link : nullptr;
}

VerbsLink* VerbsTransport::lookup_qp(uint32_t qp_num) const {
  const auto it = by_qpn_.find(qp_num);
  return it == by_qpn_.end() ? nullptr : table_[it->second].link;
}

void VerbsTransport::forget(VerbsLink* link) {
  if (link->qp_ != nullptr) {
    const auto it = by_qpn_.find(link->qp_->qp_num);
    if (it != by_qpn_.end() && it->second == link->index_) by_qpn_.erase(it);
  }
  Entry& e = table_[link->index_];
  if (e.link == link) {
    e.link = nullptr;
    ++e.gen;  // completions still in the CQ for this entry are now stale
    free_entries_.push_back(link->index_);
  }
  std::erase(repost_list_, link);  // its own receive queue goes with it
  std::erase(flush_list_, link);
  auto first = ready_.begin() + static_cast<ptrdiff_t>(ready_head_);
  ready_.erase(std::remove_if(first, ready_.end(),
                              [link](const Completion& c) { return c.link == link; }),
               ready_.end());
  if (ready_head_ == ready_.size()) {
    ready_.clear();
    ready_head_ = 0;
  }
}

size_t VerbsTransport::drain_ready(std::span<Completion> out) {
  const size_t n = std::min(out.size(), ready_.size() - ready_head_);
  std::copy_n(ready_.begin() + static_cast<ptrdiff_t>(ready_head_), n, out.begin());
  ready_head_ += n;
  if (ready_head_ == ready_.size()) {
    ready_.clear();  // keeps capacity
    ready_head_ = 0;
  }
  return n;
}

size_t VerbsTransport::process(const ibv_wc* wc, int n, Completion* out) {
  size_t k = 0;
  for (int i = 0; i < n; ++i) {
    const ibv_wc& w = wc[i];
    const auto index = static_cast<uint16_t>(w.wr_id >> 32);
    const auto value = static_cast<uint32_t>(w.wr_id & kValueMask);
    VerbsLink* link = nullptr;
    const std::byte* buffer = nullptr;
    if (index == kSrqIndex && (w.wr_id & kRecvBit) != 0 && srq_ != nullptr) {
      // An SRQ buffer always goes back, whatever became of its queue pair.
      srq_->consumed(value);
      buffer = srq_->buffer(value);
      link = lookup_qp(w.qp_num);
    } else {
      link = lookup(w.wr_id);
      if (link != nullptr && !link->down_ && (w.wr_id & kRecvBit) != 0 && link->own_rq_ != nullptr) {
        if (link->own_rq_->consumed(value)) repost_list_.push_back(link);
        buffer = link->own_rq_->buffer(value);
      }
    }
    // Stale (the link is gone) or already failed: flush errors and the
    // like after a link is down carry no news.
    if (link == nullptr || link->down_) continue;
    if (w.status != IBV_WC_SUCCESS) {
      link->fail_from_wc(w);
      continue;
    }
    if ((w.wr_id & kRecvBit) != 0) {
      if (buffer != nullptr && link->on_receive(w, buffer, out + k)) ++k;
    } else {
      if ((value & kBindBit) != 0) link->bound_ = true;
      link->on_send_done(value & ~kBindBit);
    }
  }
  // Receive buffers go back (one chain per queue) and waiting sends go out
  // before the core sees these completions.
  if (srq_ != nullptr) {
    if (const int rc = srq_->post_consumed(); rc != 0) {
      spdlog::error("slotrpc: {}: ibv_post_srq_recv: {}", device_->name(), std::strerror(rc));
      fail_all(errno_text("ibv_post_srq_recv", rc));
    }
  }
  for (VerbsLink* l : repost_list_) l->repost();
  repost_list_.clear();
  for (VerbsLink* l : flush_list_) l->flush_backlog();
  flush_list_.clear();
  return k;
}

int VerbsTransport::poll_into_ready() {
  const int n = ibv_poll_cq(cq_, static_cast<int>(wc_.size()), wc_.data());
  if (n < 0) {
    fail_all(fmt::format("ibv_poll_cq failed ({})", n));
    return 0;
  }
  if (n > 0) {
    ++poll_stats_.polls;
    poll_stats_.completions += static_cast<uint64_t>(n);
    const size_t k = process(wc_.data(), n, scratch_.data());
    ready_.insert(ready_.end(), scratch_.begin(), scratch_.begin() + static_cast<ptrdiff_t>(k));
  }
  return n;
}

void VerbsTransport::drain_cq() {
  while (poll_into_ready() > 0) {
  }
}

size_t VerbsTransport::poll(std::span<Completion> out) {
  size_t got = drain_ready(out);
  if (got == out.size()) return got;
  if (check_fds_ || --countdown_ == 0) {
    check_fds_ = false;
    countdown_ = kFdCheckInterval;
    check_fds();
    got += drain_ready(out.subspan(got));
    if (got == out.size()) return got;
  }
  const int want = static_cast<int>(std::min(out.size() - got, wc_.size()));
  const int n = ibv_poll_cq(cq_, want, wc_.data());
  if (n < 0) {
    fail_all(fmt::format("ibv_poll_cq failed ({})", n));
  } else if (n > 0) {
    ++poll_stats_.polls;
    poll_stats_.completions += static_cast<uint64_t>(n);
    got += process(wc_.data(), n, out.data() + got);
  }
  // Link failures found in this batch follow its messages.
  got += drain_ready(out.subspan(got));
  return got;
}

bool VerbsTransport::prepare_sleep() {
  if (ready_head_ < ready_.size()) return false;
  if (!armed_) {
    if (const int rc = ibv_req_notify_cq(cq_, 0); rc != 0) {
      spdlog::warn("slotrpc: ibv_req_notify_cq: {}; not sleeping", std::strerror(rc));
      return false;
    }
    armed_ = true;
  }
  // A completion that arrived before the arm raises no event: look again.
  const int n = ibv_poll_cq(cq_, static_cast<int>(wc_.size()), wc_.data());
  check_fds_ = true;  // whatever wakes the loop, look at the fds next time
  if (n > 0) {
    ++poll_stats_.polls;
    poll_stats_.completions += static_cast<uint64_t>(n);
    const size_t k = process(wc_.data(), n, scratch_.data());
    ready_.insert(ready_.end(), scratch_.begin(), scratch_.begin() + static_cast<ptrdiff_t>(k));
    return false;
  }
  return ready_head_ == ready_.size();
}

void VerbsTransport::check_fds() {
  epoll_event events[32];
  const int n = ::epoll_wait(epoll_fd_, events, 32, 0);
  for (int i = 0; i < n; ++i) {
    const uint64_t tag = events[i].data.u64;
    if (tag == kTagChannel) {
      unsigned got = 0;
      for (;;) {
        ibv_cq* cq = nullptr;
        void* ctx = nullptr;
        if (ibv_get_cq_event(channel_, &cq, &ctx) != 0) break;
        ++got;
      }
      if (got != 0) {
        ibv_ack_cq_events(cq_, got);
        armed_ = false;  // an event disarms the CQ
      }
    } else if (tag == kTagAsync) {
      for (;;) {
        ibv_async_event e{};
        if (ibv_get_async_event(device_->context(), &e) != 0) break;
        on_async_event(e);
        ibv_ack_async_event(&e);
      }
    } else if ((tag & kTagLink) != 0) {
      const auto index = static_cast<uint16_t>(tag);
      const auto gen = static_cast<uint16_t>(tag >> 16);
      if (index < table_.size() && table_[index].gen == gen && table_[index].link != nullptr)
        table_[index].link->on_control_fd(events[i].events);
    }
  }
}

void VerbsTransport::on_async_event(const ibv_async_event& e) {
  const char* what = ibv_event_type_str(e.event_type);
  switch (e.event_type) {
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_PATH_MIG_ERR: {
      for (const Entry& entry : table_) {
        if (entry.link != nullptr && entry.link->qp_ == e.element.qp) {
          spdlog::warn("slotrpc: {}: async event: {}", entry.link->description_, what);
          entry.link->fail(fmt::format("async event: {}", what));
          return;
        }
      }
      spdlog::warn("slotrpc: {}: async event for an unknown queue pair: {}", device_->name(), what);
      return;
    }
    case IBV_EVENT_CQ_ERR:  // the loop's one CQ, SRQ or device: every link is affected
    case IBV_EVENT_SRQ_ERR:
    case IBV_EVENT_DEVICE_FATAL:
      spdlog::error("slotrpc: {}: async event: {}", device_->name(), what);
      return fail_all(fmt::format("async event: {}", what));
    case IBV_EVENT_QP_LAST_WQE_REACHED:  // an SRQ queue pair that failed: expected
      spdlog::debug("slotrpc: {}: async event: {}", device_->name(), what);
      return;
    case IBV_EVENT_PORT_ERR:
      spdlog::warn("slotrpc: {} port {}: async event: {}", device_->name(), e.element.port_num, what);
      return;
    default:
      spdlog::info("slotrpc: {}: async event: {}", device_->name(), what);
      return;
  }
}

void VerbsTransport::fail_all(const std::string& reason) {
  for (const Entry& entry : table_)
    if (entry.link != nullptr) entry.link->fail(reason);
}

}  // namespace slotrpc::transport::verbs
