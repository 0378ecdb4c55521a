// ClientSession: client and bidi streams (the writer's slots lent by the
// server, the out-stream hand-over, STREAM_ACK) and server streams'
// messages.  The session's other parts: client_session.cc (set-up,
// shutdown), client_calls.cc (calls and their replies) and client_bulk.cc
// (bulk attachments).
#include "core/client_session.h"

#include <fmt/format.h>

#include <cassert>
#include <utility>

#include "base/logging.h"

namespace slotrpc::core {

void ClientSession::lend(uint16_t slot, uint16_t owner, uint64_t request_id) {
  Slot& s = slots_[slot];
  ++s.generation;
  s.state = SlotState::kLent;
  s.request_id = request_id;
  s.call = nullptr;
  s.stream_owner = owner;
  link_->arm(slot);
  send_control(Kind::kStreamGrant, slot, s.generation, request_id, owner);
}

// Reserves the client stream's window: slots its messages go into, each
// reused once the server has acknowledged the message in it.  A bidi call
// leaves at least one free credit for the window it lends the server.  The
// slots go to the writer through the stream's free ring (core/out_stream.h):
// from here on the writer builds in them on its own thread.
void ClientSession::reserve_out(uint16_t call_slot, PendingCall* call) {
  OutStream& o = *call->out;
  o.session = shared_from_this();
  o.builders = builder_ptrs_.data();
  o.call = call;
  o.request_id = call->request_id;
  const size_t keep = call->stream ? 1 : 0;
  const size_t avail = free_.size() > keep ? free_.size() - keep : 0;
  const size_t window = std::max<size_t>(1, std::min<size_t>(call->window, avail));
  for (size_t i = 0; i < window && !free_.empty(); ++i) {
    const uint16_t j = free_.back();
    free_.pop_back();
    Slot& s = slots_[j];
    s.state = SlotState::kOutIdle;
    s.request_id = call->request_id;
    s.call = nullptr;
    s.stream_owner = call_slot;
    o.give(j);  // after session/builders: the ring publishes them to the writer
  }
  o.wake_at = std::max<size_t>(1, window / 2);
}

// Loop side of the hand-over.  Hot path (one per client-stream message): no
// allocation, no lock, no virtual call; the message is already built in its
// send slot, this writes the header in front of it and queues it.
void ClientSession::drain_out(OutStream& o) {
  if (closed_) return;
  uint32_t entry = 0;
  while (o.ready.pop(entry)) {
    PendingCall* call = o.call;
    if (call == nullptr) continue;  // the stream ended: reclaim_out takes the slots
    const auto slot = static_cast<uint16_t>(entry & 0xffff);
    const auto call_slot = static_cast<uint16_t>(call->slot);
    switch (entry & 0xffff0000u) {
      case OutStream::kMessage:
        send_out(call, slot);
        break;
      case OutStream::kHalfClose:
        send_control(Kind::kHalfClose, call_slot, slots_[call_slot].generation, call->request_id);
        break;
      case OutStream::kAbandoned: {
        // The writer's build threw (Write() returned false with why): the
        // stream fails as a whole, and the server is told to stop.
        Status why;
        {
          std::lock_guard<std::mutex> lock(o.mu);
          why = o.abandon_status;
        }
        abort_call(call_slot, std::move(why), static_cast<uint16_t>(StatusCode::kCancelled));
        break;
      }
    }
  }
  if (o.call == nullptr) reclaim_out(o);
}

void ClientSession::send_out(PendingCall* call, uint16_t j) {
  Slot& s = slots_[j];
  assert(s.state == SlotState::kOutIdle && s.request_id == call->request_id);
  SlotBuilder& b = *builders_[j];
  ++s.generation;
  s.state = SlotState::kOutInFlight;
  Header h;
  h.flags = static_cast<uint8_t>(Kind::kClientMessage);
  h.method_id = static_cast<uint32_t>(call->slot);
  h.request_id = call->request_id;
  h.payload_len = b.GetSize();
  h.slot = j;
  h.generation = s.generation;
  std::byte* msg = b.message_begin();
  encode_header(h, msg);
  owner_counters().client.calls.bytes_out += kHeaderSize + h.payload_len;
  if (call->method_counters != nullptr) call->method_counters->bytes_out += kHeaderSize + h.payload_len;
  outbox_.add_slot_message(msg, static_cast<uint32_t>(kHeaderSize + h.payload_len), j,
                           s.generation);
  loop_.request_flush(this);
}

void ClientSession::reclaim_out(OutStream& o) {
  if (closed_ || o.reclaimed.load(std::memory_order_relaxed)) return;
  if (!o.ended.load(std::memory_order_seq_cst) || o.busy.load(std::memory_order_seq_cst)) return;
  o.reclaimed.store(true, std::memory_order_release);
  for (uint16_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (s.state == SlotState::kOutIdle && s.request_id == o.request_id) {
      s.stream_owner = -1;
      free_slot(i);
    }
  }
}

// The server is done with the client message in `h.slot`: the slot serves
// the stream's next message, or comes back to the free list once the
// stream is over.
void ClientSession::on_stream_ack(const Header& h) {
  Slot& s = slots_[h.slot];
  if (s.state != SlotState::kOutInFlight || s.generation != h.generation ||
      s.request_id != h.request_id || s.stream_owner != static_cast<int32_t>(h.method_id)) {
    return protocol_error(fmt::format(
        "stream ack for slot {} generation {} request {} matches no client message in flight",
        h.slot, h.generation, h.request_id));
  }
  if (outbox_.holds(send_ring_.slot(h.slot), geometry_.slot_size) || link_->sending(h.slot)) {
    // The message it acknowledges has not left: the server cannot have
    // read it.  The writer's next message in that slot would overwrite it.
    return protocol_error(fmt::format("stream ack for slot {} before the message in it was sent", h.slot));
  }
  if (!stream_active(s)) {
    s.stream_owner = -1;
    return free_slot(h.slot);
  }
  PendingCall* call = slots_[static_cast<size_t>(s.stream_owner)].call;
  s.state = SlotState::kOutIdle;
  call->out->give(h.slot);
}

void ClientSession::end_out(PendingCall* call, const Status& status) {
  if (!call->out) return;
  OutStream& o = *call->out;
  o.call = nullptr;
  o.end(status);
  if (o.session) o.session->reclaim_out(o);
}

bool ClientSession::stream_active(const Slot& lent) const {
  if (lent.stream_owner < 0) return false;
  const Slot& owner = slots_[static_cast<size_t>(lent.stream_owner)];
  return owner.state == SlotState::kInFlight && owner.call != nullptr &&
         owner.request_id == lent.request_id;
}

void ClientSession::on_stream_message(const Header& h, const std::byte* bytes) {
  Slot& s = slots_[h.slot];
  if (s.state != SlotState::kLent || h.generation != s.generation || h.request_id != s.request_id) {
    return protocol_error(fmt::format(
        "stream message in slot {} generation {} request {} matches no lent slot", h.slot,
        h.generation, h.request_id));
  }
  if (!stream_active(s)) {
    // The stream was cancelled or timed out: drop the message; the slot is
    // reclaimed when the stream's final reply arrives.
    ++late_replies_dropped_;
    return;
  }
  PendingCall* call = slots_[static_cast<size_t>(s.stream_owner)].call;
  if (call->method_counters != nullptr) call->method_counters->bytes_in += kHeaderSize + h.payload_len;
  s.state = SlotState::kHeld;  // until the application drops the message
  if (call->sink) {
    call->sink(RawReply(Status(), std::span<const std::byte>(bytes + kHeaderSize, h.payload_len),
                        shared_from_this(), h.slot, h.generation));
  }
}

// Slots lent to the stream whose call is in `owner_slot` come back: the
// server will write none of them again.  Held ones return when released.
void ClientSession::end_stream(uint16_t owner_slot) {
  for (uint16_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (s.stream_owner != owner_slot || s.request_id != slots_[owner_slot].request_id) continue;
    if (s.state == SlotState::kLent) {
      s.stream_owner = -1;
      s.state = SlotState::kFree;
      free_.push_back(i);
    }
    // kOutInFlight slots come back with their acks (on_stream_ack), kOutIdle
    // ones (in the writer's hands) when the writer has left (reclaim_out).
  }
}

}  // namespace slotrpc::core
