// Handler fibers: Boost.Context fibers kept in a pool and reused, so that a
// request costs a context switch, not a stack allocation.
//
// A fiber runs one task at a time.  Inside it, code may call suspend() to
// give the thread back to the reactor (e.g. to wait for a nested RPC); the
// reactor later calls resume() on it.  Everything here runs on one reactor
// thread; nothing is locked.
#pragma once

#include <boost/context/fiber.hpp>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace slotrpc::base {

class FiberPool;

// Thrown at the suspension point of a fiber whose pool is destroyed while
// it waits.  Code that catches everything inside a fiber must rethrow it.
struct FiberUnwind {};

struct Fiber {
  FiberPool* pool = nullptr;
  boost::context::fiber self;     // this fiber's continuation while it is not running
  boost::context::fiber reactor;  // the reactor's continuation while this fiber runs
  void (*fn)(void*, uint64_t) = nullptr;
  void* ctx = nullptr;
  uint64_t arg = 0;
  std::function<void()> task;  // used when fn == nullptr
  bool stopping = false;
  // Stack bounds for AddressSanitizer's fiber annotations.
  const void* stack_bottom = nullptr;
  size_t stack_size = 0;
  const void* reactor_stack_bottom = nullptr;
  size_t reactor_stack_size = 0;
  // ThreadSanitizer's contexts (null in other builds): this fiber's, and
  // the reactor thread's it was last resumed from.
  void* tsan_self = nullptr;
  void* tsan_reactor = nullptr;
};

class FiberPool {
 public:
  using Entry = void (*)(void* ctx, uint64_t arg);

  explicit FiberPool(size_t stack_bytes);
  ~FiberPool();
  FiberPool(const FiberPool&) = delete;
  FiberPool& operator=(const FiberPool&) = delete;

  // Reactor thread.  Runs fn(ctx, arg) on a pooled fiber until it returns
  // or suspends.  The hot path (one call per request): no allocation once
  // the pool has grown to the peak number of concurrent handlers.
  void start(Entry fn, void* ctx, uint64_t arg);
  // Same with a std::function (for spawn(); may allocate).
  void start(std::function<void()> task);

  // Reactor thread: continues `f` until it returns or suspends again.
  void resume(Fiber* f);

  // Inside a fiber: back to the reactor until someone resume()s this fiber.
  static void suspend();
  // The fiber running on this thread, or nullptr on a plain thread.
  static Fiber* current();

  size_t busy() const { return busy_; }
  size_t size() const { return all_.size(); }

 private:
  Fiber* acquire();
  void switch_into(Fiber* f);
  static void fiber_main(Fiber* f);

  size_t stack_bytes_;
  std::vector<Fiber*> idle_;
  std::vector<Fiber*> all_;
  size_t busy_ = 0;
};

}  // namespace slotrpc::base
