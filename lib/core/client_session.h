// The client side of one slot-ring session.
//
// Credits: the client owns one credit per slot of the ring.  A call takes a
// free slot, writes its request into that slot of the local send ring, and
// posts it into the same slot of the server's receive ring; the reply comes
// back into the same slot of the client's receive ring.  The slot returns
// to the free list only when that reply has arrived and been released, so
// neither side can ever be written to while it still reads a slot.  Calls
// beyond the credits wait in a FIFO without blocking the reactor.
//
// Generations: every reuse of a slot bumps its generation, carried in the
// header and the immediate.  A call abandoned at its deadline keeps its
// slot as a "zombie" until the late reply arrives; that reply's generation
// and request id identify it, it is dropped, and only then does the slot
// serve the next call.  A late reply can never reach the next user.
//
// Everything here runs on the session's reactor thread.  Hot path (submit,
// reply): no locks, no virtual calls but the batched Link::post, and no
// allocation besides the caller-owned PendingCall.
#pragma once

#include <boost/lockfree/queue.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/bulk/call_exposure.h"
#include "core/liveness.h"
#include "core/out_stream.h"
#include "core/outbox.h"
#include "core/pack.h"
#include "core/session_base.h"
#include "core/slot_builder.h"
#include "core/slot_ring.h"
#include "core/loop.h"
#include "slotrpc/call.h"
#include "slotrpc/stream.h"

namespace slotrpc::detail {
// The part of a client session that outlives its channel while replies are
// held: the receive ring they point into.
class ReplyOwner {
 public:
  virtual ~ReplyOwner() = default;
  virtual void release(uint16_t slot, uint32_t generation) = 0;
};
}  // namespace slotrpc::detail

namespace slotrpc::core {

struct PendingCall {
  // Recycled per thread (client_session.cc): a call's allocation is a pop
  // from the thread's free list when a call ended on that thread before,
  // as the next call issued from a completion finds.
  static void* operator new(size_t size);
  static void operator delete(void* p, size_t size) noexcept;

  uint32_t method_id = 0;
  // CallOptions::method_name (a static string) or null.  Statuses this
  // client makes up for the call name the method by it (named_status).
  const char* method_name = nullptr;
  // Set when the call ends with the status a handler returned, which is
  // the application's own and passed on as it is.
  bool handler_status = false;
  RequestWriter writer;
  ReplySink sink;  // unary: the reply; server stream: each message
  // Server streaming: `on_end` gets the final status; `window` slots are
  // lent to the server for the stream's messages.
  bool stream = false;
  uint32_t window = 0;
  std::function<void(Status)> on_end;
  // Client streaming (with `stream` too: bidi): the client writes messages
  // through `out` (core/out_stream.h) into `window` slots reserved for
  // them; `sink` gets the reply of a client stream.
  bool client_stream = false;
  std::shared_ptr<OutStream> out;
  std::optional<Clock::time_point> deadline;
  uint64_t request_id = 0;
  // What few calls carry, out of line so that a call with neither
  // constructs, tests and frees one null pointer for all of it: call
  // metadata (CallOptions::metadata, encoded after the header when sent)
  // and bulk attachments (unary calls; lib/core/bulk/call_exposure.h): the
  // segments from CallOptions, their exposure once the call is sent, and
  // the call's outcome while its revokes complete (the caller learns it
  // only once the peer can reach none of the memory).
  struct Extras {
    Metadata metadata;
    std::vector<BulkSegment> send_bulk;
    std::vector<BulkSegment> receive_bulk;
    std::unique_ptr<bulk::CallExposure> exposure;
    uint32_t revokes_pending = 0;
    RawReply held;
  };
  std::unique_ptr<Extras> extras;
  // CallOptions' metadata and segments; Extras only when there are some.
  void take_options(Metadata metadata, std::vector<BulkSegment> send, std::vector<BulkSegment> receive) {
    if (metadata.empty() && send.empty() && receive.empty()) return;
    if (!extras) extras = std::make_unique<Extras>();
    extras->metadata = std::move(metadata);
    extras->send_bulk = std::move(send);
    extras->receive_bulk = std::move(receive);
  }
  bool has_bulk() const { return extras && (!extras->send_bulk.empty() || !extras->receive_bulk.empty()); }
  bool has_metadata() const { return extras && !extras->metadata.empty(); }
  bulk::CallExposure* exposure() const { return extras ? extras->exposure.get() : nullptr; }
  // Metrics, set by ClientSession::submit on the loop: the loop's client
  // counters and this method's entry there, and when the call was submitted.
  core::SideCounters* counters = nullptr;
  core::MethodCounters* method_counters = nullptr;
  Clock::time_point submitted{};
  // Session-owned state.
  base::TimerHeap::TimerId timer = 0;
  int32_t slot = -1;  // -1 while queued
  PendingCall* prev = nullptr;
  PendingCall* next = nullptr;
};

class ClientSession final : public SessionBase,
                            public ::slotrpc::detail::ReplyOwner,
                            public std::enable_shared_from_this<ClientSession> {
 public:
  // Loop thread, right after create(): count into `counters` (the owning
  // Server's or Channel's, on this loop) instead of the loop's own, so
  // servers and channels sharing a loop each report only their own calls.
  // Shared: the session may outlive its owner (a RawReply still held).
  void set_counters(std::shared_ptr<core::LoopCounters> counters) { owner_counters_ = std::move(counters); }
  // Loop thread, right after create(): the owner's Config::max_bulk_bytes.
  void set_max_bulk_bytes(uint64_t bytes) { max_bulk_bytes_ = bytes; }
  struct Geometry {
    uint32_t slot_count;
    uint32_t slot_size;
  };

  // Loop thread.  Registers both rings with `link` and attaches it.  The
  // link may still be connecting (verbs: the rings' keys go into the
  // handshake); messages posted before it is up wait in the link.
  static Result<std::shared_ptr<ClientSession>> create(core::Loop& loop,
                                                       std::unique_ptr<transport::Link> link,
                                                       Geometry geometry, std::string peer);
  // Loop thread.  The link finished connecting: silence is counted from now.
  void link_ready() { liveness_.heard(Clock::now()); }
  ~ClientSession() override;

  // Loop thread.  Takes ownership of `call`; its sink (or on_end) runs
  // exactly once, and never before submit returns: a call that fails before
  // it reaches the wire (session closed, deadline passed, queue full, writer
  // failed) completes from a task posted to the loop.
  void submit(PendingCall* call);
  // Loop thread.  Cancels the call with this id, wherever it is.
  void cancel(uint64_t request_id, Status status);
  // Loop thread.  Fails everything with `status` and closes the link: the
  // outstanding calls are collected first, then completed in one pass; calls
  // their callbacks issue fail later (posted) with `status`.
  void shutdown(Status status);

  // Completes `call` with an error from a task posted to `loop`, never on
  // the caller's stack (see submit).  Any thread.
  static void fail_later(core::Loop& loop, PendingCall* call, Status status);
  // Runs `call`'s sink (or a stream's on_end) with `status` and frees it.
  static void complete(PendingCall* call, Status status);
  // Cold path: `status`, which this client made up for a call (a deadline,
  // a cancel, a lost session, the server's UNIMPLEMENTED, a request that
  // does not fit), leading with the method's name ("pkg.Service/Method: ")
  // when the call has one (CallOptions::method_name) and the message does
  // not name it already.
  static Status named_status(const char* method_name, Status status);

  // Any thread: returns a slot whose reply was held by the application.
  void release(uint16_t slot, uint32_t generation) override;

  // Any thread.
  // The owner's handle on the loop, so replies dropped on other threads can
  // reach it without racing the owner's destruction of the loop.
  void set_loop_handle(std::weak_ptr<core::Loop> handle) { loop_handle_ = std::move(handle); }
  // Before the first call: the kFeature* bits of the server's HelloReply.
  void set_peer_features(uint16_t features) { peer_features_ = features; }
  // Before the first call, when this client offered PACK in its Hello
  // (Config::pack_small != 0, not shm): accepts PACKs of replies from now
  // on, and sends PACKs of requests of at most `pack_small` bytes when the
  // server announced PACK too (lib/core/pack.h).
  void configure_packing(uint32_t pack_small, bool server_accepts);
  // Before the first call: post once this many messages wait (requests
  // built in one turn), not only at the turn's end (Outbox::set_flush_every).
  void set_flush_every(uint32_t n) { outbox_.set_flush_every(n); }

  // Loop thread (the stream's doorbell).  Client and bidi streams: sends
  // what the writer handed over (messages built in their send slots, the
  // half-close), in order; a stream that has ended drops it and takes its
  // window back once the writer has left it.
  void drain_out(OutStream& out);
  // Loop thread.  The window's slots in the writer's hands come back, if the
  // writer is not inside a Write (else its leaving rings for this).
  void reclaim_out(OutStream& out);

  uint64_t next_request_id() { return last_request_id_.fetch_add(1, std::memory_order_relaxed) + 1; }

  // Introspection for tests (loop thread).
  struct Counters {
    uint32_t free_slots = 0;
    uint32_t in_flight = 0;
    uint32_t zombies = 0;
    uint32_t held = 0;
    uint32_t queued = 0;
    uint32_t lent = 0;  // slots lent to server streams or reserved for client streams
    uint64_t late_replies_dropped = 0;
    uint64_t messages_sent = 0;
    uint64_t packs_sent = 0;        // PACKs of requests posted
    uint64_t packed_messages = 0;   // requests inside them
    uint64_t packs_received = 0;    // PACKs of replies taken apart
    transport::LinkStats link;  // zeros once the session is closed
  };
  Counters counters() const;
  bool closed() const { return closed_; }
  const Status& close_status() const { return close_status_; }
  const std::string& peer() const { return peer_; }
  core::Loop& loop() { return loop_; }
  // Loop thread, cold: the link (nullptr once closed), for its counters.
  const transport::Link* link() const { return link_.get(); }

 private:
  // kLent: granted to the server stream whose call sits in `stream_owner`;
  // a stream message that arrived in it and is held by the application is
  // kHeld with `stream_owner` still set.  kOutIdle / kOutInFlight: reserved
  // for the client stream of the call in `stream_owner`, free for its next
  // message / carrying one the server has not acknowledged yet.  A slot in
  // flight comes back only with its kStreamAck, even after the call ended:
  // until then the server may still be reading it.
  enum class SlotState : uint8_t { kFree, kInFlight, kZombie, kHeld, kLent, kOutIdle, kOutInFlight };
  struct Slot {
    SlotState state = SlotState::kFree;
    uint32_t generation = 0;
    uint64_t request_id = 0;
    PendingCall* call = nullptr;
    int32_t stream_owner = -1;
  };

  ClientSession(core::Loop& loop, std::unique_ptr<transport::Link> link, Geometry g,
                std::string peer);

  friend struct SessionDispatch<ClientSession>;
  bool ignores(const transport::Completion&) const { return closed_; }
  void on_link_down(const transport::Completion& c);
  void on_bulk_completion(const transport::Completion& c) { on_bulk_done(c.bulk_token); }  // a revoke
  static void on_deadline(void* self, uint64_t call);
  Status deadline_exceeded(const PendingCall& call) const;

  void on_message(const transport::Completion& c);
  void on_pack(const transport::Completion& c, const Header& h);
  void on_control(const transport::Completion& c);
  void send_on(uint16_t slot, PendingCall* call);
  void free_slot(uint16_t slot);
  void pump_queue();
  // `reply` must not live in `call` (it is deleted before the sink runs):
  // move PendingCall::held out first.
  static void finish(PendingCall* call, RawReply&& reply);
  static void count_finished(PendingCall* call, StatusCode code);
  static void count_bulk_out(const PendingCall& call);
  static void count_bulk_in(const PendingCall& call, const std::vector<uint64_t>& received);
  void fail(PendingCall* call, Status status);
  void fail_later(PendingCall* call, Status status);
  void send_control(Kind kind, uint16_t slot, uint32_t generation, uint64_t request_id,
                    uint32_t aux = 0, uint16_t status = 0);
  void on_stream_message(const Header& h, const std::byte* bytes);
  void lend(uint16_t slot, uint16_t owner, uint64_t request_id);
  bool stream_active(const Slot& lent) const;
  void end_stream(uint16_t owner_slot);
  // The call's slot, one lent slot for a server stream, one reserved slot
  // for a client stream: every open stream can always make progress.
  uint32_t credits_needed(const PendingCall* call) const {
    return 1u + (call->stream ? 1u : 0u) + (call->client_stream ? 1u : 0u);
  }
  void reserve_out(uint16_t call_slot, PendingCall* call);
  void send_out(PendingCall* call, uint16_t slot);
  void on_stream_ack(const Header& h);
  void abort_call(uint16_t slot, Status status, uint16_t wire_status);
  static void end_out(PendingCall* call, const Status& status);
  void protocol_error(std::string reason);
  // Bulk calls: ends `call` with `reply` once its exposures are revoked
  // (at once when there are none, or they are unreachable already).
  void end_call(PendingCall* call, RawReply&& reply);
  bool hold_for_revoke(PendingCall* call, RawReply& reply);
  Status expose_bulk(PendingCall* call, SlotBuilder& b, size_t* block_bytes);
  // Writes the call's metadata block between the header and the bulk block
  // (or the FlatBuffer); `*bytes` is its size.
  Status write_metadata(PendingCall* call, SlotBuilder& b, size_t block_bytes, size_t* bytes);
  static Status take_trailers(std::span<const std::byte>& payload,
                              std::unique_ptr<::slotrpc::detail::ReplyExtras>& extras);
  void on_bulk_done(uint64_t token);
  void flush();
  void enqueue(PendingCall* call);
  void dequeue(PendingCall* call);
  friend struct KeepaliveTimer<ClientSession>;
  void arm_keepalive() { KeepaliveTimer<ClientSession>::arm(this); }
  void peer_dead(std::string reason) { shutdown(Status(StatusCode::kUnavailable, std::move(reason))); }

  core::Loop& loop_;
  // Its owner's counters on this loop (set_counters), or null: the loop's.
  std::shared_ptr<core::LoopCounters> owner_counters_;
  core::LoopCounters& owner_counters() { return owner_counters_ ? *owner_counters_ : loop_.counters(); }
  std::weak_ptr<core::Loop> loop_handle_;
  std::unique_ptr<transport::Link> link_;
  Geometry geometry_;
  std::string peer_;
  SlotRing send_ring_;
  SlotRing recv_ring_;
  std::vector<std::unique_ptr<SlotBuilder>> builders_;
  std::vector<SlotBuilder*> builder_ptrs_;  // the same, for client-stream writers
  std::vector<Slot> slots_;
  std::vector<uint16_t> free_;  // credits (a stack: hot slots stay in cache)
  PendingCall* queue_head_ = nullptr;
  PendingCall* queue_tail_ = nullptr;
  uint32_t queued_ = 0;
  std::atomic<uint64_t> last_request_id_{0};
  // The method counters of the last call submitted (submit()).
  struct LastMethod {
    core::SideCounters* side = nullptr;
    uint32_t id = 0;
    core::MethodCounters* counters = nullptr;
  } last_method_;
  uint64_t late_replies_dropped_ = 0;
  uint64_t messages_sent_ = 0;
  uint16_t peer_features_ = 0;
  uint64_t max_bulk_bytes_ = 4ull << 30;
  // Set when this session accepts PACKs (configure_packing).
  std::unique_ptr<PackReceiver> pack_;
  // Bulk calls that ended and wait for their revokes (kBulkDone with the
  // call's request id).  Few at a time; searched linearly (cold path).
  std::vector<PendingCall*> revoking_;

  Outbox outbox_;
  // Replies released on other threads, (slot << 32 | generation), and the
  // doorbell that makes the loop take them (release()).
  boost::lockfree::queue<uint64_t> released_;
  struct ReleaseBell : core::Loop::Doorbell {
    ClientSession* owner = nullptr;
  } release_bell_;
  std::atomic<bool> release_rung_{false};
  std::shared_ptr<ClientSession> release_ref_;
  static void on_release_bell(core::Loop::Doorbell* d);
  Liveness liveness_;
  base::TimerHeap::TimerId keepalive_timer_ = 0;
  std::atomic<bool> closed_{false};
  Status close_status_;
};

}  // namespace slotrpc::core
