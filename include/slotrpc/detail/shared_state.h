// The state a Future and a stream share with the library: waiting on a
// thread or on a handler's fiber.
// Included by slotrpc/future.h; no program needs to include it or use its
// names, which may change between versions.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "slotrpc/export.h"

namespace slotrpc {

namespace detail {

// A suspended fiber and the event loop it belongs to.
struct FiberWaiter {
  void* loop = nullptr;
  void* fiber = nullptr;
};
// True (and fills `out`) when the caller runs on an event-loop fiber.
SLOTRPC_API bool current_fiber(FiberWaiter* out);
// Suspends the calling fiber until wake_fiber() is called for it.
SLOTRPC_API void suspend_current_fiber();
// Any thread: makes a suspended fiber continue on its loop.
SLOTRPC_API void wake_fiber(const FiberWaiter& waiter);

template <class T>
struct SharedState {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<T> value;
  std::vector<FiberWaiter> fibers;
  std::function<void()> cancel;  // set by the producer; safe from any thread

  void set(T v) {
    std::vector<FiberWaiter> waiting;
    {
      std::lock_guard<std::mutex> lock(mu);
      value.emplace(std::move(v));
      waiting.swap(fibers);
      cancel = nullptr;
    }
    cv.notify_all();
    for (const FiberWaiter& w : waiting) wake_fiber(w);
  }

  void wait() {
    FiberWaiter self;
    if (current_fiber(&self)) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (value) return;
        fibers.push_back(self);
      }
      // The producer's wake is posted to our own loop, which cannot run it
      // before this fiber has suspended: no lost wake-up.
      suspend_current_fiber();
      return;
    }
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return value.has_value(); });
  }
};

}  // namespace detail


}  // namespace slotrpc
