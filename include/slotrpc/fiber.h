// Helpers for code running in a handler fiber.
#pragma once

#include <chrono>

namespace slotrpc::this_fiber {

// Inside a handler: suspends only this fiber for `duration` (the event loop
// keeps serving).  On a plain thread: std::this_thread::sleep_for.
void sleep_for(std::chrono::nanoseconds duration);

// True when called from a handler fiber.
bool in_fiber();

}  // namespace slotrpc::this_fiber
