#include "base/fiber_pool.h"

#include <boost/context/protected_fixedsize_stack.hpp>

#include <algorithm>
#include <cassert>
#include <exception>

// GCC defines __SANITIZE_ADDRESS__ under -fsanitize=address; clang 14 does
// not and answers __has_feature(address_sanitizer) instead.  Without the
// annotations a clang ASan build (the fuzz targets) reports false
// stack-buffer-underflows on a fiber stack after a handler threw.
#if defined(__SANITIZE_ADDRESS__)
#define SLOTRPC_ASAN_FIBERS 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SLOTRPC_ASAN_FIBERS 1
#endif
#endif
#ifdef SLOTRPC_ASAN_FIBERS
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
// The same for ThreadSanitizer (GCC: __SANITIZE_THREAD__).  Without them it
// takes a fiber's stack switch for one thread's call stack jumping, and a
// -fsanitize=thread build dies of SIGSEGV inside TSan in every test that
// runs a handler (rpc_basic, stream, rpc_faults, ...; scripts/tsan.sh).
#if defined(__SANITIZE_THREAD__)
#define SLOTRPC_TSAN_FIBERS 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SLOTRPC_TSAN_FIBERS 1
#endif
#endif
#ifdef SLOTRPC_TSAN_FIBERS
#include <sanitizer/tsan_interface.h>
#endif

#include "base/logging.h"

namespace slotrpc::base {
namespace {

thread_local Fiber* tls_current = nullptr;

// Boost.Context switches stacks behind AddressSanitizer's back; these tell
// it which stack is live, or it reports false stack-buffer overflows.
inline void asan_start_switch(void** fake_save, const void* bottom, size_t size) {
#ifdef SLOTRPC_ASAN_FIBERS
  __sanitizer_start_switch_fiber(fake_save, bottom, size);
#else
  (void)fake_save, (void)bottom, (void)size;
#endif
}
inline void asan_finish_switch(void* fake_save, const void** bottom_old, size_t* size_old) {
#ifdef SLOTRPC_ASAN_FIBERS
  __sanitizer_finish_switch_fiber(fake_save, bottom_old, size_old);
#else
  (void)fake_save, (void)bottom_old, (void)size_old;
#endif
}

// ThreadSanitizer: each fiber has a context of its own; a switch names the
// context that runs next, just before the stack changes.
inline void* tsan_create() {
#ifdef SLOTRPC_TSAN_FIBERS
  return __tsan_create_fiber(0);
#else
  return nullptr;
#endif
}
inline void* tsan_current() {
#ifdef SLOTRPC_TSAN_FIBERS
  return __tsan_get_current_fiber();
#else
  return nullptr;
#endif
}
inline void tsan_switch(void* to) {
#ifdef SLOTRPC_TSAN_FIBERS
  __tsan_switch_to_fiber(to, 0);
#else
  (void)to;
#endif
}
inline void tsan_destroy(void* fiber) {
#ifdef SLOTRPC_TSAN_FIBERS
  if (fiber != nullptr) __tsan_destroy_fiber(fiber);
#else
  (void)fiber;
#endif
}

// A protected stack (guard page below it: an overflow faults instead of
// silently corrupting a neighbour) that remembers its bounds for ASan.
class RecordingStack {
 public:
  RecordingStack(size_t size, Fiber* f) : inner_(size), fiber_(f) {}
  boost::context::stack_context allocate() {
    boost::context::stack_context sc = inner_.allocate();
    fiber_->stack_size = sc.size;
    fiber_->stack_bottom = static_cast<char*>(sc.sp) - sc.size;
    return sc;
  }
  void deallocate(boost::context::stack_context& sc) noexcept {
#ifdef SLOTRPC_ASAN_FIBERS
    // Frames that never returned leave ASan poison behind; the next mmap at
    // this address (another stack, a slot ring) would inherit it.
    __asan_unpoison_memory_region(static_cast<char*>(sc.sp) - sc.size, sc.size);
#endif
    inner_.deallocate(sc);
  }

 private:
  boost::context::protected_fixedsize_stack inner_;
  Fiber* fiber_;
};

}  // namespace

FiberPool::FiberPool(size_t stack_bytes) : stack_bytes_(stack_bytes) {}

FiberPool::~FiberPool() {
  // Idle fibers wait at the bottom of fiber_main: let them return.
  for (Fiber* f : all_) {
    f->stopping = true;
    if (f->self) {
      // A fiber still suspended inside a task is unwound by Boost when its
      // continuation is destroyed; an idle one simply returns.
      if (std::find(idle_.begin(), idle_.end(), f) != idle_.end()) {
        switch_into(f);
      } else {
        // Suspended inside a task: unwind it by throwing FiberUnwind at its
        // suspension point, with the stack switches announced to ASan.
        tls_current = f;
        void* fake = nullptr;
        asan_start_switch(&fake, f->stack_bottom, f->stack_size);
        f->tsan_reactor = tsan_current();
        tsan_switch(f->tsan_self);
        f->self = std::move(f->self).resume_with([f](boost::context::fiber&& c) -> boost::context::fiber {
          f->reactor = std::move(c);
          asan_finish_switch(nullptr, &f->reactor_stack_bottom, &f->reactor_stack_size);
          throw FiberUnwind{};
        });
        asan_finish_switch(fake, nullptr, nullptr);
        tls_current = nullptr;
      }
    }
  }
  for (Fiber* f : all_) {
    // Every fiber returned above; one that had not would be unwound by
    // Boost when `self` is destroyed, on its own stack: announced to TSan
    // as a switch there and back.
    void* const tsan_here = tsan_current();
    const bool unwinds = static_cast<bool>(f->self);
    if (unwinds) tsan_switch(f->tsan_self);
    void* const tsan_self = f->tsan_self;
    delete f;
    if (unwinds) tsan_switch(tsan_here);
    tsan_destroy(tsan_self);
  }
}

Fiber* FiberPool::current() { return tls_current; }

void FiberPool::fiber_main(Fiber* f) {
  for (;;) {
    if (f->stopping) return;
    try {
      if (f->fn != nullptr) {
        f->fn(f->ctx, f->arg);
      } else if (f->task) {
        f->task();
      }
    } catch (const FiberUnwind&) {
      return;  // the pool is being destroyed
    } catch (const boost::context::detail::forced_unwind&) {
      throw;  // Boost unwinding a destroyed fiber: must propagate
    } catch (const std::exception& e) {
      // Tasks catch their own errors (handlers turn them into INTERNAL
      // replies); reaching here is a bug, but must not kill the reactor.
      base::log().error("slotrpc: uncaught exception in fiber task: {}", e.what());
    } catch (...) {
      base::log().error("slotrpc: uncaught non-standard exception in fiber task");
    }
    f->fn = nullptr;
    f->task = nullptr;
    FiberPool* pool = f->pool;
    --pool->busy_;
    pool->idle_.push_back(f);
    suspend();
  }
}

Fiber* FiberPool::acquire() {
  if (!idle_.empty()) {
    Fiber* f = idle_.back();
    idle_.pop_back();
    return f;
  }
  Fiber* f = new Fiber;
  f->pool = this;
  f->tsan_self = tsan_create();
  f->self = boost::context::fiber(
      std::allocator_arg, RecordingStack(stack_bytes_, f),
      [f](boost::context::fiber&& reactor) {
        f->reactor = std::move(reactor);
        asan_finish_switch(nullptr, &f->reactor_stack_bottom, &f->reactor_stack_size);
        fiber_main(f);
        // Final switch back; this stack is about to be released.
        asan_start_switch(nullptr, f->reactor_stack_bottom, f->reactor_stack_size);
        tsan_switch(f->tsan_reactor);
        return std::move(f->reactor);
      });
  all_.push_back(f);
  return f;
}

void FiberPool::switch_into(Fiber* f) {
  Fiber* outer = tls_current;
  assert(outer == nullptr && "fibers are resumed from the reactor, not from other fibers");
  tls_current = f;
  void* fake = nullptr;
  asan_start_switch(&fake, f->stack_bottom, f->stack_size);
  f->tsan_reactor = tsan_current();
  tsan_switch(f->tsan_self);
  f->self = std::move(f->self).resume();
  asan_finish_switch(fake, nullptr, nullptr);
  tls_current = outer;
}

void FiberPool::start(Entry fn, void* ctx, uint64_t arg) {
  Fiber* f = acquire();
  f->fn = fn;
  f->ctx = ctx;
  f->arg = arg;
  ++busy_;
  switch_into(f);
}

void FiberPool::start(std::function<void()> task) {
  Fiber* f = acquire();
  f->fn = nullptr;
  f->task = std::move(task);
  ++busy_;
  switch_into(f);
}

void FiberPool::resume(Fiber* f) { switch_into(f); }

void FiberPool::suspend() {
  Fiber* f = tls_current;
  assert(f != nullptr && "suspend() outside a fiber");
  void* fake = nullptr;
  asan_start_switch(&fake, f->reactor_stack_bottom, f->reactor_stack_size);
  tsan_switch(f->tsan_reactor);
  f->reactor = std::move(f->reactor).resume();
  asan_finish_switch(fake, &f->reactor_stack_bottom, &f->reactor_stack_size);
}

}  // namespace slotrpc::base
