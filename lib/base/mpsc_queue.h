// Multi-producer, single-consumer queue: how other threads hand work to a
// reactor.  Producers never take a lock; the consumer (the reactor thread)
// pops without one.  A linked list with an atomic tail exchange (Vyukov's
// design), written here from its description.
#pragma once

#include <atomic>
#include <utility>

namespace slotrpc::base {

template <class T>
class MpscQueue {
 public:
  MpscQueue() : head_(&stub_), tail_(&stub_) {}
  ~MpscQueue() {
    T ignored;
    while (pop(ignored)) {
    }
  }
  MpscQueue(const MpscQueue&) = delete;
  MpscQueue& operator=(const MpscQueue&) = delete;

  // Any thread.  One allocation per item: this is the cross-thread path, not
  // the per-message path of calls issued on the reactor itself.
  void push(T value) {
    Node* n = new Node{std::move(value), nullptr};
    Node* prev = head_.exchange(n, std::memory_order_acq_rel);
    // Between the exchange and this store the list is briefly cut; pop()
    // sees that as "empty for now", which is safe: the producer's wakeup
    // follows and the consumer looks again.
    prev->next.store(n, std::memory_order_release);
  }

  // Consumer thread only.  False when empty (or a push is mid-flight).
  bool pop(T& out) {
    Node* tail = tail_;
    Node* next = tail->next.load(std::memory_order_acquire);
    if (tail == &stub_) {
      if (next == nullptr) return false;
      tail_ = next;
      tail = next;
      next = next->next.load(std::memory_order_acquire);
    }
    if (next != nullptr) {
      tail_ = next;
      out = std::move(tail->value);
      delete tail;
      return true;
    }
    if (tail != head_.load(std::memory_order_acquire)) return false;  // push mid-flight
    // Re-insert the stub so the last real node can be taken.
    stub_.next.store(nullptr, std::memory_order_relaxed);
    Node* prev = head_.exchange(&stub_, std::memory_order_acq_rel);
    prev->next.store(&stub_, std::memory_order_release);
    next = tail->next.load(std::memory_order_acquire);
    if (next == nullptr) return false;
    tail_ = next;
    out = std::move(tail->value);
    delete tail;
    return true;
  }

  // Consumer thread only: a hint, exact when no producer is mid-push.
  bool empty() const {
    return tail_ == &stub_ && stub_.next.load(std::memory_order_acquire) == nullptr &&
           head_.load(std::memory_order_acquire) == &stub_;
  }

 private:
  struct Node {
    T value;
    std::atomic<Node*> next;
  };
  std::atomic<Node*> head_;  // producers push here
  Node* tail_;               // consumer pops here
  Node stub_{T{}, nullptr};
};

}  // namespace slotrpc::base
