#include "transport/shm/shm_transport.h"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cassert>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include "base/logging.h"

namespace slotrpc::transport::shm {
namespace {

// After copying bytes out of memory a hostile peer writes: the compiler must
// not serve a later read of the private copy by re-reading shared memory (a
// copy it may otherwise elide).  A compiler barrier, no instruction.
inline void copied_out() { asm volatile("" ::: "memory"); }

}  // namespace

// ---------------------------------------------------------------- ShmLink

ShmLink::ShmLink(ShmTransport& owner, Fd sock, OwnSegment own, PeerSegment peer,
                 std::string description)
    : owner_(owner),
      sock_(std::move(sock)),
      own_(std::move(own)),
      peer_(std::move(peer)),
      description_(std::move(description)),
      slot_count_(own_.layout.geometry.slot_count),
      slot_size_(own_.layout.geometry.slot_size),
      desc_mask_(own_.layout.desc_count - 1) {
  backlog_limit_ = own_.layout.desc_count;
  backlog_.reserve(backlog_limit_);
}

ShmLink::~ShmLink() {
  if (in_epoll_) {
    ::epoll_ctl(owner_.epoll_fd_.get(), EPOLL_CTL_DEL, sock_.get(), nullptr);
    in_epoll_ = false;
  }
  owner_.forget(this);
}

Result<MemoryRegion> ShmLink::register_memory(std::span<std::byte> memory, Access access) {
  // A send ring that maps our data area a second time (core::SlotRing over
  // send_slots()) is recorded, so post() sends from it in place.  The probe
  // proves it is the same pages, not just a claim: a byte stored through
  // the ring must show in our own mapping.  The ring is fresh (nothing was
  // built or sent yet), and the byte is put back.
  if (access == Access::kLocalSend && memory.size() == size_t{slot_count_} * slot_size_ &&
      !memory.empty()) {
    std::byte* const area = own_.map.base() + own_.layout.data_offset;
    volatile std::byte* const mine = area;
    volatile std::byte* const theirs = memory.data();
    const std::byte old = *theirs;
    *theirs = ~old;
    const bool same = *mine == ~old;
    *theirs = old;
    if (same) send_alias_ = memory.data();
  }
  MemoryRegion r;
  r.base = memory.data();
  r.length = memory.size();
  return r;
}

void ShmLink::deregister(MemoryRegion& region) {
  if (region.base == send_alias_) send_alias_ = nullptr;
  region = MemoryRegion{};
}

Status ShmLink::attach(const MemoryRegion& receive_ring, const MemoryRegion& /*send_ring*/,
                       uint32_t slot_count, uint32_t slot_size, void* context) {
  if (attached_) return Status(StatusCode::kInvalidArgument, "shm link already attached");
  // The segments were laid out for the geometry of the handshake; a session
  // with another one would read and write outside them.
  if (slot_count != slot_count_ || slot_size != slot_size_)
    return Status(StatusCode::kInvalidArgument,
                  "shm link carries " + std::to_string(slot_count_) + " slots of " +
                      std::to_string(slot_size_) + ", session wants " + std::to_string(slot_count) +
                      " of " + std::to_string(slot_size));
  const uint64_t need = uint64_t{slot_count} * slot_size;
  if (receive_ring.base == nullptr || need > receive_ring.length)
    return Status(StatusCode::kInvalidArgument,
                  "receive ring of " + std::to_string(receive_ring.length) + " bytes cannot hold " +
                      std::to_string(slot_count) + " slots of " + std::to_string(slot_size));
  ring_ = receive_ring;
  context_ = context;
  size_arming(slot_count);
  attached_ = true;
  return Status::ok_status();
}

std::span<std::byte> ShmLink::send_slots() {
  return {own_.map.base() + own_.layout.data_offset, size_t{slot_count_} * slot_size_};
}

void ShmLink::post(std::span<const Outgoing> batch) {
  if (down_) return;
  for (const Outgoing& o : batch) {
    // A bad Outgoing is a bug in the caller; refusing it keeps a descriptor
    // off the ring that would make the peer close the link.
    if (o.length == 0 || o.data == nullptr) {
      fail("post: invalid message of " + std::to_string(o.length) + " bytes");
      return;
    }
    if (o.delivery == Delivery::kControl) {
      if (o.length != transport::kHeaderSize) {
        fail("post: control message of " + std::to_string(o.length) + " bytes, expected " +
             std::to_string(transport::kHeaderSize));
        return;
      }
    } else if (transport::imm_slot(o.imm) >= slot_count_ || o.length > slot_size_) {
      fail("post: message of " + std::to_string(o.length) + " bytes for slot " +
           std::to_string(transport::imm_slot(o.imm)) + " does not fit the ring");
      return;
    }
    // Order is kept: once anything waits, everything after it waits too.
    if (backlog_.empty() && write_descriptor(o, o.data)) {
      ++(o.delivery == Delivery::kControl ? stats_.control_sends : stats_.slot_sends);
      stats_.messages += o.messages;
      continue;
    }
    if (down_) return;
    if (backlog_.size() >= backlog_limit_) {
      fail("send backlog over budget: " + std::to_string(backlog_.size()) +
           " messages wait behind a full ring of " + std::to_string(desc_mask_ + 1) +
           " descriptors (budget " + std::to_string(backlog_limit_) +
           "; the peer is not consuming)");
      return;
    }
    if (backlog_.empty()) last_drain_ = std::chrono::steady_clock::now();
    Pending& p = backlog_.emplace_back();
    p.o = o;
    if (o.delivery == Delivery::kControl) std::memcpy(p.control.data(), o.data, transport::kHeaderSize);
    ++shm_stats_.backlogged;
  }
  publish();
}

bool ShmLink::write_descriptor(const Outgoing& o, const std::byte* source) {
  const uint64_t desc_count = desc_mask_ + uint64_t{1};
  if (published_ - peer_tail_ >= desc_count) {
    // Full as far as we knew: read how far the peer got.
    if (!refresh_peer_count(peer_ctl()->tail, &peer_tail_, published_, "")) return false;
    if (published_ - peer_tail_ >= desc_count) return false;
  }
  Descriptor d{};
  d.length = o.length;
  d.imm = o.imm;
  if (o.delivery == Delivery::kControl) {
    d.lane = static_cast<uint32_t>(DescLane::kControl);
    std::memcpy(d.payload, source, transport::kHeaderSize);
  } else if (o.length <= kInlineMax) {
    // Small: in the descriptor's own cache line, the slot is not touched.
    d.lane = static_cast<uint32_t>(DescLane::kInline);
    std::memcpy(d.payload, source, o.length);
    ++shm_stats_.inline_sends;
    ++stats_.inline_sends;
  } else {
    d.lane = static_cast<uint32_t>(DescLane::kSlot);
    const uint16_t slot = transport::imm_slot(o.imm);
    std::byte* const area = own_.map.base() + own_.layout.data_offset;
    std::byte* const base = area + size_t{slot} * slot_size_;
    const size_t ring_bytes = size_t{slot_count_} * slot_size_;
    // Built in the session's send ring mapped over our data area: the
    // same byte under our own mapping's address.
    if (send_alias_ != nullptr && source >= send_alias_ && source < send_alias_ + ring_bytes)
      source = area + (source - send_alias_);
    if (source >= base && source < base + slot_size_) {
      // Built in place: the peer reads it where it is.
      if (size_t(source - base) + o.length > slot_size_) {
        fail("post: message in slot " + std::to_string(slot) + " runs past its end");
        return false;
      }
      d.offset = static_cast<uint32_t>(source - base);
      ++shm_stats_.in_place_sends;
      ++stats_.noninline_sends;  // LinkStats' meaning on shm: read by the peer in place
    } else if (source >= area && source < area + ring_bytes) {
      fail("post: message built in another slot than " + std::to_string(slot));
      return false;
    } else {
      // The session's own memory: one copy into our slot.  The credit
      // protocol guarantees the peer has taken the slot's previous message.
      std::memcpy(base, source, o.length);
      d.offset = 0;
      ++shm_stats_.copied_sends;
    }
  }
  auto* const slot_desc = reinterpret_cast<Descriptor*>(own_.map.base() + own_.layout.desc_offset) +
                          (published_ & desc_mask_);
  store_descriptor(slot_desc, d, ++published_);
  return true;
}

void ShmLink::store_descriptor(Descriptor* slot, const Descriptor& d, uint64_t seq) {
  // Everything but `seq` first, then `seq` with release: a receiver that
  // sees the new sequence sees the whole descriptor.
  std::memcpy(reinterpret_cast<std::byte*>(slot) + sizeof d.seq,
              reinterpret_cast<const std::byte*>(&d) + sizeof d.seq, sizeof d - sizeof d.seq);
  store_own(slot->seq, seq, std::memory_order_release);
}

bool ShmLink::refresh_peer_count(const uint64_t& word, uint64_t* last, uint64_t published,
                                 const char* ring) {
  // The peer's word is checked against what we published: it can only
  // have moved forward, and not past our head.
  const uint64_t t = load_peer(word, std::memory_order_acquire);
  if (t - *last > published - *last) {
    fail("peer's consumed count " + (*ring != '\0' ? "of our " + std::string(ring) + "ring " : "") +
         std::to_string(t) + " is outside " + std::to_string(*last) + ".." +
         std::to_string(published) + " (corrupt or hostile peer)");
    return false;
  }
  *last = t;
  return true;
}

void ShmLink::flush_backlog() {
  size_t i = 0;
  for (; i < backlog_.size(); ++i) {
    Pending& p = backlog_[i];
    const std::byte* src = p.o.delivery == Delivery::kControl ? p.control.data() : p.o.data;
    if (!write_descriptor(p.o, src)) break;
    ++(p.o.delivery == Delivery::kControl ? stats_.control_sends : stats_.slot_sends);
    stats_.messages += p.o.messages;
  }
  if (down_) return;
  check_drain(i != 0);
  if (down_ || i == 0) return;
  backlog_.erase(backlog_.begin(), backlog_.begin() + static_cast<ptrdiff_t>(i));
  publish();
}

void ShmLink::check_drain(bool progressed) {
  const auto now = std::chrono::steady_clock::now();
  if (progressed) {
    // Any progress restarts the clock: a slow peer is never closed.
    last_drain_ = now;
    return;
  }
  const auto idle = now - last_drain_;
  if (idle < std::chrono::milliseconds(owner_.peer_timeout_ms_)) return;
  std::string reason =
      "peer has consumed nothing for " +
      std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(idle).count()) +
      " ms with " + std::to_string(backlog_.size()) + " messages waiting (peer_timeout_ms = " +
      std::to_string(owner_.peer_timeout_ms_) + ")";
  base::log().warn("slotrpc: closing {}: {}", description_, reason);
  fail(std::move(reason));
}

void ShmLink::publish() {
  if (down_) return;
  // Dekker with announce_sleep() on the other side: we store head then load
  // its sleeping word; it stores sleeping then loads our head.  With both
  // sequentially consistent, at least one sees the other's store, so either
  // it stays awake or we wake it: no lost wake-up.
  store_own(own_ctl()->head, published_, std::memory_order_seq_cst);
  wake_peer_if_sleeping();
}

void ShmLink::wake_peer_if_sleeping() {
  // One wake-up per announced sleep: each announcement carries a new
  // number, and a byte already sent for this one stays readable until the
  // peer is awake (it drains only before announcing again).  So a burst of
  // batches towards a sleeping peer costs one send, not one each.
  const uint32_t sleep = load_peer(peer_ctl()->sleeping, std::memory_order_seq_cst);
  if (sleep == 0 || sleep == woken_sleep_ || sock_.get() < 0) return;
  woken_sleep_ = sleep;
  // On our own end of the connection, which no other process holds, and
  // MSG_DONTWAIT whatever its flags: a peer can refuse the byte (a full
  // socket), never make this wait.  Not an eventfd the peer also holds:
  // it could clear O_NONBLOCK on the shared description and fill the
  // counter, and the write would block this loop for good (docs/design.md,
  // "Trust and security").
  const char wake = 1;
  ++shm_stats_.wakeups_sent;
  const ssize_t n = ::send(sock_.get(), &wake, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
  // EAGAIN: the peer has not read earlier wake-ups, so its socket is
  // readable and it wakes anyway.  EPIPE and the like: the hang-up ends
  // the link through on_socket_event.
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) ++shm_stats_.wakeups_already_pending;
}

bool ShmLink::peer_has_more() {
  const auto* const base = peer_.map.base();
  return peer_ring_has_more(peer_ctl()->bulk_head,
                            reinterpret_cast<const Descriptor*>(base + peer_.layout.bulk_desc_offset),
                            kBulkDescCount, bulk_consumed_, "bulk ") ||
         peer_ring_has_more(peer_ctl()->head,
                            reinterpret_cast<const Descriptor*>(base + peer_.layout.desc_offset),
                            desc_mask_ + uint64_t{1}, consumed_, "");
}

bool ShmLink::peer_ring_has_more(const uint64_t& head_word, const Descriptor* descs, uint64_t count,
                                 uint64_t consumed, const char* ring) {
  // The Dekker pair is on the head word (seq_cst on both sides); the
  // descriptors' own words are release/acquire, ordered before the head
  // store.  So an honest peer whose head we see has its next descriptor
  // visible too.
  const uint64_t head = load_peer(head_word, std::memory_order_seq_cst);
  // Behind what we consumed is legitimate: the poller took descriptors by
  // their own words before the sender stored the head for that batch (and
  // then the sender sees our `sleeping` and wakes us).  At most a ring
  // behind, though.
  if (consumed - head <= count) return false;
  const uint64_t seq = load_peer(descs[consumed & (count - 1)].seq, std::memory_order_acquire);
  // A head that claims more than the ring shows would keep us awake for
  // nothing, forever.
  if (head - consumed > count || seq != consumed + 1)
    fail("peer's " + std::string(ring) + "sequence word " + std::to_string(head) +
         " disagrees with its " + ring + "ring at " + std::to_string(consumed) +
         " (claims descriptors that are not there; corrupt or hostile peer)");
  return true;  // a message, or the link-down just queued, for the next poll
}

ShmLink::Take ShmLink::take_descriptor(const Descriptor* descs, uint64_t count, uint64_t index,
                                       Descriptor* d, const char* ring) {
  // The descriptor's own sequence word says whether it is there: one cache
  // line per message (the head word is only read before sleeping).
  const uint64_t expect = index + 1;
  const Descriptor& shared = descs[index & (count - 1)];
  const uint64_t seq = load_peer(shared.seq, std::memory_order_acquire);
  if (seq != expect) {
    // Not written yet: it still holds its previous lap (0 on the first).
    const uint64_t stale = expect > count ? expect - count : 0;
    if (seq == stale) return Take::kEmpty;
    fail(std::string(ring) + "descriptor " + std::to_string(index) + " has sequence word " +
         std::to_string(seq) + ", expected " + std::to_string(expect) + " or " +
         std::to_string(stale) + " (corrupt or hostile peer)");
    return Take::kFailed;
  }
  // Copy first, then look: the peer may rewrite the descriptor at any
  // moment, so every check and every use is on this private copy.
  std::memcpy(d, &shared, sizeof *d);
  copied_out();
  if (d->seq != expect) {
    fail(std::string(ring) + "descriptor " + std::to_string(index) +
         " rewritten while read (sequence word " + std::to_string(d->seq) + ", expected " +
         std::to_string(expect) + "; corrupt or hostile peer)");
    return Take::kFailed;
  }
  return Take::kGot;
}

size_t ShmLink::receive(std::span<Completion> out) {
  if (down_ || !attached_ || out.empty()) return 0;
  const auto* const descs = reinterpret_cast<const Descriptor*>(peer_.map.base() +
                                                                peer_.layout.desc_offset);
  const std::byte* const data = peer_.map.base() + peer_.layout.data_offset;
  const uint64_t desc_count = desc_mask_ + uint64_t{1};
  size_t k = 0;
  for (; k < out.size() && !down_; ++k) {
    Descriptor d;
    if (take_descriptor(descs, desc_count, consumed_ + k, &d, "") != Take::kGot) break;
    Completion& c = out[k];
    c.context = context_;
    c.link = this;
    c.imm = d.imm;
    if (d.lane == static_cast<uint32_t>(DescLane::kControl)) {
      if (d.length != transport::kHeaderSize) {
        fail("control descriptor of " + std::to_string(d.length) + " bytes, expected " +
             std::to_string(transport::kHeaderSize));
        break;
      }
      c.kind = Completion::Kind::kControl;
      c.slot = 0;
      c.length = d.length;
      std::memcpy(c.control.data(), d.payload, transport::kHeaderSize);
    } else if (d.lane == static_cast<uint32_t>(DescLane::kSlot) ||
               d.lane == static_cast<uint32_t>(DescLane::kInline)) {
      const bool in_line = d.lane == static_cast<uint32_t>(DescLane::kInline);
      const uint16_t slot = transport::imm_slot(d.imm);
      // Every index and length against our own record, before a byte moves.
      if (slot >= slot_count_) {
        fail("slot " + std::to_string(slot) + " outside ring of " + std::to_string(slot_count_));
        break;
      }
      if (in_line) {
        if (d.length == 0 || d.length > kInlineMax || d.length > slot_size_) {
          fail("inline message of " + std::to_string(d.length) + " bytes, allowed 1.." +
               std::to_string(std::min<uint32_t>(kInlineMax, slot_size_)));
          break;
        }
      } else if (d.length == 0 || d.length > slot_size_ || d.offset > slot_size_ - d.length) {
        fail("message of " + std::to_string(d.length) + " bytes at offset " +
             std::to_string(d.offset) + " does not fit a slot of " + std::to_string(slot_size_));
        break;
      }
      if (!take_armed(slot)) {
        fail("peer sent into slot " + std::to_string(slot) + " which was not armed");
        break;
      }
      // Into the session's private slot: the core validates the header and
      // verifies the payload there, and handlers read it there, where the
      // peer cannot change it afterwards (docs/design.md, "Trust").
      std::memcpy(ring_.base + size_t{slot} * slot_size_,
                  in_line ? d.payload : data + size_t{slot} * slot_size_ + d.offset, d.length);
      c.kind = Completion::Kind::kMessage;
      c.slot = slot;
      c.length = d.length;
    } else {
      // Bulk descriptors travel in the bulk ring (receive_bulk), never here.
      fail("descriptor with unknown lane " + std::to_string(d.lane) + " in the slot ring");
      break;
    }
  }
  if (k == 0) return 0;
  consumed_ += k;
  // One store per batch tells the peer the descriptors may be reused.
  store_own(own_ctl()->tail, consumed_, std::memory_order_release);
  return k;
}

void ShmLink::check_peer_gone() {
  // Everything the peer published before it died has been delivered: both
  // rings are empty (the caller just found nothing in either).
  if (peer_gone_ && !down_) fail("peer closed the shm socket (process exited or session closed)");
}

bool ShmLink::announce_sleep() {
  if (down_ || !attached_) return true;
  // Work for the next poll: a backlog, or bulk data to send (a peer slow
  // to consume it is bounded by the drain rule, pump_bulk()).
  if (peer_gone_ || !backlog_.empty() || has_bulk_work()) return false;
  // Bulk bytes moved lately: more are likely a poll of the peer away
  // (kBulkSpin).  The clock is read here, on the way to sleep, never per
  // message.
  if (bulk_active_ || bulk_spin_until_ != std::chrono::steady_clock::time_point{}) {
    const auto now = std::chrono::steady_clock::now();
    if (bulk_active_) {
      bulk_active_ = false;
      bulk_spin_until_ = now + kBulkSpin;
      return false;
    }
    if (now < bulk_spin_until_) return false;
    bulk_spin_until_ = {};
  }
  // A new number for each announcement (never 0): the peer sends one
  // wake-up per number (wake_peer_if_sleeping).
  if (++sleep_number_ == 0) sleep_number_ = 1;
  store_own(own_ctl()->sleeping, sleep_number_, std::memory_order_seq_cst);
  sleep_announced_ = true;
  return !peer_has_more();
}

void ShmLink::withdraw_sleep() {
  if (!sleep_announced_) return;
  sleep_announced_ = false;
  store_own(own_ctl()->sleeping, uint32_t{0}, std::memory_order_relaxed);
}

void ShmLink::on_socket_event(uint32_t events) {
  if (down_) return;
  if ((events & EPOLLIN) != 0) {
    // Wake-up bytes: their value means nothing (the rings say what
    // arrived).  At most one buffer per event, so a peer that floods the
    // socket costs one recv per turn; the rest stays readable.
    std::array<char, 4096> sink;
    const ssize_t n = ::recv(sock_.get(), sink.data(), sink.size(), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
      peer_gone_ = true;
  }
  if ((events & (EPOLLHUP | EPOLLRDHUP | EPOLLERR)) != 0) peer_gone_ = true;
  if (!peer_gone_) return;
  // Level-triggered hang-up would wake every epoll_wait until the link is
  // failed; the flag carries it from here.
  ::epoll_ctl(owner_.epoll_fd_.get(), EPOLL_CTL_DEL, sock_.get(), nullptr);
  if (!attached_) fail("peer closed the shm socket (process exited or session closed)");
}

void ShmLink::close(std::string reason) { fail(std::move(reason)); }

void ShmLink::fail(std::string reason) {
  if (down_) return;
  down_ = true;
  down_reason_ = std::move(reason);
  base::log().debug("shm link {} down: {}", description_, down_reason_);
  withdraw_sleep();
  if (in_epoll_) {
    ::epoll_ctl(owner_.epoll_fd_.get(), EPOLL_CTL_DEL, sock_.get(), nullptr);
    in_epoll_ = false;
  }
  // Closing our end is how the peer learns at once that this link is gone.
  sock_.reset();
  backlog_.clear();
  fail_bulk();
  // The segments stay mapped until destruction: a session may still hold
  // pointers into send_slots().
  Completion c;
  c.kind = Completion::Kind::kLinkDown;
  c.context = context_;
  c.link = this;
  owner_.push(c);
}

// ----------------------------------------------------------- ShmTransport

ShmTransport::ShmTransport(const Config& config)
    : epoll_fd_(::epoll_create1(EPOLL_CLOEXEC)), peer_timeout_ms_(config.peer_timeout_ms) {
  ready_.reserve(64);
}

ShmTransport::~ShmTransport() {
  assert(links_.empty() && "destroy every ShmLink before its ShmTransport");
}

Result<ShmTransport::Offered> ShmTransport::offer(int sock, Geometry g) {
  Fd owned(sock);  // ownership is taken even on failure
  if (sock < 0) return Status(StatusCode::kInvalidArgument, "shm: invalid socket");
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (::getsockname(sock, reinterpret_cast<sockaddr*>(&addr), &len) != 0 || addr.ss_family != AF_UNIX)
    return Status(StatusCode::kInvalidArgument, "shm: not a Unix domain socket");
  auto own = create_own_segment(g);
  if (!own.ok()) return own.status();
  Status st = send_offer(sock, own.value());
  if (!st.ok()) return st;
  Offered o;
  o.sock = std::move(owned);
  o.geometry = g;
  o.own = std::move(own).value();
  return o;
}

Result<std::unique_ptr<ShmLink>> ShmTransport::complete(Offered offered,
                                                        std::chrono::milliseconds timeout,
                                                        std::string description) {
  if (epoll_fd_.get() < 0) return Status(StatusCode::kInternal, errno_text("epoll_create1", errno));
  auto peer = receive_offer(offered.sock.get(), offered.geometry, timeout);
  if (!peer.ok()) return peer.status();
  return make_link(std::move(offered.sock), std::move(offered.own), std::move(peer).value(),
                   std::move(description));
}

Result<std::unique_ptr<ShmLink>> ShmTransport::accept(int sock, Geometry g,
                                                      std::chrono::milliseconds timeout,
                                                      std::string description) {
  Fd owned(sock);  // ownership is taken even on failure
  if (epoll_fd_.get() < 0) return Status(StatusCode::kInternal, errno_text("epoll_create1", errno));
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (sock < 0 || ::getsockname(sock, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      addr.ss_family != AF_UNIX)
    return Status(StatusCode::kInvalidArgument, "shm: not a Unix domain socket");
  auto peer = receive_offer(sock, g, timeout);
  if (!peer.ok()) return peer.status();
  auto own = create_own_segment(g);
  if (!own.ok()) return own.status();
  return make_link(std::move(owned), std::move(own).value(), std::move(peer).value(),
                   std::move(description));
}

Status ShmLink::send_own_offer() { return send_offer(sock_.get(), own_); }

Result<std::unique_ptr<ShmLink>> ShmTransport::make_link(Fd sock_fd, OwnSegment own, PeerSegment peer,
                                                         std::string description) {
  const int sock = sock_fd.get();
  std::unique_ptr<ShmLink> link(new ShmLink(*this, std::move(sock_fd), std::move(own),
                                            std::move(peer), std::move(description)));
  // The socket: the peer's wake-up bytes and its hang-up.
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.u64 = reinterpret_cast<uintptr_t>(link.get());
  if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, sock, &ev) != 0)
    return Status(StatusCode::kInternal, errno_text("epoll_ctl", errno));
  link->in_epoll_ = true;
  links_.push_back(link.get());
  return link;
}

Result<std::unique_ptr<ShmLink>> ShmTransport::adopt(int sock, Geometry g,
                                                     std::chrono::milliseconds timeout,
                                                     std::string description) {
  auto o = offer(sock, g);
  if (!o.ok()) return o.status();
  return complete(std::move(o).value(), timeout, std::move(description));
}

void ShmTransport::forget(ShmLink* link) {
  links_.erase(std::remove(links_.begin(), links_.end(), link), links_.end());
  ready_.erase(std::remove_if(ready_.begin(), ready_.end(),
                              [link](const Completion& c) { return c.link == link; }),
               ready_.end());
  if (next_link_ >= links_.size()) next_link_ = 0;
}

void ShmTransport::handle_events() {
  if (epoll_fd_.get() < 0) return;
  const int n = ::epoll_wait(epoll_fd_.get(), events_, kMaxEvents, 0);
  for (int i = 0; i < n; ++i) {
    auto* link = reinterpret_cast<ShmLink*>(static_cast<uintptr_t>(events_[i].data.u64));
    link->on_socket_event(events_[i].events);
  }
}

size_t ShmTransport::poll(std::span<Completion> out) {
  auto drain = [this](std::span<Completion> dst) {
    const size_t n = std::min(dst.size(), ready_.size());
    std::copy_n(ready_.begin(), n, dst.begin());
    ready_.erase(ready_.begin(), ready_.begin() + static_cast<ptrdiff_t>(n));
    return n;
  };
  size_t got = ready_.empty() ? 0 : drain(out);
  if (got == out.size()) return got;
  if (++tick_ >= kEpollEvery) {
    tick_ = 0;
    handle_events();
  }
  const size_t count = links_.size();
  for (size_t i = 0; i < count && got < out.size(); ++i) {
    ShmLink* link = links_[(next_link_ + i) % count];
    link->withdraw_sleep();
    if (!link->backlog_.empty()) link->flush_backlog();
    if (link->has_bulk_work()) link->pump_bulk();
    // Slot messages first; then at most about one chunk of bulk data.
    const size_t before = got;
    got += link->receive(out.subspan(got));
    bool took_bulk = false;
    if (got < out.size()) got += link->receive_bulk(out.subspan(got), &took_bulk);
    if (got == before && !took_bulk && link->peer_gone_) link->check_peer_gone();
  }
  if (count != 0) next_link_ = (next_link_ + 1) % count;
  if (!ready_.empty()) got += drain(out.subspan(got));
  return got;
}

bool ShmTransport::prepare_sleep() {
  // Drains the sockets' wake-up bytes before announcing: a wake-up sent
  // after the announcement stays readable and ends the sleep.
  handle_events();
  if (!ready_.empty()) return false;
  for (ShmLink* link : links_)
    if (!link->announce_sleep()) return false;
  return true;
}

}  // namespace slotrpc::transport::shm
