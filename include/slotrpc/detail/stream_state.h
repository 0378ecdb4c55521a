// A server stream's messages as the client receives them.
// Included by slotrpc/typed.h; no program needs to include it or use its
// names, which may change between versions.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "slotrpc/detail/shared_state.h"
#include "slotrpc/reply.h"
#include "slotrpc/status.h"

namespace slotrpc {

namespace detail {
// Shared between the channel's loop (producer) and the reader (consumer).
struct StreamState {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<RawReply> messages;
  std::optional<Status> end;
  std::vector<FiberWaiter> fibers;
  std::function<void()> cancel;

  void push(RawReply&& m) {
    std::vector<FiberWaiter> waiting;
    {
      std::lock_guard<std::mutex> lock(mu);
      messages.push_back(std::move(m));
      waiting.swap(fibers);
    }
    cv.notify_all();
    for (const FiberWaiter& w : waiting) wake_fiber(w);
  }
  void finish(Status s) {
    std::vector<FiberWaiter> waiting;
    {
      std::lock_guard<std::mutex> lock(mu);
      end = std::move(s);
      waiting.swap(fibers);
      cancel = nullptr;
    }
    cv.notify_all();
    for (const FiberWaiter& w : waiting) wake_fiber(w);
  }
  // Next message, or nullopt at the end.  Thread or fiber.
  std::optional<RawReply> pop() {
    for (;;) {
      FiberWaiter self;
      const bool fiber = current_fiber(&self);
      {
        std::unique_lock<std::mutex> lock(mu);
        if (!fiber) cv.wait(lock, [&] { return !messages.empty() || end.has_value(); });
        if (!messages.empty()) {
          RawReply m = std::move(messages.front());
          messages.pop_front();
          return m;
        }
        if (end) return std::nullopt;
        fibers.push_back(self);
      }
      suspend_current_fiber();
    }
  }
};
}  // namespace detail


}  // namespace slotrpc
