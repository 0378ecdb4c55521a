#include "base/timer_heap.h"

namespace slotrpc::base {

TimerHeap::TimerId TimerHeap::add(Clock::time_point when, Callback cb, void* ctx, uint64_t arg) {
  uint32_t index;
  if (free_head_ != kNone) {
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
  e.next_free = kNone;
  const auto pos = static_cast<uint32_t>(heap_.size());
  heap_.push_back(Node{when, index});  // no allocation once at peak size
  e.heap_pos = pos;
  sift_up(pos);
  return make_id(index, e.generation);
}

// Moves the node at `pos` towards the root while it is earlier than its parent.
void TimerHeap::sift_up(uint32_t pos) {
  const Node node = heap_[pos];
  while (pos > 0) {
    const uint32_t parent = (pos - 1) / 2;
    if (!(node.when < heap_[parent].when)) break;
    place(pos, heap_[parent]);
    pos = parent;
  }
  place(pos, node);
}

// Moves the node at `pos` towards the leaves while a child is earlier.
void TimerHeap::sift_down(uint32_t pos) {
  const Node node = heap_[pos];
  const auto n = static_cast<uint32_t>(heap_.size());
  for (;;) {
    uint32_t child = 2 * pos + 1;
    if (child >= n) break;
    if (child + 1 < n && heap_[child + 1].when < heap_[child].when) ++child;
    if (!(heap_[child].when < node.when)) break;
    place(pos, heap_[child]);
    pos = child;
  }
  place(pos, node);
}

// Takes the node at `pos` out of the heap: the last node fills the hole and
// moves up or down to where it belongs.
void TimerHeap::remove_at(uint32_t pos) {
  slab_[heap_[pos].index].heap_pos = kNone;
  const auto last = static_cast<uint32_t>(heap_.size() - 1);
  if (pos != last) {
    place(pos, heap_[last]);
    heap_.pop_back();
    if (pos > 0 && heap_[pos].when < heap_[(pos - 1) / 2].when) {
      sift_up(pos);
    } else {
      sift_down(pos);
    }
  } else {
    heap_.pop_back();
  }
}

void TimerHeap::release(uint32_t index) {
  Entry& e = slab_[index];
  ++e.generation;  // every id handed out for this entry is stale from now on
  e.next_free = free_head_;
  free_head_ = index;
}

void TimerHeap::cancel(TimerId id) {
  if (id == 0) return;
  const uint32_t index = static_cast<uint32_t>(id & 0xffffffffu) - 1;
  const uint32_t generation = static_cast<uint32_t>(id >> 32);
  if (index >= slab_.size()) return;
  Entry& e = slab_[index];
  if (e.heap_pos == kNone || e.generation != generation) return;
  remove_at(e.heap_pos);
  release(index);
}

void TimerHeap::run_expired(Clock::time_point now) {
  while (!heap_.empty() && !(now < heap_.front().when)) {
    const uint32_t index = heap_.front().index;
    remove_at(0);
    Entry& e = slab_[index];
    Callback cb = e.cb;
    void* ctx = e.ctx;
    uint64_t arg = e.arg;
    release(index);  // before the callback, which may add or cancel timers
    cb(ctx, arg);
  }
}

Clock::time_point TimerHeap::next_deadline() const {
  return heap_.empty() ? Clock::time_point::max() : heap_.front().when;
}

}  // namespace slotrpc::base
