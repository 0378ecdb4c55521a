// The server side of one slot-ring session.
//
// A request arrives in slot i of this session's receive ring.  Its header
// is validated against the ring and the slot's state (a client may only
// write a slot whose previous reply it has received), the method is looked
// up, the FlatBuffer is verified in place, and the handler runs on a fiber
// with a builder over send slot i.  The reply goes back into slot i of the
// client's ring, after which slot i may receive again.
//
// A malformed message closes this session only, with a logged reason; the
// server's other sessions are not affected.  A session whose link is gone
// stays alive until its last running handler returns (handlers read the
// rings in place), then asks its owner to destroy it.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/bulk/server_bulk.h"
#include "core/liveness.h"
#include "core/call_checks.h"
#include "core/method_table.h"
#include "core/outbox.h"
#include "core/pack.h"
#include "core/session_base.h"
#include "core/slot_builder.h"
#include "core/slot_ring.h"
#include "core/loop.h"

namespace slotrpc::core {

class ServerSession final : public SessionBase {
 public:
  // Loop thread, right after create(): count into `counters` (the owning
  // Server's or Channel's, on this loop) instead of the loop's own, so
  // servers and channels sharing a loop each report only their own calls.
  // Shared: the session may outlive its owner (a RawReply still held).
  void set_counters(std::shared_ptr<core::LoopCounters> counters) { owner_counters_ = std::move(counters); }
  // Loop thread, right after create(): the owner's Config::max_bulk_bytes.
  void set_max_bulk_bytes(uint64_t bytes) { max_bulk_bytes_ = bytes; }
  // Loop thread, right after create(): the owner's Config::bulk_timeout_ms,
  // the bound of a handler's bulk transfer when its call has no deadline.
  void set_bulk_timeout_ms(uint32_t ms) { bulk_timeout_ms_ = ms; }
  // Loop thread, right after create(), when this server announces PACK
  // (Config::pack_small != 0, not shm): accepts PACKs of requests, and
  // sends PACKs of replies of at most `pack_small` bytes when the client's
  // Hello offered PACK too (lib/core/pack.h).
  void configure_packing(uint32_t pack_small, bool client_accepts);
  // Loop thread, right after create(): false for a client whose Hello did
  // not announce kFeatureStatusCodes; it then receives the codes outside
  // the first version's as INTERNAL (handshake.h).
  void set_client_takes_all_status_codes(bool all) { client_all_codes_ = all; }
  // Loop thread, right after create(): post once this many messages wait
  // (replies finished in one turn), not only at the turn's end
  // (Outbox::set_flush_every).
  void set_flush_every(uint32_t n) { outbox_.set_flush_every(n); }
  struct Geometry {
    uint32_t slot_count;
    uint32_t slot_size;
  };
  using ClosedFn = std::function<void(ServerSession*)>;

  // Loop thread.  `on_closed` runs (on the loop) once the session is closed
  // and idle; the owner destroys the session then.
  // Registers both rings with `link`, attaches it and arms every slot.
  static Result<std::unique_ptr<ServerSession>> create(core::Loop& loop,
                                                       std::unique_ptr<transport::Link> link,
                                                       Geometry geometry, const MethodTable& methods,
                                                       std::string peer, ClosedFn on_closed);
  ~ServerSession();

  // Loop thread.
  void close(std::string reason);
  bool closed() const { return closed_; }
  const std::string& peer() const { return peer_; }
  // Before the first call (the server, right after create()): who the
  // client is (ServerCall::peer_info()), and the checks every call passes
  // before its handler runs, or null when there are none: the server's,
  // which outlives its sessions.
  void set_peer_info(PeerInfo info) { peer_info_ = std::move(info); }
  const PeerInfo& peer_info() const { return peer_info_; }
  void set_call_checks(const CallChecks* checks) { checks_ = checks; }
  // The client announced kFeatureMetadata: it takes trailers.  Without it
  // a handler's trailers are dropped (an older client would refuse the flag).
  void set_client_takes_trailers(bool yes) { client_trailers_ = yes; }
  uint32_t running_handlers() const { return running_; }
  // Loop thread, cold: the link, for its counters (metrics).
  const transport::Link& link() const { return *link_; }

 private:
  enum class SlotState : uint8_t { kIdle, kRunning };
  struct Slot {
    SlotState state = SlotState::kIdle;
    bool cancelled = false;
    bool streaming = false;
    // Server streaming: client slots lent to this call, in grant order, and
    // the handler's fiber while it waits for one.
    std::vector<uint16_t> grants;
    size_t grant_head = 0;
    // The handler's fiber while it waits for a grant or a client message.
    base::Fiber* waiter = nullptr;       // the handler's fiber, waiting in Write()
    base::Fiber* read_waiter = nullptr;  // a fiber waiting in Read() (bidi: may be another)
    // Client streaming: the client's messages not yet read (a FIFO of slots
    // linked through in_next_), the one the handler reads now, whether the
    // client half-closed, why the client cancelled (kCancel's status), and
    // a message that failed verification.
    bool client_stream = false;
    bool half_closed = false;
    int32_t in_head = -1;
    int32_t in_tail = -1;
    int32_t in_held = -1;
    StatusCode cancel_code = StatusCode::kCancelled;
    bool in_invalid = false;
    uint32_t generation = 0;
    uint64_t request_id = 0;
    uint32_t payload_len = 0;   // of the FlatBuffer, after the bulk block if any
    uint32_t payload_offset = 0;  // bytes of metadata and bulk descriptors before the FlatBuffer
    uint32_t meta_len = 0;        // the request's metadata block, right after the header
    Metadata trailers;            // ServerCall::add_trailer's, sent with the final reply
    bool bulk = false;            // the request carries bulk segments (bulk_[slot])
    uint32_t timeout_us = 0;
    Clock::time_point received;
    const MethodDescriptor* method = nullptr;
    core::MethodCounters* counters = nullptr;  // the method's, on this loop
  };

  // The handler's end of a server stream on one call slot.
  class StreamWriter final : public ::slotrpc::detail::StreamWriterImpl {
   public:
    StreamWriter(ServerSession* session, uint16_t slot) : session_(session), slot_(slot) {}
    bool write(const std::function<void(flatbuffers::FlatBufferBuilder&)>& build,
               Status* error) override;

   private:
    ServerSession* session_;
    uint16_t slot_;
  };

  // The handler's end of a client stream on one call slot.
  struct Inbound : ::slotrpc::detail::InboundStream {
    ServerSession* session = nullptr;
    uint16_t slot = 0;
  };
  static bool read_inbound(::slotrpc::detail::InboundStream* in, std::span<const std::byte>* msg,
                           Status* status);

  ServerSession(core::Loop& loop, std::unique_ptr<transport::Link> link, Geometry g,
                const MethodTable& methods, std::string peer, ClosedFn on_closed);

  friend struct SessionDispatch<ServerSession>;
  // Nothing is dropped unseen: a handler's fiber waits for its kBulkDone
  // even on a closed session, and on_message checks for itself.
  bool ignores(const transport::Completion&) const { return false; }
  void on_link_down(const transport::Completion& c) {
    close(c.link != nullptr ? c.link->down_reason() : "link down");
  }
  void on_bulk_completion(const transport::Completion& c);
  static void run_handler(void* self, uint64_t slot);

  void on_message(const transport::Completion& c);
  void on_pack(const transport::Completion& c, const Header& h);
  void on_control(const transport::Completion& c);
  // `status` by reference: a Status move is an out-of-line std::string
  // move, and the handler's status comes here once per call.
  void send_reply(uint16_t slot, Status&& status);
  // send_reply's path for the rest: errors, stream ends, bulk blocks and
  // trailers.
  std::byte* build_final(uint16_t slot, Status& status, Header& h);
  void send_control(Kind kind, uint16_t slot, uint32_t generation, uint64_t request_id,
                    uint32_t aux = 0);
  void on_client_message(const transport::Completion& c, const Header& h);
  void on_half_close(const Header& h);
  void ack_inbound(uint16_t slot);
  void release_inbound(uint16_t call_slot);
  Status cancel_status(const Slot& s) const;
  void protocol_error(std::string reason);
  void on_grant(const Header& h);
  void release_grants(uint16_t call_slot);
  void wake_writer(Slot& s);
  void flush();
  void maybe_finished();
  void count_finished(Slot& s, StatusCode code);
  void count_bulk(Slot& s, const bulk::ServerCallBulk& b);
  friend struct KeepaliveTimer<ServerSession>;
  void arm_keepalive() { KeepaliveTimer<ServerSession>::arm(this); }
  void peer_dead(std::string reason) { close(std::move(reason)); }

  core::Loop& loop_;
  // Its owner's counters on this loop (set_counters), or null: the loop's.
  std::shared_ptr<core::LoopCounters> owner_counters_;
  core::LoopCounters& owner_counters() { return owner_counters_ ? *owner_counters_ : loop_.counters(); }
  std::unique_ptr<transport::Link> link_;
  Geometry geometry_;
  const MethodTable& methods_;
  std::string peer_;
  PeerInfo peer_info_;
  const CallChecks* checks_ = nullptr;
  bool client_trailers_ = false;
  // The last request's method and its counters (on_message).
  struct LastMethod {
    uint32_t id = 0;
    const core::SideCounters* side = nullptr;
    const MethodDescriptor* method = nullptr;
    core::MethodCounters* counters = nullptr;
  } last_method_;
  ClosedFn on_closed_;
  SlotRing recv_ring_;
  SlotRing send_ring_;
  std::vector<std::unique_ptr<SlotBuilder>> builders_;
  std::vector<Slot> slots_;
  std::vector<StreamWriter> writers_;
  std::vector<Inbound> inbound_;
  // Bulk attachments per call slot (lib/core/bulk/server_bulk.h), made at the
  // slot's first bulk request: sessions without bulk calls pay nothing.
  std::vector<std::unique_ptr<bulk::ServerCallBulk>> bulk_;
  Status begin_bulk(uint16_t slot, const std::byte* payload, uint32_t payload_len);
  // For each slot j holding a client-stream message: the call slot it
  // belongs to (or -1), the next message of that stream, and the message's
  // generation and length.  Fixed size: no allocation per message.
  std::vector<int32_t> in_owner_;
  std::vector<int32_t> in_next_;
  std::vector<uint32_t> in_generation_;
  std::vector<uint32_t> in_len_;
  // For each slot j: the call slot whose stream it is lent to, or -1, and
  // the generation the client gave it.
  std::vector<int32_t> granted_to_;
  std::vector<uint32_t> grant_generation_;
  Outbox outbox_;
  bool client_all_codes_ = true;  // set_client_takes_all_status_codes
  // Set when this session accepts PACKs (configure_packing).
  std::unique_ptr<PackReceiver> pack_;
  uint32_t running_ = 0;
  uint64_t max_bulk_bytes_ = 4ull << 30;
  uint32_t bulk_timeout_ms_ = 60'000;
  bool closed_ = false;
  bool close_reported_ = false;
  Liveness liveness_;
  base::TimerHeap::TimerId keepalive_timer_ = 0;
};

}  // namespace slotrpc::core
