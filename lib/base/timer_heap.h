// Deadline timers of one reactor: a binary min-heap over a slab of entries.
//
// Why our own heap and not std::priority_queue (or Asio's timer queue):
// adding and cancelling happen once per call (every call with a deadline
// arms one, and nearly every call completes before its deadline, so nearly
// every timer is cancelled). That needs two things the standard heap cannot
// give: cancel must remove the entry at once, in O(log n), so memory tracks
// the live timers rather than call rate x deadline (lazy deletion kept
// cancelled nodes until their deadline: 5 million add+cancel pairs with 60 s
// deadlines held millions of dead nodes); and neither operation may allocate
// in steady state. So each slab entry remembers its position in the heap
// (the idea Boost.Asio's timer_queue uses; the code is ours), entries are
// recycled through a free list, and the heap and slab vectors only grow to
// the peak number of live timers.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace slotrpc::base {

using Clock = std::chrono::steady_clock;

class TimerHeap {
 public:
  using Callback = void (*)(void* ctx, uint64_t arg);

  // A handle; 0 is "no timer". Holds the slab index and the entry's
  // generation, so a stale id (its timer fired or was cancelled and the
  // entry reused) cancels nothing.
  using TimerId = uint64_t;

  TimerId add(Clock::time_point when, Callback cb, void* ctx, uint64_t arg);
  // Removes the timer from the heap now. Safe with a stale or zero id.
  void cancel(TimerId id);
  // Runs every timer due at `now`; callbacks may add or cancel timers.
  void run_expired(Clock::time_point now);
  // Earliest live deadline, or time_point::max().
  Clock::time_point next_deadline() const;
  size_t live() const { return heap_.size(); }
  // Nodes in the heap: equal to live(), kept separate so a test can watch
  // the structure itself rather than the counter.
  size_t heap_nodes() const { return heap_.size(); }
  // Slab entries ever created: the peak number of live timers, never the
  // number of timers added.
  size_t slab_size() const { return slab_.size(); }

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  struct Entry {
    Callback cb = nullptr;
    void* ctx = nullptr;
    uint64_t arg = 0;
    uint32_t generation = 0;
    uint32_t heap_pos = kNone;  // kNone: not armed (free or firing)
    uint32_t next_free = kNone;
  };
  // The deadline is copied into the node so sifting compares within the
  // heap array without touching the slab.
  struct Node {
    Clock::time_point when;
    uint32_t index;
  };
  static TimerId make_id(uint32_t index, uint32_t generation) {
    return (uint64_t{generation} << 32) | (uint64_t{index} + 1);
  }
  void place(uint32_t pos, const Node& node) {
    heap_[pos] = node;
    slab_[node.index].heap_pos = pos;
  }
  void sift_up(uint32_t pos);
  void sift_down(uint32_t pos);
  void remove_at(uint32_t pos);
  void release(uint32_t index);

  std::vector<Entry> slab_;
  std::vector<Node> heap_;
  uint32_t free_head_ = kNone;
};

}  // namespace slotrpc::base
