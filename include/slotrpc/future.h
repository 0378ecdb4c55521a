// Future<T>: the result of an asynchronous call.
//
// get() blocks a plain thread; called inside a handler (which runs on a
// fiber of a server's event loop) it suspends only that fiber, and the loop
// keeps serving other requests until the result arrives.  That is how a
// handler calls another service without blocking its server.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
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

template <class T>
class Future {
 public:
  Future() = default;
  explicit Future(std::shared_ptr<detail::SharedState<T>> state) : state_(std::move(state)) {}

  bool valid() const { return state_ != nullptr; }
  bool ready() const {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->value.has_value();
  }
  // Waits (thread or fiber), then moves the result out; valid() is false after.
  T get() {
    state_->wait();
    T out = std::move(*state_->value);
    state_.reset();
    return out;
  }
  // Thread only: waits up to `timeout`; true when ready.
  template <class Rep, class Period>
  bool wait_for(std::chrono::duration<Rep, Period> timeout) const {
    std::unique_lock<std::mutex> lock(state_->mu);
    return state_->cv.wait_for(lock, timeout, [&] { return state_->value.has_value(); });
  }
  // Asks the channel to cancel the call; it completes with CANCELLED unless
  // its result was already on its way.
  void cancel() {
    std::function<void()> fn;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      fn = state_->cancel;
    }
    if (fn) fn();
  }

 private:
  std::shared_ptr<detail::SharedState<T>> state_;
};

}  // namespace slotrpc
