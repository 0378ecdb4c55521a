// Types shared by every kind of call.
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "slotrpc/memory.h"
#include "slotrpc/metadata.h"
#include "slotrpc/raw.h"
#include "slotrpc/reply.h"

namespace slotrpc {

using Clock = std::chrono::steady_clock;

// RequestWriter and ReplySink, what every call is made of underneath, are
// the raw call's types (raw.h).

// One bulk attachment (docs/design.md, "Bulk payloads"):
// `length` bytes at `offset` of a registered region, or of memory not
// registered beforehand (`region` empty, `address` set), which the
// registration cache registers at its first use and keeps for the next.
// The bytes stay where they are: the slot carries only a descriptor, and
// the peer reads or writes the range once, NIC to NIC on verbs.  The
// memory must stay valid until the call has completed.
struct BulkSegment {
  MemoryRegion region;
  std::byte* address = nullptr;  // unregistered memory (when `region` is empty)
  size_t offset = 0;             // into `region`
  size_t length = 0;

  static BulkSegment of(const MemoryRegion& region, size_t offset, size_t length) {
    BulkSegment s;
    s.region = region;
    s.offset = offset;
    s.length = length;
    return s;
  }
  static BulkSegment of(std::span<std::byte> memory) {
    BulkSegment s;
    s.address = memory.data();
    s.length = memory.size();
    return s;
  }
};

// At most this many bulk segments per call and direction.
inline constexpr size_t kMaxBulkSegments = 16;

struct CallOptions {
  // Absolute deadline; none by default.  A call still unanswered then fails
  // with DEADLINE_EXCEEDED (whether it was queued or sent), and the server
  // is told to cancel it.
  std::optional<Clock::time_point> deadline;

  // Server streaming: how many messages the server may have in flight
  // (slots lent to the stream).  0 = Config::stream_window.
  uint32_t stream_window = 0;

  // Retry on UNAVAILABLE, reconnecting the channel, up to this many extra
  // attempts -- honoured only for methods marked idempotent (generated
  // code sets `idempotent`).  0 = never retry.
  uint32_t max_retries = 0;
  bool idempotent = false;

  // The method's full name ("pkg.Service.Method"), a string that outlives
  // the call (a literal).  Generated clients set it from their descriptor;
  // the client's own statuses then name the method ("call to
  // pkg.Service/Method exceeded its deadline of 10 ms ..."), as do its
  // per-method metrics.  Null (raw calls): they name the method id.
  const char* method_name = nullptr;

  // Bulk attachments of a unary call.  `send_bulk` offers
  // request data the handler pulls with ServerCall::read_bulk(i);
  // `receive_bulk` offers destinations the handler fills with
  // ServerCall::write_bulk(i) before it replies (RawReply::bulk_received
  // says how much landed).  Exposed to this call's server only, and only
  // until the call completes (reply, error, cancel, deadline, lost
  // session); the call completes only once the ranges are unreachable.
  // At most kMaxBulkSegments each; the sum of all lengths at most
  // Config::max_bulk_bytes (SLOTRPC_MAX_BULK_BYTES).
  std::vector<BulkSegment> send_segments;
  std::vector<BulkSegment> receive_segments;

  CallOptions& send_bulk(const MemoryRegion& region, size_t offset, size_t length) {
    send_segments.push_back(BulkSegment::of(region, offset, length));
    return *this;
  }
  // Read-only to the server; const only in spirit for the registration.
  CallOptions& send_bulk(std::span<const std::byte> memory) {
    send_segments.push_back(BulkSegment::of(
        std::span<std::byte>(const_cast<std::byte*>(memory.data()), memory.size())));
    return *this;
  }
  CallOptions& receive_bulk(const MemoryRegion& region, size_t offset, size_t length) {
    receive_segments.push_back(BulkSegment::of(region, offset, length));
    return *this;
  }
  CallOptions& receive_bulk(std::span<std::byte> memory) {
    receive_segments.push_back(BulkSegment::of(memory));
    return *this;
  }

  // Call metadata (slotrpc/metadata.h): sent with the request, read by the
  // server's interceptors and handler (ServerCall::metadata).  A server
  // that predates metadata fails such a call with UNIMPLEMENTED.
  Metadata metadata;
  CallOptions& add_metadata(std::string key, std::string value) {
    metadata.emplace_back(std::move(key), std::move(value));
    return *this;
  }

  static CallOptions with_timeout(std::chrono::nanoseconds timeout) {
    CallOptions o;
    o.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout);
    return o;
  }
};

}  // namespace slotrpc
