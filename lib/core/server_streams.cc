// ServerSession: streams.  Server streams (a handler's StreamWriter and the
// slots the client grants it) and client streams inbound (the messages a
// client or bidi stream sends, read in place, acknowledged slot by slot).
// The session's other parts are in server_session.cc.
#include "core/server_session.h"

#include <boost/context/fiber.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "base/logging.h"

namespace slotrpc::core {

// Wakes whichever fibers wait on the call: its writer and its reader (both
// re-check what they wait for, so a wake for the other is harmless).
void ServerSession::wake_writer(Slot& s) {
  if (s.waiter != nullptr) {
    loop_.make_ready(s.waiter);
    s.waiter = nullptr;
  }
  if (s.read_waiter != nullptr) {
    loop_.make_ready(s.read_waiter);
    s.read_waiter = nullptr;
  }
}

void ServerSession::on_grant(const Header& h) {
  const uint16_t lent = h.slot;
  const uint32_t owner = h.method_id;
  if (owner >= geometry_.slot_count || owner == lent) {
    return protocol_error(fmt::format("stream grant of slot {} names call slot {}", lent, owner));
  }
  if (slots_[lent].state != SlotState::kIdle || granted_to_[lent] >= 0) {
    return protocol_error(fmt::format("slot {} lent to a stream while it is in use", lent));
  }
  if (outbox_.holds(send_ring_.slot(lent), geometry_.slot_size) || link_->sending(lent)) {
    // Our last message from slot `lent` has not left: the client cannot
    // have read it, so it cannot be lending the slot.  Building the stream
    // message there would overwrite the one still queued.
    return protocol_error(fmt::format("slot {} lent to a stream before our message in it was sent", lent));
  }
  Slot& s = slots_[owner];
  if (s.state != SlotState::kRunning || !s.streaming || s.request_id != h.request_id) {
    // The stream ended while this grant was on its way: the client takes
    // the slot back when it reads the final reply.
    return;
  }
  granted_to_[lent] = static_cast<int32_t>(owner);
  grant_generation_[lent] = h.generation;
  s.grants.push_back(lent);
  wake_writer(s);
}

void ServerSession::release_grants(uint16_t call_slot) {
  Slot& s = slots_[call_slot];
  for (size_t i = s.grant_head; i < s.grants.size(); ++i) granted_to_[s.grants[i]] = -1;
  s.grants.clear();
  s.grant_head = 0;
}

bool ServerSession::StreamWriter::write(
    const std::function<void(flatbuffers::FlatBufferBuilder&)>& build, Status* error) {
  ServerSession& ss = *session_;
  Slot& s = ss.slots_[slot_];
  for (;;) {
    if (ss.closed_) {
      *error = Status(StatusCode::kUnavailable, "session closed");
      return false;
    }
    if (s.cancelled) {
      *error = ss.cancel_status(s);
      return false;
    }
    if (s.grant_head < s.grants.size()) break;
    if (base::FiberPool::current() == nullptr) {
      *error = Status(StatusCode::kInternal, "ServerWriter used outside its handler");
      return false;
    }
    // No credit: the client has not read enough yet.  Wait for a grant.
    s.waiter = base::FiberPool::current();
    base::FiberPool::suspend();
  }
  const uint16_t lent = s.grants[s.grant_head++];
  if (s.grant_head == s.grants.size()) {
    s.grants.clear();
    s.grant_head = 0;
  }
  SlotBuilder& b = *ss.builders_[lent];
  b.Clear();
  // On any failure the grant stays unused: give it back to the stream.
  auto unuse = [&] {
    b.recover();
    s.grants.insert(s.grants.begin() + static_cast<std::ptrdiff_t>(s.grant_head), lent);
  };
  Status failure;
  try {
    build(b);
  } catch (const SlotOverflow& o) {
    failure = Status(StatusCode::kResourceExhausted,
                     fmt::format("the server's stream message, at least {} bytes, does not fit a slot ({} "
                                 "bytes of payload); raise slot_size (SLOTRPC_SLOT_SIZE)",
                                 o.at_least(), b.payload_capacity()));
  } catch (...) {
    unuse();  // the handler's exception continues to run_handler
    throw;
  }
  if (failure.ok() && !b.is_finished()) {
    failure = Status(StatusCode::kInternal, "stream message was not finished");
  }
  if (!failure.ok()) {
    unuse();
    *error = failure;
    return false;
  }
  ss.granted_to_[lent] = -1;  // consumed; the client lends it again once read
  Header h;
  h.flags = static_cast<uint8_t>(Kind::kStreamMessage);
  h.request_id = s.request_id;
  h.slot = lent;
  h.generation = ss.grant_generation_[lent];
  h.payload_len = b.GetSize();
  std::byte* msg = b.message_begin();
  encode_header(h, msg);
  ss.owner_counters().server.calls.bytes_out += kHeaderSize + h.payload_len;
  if (s.counters != nullptr) s.counters->bytes_out += kHeaderSize + h.payload_len;
  ss.outbox_.add_slot_message(msg, static_cast<uint32_t>(kHeaderSize + h.payload_len), lent,
                              h.generation);
  ss.loop_.request_flush(&ss);
  return true;
}

}  // namespace slotrpc::core

namespace slotrpc::core {

Status ServerSession::cancel_status(const Slot& s) const {
  if (s.cancel_code == StatusCode::kDeadlineExceeded)
    return Status(StatusCode::kDeadlineExceeded, "the client's deadline passed");
  return Status(StatusCode::kCancelled, "the client cancelled the call");
}

// A message of a client stream in slot j (not the call's slot): queued for
// the handler's reader, in order.  Hot path: no allocation (the FIFO is
// linked through in_next_), no lock.
void ServerSession::on_client_message(const transport::Completion& c, const Header& h) {
  const uint16_t j = h.slot;
  if (imm_generation(c.imm) != static_cast<uint16_t>(h.generation)) {
    return protocol_error(fmt::format("slot {}: immediate and header disagree on the generation", j));
  }
  const uint32_t owner = h.method_id;
  if (owner >= geometry_.slot_count || owner == j) {
    return protocol_error(fmt::format("client stream message in slot {} names call slot {}", j, owner));
  }
  if (slots_[j].state != SlotState::kIdle || granted_to_[j] >= 0 || in_owner_[j] >= 0) {
    return protocol_error(fmt::format("client stream message written into slot {} while it is in use", j));
  }
  owner_counters().server.calls.bytes_in += c.length;
  Slot& s = slots_[owner];
  if (s.state != SlotState::kRunning || !s.client_stream || s.request_id != h.request_id) {
    // The call ended (its final message crossed this one): the message is
    // dropped, but acknowledged like any other, which gives the client
    // its slot back.
    link_->arm(j);
    return send_control(Kind::kStreamAck, j, h.generation, h.request_id, owner);
  }
  if (s.half_closed) {
    return protocol_error(fmt::format("client stream message in slot {} after the half-close", j));
  }
  if (s.counters != nullptr) s.counters->bytes_in += c.length;
  in_owner_[j] = static_cast<int32_t>(owner);
  in_next_[j] = -1;
  in_generation_[j] = h.generation;
  in_len_[j] = h.payload_len;
  if (s.in_tail >= 0) in_next_[static_cast<size_t>(s.in_tail)] = j; else s.in_head = j;
  s.in_tail = j;
  wake_writer(s);  // the handler's fiber, if it waits in Read()
}

void ServerSession::on_half_close(const Header& h) {
  if (h.slot >= slots_.size()) return;
  Slot& s = slots_[h.slot];
  // A half-close may cross the call's end on the wire: then it is moot.
  if (s.state != SlotState::kRunning || !s.client_stream || s.request_id != h.request_id ||
      s.generation != h.generation) {
    return;
  }
  s.half_closed = true;
  wake_writer(s);
}

// The handler is done with the client message in `slot`: the slot may be
// written again, and the client learns so.
void ServerSession::ack_inbound(uint16_t slot) {
  const auto owner = static_cast<uint16_t>(in_owner_[slot]);
  in_owner_[slot] = -1;
  link_->arm(slot);
  send_control(Kind::kStreamAck, slot, in_generation_[slot], slots_[owner].request_id, owner);
}

void ServerSession::release_inbound(uint16_t call_slot) {
  Slot& s = slots_[call_slot];
  if (s.in_held >= 0) ack_inbound(static_cast<uint16_t>(s.in_held));
  s.in_held = -1;
  while (s.in_head >= 0) {
    const auto j = static_cast<uint16_t>(s.in_head);
    s.in_head = in_next_[j];
    ack_inbound(j);
  }
  s.in_tail = -1;
}

// ServerReader::Read() on the handler's fiber.  Hot path: releasing the
// previous message and taking the next are array operations; the fiber
// suspends only when nothing has arrived yet.
bool ServerSession::read_inbound(::slotrpc::detail::InboundStream* in_base,
                                 std::span<const std::byte>* msg, Status* status) {
  auto* in = static_cast<Inbound*>(in_base);
  ServerSession& ss = *in->session;
  Slot& s = ss.slots_[in->slot];
  if (s.in_held >= 0) {
    ss.ack_inbound(static_cast<uint16_t>(s.in_held));
    s.in_held = -1;
  }
  for (;;) {
    if (ss.closed_) {
      *status = Status(StatusCode::kUnavailable, "session closed");
      return false;
    }
    if (s.cancelled) {
      *status = ss.cancel_status(s);
      return false;
    }
    if (s.in_invalid) {
      *status = Status(StatusCode::kInvalidArgument, "a client stream message failed verification");
      return false;
    }
    if (s.in_head >= 0) {
      const auto j = static_cast<uint16_t>(s.in_head);
      s.in_head = ss.in_next_[j];
      if (s.in_head < 0) s.in_tail = -1;
      s.in_held = j;
      const std::byte* bytes = ss.recv_ring_.slot(j) + kHeaderSize;
      const uint32_t len = ss.in_len_[j];
      if (in->verify != nullptr && !in->verify(reinterpret_cast<const uint8_t*>(bytes), len)) {
        s.in_invalid = true;
        continue;
      }
      *msg = {bytes, len};
      return true;
    }
    if (s.half_closed) {
      *status = Status();
      return false;
    }
    if (base::FiberPool::current() == nullptr) {
      *status = Status(StatusCode::kInternal, "ServerReader used outside its handler");
      return false;
    }
    s.read_waiter = base::FiberPool::current();
    base::FiberPool::suspend();
  }
}

}  // namespace slotrpc::core
