// Deadline timers of one reactor: a binary min-heap over a slab of entries.
//
// Adding and cancelling happen once per call (every call with a deadline
// arms one), so neither allocates in steady state: entries live in a slab
// with a free list, and cancelling bumps the entry's generation so its heap
// node is skipped when it surfaces (lazy deletion).
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

namespace slotrpc::reactor {

using Clock = std::chrono::steady_clock;

class TimerHeap {
 public:
  using Callback = void (*)(void* ctx, uint64_t arg);

  // A handle; 0 is "no timer".
  using TimerId = uint64_t;

  TimerId add(Clock::time_point when, Callback cb, void* ctx, uint64_t arg);
  // Safe with a stale or zero id.
  void cancel(TimerId id);
  // Runs every timer due at `now`; callbacks may add or cancel timers.
  void run_expired(Clock::time_point now);
  // Earliest live deadline, or time_point::max().
  Clock::time_point next_deadline();
  size_t live() const { return live_; }

 private:
  struct Entry {
    Callback cb = nullptr;
    void* ctx = nullptr;
    uint64_t arg = 0;
    uint32_t generation = 0;
    bool armed = false;
    uint32_t next_free = 0;
  };
  struct Node {
    Clock::time_point when;
    uint32_t index;
    uint32_t generation;
    bool operator>(const Node& o) const { return when > o.when; }
  };
  static TimerId make_id(uint32_t index, uint32_t generation) {
    return (uint64_t{generation} << 32) | (index + 1);
  }
  void drop_stale_top();
  void release(uint32_t index);

  std::vector<Entry> slab_;
  std::vector<Node> heap_;
  uint32_t free_head_ = UINT32_MAX;
  size_t live_ = 0;
};

}  // namespace slotrpc::reactor
