// The fiber side of Future<T>::get(): lets a handler wait without blocking
// its event loop.
#include "slotrpc/future.h"

#include "reactor/reactor.h"

namespace slotrpc::detail {

bool current_fiber(FiberWaiter* out) {
  base::Fiber* f = base::FiberPool::current();
  reactor::Reactor* loop = reactor::Reactor::current();
  if (f == nullptr || loop == nullptr) return false;
  out->loop = loop;
  out->fiber = f;
  return true;
}

void suspend_current_fiber() { base::FiberPool::suspend(); }

void wake_fiber(const FiberWaiter& waiter) {
  auto* loop = static_cast<reactor::Reactor*>(waiter.loop);
  auto* f = static_cast<base::Fiber*>(waiter.fiber);
  if (loop->on_this_thread()) {
    loop->make_ready(f);
  } else {
    loop->post([loop, f] { loop->make_ready(f); });
  }
}

}  // namespace slotrpc::detail
