// ClientSession: a call's bulk attachments (core/bulk/call_exposure.h):
// exposing its segments, and holding its end until every exposure is
// revoked.  The session's other parts: client_session.cc, client_calls.cc,
// client_streams.cc.
#include "core/client_session.h"

#include <utility>

#include "base/logging.h"

namespace slotrpc::core {

// Revokes the call's exposures.  True when kBulkDone completions must come
// first: `reply` is then held in the call until on_bulk_done finishes it.
// False when nothing is reachable any more (the leases are released): the
// caller completes the call itself.
bool ClientSession::hold_for_revoke(PendingCall* call, RawReply& reply) {
  if (call->exposure() == nullptr) return false;
  PendingCall::Extras& x = *call->extras;
  if (!closed_ && link_) {
    x.revokes_pending = x.exposure->revoke(*link_, call->request_id);
    if (x.revokes_pending > 0) {
      x.held = std::move(reply);
      revoking_.push_back(call);
      return true;
    }
  }
  x.exposure->release();
  return false;
}

void ClientSession::on_bulk_done(uint64_t token) {
  for (size_t i = 0; i < revoking_.size(); ++i) {
    PendingCall* call = revoking_[i];
    if (call->request_id != token) continue;
    if (--call->extras->revokes_pending != 0) return;
    revoking_.erase(revoking_.begin() + static_cast<std::ptrdiff_t>(i));
    call->extras->exposure->release();
    RawReply held = std::move(call->extras->held);  // finish() deletes the call
    return finish(call, std::move(held));
  }
}

// Registers and exposes the call's segments and writes their descriptors
// between the header and the FlatBuffer; `*block_bytes` is the block's
// size.  Nothing is exposed when a check fails.
Status ClientSession::expose_bulk(PendingCall* call, SlotBuilder& b, size_t* block_bytes) {
  // Before the block is sized (CallExposure::expose checks again).
  PendingCall::Extras& x = *call->extras;
  if (Status st = bulk::check_counts(x.send_bulk.size(), x.receive_bulk.size()); !st.ok())
    return st;
  const size_t block = bulk::request_block_bytes(x.send_bulk.size(), x.receive_bulk.size());
  const size_t flatbuffer_len = b.is_finished() ? b.GetSize() : 0;
  if (flatbuffer_len + block > b.payload_capacity()) {
    return Status(StatusCode::kResourceExhausted,
                  fmt::format("request of {} bytes plus its {}-byte bulk block does not fit a slot "
                              "({} bytes of payload)",
                              flatbuffer_len, block, b.payload_capacity()));
  }
  bulk::RequestBlock descriptors;
  x.exposure = std::make_unique<bulk::CallExposure>();
  Status st = x.exposure->expose(*link_, x.send_bulk, x.receive_bulk, max_bulk_bytes_,
                                     descriptors);
  if (!st.ok()) return st;
  std::byte* at = flatbuffer_len == 0 ? b.slot() + kHeaderSize
                                      : reinterpret_cast<std::byte*>(b.GetBufferPointer()) - block;
  bulk::encode_request_block(descriptors, at);
  *block_bytes = block;
  return {};
}

}  // namespace slotrpc::core
