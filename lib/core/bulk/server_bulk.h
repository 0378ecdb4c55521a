// The server's side of a call's bulk attachments: the segments
// a request offers, and the handler's read_bulk / write_bulk on them.
//
// One per call slot of a server session, made at the slot's first bulk
// request (a session that never sees one allocates nothing).  A transfer
// runs on the handler's fiber: it resolves the handler's memory through the
// registration cache, starts one Link::read or Link::write, and suspends
// the fiber until the link's kBulkDone for it arrives (the session routes
// it here by the slot in the token's top 16 bits).  The reactor thread
// never blocks, and other calls of the session go on meanwhile.
//
// The wait is bounded: a client that never answers (a TCP READ_REQ left
// unserved) would otherwise hold the handler for ever.  The bound is the
// call's deadline plus kRevokeGrace (a client ends its own transfers at its
// deadline, by revoking the segments; the grace lets that answer arrive),
// or bulk_timeout_ms (SLOTRPC_BULK_TIMEOUT_MS) from the transfer's start for
// a call without a deadline.  Past it the transfer cannot simply be
// abandoned: the link may still write into the handler's memory.  So the
// session is closed, which makes the link end every transfer it holds
// (before its kLinkDown), and the handler gets DEADLINE_EXCEEDED once its
// transfer has ended.
//
// Nothing here is on the small-call hot path.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "core/bulk/descriptors.h"
#include "core/loop.h"
#include "slotrpc/service.h"
#include "transport/transport.h"

namespace slotrpc::bulk {

class ServerCallBulk final : public ::slotrpc::detail::ServerBulk {
 public:
  // Closes the session (the bound passed): `ctx` is the session.
  using CloseFn = void (*)(void* ctx, std::string reason);
  // A compliant client's own end of a transfer at its deadline (a revoke)
  // reaches the server about one network delay after the server's copy of
  // that deadline; the session is closed only if nothing came by then.
  static constexpr std::chrono::milliseconds kRevokeGrace{1000};

  // `closed` is the session's flag: a transfer on a closed session fails
  // with UNAVAILABLE instead of starting.  `close(close_ctx, reason)`
  // closes the session when a transfer outlives its bound;
  // `bulk_timeout_ms` is that bound for calls without a deadline.
  ServerCallBulk(core::Loop& loop, transport::Link& link, uint16_t slot, const bool* closed,
                 CloseFn close, void* close_ctx, uint32_t bulk_timeout_ms)
      : loop_(loop), link_(link), slot_(slot), closed_(closed), close_(close),
        close_ctx_(close_ctx), bulk_timeout_ms_(bulk_timeout_ms) {}

  // A request with this block starts on the slot / its call has ended.
  void begin(const RequestBlock& block);
  void end() { active_ = false; }
  // The call's deadline, if the client sent one (before the handler runs).
  void set_deadline(std::optional<std::chrono::steady_clock::time_point> deadline) {
    deadline_ = deadline;
  }
  bool active() const { return active_; }

  // The reply's block: bytes written into each of the client's receive
  // segments (the end of the furthest write).
  std::span<const uint64_t> written() const { return {written_.data(), block_.writes}; }
  // Bytes the call's transfers moved so far (metrics): pulled from the
  // client's send segments, pushed into its receive segments.
  uint64_t bytes_read() const { return moved_[1]; }
  uint64_t bytes_written() const { return moved_[0]; }

  // kBulkDone of a transfer of this slot.
  void on_done(uint64_t token, uint16_t status);
  static uint16_t slot_of(uint64_t token) { return static_cast<uint16_t>(token >> 48); }

  size_t count(bool incoming) const override { return incoming ? block_.reads : block_.writes; }
  uint64_t length(bool incoming, size_t i) const override;
  Status transfer(bool incoming, size_t i, std::span<const BulkSegment> pieces,
                  uint64_t offset) override;

 private:
  // One Link::read or Link::write of `length` bytes at `local_offset` of
  // `local`, `remote_offset` into segment `seg`; waits for its kBulkDone.
  // Sets timed_out_ when the wait reached its bound.
  uint16_t move(bool incoming, size_t index, const transport::BulkRegistration& local,
                size_t local_offset, const transport::RemoteSegment& seg, uint64_t remote_offset,
                uint64_t length, Status* start_error);
  static void on_timeout(void* self, uint64_t token);
  // What the bound was, for messages: "the call's deadline (+1000 ms)" or
  // "30000 ms (SLOTRPC_BULK_TIMEOUT_MS; the call has no deadline)".
  std::string bound_text() const;

  core::Loop& loop_;
  transport::Link& link_;
  const uint16_t slot_;
  const bool* closed_;
  const CloseFn close_;
  void* const close_ctx_;
  const uint32_t bulk_timeout_ms_;
  std::optional<std::chrono::steady_clock::time_point> deadline_;
  RequestBlock block_;
  std::array<uint64_t, kMaxBulkSegments> written_{};
  bool active_ = false;
  std::array<uint64_t, 2> moved_{};  // [incoming]
  uint64_t seq_ = 0;
  // The transfer in progress (one at a time: the handler's fiber waits).
  uint64_t token_ = 0;
  bool pending_ = false;
  uint16_t status_ = 0;
  base::Fiber* waiter_ = nullptr;
  bool timed_out_ = false;
  const char* op_ = "";  // of the transfer in progress, for the time-out's reason
  size_t index_ = 0;
};

}  // namespace slotrpc::bulk
