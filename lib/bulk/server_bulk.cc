#include "bulk/server_bulk.h"

#include <fmt/format.h>

#include <algorithm>

#include "bulk/call_exposure.h"
#include "bulk/registration_cache.h"
#include "reactor/fiber_pool.h"

namespace slotrpc::bulk {

void ServerCallBulk::begin(const RequestBlock& block) {
  block_ = block;
  written_.fill(0);
  active_ = true;
}

uint64_t ServerCallBulk::length(bool incoming, size_t i) const {
  if (incoming) return i < block_.reads ? block_.read(i).length : 0;
  return i < block_.writes ? block_.write(i).length : 0;
}

void ServerCallBulk::on_done(uint64_t token, uint16_t status) {
  if (!pending_ || token != token_) return;  // not ours (a stale token)
  pending_ = false;
  status_ = status;
  if (waiter_ != nullptr) {
    loop_.make_ready(waiter_);
    waiter_ = nullptr;
  }
}

Status ServerCallBulk::transfer(bool incoming, size_t i, const BulkSegment& local,
                                uint64_t offset) {
  const char* op = incoming ? "read_bulk" : "write_bulk";
  if (!active_)
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("{}: the call is over (bulk segments live as long as their handler)", op));
  const size_t n = count(incoming);
  if (i >= n)
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("{}: no {} bulk segment {} (the call has {})", op,
                              incoming ? "incoming" : "outgoing", i, n));
  const transport::RemoteSegment& seg = incoming ? block_.read(i) : block_.write(i);
  const uint64_t len = local.length;
  if (offset > seg.length || len > seg.length - offset) {
    if (incoming)
      return Status(StatusCode::kInvalidArgument,
                    fmt::format("read_bulk: {} bytes at offset {} of incoming segment {}, which "
                                "holds {} bytes",
                                len, offset, i, seg.length));
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("write_bulk: {} bytes at offset {} do not fit the client's "
                              "destination {}, which holds {} bytes",
                              len, offset, i, seg.length));
  }
  if (len == 0) return {};
  if (Status st = check_segment(local, incoming ? "read_bulk's destination" : "write_bulk's source");
      !st.ok())
    return st;
  if (*closed_) return Status(StatusCode::kUnavailable, fmt::format("{}: the session is closed", op));
  if (reactor::FiberPool::current() == nullptr)
    return Status(StatusCode::kInternal, fmt::format("{} used outside its handler", op));
  auto r = resolve(link_, local);
  if (!r.ok()) return r.status();
  token_ = (uint64_t{slot_} << 48) | (++seq_ & ((uint64_t{1} << 48) - 1));
  pending_ = true;
  Status started = incoming ? link_.read(r.value().registration, r.value().offset, seg, offset, len, token_)
                            : link_.write(r.value().registration, r.value().offset, seg, offset, len, token_);
  if (!started.ok()) {
    pending_ = false;
    RegistrationCache::instance().release(r.value().lease);
    return started;
  }
  // The link reports every transfer exactly once, a failed link too (before
  // its kLinkDown), so this wait always ends.
  while (pending_) {
    waiter_ = reactor::FiberPool::current();
    reactor::FiberPool::suspend();
  }
  RegistrationCache::instance().release(r.value().lease);
  const auto code = static_cast<StatusCode>(status_);
  if (code == StatusCode::kOk) {
    if (!incoming) written_[i] = std::max(written_[i], offset + len);
    return {};
  }
  if (code == StatusCode::kInvalidArgument)
    return Status(code, fmt::format("{} of segment {}: the client's memory refused the transfer "
                                    "(its call ended and the segment was revoked)",
                                    op, i));
  if (code == StatusCode::kUnavailable)
    return Status(code, fmt::format("{} of segment {}: the session was lost during the transfer", op, i));
  return Status(code, fmt::format("{} of segment {} failed", op, i));
}

}  // namespace slotrpc::bulk
