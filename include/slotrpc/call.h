// Types shared by every kind of call.
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>

#include "slotrpc/reply.h"

namespace slotrpc {

using Clock = std::chrono::steady_clock;

// Builds the request FlatBuffer and calls Finish().  It runs on the
// channel's event loop as soon as a slot is free, writing straight into the
// registered send slot (zero copy) - possibly after call() returned, so
// capture by value what it needs.  A request larger than the slot throws
// inside the builder; the call then fails with RESOURCE_EXHAUSTED and
// nothing is sent.
using RequestWriter = std::function<void(flatbuffers::FlatBufferBuilder&)>;

// Receives the outcome of a call on the channel's event loop.  Keep the
// RawReply (move it) to read it later; drop it to free its slot at once.
using ReplySink = std::function<void(RawReply&&)>;

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

  static CallOptions with_timeout(std::chrono::nanoseconds timeout) {
    CallOptions o;
    o.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout);
    return o;
  }
};

}  // namespace slotrpc
