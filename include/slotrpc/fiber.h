// Helpers for code running in a handler fiber.
#pragma once

#include <chrono>

#include "slotrpc/export.h"

namespace slotrpc::this_fiber {

// Inside a handler: suspends only this fiber for `duration` (the event loop
// keeps serving).  On a plain thread: std::this_thread::sleep_for.
SLOTRPC_API void sleep_for(std::chrono::nanoseconds duration);

// True when called from a handler fiber.
SLOTRPC_API bool in_fiber();

}  // namespace slotrpc::this_fiber
