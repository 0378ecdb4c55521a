// Future<T>: the result of an asynchronous call.
//
// get() blocks a plain thread (running the event loop's turns itself while
// it waits, where the loop lets it, else spinning briefly; then asleep);
// called inside a handler (which runs on a fiber of a server's event loop)
// it suspends only that fiber, and the loop keeps serving other requests
// until the result arrives.  That is how a handler calls another service
// without blocking its server.
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
  // An acquire load when ready.  When not, on a plain thread whose last
  // call went through a loop that lets callers run its turns, one turn of
  // that loop first: a thread that polls ready() delivers its own reply, as
  // get() does.
  bool ready() const { return state_->poll(); }
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
