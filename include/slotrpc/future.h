// Future<T>: the result of an asynchronous call.
//
// get() blocks a plain thread (spinning first for about as long as its
// recent calls took, then asleep); called inside a handler (which runs on a
// fiber of a server's event loop) it suspends only that fiber, and the loop
// keeps serving other requests until the result arrives.  That is how a
// handler calls another service without blocking its server.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "slotrpc/export.h"

namespace slotrpc {

}  // namespace slotrpc

#include "slotrpc/detail/shared_state.h"

namespace slotrpc {

template <class T>
class Future {
 public:
  Future() = default;
  explicit Future(std::shared_ptr<detail::SharedState<T>> state) : state_(std::move(state)) {}

  bool valid() const { return state_ != nullptr; }
  // A plain acquire load: cheap to poll, and never delays the result.
  bool ready() const { return state_->ready(); }
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
    // In double nanoseconds first: a timeout of hours::max() must not wrap.
    const double ns = std::chrono::duration<double, std::nano>(timeout).count();
    constexpr double kMaxNs = 1e18;  // about 31 years: "forever"
    return state_->wait_for_ns(ns <= 0 ? 0 : ns >= kMaxNs ? static_cast<int64_t>(kMaxNs) : static_cast<int64_t>(ns));
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
