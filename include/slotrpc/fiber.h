// Helpers for code running in a handler fiber.
#pragma once

#include <chrono>
#include <functional>

#include "slotrpc/export.h"

namespace slotrpc::this_fiber {

// Inside a handler: suspends only this fiber for `duration` (the event loop
// keeps serving).  On a plain thread: std::this_thread::sleep_for.
SLOTRPC_API void sleep_for(std::chrono::nanoseconds duration);

// True when called from a handler fiber.
SLOTRPC_API bool in_fiber();

// Inside a handler: runs `fn` on a new fiber of the same event loop, soon
// (from the loop, not nested in this fiber).  False, and `fn` is dropped,
// outside a handler fiber.  The handler must outlive what `fn` uses: e.g.
// a bidi handler whose reader fiber reads the stream waits for it to finish
// (a slotrpc::Notifier) before it returns.
SLOTRPC_API bool spawn(std::function<void()> fn);

}  // namespace slotrpc::this_fiber
