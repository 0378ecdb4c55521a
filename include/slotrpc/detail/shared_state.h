// The state a Future and a stream share with the library: waiting on a
// thread or on a handler's fiber.
// Included by slotrpc/future.h; no program needs to include it or use its
// names, which may change between versions.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
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

// A result's readiness as one word, so that a waiting thread, ready() and
// the producer never meet on a lock (lib/rpc/future.cc has the protocol):
// kReady is set once, with release order, after the value is in place;
// kSleeper is set by a thread before it sleeps on the word (a futex), and
// only then does the producer pay for a wake-up system call.
inline constexpr uint32_t kWordReady = 1;
inline constexpr uint32_t kWordSleeper = 2;
// Thread (not fiber): returns once `word` has kReady.  Runs the turns of
// the event loop its last call went through while that loop lets it
// (lib/reactor/caller_turns.cc), else spins for a time learned from this
// thread's recent waits; then sleeps.
SLOTRPC_API void wait_word(std::atomic<uint32_t>* word);
// Thread: a not-ready Future::ready() runs one turn of that loop, when it
// can without waiting, so that polling ready() makes progress.
SLOTRPC_API void poll_progress();
// Thread: as wait_word(), for at most `timeout_ns` (no spin); true if ready.
SLOTRPC_API bool wait_word_for(std::atomic<uint32_t>* word, int64_t timeout_ns);
// Producer: wakes every thread asleep on `word` (after it set kReady and
// saw kSleeper).
SLOTRPC_API void wake_word(std::atomic<uint32_t>* word);

template <class T>
struct SharedState {
  std::mutex mu;  // fibers, cancel, and value against a fiber that registers
  std::optional<T> value;
  std::vector<FiberWaiter> fibers;
  std::function<void()> cancel;  // set by the producer; safe from any thread
  std::atomic<uint32_t> word{0};  // kWordReady | kWordSleeper

  bool ready() const { return (word.load(std::memory_order_acquire) & kWordReady) != 0; }

  void set(T v) {
    std::vector<FiberWaiter> waiting;
    {
      std::lock_guard<std::mutex> lock(mu);
      value.emplace(std::move(v));
      waiting.swap(fibers);
      cancel = nullptr;
    }
    // Release: a thread that sees kReady sees the value.  A thread that
    // spins (or never waited) costs nothing here; only a sleeper a wake.
    if ((word.exchange(kWordReady, std::memory_order_acq_rel) & kWordSleeper) != 0) wake_word(&word);
    for (const FiberWaiter& w : waiting) wake_fiber(w);
  }

  void wait() {
    if (ready()) return;
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
    wait_word(&word);
  }
  // Thread only.
  bool wait_for_ns(int64_t timeout_ns) { return ready() || wait_word_for(&word, timeout_ns); }
  // Thread: ready(), and if not, one turn of the caller's loop first.
  bool poll() {
    if (ready()) return true;
    poll_progress();
    return ready();
  }
};

}  // namespace detail


}  // namespace slotrpc
