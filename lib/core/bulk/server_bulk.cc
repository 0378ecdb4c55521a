#include "core/bulk/server_bulk.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "core/bulk/call_exposure.h"
#include "core/bulk/registration_cache.h"
#include "base/fiber_pool.h"

namespace slotrpc::bulk {

void ServerCallBulk::begin(const RequestBlock& block) {
  block_ = block;
  written_.fill(0);
  moved_.fill(0);
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

// One transfer: started on the link, then this fiber waits for its
// kBulkDone.  The link reports every transfer exactly once, a failed link
// too (before its kLinkDown), so the wait always ends: by itself, or once
// on_timeout closed the session.
uint16_t ServerCallBulk::move(bool incoming, size_t index, const transport::BulkRegistration& local,
                              size_t local_offset, const transport::RemoteSegment& seg,
                              uint64_t remote_offset, uint64_t length, Status* start_error) {
  token_ = (uint64_t{slot_} << 48) | (++seq_ & ((uint64_t{1} << 48) - 1));
  pending_ = true;
  Status started = incoming ? link_.read(local, local_offset, seg, remote_offset, length, token_)
                            : link_.write(local, local_offset, seg, remote_offset, length, token_);
  if (!started.ok()) {
    pending_ = false;
    *start_error = std::move(started);
    return static_cast<uint16_t>(start_error->code());
  }
  op_ = incoming ? "read_bulk" : "write_bulk";
  index_ = index;
  const auto bound = deadline_.has_value()
                         ? *deadline_ + kRevokeGrace
                         : std::chrono::steady_clock::now() + std::chrono::milliseconds(bulk_timeout_ms_);
  // Cancelled however the wait ends (a server being destroyed unwinds this
  // fiber from suspend()).
  struct Timer {
    base::TimerHeap& heap;
    base::TimerHeap::TimerId id;
    ~Timer() { heap.cancel(id); }
  } timer{loop_.timers(), loop_.timers().add(bound, &ServerCallBulk::on_timeout, this, token_)};
  while (pending_) {
    waiter_ = base::FiberPool::current();
    base::FiberPool::suspend();
  }
  return status_;
}

void ServerCallBulk::on_timeout(void* self_ptr, uint64_t token) {
  auto* self = static_cast<ServerCallBulk*>(self_ptr);
  if (!self->pending_ || token != self->token_ || *self->closed_) return;
  self->timed_out_ = true;
  // The link ends the transfer (kBulkDone, UNAVAILABLE) as it goes down.
  self->close_(self->close_ctx_,
               fmt::format("{} of bulk segment {} not complete by {}: the client did not answer",
                           self->op_, self->index_, self->bound_text()));
}

std::string ServerCallBulk::bound_text() const {
  if (deadline_.has_value())
    return fmt::format("the call's deadline (+{} ms)", kRevokeGrace.count());
  return fmt::format("{} ms (SLOTRPC_BULK_TIMEOUT_MS; the call has no deadline)", bulk_timeout_ms_);
}

Status ServerCallBulk::transfer(bool incoming, size_t i, std::span<const BulkSegment> pieces,
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
  uint64_t len = 0;
  for (const BulkSegment& p : pieces) {
    if (p.length > UINT64_MAX - len)
      return Status(StatusCode::kInvalidArgument, fmt::format("{}: the pieces' lengths overflow", op));
    len += p.length;
  }
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
  for (const BulkSegment& p : pieces) {
    if (p.length == 0) continue;
    if (Status st = check_segment(p, incoming ? "read_bulk's destination" : "write_bulk's source");
        !st.ok())
      return st;
  }
  if (*closed_) return Status(StatusCode::kUnavailable, fmt::format("{}: the session is closed", op));
  if (deadline_.has_value() && std::chrono::steady_clock::now() >= *deadline_)
    return Status(StatusCode::kDeadlineExceeded,
                  fmt::format("{}: the call's deadline has passed", op));
  if (base::FiberPool::current() == nullptr)
    return Status(StatusCode::kInternal, fmt::format("{} used outside its handler", op));

  // Runs of pieces contiguous in memory and in one registration become one
  // transfer each (the link splits it only at the path's largest message).
  // A piece inside the registration of the run before it needs no lookup
  // in the registration cache: the run's lease covers it.
  RegistrationCache& cache = RegistrationCache::instance();
  std::vector<uint64_t> leases;
  transport::BulkRegistration reg{};
  size_t run_offset = 0;  // of the current run, in `reg`
  uint64_t run_len = 0;
  uint64_t remote = offset;
  uint16_t code = 0;
  timed_out_ = false;
  Status start_error;
  auto flush = [&]() {
    if (run_len == 0) return true;
    code = move(incoming, i, reg, run_offset, seg, remote, run_len, &start_error);
    if (code == static_cast<uint16_t>(StatusCode::kOk)) moved_[incoming ? 1 : 0] += run_len;
    remote += run_len;
    run_len = 0;
    return code == static_cast<uint16_t>(StatusCode::kOk);
  };
  bool ok = true;
  for (const BulkSegment& p : pieces) {
    if (p.length == 0) continue;
    const std::byte* first = p.region.impl() != nullptr ? p.region.data() + p.offset : p.address;
    const bool inside = reg.base != nullptr && first >= reg.base &&
                        static_cast<size_t>(first - reg.base) <= reg.length &&
                        p.length <= reg.length - static_cast<size_t>(first - reg.base);
    if (inside && run_len != 0 && first == reg.base + run_offset + run_len) {
      run_len += p.length;  // adjacent: the run grows
      continue;
    }
    if (!(ok = flush())) break;
    if (inside) {
      run_offset = static_cast<size_t>(first - reg.base);
      run_len = p.length;
      continue;
    }
    auto r = resolve(link_, p);
    if (!r.ok()) {
      start_error = r.status();
      code = static_cast<uint16_t>(r.status().code());
      ok = false;
      break;
    }
    leases.push_back(r.value().lease);
    reg = r.value().registration;
    run_offset = r.value().offset;
    run_len = p.length;
  }
  if (ok) ok = flush();
  for (uint64_t lease : leases) cache.release(lease);
  if (!start_error.ok()) return start_error;
  if (ok) {
    if (!incoming) written_[i] = std::max(written_[i], offset + len);
    return {};
  }
  if (timed_out_)
    return Status(StatusCode::kDeadlineExceeded,
                  fmt::format("{} of segment {}: the client did not complete the transfer by {}; "
                              "the session was closed",
                              op, i, bound_text()));
  // UNAVAILABLE is also what the link reports for a transfer it ended as it
  // went down: only then was the session lost.
  if (code == static_cast<uint16_t>(StatusCode::kUnavailable) &&
      (*closed_ || !link_.down_reason().empty()))
    return Status(StatusCode::kUnavailable,
                  fmt::format("{} of segment {}: the session was lost during the transfer ({})", op,
                              i, link_.down_reason().empty() ? "closed" : link_.down_reason()));
  if (code == static_cast<uint16_t>(StatusCode::kInvalidArgument))
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("{} of segment {}: the client's memory refused the transfer "
                              "(its call ended and the segment was revoked)",
                              op, i));
  // The client ended the transfer itself, with a status of its own (TCP and
  // shm: a failed READ_DATA).  A code this server does not know reaches the
  // handler as UNAVAILABLE (docs/protocol.md), but the text says what came.
  if (!is_known_status_code(code))
    return Status(StatusCode::kUnavailable,
                  fmt::format("{} of segment {}: the client ended the transfer with status {}{}, "
                              "which is no status code this server knows",
                              op, i, code, code == UINT16_MAX ? " or above" : ""));
  const auto status = static_cast<StatusCode>(code);
  return Status(status, fmt::format("{} of segment {}: the client ended the transfer with status {}",
                                    op, i, status_code_name(status)));
}

}  // namespace slotrpc::bulk
