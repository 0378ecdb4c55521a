#include "reactor/timer_heap.h"

#include <algorithm>
#include <functional>

namespace slotrpc::reactor {

TimerHeap::TimerId TimerHeap::add(Clock::time_point when, Callback cb, void* ctx, uint64_t arg) {
  uint32_t index;
  if (free_head_ != UINT32_MAX) {
    index = free_head_;
    free_head_ = slab_[index].next_free;
  } else {
    index = static_cast<uint32_t>(slab_.size());
    slab_.emplace_back();
  }
  Entry& e = slab_[index];
  e.cb = cb;
  e.ctx = ctx;
  e.arg = arg;
  e.armed = true;
  heap_.push_back(Node{when, index, e.generation});
  std::push_heap(heap_.begin(), heap_.end(), std::greater<>());
  ++live_;
  return make_id(index, e.generation);
}

void TimerHeap::release(uint32_t index) {
  Entry& e = slab_[index];
  e.armed = false;
  ++e.generation;
  e.next_free = free_head_;
  free_head_ = index;
  --live_;
}

void TimerHeap::cancel(TimerId id) {
  if (id == 0) return;
  const uint32_t index = static_cast<uint32_t>(id & 0xffffffffu) - 1;
  const uint32_t generation = static_cast<uint32_t>(id >> 32);
  if (index >= slab_.size()) return;
  Entry& e = slab_[index];
  if (!e.armed || e.generation != generation) return;
  release(index);
}

void TimerHeap::drop_stale_top() {
  while (!heap_.empty()) {
    const Node& top = heap_.front();
    const Entry& e = slab_[top.index];
    if (e.armed && e.generation == top.generation) return;
    std::pop_heap(heap_.begin(), heap_.end(), std::greater<>());
    heap_.pop_back();
  }
}

void TimerHeap::run_expired(Clock::time_point now) {
  for (;;) {
    drop_stale_top();
    if (heap_.empty() || heap_.front().when > now) return;
    const Node top = heap_.front();
    std::pop_heap(heap_.begin(), heap_.end(), std::greater<>());
    heap_.pop_back();
    Entry& e = slab_[top.index];
    Callback cb = e.cb;
    void* ctx = e.ctx;
    uint64_t arg = e.arg;
    release(top.index);  // before the callback, which may add timers
    cb(ctx, arg);
  }
}

Clock::time_point TimerHeap::next_deadline() {
  drop_stale_top();
  return heap_.empty() ? Clock::time_point::max() : heap_.front().when;
}

}  // namespace slotrpc::reactor
