// ClientSession: a call's life -- submit, the credit queue, sending the
// request, the reply (alone or in a PACK), deadlines, cancels, and the
// completion that hands the caller its status.  The session's other parts:
// client_session.cc (set-up, control messages, released replies, shutdown),
// client_streams.cc (streams) and client_bulk.cc (bulk attachments).
#include "core/client_session.h"
#include "core/metadata.h"

#include <fmt/format.h>

#include <array>
#include <cstring>
#include <cassert>
#include <string>
#include <utility>

#include "core/handshake.h"
#include "base/logging.h"

namespace slotrpc::detail {
struct ReplyAccess {
  static void set_extras(RawReply& reply, std::unique_ptr<ReplyExtras> extras) {
    reply.set_extras(std::move(extras));
  }
};
}  // namespace slotrpc::detail

namespace slotrpc::core {
namespace {

uint32_t remaining_us(const std::optional<Clock::time_point>& deadline, Clock::time_point now) {
  if (!deadline) return 0;
  auto left = std::chrono::duration_cast<std::chrono::microseconds>(*deadline - now).count();
  if (left < 1) return 1;  // 0 means "no deadline" on the wire
  if (left > UINT32_MAX) return UINT32_MAX;
  return static_cast<uint32_t>(left);
}

// A call that failed before it reached the wire, completed from a task of
// its own.  std::function wants a copyable target; this one is only ever
// moved (a copy takes the call over), and a task the loop never ran (it was
// destroyed with the loop) frees the call without running its callbacks:
// nobody is left to run them on.
struct FailLater {
  PendingCall* call;
  Status status;
  FailLater(PendingCall* c, Status s) : call(c), status(std::move(s)) {}
  FailLater(FailLater&& o) noexcept : call(std::exchange(o.call, nullptr)), status(std::move(o.status)) {}
  FailLater(const FailLater& o) : FailLater(std::move(const_cast<FailLater&>(o))) {}
  FailLater& operator=(const FailLater&) = delete;
  ~FailLater() { delete call; }
  void operator()() { ClientSession::complete(std::exchange(call, nullptr), std::move(status)); }
};

}  // namespace

// Completions never run inside the call that started them (Asio's rule for
// handlers and their initiating functions): a caller that issues its next
// call from a completion callback would otherwise recurse once per failed
// call -- on a dead session, until the stack overflows.  So a call that
// fails here, before reaching the wire, completes from a task posted to the
// loop.  That is the cold path and costs one task: the std::function's
// target (call pointer + Status) and one inbox node, two allocations.  The
// calls that get a slot or a place in the queue allocate nothing here.
void ClientSession::fail_later(PendingCall* call, Status status) {
  loop_.post(FailLater(call, std::move(status)));
}

void ClientSession::fail_later(core::Loop& loop, PendingCall* call, Status status) {
  loop.post(FailLater(call, std::move(status)));
}

void ClientSession::submit(PendingCall* call) {
  assert(loop_.on_this_thread());
  // Metrics: plain integers of this loop.  The first call of a method id on
  // this loop inserts its entry (one allocation per method and loop, ever);
  // every later call finds it, a call of the same method as the last one
  // without a hash lookup (entries are never erased, so the pointer stays
  // valid).
  core::SideCounters& counters = owner_counters().client;
  ++counters.calls.started;
  call->counters = &counters;
  if (last_method_.side != &counters || last_method_.id != call->method_id) {
    last_method_ = {&counters, call->method_id, &counters.methods[call->method_id]};
  }
  call->method_counters = last_method_.counters;
  if (call->method_name != nullptr) call->method_counters->name = call->method_name;
  ++call->method_counters->started;
  call->submitted = loop_.stamp();  // a call issued by a callback: its batch's clock read
  if (closed_) return fail_later(call, close_status_);
  if (call->request_id == 0) call->request_id = next_request_id();
  if (call->client_stream && (peer_features_ & kFeatureClientStreams) == 0) {
    // An older server would take the new message kinds for a protocol
    // error and close the session: refuse here instead (protocol.md,
    // "Versions and features").
    return fail_later(call, Status(StatusCode::kUnimplemented,
                                   fmt::format("the server at {} does not support client or bidi "
                                               "streaming (it predates the feature)",
                                               peer_)));
  }
  if (call->has_bulk()) [[unlikely]] {
    if (call->stream || call->client_stream) {
      return fail_later(call, Status(StatusCode::kInvalidArgument,
                                     "bulk segments (CallOptions::send_bulk / receive_bulk) are for "
                                     "unary calls"));
    }
    if ((peer_features_ & kFeatureBulk) == 0) {
      return fail_later(call, Status(StatusCode::kUnimplemented,
                                     fmt::format("the server at {} does not support bulk segments "
                                                 "(it predates the feature)",
                                                 peer_)));
    }
  }
  if (call->deadline && *call->deadline <= Clock::now()) {
    return fail_later(call, Status(StatusCode::kDeadlineExceeded, "deadline passed before the call was sent"));
  }
  if (free_.size() >= credits_needed(call) && queued_ == 0) {
    const uint16_t slot = free_.back();
    free_.pop_back();
    if (call->deadline) {
      call->timer = loop_.timers().add(*call->deadline, &ClientSession::on_deadline, this,
                                       reinterpret_cast<uint64_t>(call));
    }
    return send_on(slot, call);
  }
  const uint32_t limit = loop_.config().max_queued_calls;
  if (queued_ >= limit) {
    return fail_later(call, Status(StatusCode::kResourceExhausted,
                             fmt::format("{} calls already wait for a credit on the channel to "
                                         "{} (max_queued_calls = {})",
                                         queued_, peer_, limit)));
  }
  ++counters.calls.credit_stalls;  // no credit: it waits in the queue
  if (call->deadline) {
    call->timer = loop_.timers().add(*call->deadline, &ClientSession::on_deadline, this,
                                     reinterpret_cast<uint64_t>(call));
  }
  enqueue(call);
}

void ClientSession::enqueue(PendingCall* call) {
  call->slot = -1;
  call->next = nullptr;
  call->prev = queue_tail_;
  if (queue_tail_ != nullptr) queue_tail_->next = call; else queue_head_ = call;
  queue_tail_ = call;
  ++queued_;
}

void ClientSession::dequeue(PendingCall* call) {
  if (call->prev != nullptr) call->prev->next = call->next; else queue_head_ = call->next;
  if (call->next != nullptr) call->next->prev = call->prev; else queue_tail_ = call->prev;
  call->prev = call->next = nullptr;
  --queued_;
}

void ClientSession::send_on(uint16_t slot, PendingCall* call) {
  Slot& s = slots_[slot];
  SlotBuilder& b = *builders_[slot];
  b.Clear();
  Status error;
  try {
    if (call->writer) call->writer(b);  // client streams open without a payload
  } catch (const SlotOverflow& o) {
    error = Status(StatusCode::kResourceExhausted,
                   fmt::format("request of at least {} bytes does not fit a slot: payload capacity is {} "
                               "bytes (slot_size {} minus the {}-byte header); raise slot_size "
                               "(SLOTRPC_SLOT_SIZE) or send the data as a bulk segment (CallOptions::send_bulk)",
                               o.at_least(), b.payload_capacity(), geometry_.slot_size, kHeaderSize));
  } catch (const std::exception& e) {
    error = Status(StatusCode::kInternal, fmt::format("request writer threw: {}", e.what()));
  }
  if (error.ok() && call->writer && !b.is_finished()) {
    error = Status(StatusCode::kInvalidArgument, "request writer did not call Finish()");
  }
  call->writer = nullptr;  // release captures now
  if (!error.ok()) {
    b.recover();
    free_.push_back(slot);
    loop_.timers().cancel(call->timer);
    call->timer = 0;
    // Posted: send_on runs from submit (the caller's stack) or from
    // pump_queue (inside a reply or a release, which may be the caller's).
    return fail_later(call, std::move(error));
  }
  // A failure below gives the slot back and completes the call unsent;
  // whatever was exposed before it is revoked before the caller learns, and
  // completion never runs on this stack either way.
  auto abandon = [&](Status st) {
    b.recover();
    free_.push_back(slot);
    loop_.timers().cancel(call->timer);
    call->timer = 0;
    RawReply failed(std::move(st));
    if (hold_for_revoke(call, failed)) return;
    fail_later(call, failed.status());
  };
  // What goes between the header and the FlatBuffer (call metadata, then
  // a bulk block) and the flags that say so: one length and one flags
  // byte, both zero for a call without extras, so that the header costs
  // what it cost before either feature existed.
  size_t extra_bytes = 0;
  uint8_t extra_flags = 0;
  if (call->extras) [[unlikely]] {
    size_t block_bytes = 0;
    size_t meta_bytes = 0;
    if (call->has_bulk()) {
      if (Status st = expose_bulk(call, b, &block_bytes); !st.ok()) return abandon(std::move(st));
    }
    if (call->has_metadata()) {
      if (Status st = write_metadata(call, b, block_bytes, &meta_bytes); !st.ok())
        return abandon(std::move(st));
    }
    extra_bytes = block_bytes + meta_bytes;
    extra_flags = static_cast<uint8_t>((block_bytes != 0 ? kFlagBulk : 0) | (meta_bytes != 0 ? kFlagMetadata : 0));
  }

  ++s.generation;
  s.state = SlotState::kInFlight;
  s.request_id = call->request_id;
  s.call = call;
  s.stream_owner = -1;
  call->slot = slot;

  Header h;
  h.flags = static_cast<uint8_t>(Kind::kRequest) | (call->stream ? kFlagServerStream : 0) |
            (call->client_stream ? kFlagClientStream : 0) | extra_flags;
  h.method_id = call->method_id;
  h.request_id = call->request_id;
  const uint32_t flatbuffer_len = b.is_finished() ? b.GetSize() : 0;
  h.payload_len = flatbuffer_len + static_cast<uint32_t>(extra_bytes);
  h.slot = slot;
  h.generation = s.generation;
  h.timeout_us = call->deadline ? remaining_us(call->deadline, Clock::now()) : 0;  // no clock read without one
  // An empty payload may leave the builder without memory: put the header
  // at the start of the slot then.  A bulk block sits between the header
  // and the FlatBuffer (expose_bulk wrote it there).
  // Call metadata goes first, before the bulk block (write_metadata).
  std::byte* msg = flatbuffer_len == 0 ? b.slot() : b.message_begin() - extra_bytes;
  encode_header(h, msg);

  if (call->counters != nullptr) {
    call->counters->calls.bytes_out += kHeaderSize + h.payload_len;
    call->method_counters->bytes_out += kHeaderSize + h.payload_len;
    if (call->exposure() != nullptr) [[unlikely]] count_bulk_out(*call);
  }
  link_->arm(slot);  // the reply may now land in our receive slot
  outbox_.add_slot_message(msg, static_cast<uint32_t>(kHeaderSize + h.payload_len), slot,
                           s.generation, /*packable=*/true);
  loop_.request_flush(this);
  if (outbox_.flush_due()) flush();  // the request goes before its grants either way

  if (call->client_stream) reserve_out(slot, call);
  if (call->stream) {
    // Lend the stream its window: the grants follow the request on the same
    // ordered link, so the server sees the call before its credits.
    const size_t window = std::max<size_t>(1, std::min<size_t>(call->window, free_.size()));
    for (size_t i = 0; i < window && !free_.empty(); ++i) {
      const uint16_t lent = free_.back();
      free_.pop_back();
      lend(lent, slot, call->request_id);
    }
  }
  // A half-close the writer handed over before the call reached the wire
  // (an empty client stream, or one queued for credits): its doorbell found
  // no session then.  Sent now, after the request and the grants.
  if (call->client_stream && call->out->ready.read_available() != 0) drain_out(*call->out);
}

// Ends the call in `slot` from this side (cancel, deadline, a failed
// stream message): the caller learns `status` now, the slot waits as a
// zombie for the server's final message, which CANCEL asks for;
// `wire_status` tells the server why.
void ClientSession::abort_call(uint16_t slot, Status status, uint16_t wire_status) {
  Slot& s = slots_[slot];
  PendingCall* call = s.call;
  s.state = SlotState::kZombie;
  s.call = nullptr;
  loop_.timers().cancel(call->timer);
  call->timer = 0;
  send_control(Kind::kCancel, slot, s.generation, s.request_id, 0, wire_status);
  if (call->exposure() != nullptr) return end_call(call, RawReply(std::move(status)));
  fail(call, std::move(status));
}

// A bulk call ends: the peer loses access to its memory first (on verbs
// the windows' invalidations are posted now and the call completes with
// their kBulkDone).  Calls without bulk segments finish at once.
void ClientSession::end_call(PendingCall* call, RawReply&& reply) {
  if (call->extras != nullptr && hold_for_revoke(call, reply)) [[unlikely]] return;
  finish(call, std::move(reply));
}

void ClientSession::on_message(const transport::Completion& c) {
  loop_.heard(this);
  const std::byte* bytes = recv_ring_.slot(c.slot);
  const Header h = decode_header(bytes);
  HeaderError e = validate_header(h, c.length, geometry_.slot_count, geometry_.slot_size, c.slot);
  if (e != HeaderError::kOk) {
    return protocol_error(fmt::format("malformed reply header in slot {}: {}", c.slot, to_string(e)));
  }
  if (h.kind() == Kind::kPack) return on_pack(c, h);
  owner_counters().client.calls.bytes_in += c.length;
  if (h.kind() == Kind::kStreamMessage) return on_stream_message(h, bytes);
  if (h.kind() != Kind::kReply && h.kind() != Kind::kError) {
    return protocol_error(fmt::format("unexpected message kind 0x{:02x} in slot {}", h.flags, c.slot));
  }
  Slot& s = slots_[h.slot];
  const bool outstanding = s.state == SlotState::kInFlight || s.state == SlotState::kZombie;
  if (!outstanding || h.generation != s.generation || h.request_id != s.request_id ||
      imm_generation(c.imm) != static_cast<uint16_t>(s.generation)) {
    return protocol_error(fmt::format(
        "reply for slot {} generation {} request {} matches no outstanding call", h.slot,
        h.generation, h.request_id));
  }
  if (h.kind() == Kind::kError && (h.status == 0 || !is_known_status_code(h.status))) {
    return protocol_error(fmt::format("error reply with invalid status {}", h.status));
  }
  if (s.state == SlotState::kZombie) {
    // The caller already gave up on this call: drop the late reply here, so
    // the next user of the slot can never see it.
    ++late_replies_dropped_;
    end_stream(h.slot);
    return free_slot(h.slot);
  }
  PendingCall* call = s.call;
  s.call = nullptr;
  if (call->method_counters != nullptr) call->method_counters->bytes_in += c.length;
  loop_.timers().cancel(call->timer);
  if (h.bulk() && (call->exposure() == nullptr || h.kind() != Kind::kReply)) {
    // The session goes first (its link's close makes every exposure
    // unreachable), then the caller learns.
    protocol_error(fmt::format("reply in slot {} carries a bulk block, but its call has no bulk segments",
                               h.slot));
    return complete(call, Status(StatusCode::kUnavailable, "the server sent a bulk block the call did not ask for"));
  }
  if (call->deadline && *call->deadline <= Clock::now()) {
    // The deadline passed before this turn got to the reply: the loop ran
    // late (descheduled, or an application callback held it), and this
    // turn polls before it runs timers.  The caller sees DEADLINE_EXCEEDED,
    // as it would have had the timer run first; the reply is dropped like
    // any late one.  One clock read per reply, and only for calls with a
    // deadline.
    ++late_replies_dropped_;
    end_stream(h.slot);
    free_slot(h.slot);
    if (call->exposure() != nullptr) return end_call(call, RawReply(deadline_exceeded(*call)));
    return fail(call, deadline_exceeded(*call));
  }
  std::span<const std::byte> payload(bytes + kHeaderSize, h.payload_len);
  // Trailers and bulk lengths, for the few replies with either (null
  // otherwise: a reply without them constructs nothing for them).
  std::unique_ptr<::slotrpc::detail::ReplyExtras> extras;
  if (h.metadata()) [[unlikely]] {
    if (Status st = take_trailers(payload, extras); !st.ok()) {
      protocol_error(fmt::format("reply in slot {}: {}", h.slot, st.message()));
      return complete(call, Status(StatusCode::kUnavailable, "the server sent a malformed reply: " + st.message()));
    }
  }
  if (call->stream) {
    // The final status of a stream: no more messages will come.  (A
    // stream's end has no reply to carry trailers: they are dropped.)
    Status status;
    if (h.kind() == Kind::kError) {
      call->handler_status = h.status != static_cast<uint16_t>(StatusCode::kUnimplemented);
      status = Status(static_cast<StatusCode>(h.status),
                      std::string(reinterpret_cast<const char*>(payload.data()), payload.size()));
    }
    end_stream(h.slot);
    free_slot(h.slot);
    return fail(call, std::move(status));
  }
  if (call->client_stream) end_stream(h.slot);  // the reply ends the client's writes too
  if (h.kind() == Kind::kError) {
    // The server's own UNIMPLEMENTED (no such method) names only the id:
    // the client adds the name.  Other errors are the handler's, as it
    // wrote them.
    call->handler_status = h.status != static_cast<uint16_t>(StatusCode::kUnimplemented);
    std::string message(reinterpret_cast<const char*>(payload.data()), payload.size());
    free_slot(h.slot);
    RawReply failed(Status(static_cast<StatusCode>(h.status), std::move(message)));
    if (extras) ::slotrpc::detail::ReplyAccess::set_extras(failed, std::move(extras));
    return end_call(call, std::move(failed));
  }
  if (h.bulk()) [[unlikely]] {
    // How much the handler wrote into each receive segment, checked
    // against what the call offered.
    const std::vector<uint64_t>& lengths = call->exposure()->receive_lengths();
    std::array<uint64_t, kMaxBulkSegments> written{};
    size_t block = 0;
    if (Status st = bulk::decode_reply_block(payload, lengths, written, &block); !st.ok()) {
      protocol_error(st.message());
      return complete(call, Status(StatusCode::kUnavailable, "the server sent a malformed reply: " + st.message()));
    }
    if (!extras) extras = std::make_unique<::slotrpc::detail::ReplyExtras>();
    extras->bulk_received.assign(written.begin(), written.begin() + static_cast<std::ptrdiff_t>(lengths.size()));
    count_bulk_in(*call, extras->bulk_received);
    payload = payload.subspan(block);
  }
  s.state = SlotState::kHeld;  // until the application drops the reply
  RawReply reply(payload, shared_from_this(), h.slot, h.generation);
  if (extras) [[unlikely]] ::slotrpc::detail::ReplyAccess::set_extras(reply, std::move(extras));
  end_call(call, std::move(reply));
}

// A PACK of replies (lib/core/pack.h): the whole pack is checked first,
// every reply against an outstanding call whose slot the server may write;
// only then is each copied into its own slot and handled exactly as if it
// had come alone.  Anything wrong closes the session, like a bad frame.
void ClientSession::on_pack(const transport::Completion& c, const Header& h) {
  if (!pack_) {
    return protocol_error(fmt::format("PACK in slot {}, but this client did not offer packing", c.slot));
  }
  // Each packed reply must answer an outstanding call, in a slot the server
  // may write.
  auto accept = [this, &c](const PackedEntry& e) -> std::string {
    const Slot& s = slots_[e.header.slot];
    const bool outstanding = s.state == SlotState::kInFlight || s.state == SlotState::kZombie;
    if (!outstanding || e.header.generation != s.generation || e.header.request_id != s.request_id ||
        (e.header.slot != c.slot && !link_->armed(e.header.slot))) {
      return fmt::format("packed reply for slot {} generation {} request {} matches no outstanding call",
                         e.header.slot, e.header.generation, e.header.request_id);
    }
    return {};
  };
  const std::string bad =
      pack_->receive(recv_ring_.slot(0), geometry_.slot_count, geometry_.slot_size, *link_, c, h,
                     PackSender::kServer, accept, [this] { return !closed_.load(); },
                     [this](const transport::Completion& inner) { on_message(inner); });
  if (!bad.empty()) protocol_error(bad);
}

void ClientSession::free_slot(uint16_t slot) {
  Slot& s = slots_[slot];
  s.state = SlotState::kFree;
  s.call = nullptr;
  s.stream_owner = -1;
  free_.push_back(slot);
  pump_queue();
}

void ClientSession::pump_queue() {
  // FIFO: a stream at the head waits for its two credits, and nothing
  // overtakes it.
  while (queue_head_ != nullptr && free_.size() >= credits_needed(queue_head_) && !closed_) {
    PendingCall* call = queue_head_;
    dequeue(call);
    const uint16_t slot = free_.back();
    free_.pop_back();
    send_on(slot, call);
  }
}

// Cold path (calls with bulk segments): the bytes the call offers the
// server, counted as it is sent, and those the server wrote for it.
void ClientSession::count_bulk_out(const PendingCall& call) {
  uint64_t n = 0;
  for (const BulkSegment& seg : call.extras->send_bulk) n += seg.length;
  call.counters->calls.bulk_bytes_out += n;
  call.method_counters->bulk_bytes_out += n;
}

void ClientSession::count_bulk_in(const PendingCall& call, const std::vector<uint64_t>& received) {
  if (call.counters == nullptr) return;
  uint64_t n = 0;
  for (uint64_t r : received) n += r;
  call.counters->calls.bulk_bytes_in += n;
  call.method_counters->bulk_bytes_in += n;
}

// Hot path: at most one clock read and a few increments of the loop's counters.
// Runs on the loop (completions and posted failures do).
void ClientSession::count_finished(PendingCall* call, StatusCode code) {
  if (call->counters == nullptr) return;  // never submitted to a session
  ++call->counters->calls.finished[core::code_index(code)];
  // On the loop that ran the call (static: completions posted from any
  // thread end here too); the batch's clock read inside a callback.
  const core::Loop* loop = core::Loop::current();
  const Clock::time_point end = loop != nullptr ? loop->stamp() : Clock::now();
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(end - call->submitted);
  call->method_counters->finish(code, static_cast<uint64_t>(std::max<int64_t>(0, us.count())));
  call->counters = nullptr;
}

void ClientSession::finish(PendingCall* call, RawReply&& reply) {
  if (!reply.ok() && call->method_name != nullptr && !call->handler_status) {
    reply = RawReply(named_status(call->method_name, reply.status()));
  }
  end_out(call, reply.status());
  count_finished(call, reply.status().code());
  ReplySink sink = std::move(call->sink);
  delete call;
  if (sink) sink(std::move(reply));
}

void ClientSession::fail(PendingCall* call, Status status) { complete(call, std::move(status)); }

void ClientSession::complete(PendingCall* call, Status status) {
  if (!status.ok() && call->method_name != nullptr && !call->handler_status) {
    status = named_status(call->method_name, std::move(status));
  }
  end_out(call, status);
  if (call->stream) {
    count_finished(call, status.code());
    auto on_end = std::move(call->on_end);
    delete call;
    if (on_end) on_end(std::move(status));
    return;
  }
  finish(call, RawReply(std::move(status)));
}

namespace {

// "pkg.Service.Method" -> "pkg.Service/Method", as metrics and logs show it.
std::string display_name(const char* full_name) {
  std::string out(full_name);
  const size_t dot = out.rfind('.');
  if (dot != std::string::npos) out[dot] = '/';
  return out;
}

std::string method_of(const PendingCall& call) {
  return call.method_name != nullptr ? display_name(call.method_name)
                                     : fmt::format("method id 0x{:08x}", call.method_id);
}

}  // namespace

Status ClientSession::named_status(const char* method_name, Status status) {
  if (method_name == nullptr || status.ok()) return status;
  const std::string name = display_name(method_name);
  if (status.message().find(name) != std::string::npos) return status;
  return Status(status.code(), fmt::format("{}: {}", name, status.message()));
}

// "call to echo.Echo/Echo exceeded its deadline of 10 ms (request 4 to
// 127.0.0.1:7100)": the deadline as the time the call had from its
// submission on this loop.
Status ClientSession::deadline_exceeded(const PendingCall& call) const {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                      call.deadline.value_or(call.submitted) - call.submitted)
                      .count();
  const std::string budget = us >= 1000 ? fmt::format("{} ms", (us + 500) / 1000) : fmt::format("{} us", us);
  return Status(StatusCode::kDeadlineExceeded,
                fmt::format("call to {} exceeded its deadline of {} (request {} to {})", method_of(call),
                            budget, call.request_id, peer_));
}

void ClientSession::on_deadline(void* self_ptr, uint64_t call_ptr) {
  auto* self = static_cast<ClientSession*>(self_ptr);
  auto* call = reinterpret_cast<PendingCall*>(call_ptr);
  call->timer = 0;
  Status status = self->deadline_exceeded(*call);
  if (call->slot < 0) {
    self->dequeue(call);
    return self->fail(call, std::move(status));
  }
  self->abort_call(static_cast<uint16_t>(call->slot), std::move(status),
                   static_cast<uint16_t>(StatusCode::kDeadlineExceeded));
}

void ClientSession::cancel(uint64_t request_id, Status status) {
  for (PendingCall* c = queue_head_; c != nullptr; c = c->next) {
    if (c->request_id == request_id) {
      dequeue(c);
      loop_.timers().cancel(c->timer);
      return fail(c, std::move(status));
    }
  }
  for (uint16_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (s.state == SlotState::kInFlight && s.call != nullptr && s.request_id == request_id) {
      return abort_call(i, std::move(status), static_cast<uint16_t>(StatusCode::kCancelled));
    }
  }
}

}  // namespace slotrpc::core

namespace slotrpc::core {

// Cold path: a reply's trailers, checked and copied out (they outlive the
// slot, and come with errors, which hold none); `payload` then starts after
// them.
Status ClientSession::take_trailers(std::span<const std::byte>& payload,
                                    std::unique_ptr<::slotrpc::detail::ReplyExtras>& extras) {
  auto len = check_metadata_block(payload);
  if (!len.ok()) return len.status();
  const MetadataView view(payload.first(len.value()));
  extras = std::make_unique<::slotrpc::detail::ReplyExtras>();
  extras->trailers.reserve(view.size());
  for (size_t i = 0; i < view.size(); ++i) {
    auto [k, v] = view.at(i);
    extras->trailers.emplace_back(std::string(k), std::string(v));
  }
  payload = payload.subspan(len.value());
  return {};
}

Status ClientSession::write_metadata(PendingCall* call, SlotBuilder& b, size_t block_bytes,
                                     size_t* bytes) {
  if ((peer_features_ & kFeatureMetadata) == 0) {
    return Status(StatusCode::kUnimplemented,
                  fmt::format("the server at {} does not take call metadata (it predates the feature)",
                              peer_));
  }
  auto n = metadata_block_bytes(call->extras->metadata, "call metadata");
  if (!n.ok()) return n.status();
  const size_t flatbuffer_len = b.is_finished() ? b.GetSize() : 0;
  if (flatbuffer_len + block_bytes + n.value() > b.payload_capacity()) {
    return Status(StatusCode::kResourceExhausted,
                  fmt::format("request of {} bytes plus {} bytes of call metadata{} does not fit a slot "
                              "({} bytes of payload); raise slot_size (SLOTRPC_SLOT_SIZE)",
                              flatbuffer_len, n.value(),
                              block_bytes != 0 ? fmt::format(" and a {}-byte bulk block", block_bytes)
                                               : std::string(),
                              b.payload_capacity()));
  }
  std::byte* at;
  if (flatbuffer_len == 0) {
    // Nothing built: the header sits at the start of the slot, and a bulk
    // block already written right after it moves behind the metadata.
    at = b.slot() + kHeaderSize;
    if (block_bytes != 0) std::memmove(at + n.value(), at, block_bytes);
  } else {
    at = reinterpret_cast<std::byte*>(b.GetBufferPointer()) - block_bytes - n.value();
  }
  encode_metadata(call->extras->metadata, at, n.value());
  *bytes = n.value();
  return {};
}

}  // namespace slotrpc::core
