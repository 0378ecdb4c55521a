// What a reactor knows of a session: how to hand it a completion and how to
// ask it to flush.  Plain function pointers instead of virtual functions:
// the reactor calls these once per message, and the pointer is fixed per
// session kind, so the call is a predictable indirect branch with no vtable
// load.
#pragma once

#include "transport/transport.h"

#include <chrono>

namespace slotrpc::core {

using Clock = std::chrono::steady_clock;

struct SessionBase {
  using CompletionFn = void (*)(SessionBase*, const transport::Completion&);
  using FlushFn = void (*)(SessionBase*);

  CompletionFn on_completion = nullptr;
  FlushFn flush = nullptr;
  bool flush_queued = false;  // owned by the reactor's flush list
  // When the peer was last heard (core/liveness.h).  A message marks the
  // session (Reactor::heard) and the reactor stamps this once the turn's
  // completions have all been handed out: one clock read per turn for all
  // sessions, not one per message, and never earlier than the handling of
  // what arrived.
  bool heard_queued = false;  // owned by the reactor's heard list
  Clock::time_point last_heard{};
};

}  // namespace slotrpc::core
