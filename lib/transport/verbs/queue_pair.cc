// A link's queue pair: creation (INIT, the inline probe), attach, and the
// transitions to RTR and RTS on connect, with the ring window's bind.
#include "transport/verbs/verbs_transport.h"

#include "transport/verbs/verbs_internal.h"

#include <cstring>

namespace slotrpc::transport::verbs {

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
      base::log().error("slotrpc: ibv_destroy_qp ({}): {}", description_, std::strerror(errno));
    // SRQ completions are matched by queue-pair number, which the device
    // may hand to the next queue pair: ours leave the CQ now (their
    // buffers go back to the SRQ; the messages are dropped).
    if (srq_budget_ != 0) owner_.drain_cq();
  }
  for (Window& w : windows_)
    if (w.mw != nullptr) ibv_dealloc_mw(w.mw);
  free_bulk_windows();
  if (!mrs_.empty()) {
    base::log().warn("slotrpc: {} destroyed with {} memory region(s) still registered", description_,
                 mrs_.size());
    for (ibv_mr* mr : mrs_) ibv_dereg_mr(mr);
  }
  own_rq_.reset();
  ctrl_bufs_ = RegisteredBuffer{};  // before the PD it is registered in
  if (owns_pd_ && pd_ != nullptr && ibv_dealloc_pd(pd_) != 0)
    base::log().error("slotrpc: ibv_dealloc_pd ({}): {}", description_, std::strerror(errno));
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
  // The same rule as TCP's output budget, counted in messages: one slot
  // message per slot, two cancels and two grants per slot, 64 keepalives.
  backlog_limit_ = 5 * size_t{slot_count} + 64;
  const uint32_t want_rq = 3 * slot_count + 16;
  const bool use_srq = owner_.srq_ != nullptr &&
                       uint64_t{owner_.srq_committed_} + want_rq <= owner_.srq_->depth();
  if (use_srq) {
    rq_depth_ = want_rq;
  } else {
    rq_depth_ = std::min<uint32_t>(want_rq, max_wr);
    if (rq_depth_ < want_rq) {
      base::log().warn("slotrpc: {} allows {} receive requests per QP; {} slots want {}: a burst of "
                   "control messages could meet receiver-not-ready",
                   dev.name(), max_wr, slot_count, want_rq);
    }
    if (owner_.srq_ != nullptr && !owner_.srq_full_logged_) {
      owner_.srq_full_logged_ = true;
      base::log().info("slotrpc: {}: the shared receive queue ({} requests, {} reserved) cannot take "
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
    base::log().debug("slotrpc: {}: inline_bytes {} not supported, using {}", dev.name(),
                  cfg.inline_bytes, max_inline_);
  }
  // An attribute "no more than asked" keeps the documented meaning of
  // inline_bytes even when the device rounds up.
  max_inline_ = std::min(max_inline_, cfg.inline_bytes);

  ibv_qp_attr at{};
  at.qp_state = IBV_QPS_INIT;
  at.pkey_index = 0;
  at.port_num = dev.port();
  // REMOTE_READ lets the peer read through a bulk window (expose); the
  // rings' MRs and windows grant remote write only, so nothing else becomes
  // readable.
  at.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  if (const int rc = ibv_modify_qp(qp_, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                                 IBV_QP_ACCESS_FLAGS);
      rc != 0) {
    return Status(StatusCode::kUnavailable, errno_text("ibv_modify_qp to INIT", rc));
  }
  psn_ = random_psn();
  if (use_srq) owner_.by_qpn_[qp_->qp_num] = index_;

  if (max_inline_ < transport::kHeaderSize) {
    auto b = RegisteredBuffer::create(pd_, size_t{sq_depth_} * transport::kHeaderSize, 0, "control buffers");
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
  const ibv_gid gid = dev.gid();
  std::memcpy(info.gid.raw, gid.raw, sizeof info.gid.raw);
  info.lid = dev.lid();
  info.mtu = static_cast<uint8_t>(dev.active_mtu());
  info.link_layer = dev.link_layer();
  info.ring_addr = reinterpret_cast<uintptr_t>(ring_.base);
  info.ring_rkey = ring_.rkey;
  info.slot_count = slot_count_;
  info.slot_size = slot_size_;
  info.max_dest_rd_atomic = responder_resources();
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
  if (const uint32_t bytes = mtu_bytes(mtu); bytes != 0) path_mtu_ = bytes;

  ibv_qp_attr at{};
  at.qp_state = IBV_QPS_RTR;
  at.path_mtu = mtu;
  at.dest_qp_num = peer.qpn;
  at.rq_psn = peer.psn;
  // Bulk reads: the RDMA READs we answer at once, and (RTS below) the ones
  // we issue at once, never more than the peer answers (0 = an older peer,
  // which answered one).
  at.max_dest_rd_atomic = responder_resources();
  at.min_rnr_timer = static_cast<uint8_t>(cfg.min_rnr_timer);
  at.ah_attr.port_num = dev.port();
  at.ah_attr.sl = static_cast<uint8_t>(cfg.service_level);
  at.ah_attr.src_path_bits = 0;
  if (dev.ethernet()) {
    // RoCE: always routed by GID (the GRH carries traffic class and TTL).
    at.ah_attr.is_global = 1;
    std::memcpy(at.ah_attr.grh.dgid.raw, peer.gid.raw, sizeof peer.gid.raw);
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
  max_rd_atomic_ = static_cast<uint8_t>(std::clamp<int>(
      std::min<int>({std::max<int>(peer.max_dest_rd_atomic, 1), dev.attr().max_qp_init_rd_atom,
                     kMaxReadsInFlight}),
      1, kMaxReadsInFlight));
  at.max_rd_atomic = max_rd_atomic_;
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

}  // namespace slotrpc::transport::verbs
