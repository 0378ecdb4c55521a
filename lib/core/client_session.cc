// ClientSession: set-up, completion dispatch, control messages, replies
// released by the application, shutdown and counters.  The session's other
// parts: client_calls.cc (a call from submit to its completion),
// client_streams.cc (streams) and client_bulk.cc (bulk attachments).
#include "core/client_session.h"

#include <fmt/format.h>

#include <cassert>
#include <string_view>
#include <utility>

#include "core/bulk/registration_cache.h"
#include "core/handshake.h"
#include "base/logging.h"

namespace slotrpc::detail {
void release_reply(const std::shared_ptr<ReplyOwner>& owner, uint16_t slot, uint32_t generation) {
  owner->release(slot, generation);
}
}  // namespace slotrpc::detail

namespace slotrpc::core {

namespace {

// Each thread's free PendingCalls.  Most calls end on the loop thread, and
// most calls a busy client makes are issued there too (the next call from
// a completion, a server's handler calling onwards): those reuse a block
// this list keeps hot instead of a malloc and a free.  Bounded, because a
// thread that only frees calls made on others (a loop whose calls come
// from application threads) would otherwise keep every one: past the
// bound blocks go back to the allocator.  Under AddressSanitizer every
// call gets its own allocation, so use-after-free stays detectable.
#if defined(__SANITIZE_ADDRESS__)
constexpr uint32_t kFreeCallsKept = 0;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr uint32_t kFreeCallsKept = 0;
#else
constexpr uint32_t kFreeCallsKept = 64;
#endif
#else
constexpr uint32_t kFreeCallsKept = 64;
#endif

struct FreeCalls {
  void* head = nullptr;  // each free block starts with the next one's address
  uint32_t count = 0;
  ~FreeCalls() {
    while (head != nullptr) {
      void* next = *static_cast<void**>(head);
      ::operator delete(head);  // unsized: clang builds (the fuzz targets) lack -fsized-deallocation
      head = next;
    }
    count = UINT32_MAX;  // calls freed later on this thread (its exit) go to the allocator
  }
};
thread_local FreeCalls t_free_calls;

}  // namespace

void* PendingCall::operator new(size_t size) {
  FreeCalls& f = t_free_calls;
  if (f.head != nullptr && size == sizeof(PendingCall)) {
    void* p = f.head;
    f.head = *static_cast<void**>(p);
    --f.count;
    return p;
  }
  return ::operator new(size);
}

void PendingCall::operator delete(void* p, size_t size) noexcept {
  FreeCalls& f = t_free_calls;
  if (f.count < kFreeCallsKept && size == sizeof(PendingCall)) {
    *static_cast<void**>(p) = f.head;
    f.head = p;
    ++f.count;
    return;
  }
  ::operator delete(p);
}

ClientSession::ClientSession(core::Loop& loop, std::unique_ptr<transport::Link> link,
                             Geometry g, std::string peer)
    : loop_(loop),
      link_(std::move(link)),
      geometry_(g),
      peer_(std::move(peer)),
      // In the link's shared memory when it has some (shm): requests and
      // replies are built where the peer reads them (core/slot_ring.h).
      // link_ is declared, so initialised, before send_ring_.
      send_ring_(g.slot_count, g.slot_size, link_ ? link_->send_slots() : std::span<std::byte>{}),
      recv_ring_(g.slot_count, g.slot_size),
      slots_(g.slot_count),
      outbox_(g.slot_count),
      released_(g.slot_count + 1),
      liveness_(last_heard, Clock::now()) {
  release_bell_.run = &ClientSession::on_release_bell;
  release_bell_.owner = this;
  SessionDispatch<ClientSession>::bind(this);
  builders_.reserve(g.slot_count);
  free_.reserve(g.slot_count);
  for (uint32_t i = 0; i < g.slot_count; ++i) {
    builders_.push_back(std::make_unique<SlotBuilder>(send_ring_.slot(i), g.slot_size));
    builder_ptrs_.push_back(builders_.back().get());
  }
  // Lowest slot on top of the stack.
  for (uint32_t i = g.slot_count; i-- > 0;) free_.push_back(static_cast<uint16_t>(i));
}

Result<std::shared_ptr<ClientSession>> ClientSession::create(core::Loop& loop,
                                                             std::unique_ptr<transport::Link> link,
                                                             Geometry g, std::string peer) {
  std::shared_ptr<ClientSession> s(new ClientSession(loop, std::move(link), g, std::move(peer)));
  Status st = s->send_ring_.register_with(*s->link_, transport::Access::kLocalSend);
  if (st.ok()) st = s->recv_ring_.register_with(*s->link_, transport::Access::kRemoteWrite);
  if (st.ok())
    st = s->link_->attach(s->recv_ring_.region(), s->send_ring_.region(), g.slot_count,
                          g.slot_size, static_cast<SessionBase*>(s.get()));
  if (!st.ok()) {
    // Not started: no timers, nothing queued.  The rings go before the link.
    s->closed_ = true;
    s->send_ring_.deregister();
    s->recv_ring_.deregister();
    s->link_.reset();
    return st;
  }
  // The registration cache deregisters bulk memory through a live link of
  // its domain (lib/core/bulk/registration_cache.h).
  bulk::RegistrationCache::instance().link_up(*s->link_);
  s->arm_keepalive();
  return s;
}

// The owner shuts the session down on its loop first; what is left here is
// memory only (rings held alive by replies the application still keeps).
ClientSession::~ClientSession() { assert(closed_); }

void ClientSession::on_link_down(const transport::Completion& c) {
  shutdown(Status(StatusCode::kUnavailable,
                  fmt::format("connection to {} lost: {}", peer_,
                              c.link != nullptr ? c.link->down_reason() : "")));
}


void ClientSession::send_control(Kind kind, uint16_t slot, uint32_t generation,
                                 uint64_t request_id, uint32_t aux, uint16_t status) {
  if (closed_) return;
  if (!outbox_.has_control_room()) flush();
  outbox_.add_control(control_header(kind, slot, generation, request_id, aux, status));
  loop_.request_flush(this);
}

void ClientSession::flush() {
  if (closed_) return outbox_.clear();
  messages_sent_ += outbox_.post_to(*link_);
}

void ClientSession::configure_packing(uint32_t pack_small, bool server_accepts) {
  if (pack_small == 0) return;
  pack_ = std::make_unique<PackReceiver>(geometry_.slot_count);
  if (server_accepts) outbox_.enable_packing(send_ring_.slot(0), geometry_.slot_size, pack_small);
}

void ClientSession::on_control(const transport::Completion& c) {
  loop_.heard(this);
  const Header h = decode_header(c.control.data());
  HeaderError e = validate_header(h, kHeaderSize, geometry_.slot_count, geometry_.slot_size, h.slot);
  if (e != HeaderError::kOk) {
    return protocol_error(fmt::format("malformed control header: {}", to_string(e)));
  }
  switch (h.kind()) {
    case Kind::kPing:
      // Coalesced: one PONG per flush answers every PING since the last.
      if (closed_) return;
      outbox_.owe_pong(h.request_id);
      return loop_.request_flush(this);
    case Kind::kPong:
      return;
    case Kind::kStreamAck:
      return on_stream_ack(h);
    default:
      return protocol_error(fmt::format("unexpected control kind 0x{:02x}", h.flags));
  }
}

void ClientSession::release(uint16_t slot, uint32_t generation) {
  // After shutdown the loop may be gone; nothing is waiting for credits.
  if (closed_.load(std::memory_order_acquire)) return;
  if (!loop_.on_this_thread()) {
    // A reply dropped on another thread (a stream reader's every message):
    // the slot state belongs to the loop.  Hot path for server streams and
    // bidi reads: a bounded lock-free queue and the session's doorbell, no
    // allocation, lock or task.  The queue cannot fill: a slot is held by
    // at most one reply, and released once per generation.
    const bool pushed = released_.bounded_push(uint64_t{slot} << 32 | generation);
    assert(pushed && "release queue overflowed");
    (void)pushed;
    if (release_rung_.exchange(true, std::memory_order_acq_rel)) return;  // already queued
    if (auto loop = loop_handle_.lock()) {
      release_ref_ = shared_from_this();  // until on_release_bell runs
      loop->ring(&release_bell_);
    } else {
      release_rung_.store(false, std::memory_order_release);
    }
    return;
  }
  if (slot >= slots_.size()) return;
  Slot& s = slots_[slot];
  if (s.state != SlotState::kHeld || s.generation != generation) return;
  if (stream_active(s)) {
    // A stream message was consumed: lend the slot to the stream again.
    return lend(slot, static_cast<uint16_t>(s.stream_owner), s.request_id);
  }
  s.stream_owner = -1;
  free_slot(slot);
}

// Loop thread: the replies dropped on other threads since the last ring.
void ClientSession::on_release_bell(core::Loop::Doorbell* d) {
  ClientSession* self = static_cast<ReleaseBell*>(d)->owner;
  std::shared_ptr<ClientSession> keep = std::move(self->release_ref_);
  self->release_rung_.exchange(false, std::memory_order_acq_rel);
  uint64_t entry = 0;
  while (self->released_.pop(entry)) {
    if (self->closed_ || !self->loop_.on_this_thread()) continue;  // ~Reactor drains too
    self->release(static_cast<uint16_t>(entry >> 32), static_cast<uint32_t>(entry));
  }
}

void ClientSession::protocol_error(std::string reason) {
  base::log().error("slotrpc: closing session with {}: {}", peer_, reason);
  shutdown(Status(StatusCode::kUnavailable,
                  fmt::format("session with {} closed: protocol error: {}", peer_, reason)));
}

void ClientSession::shutdown(Status status) {
  if (closed_) return;
  // The callbacks below run application code.  None of it can drop the
  // channel's reference today (a reconnect swaps sessions from a posted
  // task), but the loop below must not depend on that: hold the session.
  std::shared_ptr<ClientSession> keep = shared_from_this();
  close_status_ = status;
  closed_.store(true, std::memory_order_release);
  loop_.timers().cancel(keepalive_timer_);
  keepalive_timer_ = 0;
  outbox_.clear();
  loop_.forget(this);
  link_->close(status.message());
  // Closed: no bulk range is reachable any more (verbs: the queue pair is
  // in the error state and its windows are gone), so bulk calls waiting
  // for their revokes complete below, and the domain's registrations may go.
  std::vector<PendingCall*> revoked;
  revoked.swap(revoking_);
  bulk::RegistrationCache::instance().link_down(*link_);
  // One pass: take every outstanding call out of the session first, then
  // complete them.  Callbacks that issue new calls find the session closed
  // and get posted failures (submit), so nothing here re-enters the loop
  // below and the stack stays flat however many calls were out.  Cold path:
  // the list allocates.
  std::vector<PendingCall*> dying;
  dying.reserve(slots_.size() + queued_);
  for (Slot& s : slots_) {
    if (s.state == SlotState::kInFlight && s.call != nullptr) {
      dying.push_back(s.call);
      s.call = nullptr;
      s.state = SlotState::kZombie;  // never reused: the session is gone
    }
  }
  while (queue_head_ != nullptr) {
    PendingCall* call = queue_head_;
    dequeue(call);
    dying.push_back(call);
  }
  for (PendingCall* call : dying) {
    loop_.timers().cancel(call->timer);
    call->timer = 0;
  }
  // Unregister the rings through the link that registered them, then drop
  // the link (that purges queued completions pointing at this session);
  // held replies keep the memory itself mapped.
  send_ring_.deregister();
  recv_ring_.deregister();
  owner_counters().retire_link(*link_);
  link_.reset();
  for (PendingCall* call : dying) complete(call, status);
  for (PendingCall* call : revoked) {
    call->extras->exposure->release();
    RawReply held = std::move(call->extras->held);  // finish() deletes the call
    finish(call, std::move(held));
  }
}

// The liveness timer fires when something is due (core/liveness.h): the
// next PING or the server's death, counted from when it was last heard.
ClientSession::Counters ClientSession::counters() const {
  Counters c;
  c.free_slots = static_cast<uint32_t>(free_.size());
  for (const Slot& s : slots_) {
    if (s.state == SlotState::kInFlight) ++c.in_flight;
    if (s.state == SlotState::kZombie) ++c.zombies;
    if (s.state == SlotState::kHeld) ++c.held;
    if (s.state == SlotState::kLent || s.state == SlotState::kOutIdle ||
        s.state == SlotState::kOutInFlight)
      ++c.lent;
  }
  c.queued = queued_;
  c.late_replies_dropped = late_replies_dropped_;
  c.messages_sent = messages_sent_;
  c.packs_sent = outbox_.packs_sent();
  c.packed_messages = outbox_.packed_messages();
  c.packs_received = pack_ ? pack_->received() : 0;
  if (link_) c.link = link_->stats();
  return c;
}

}  // namespace slotrpc::core
