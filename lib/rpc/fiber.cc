#include "slotrpc/fiber.h"

#include <thread>

#include "reactor/reactor.h"

namespace slotrpc::this_fiber {
namespace {
void resume_fiber(void* loop, uint64_t fiber) {
  static_cast<reactor::Reactor*>(loop)->make_ready(reinterpret_cast<base::Fiber*>(fiber));
}
}  // namespace

bool in_fiber() {
  return base::FiberPool::current() != nullptr && reactor::Reactor::current() != nullptr;
}

bool spawn(std::function<void()> fn) {
  if (!in_fiber()) return false;
  reactor::Reactor* loop = reactor::Reactor::current();
  // Posted: a fiber is started from the loop, never switched into from
  // another fiber's stack.
  loop->post([loop, fn = std::move(fn)]() mutable { loop->spawn(std::move(fn)); });
  return true;
}

void sleep_for(std::chrono::nanoseconds duration) {
  if (!in_fiber()) return std::this_thread::sleep_for(duration);
  reactor::Reactor* loop = reactor::Reactor::current();
  loop->timers().add(reactor::Clock::now() + duration, &resume_fiber, loop,
                     reinterpret_cast<uint64_t>(base::FiberPool::current()));
  base::FiberPool::suspend();
}

}  // namespace slotrpc::this_fiber
