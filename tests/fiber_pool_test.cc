// FiberPool: running tasks, suspending and resuming them, reuse of pooled
// fibers, FiberPool::current(), and exceptions in tasks.  Everything runs on
// the test thread, as it does on a reactor thread.
#include "base/fiber_pool.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

using slotrpc::base::Fiber;
using slotrpc::base::FiberPool;

namespace {
constexpr size_t kStack = 64 * 1024;

// Stack-hungry work on a fiber: ~300 bytes of frame per level.
int recurse(int n) {
  volatile char pad[256];
  pad[0] = static_cast<char>(n);
  pad[255] = pad[0];
  return n == 0 ? 0 : 1 + recurse(n - 1);
}
}  // namespace

TEST_CASE("fiber_pool: start() runs a task to completion") {
  FiberPool pool(kStack);
  CHECK(pool.size() == 0);
  CHECK(pool.busy() == 0);

  std::vector<int> steps;
  pool.start([&] {
    steps.push_back(1);
    steps.push_back(2);
  });
  CHECK(steps == std::vector<int>{1, 2});
  CHECK(pool.busy() == 0);
  CHECK(pool.size() == 1);

  // A second task reuses the idle fiber.
  pool.start([&] { steps.push_back(3); });
  CHECK(steps == std::vector<int>{1, 2, 3});
  CHECK(pool.busy() == 0);
  CHECK(pool.size() == 1);
}

TEST_CASE("fiber_pool: the function-pointer form passes ctx and arg") {
  FiberPool pool(kStack);
  struct Ctx {
    uint64_t got = 0;
    Fiber* fiber = nullptr;
  } ctx;
  pool.start(
      [](void* c, uint64_t arg) {
        auto* x = static_cast<Ctx*>(c);
        x->got = arg;
        x->fiber = FiberPool::current();
      },
      &ctx, 0x1234567890abcdefull);
  CHECK(ctx.got == 0x1234567890abcdefull);
  CHECK(ctx.fiber != nullptr);
  CHECK(pool.busy() == 0);
  CHECK(pool.size() == 1);
}

TEST_CASE("fiber_pool: a task that suspends returns control and continues on resume()") {
  FiberPool pool(kStack);
  std::vector<std::string> log;
  Fiber* fiber = nullptr;
  int local_survives = 0;

  pool.start([&] {
    int on_fiber_stack = 41;  // must survive the suspension
    log.push_back("before");
    fiber = FiberPool::current();
    FiberPool::suspend();
    log.push_back("middle");
    ++on_fiber_stack;
    FiberPool::suspend();
    log.push_back("after");
    local_survives = on_fiber_stack;
  });
  // start() came back at the first suspend.
  CHECK(log == std::vector<std::string>{"before"});
  REQUIRE(fiber != nullptr);
  CHECK(pool.busy() == 1);
  CHECK(FiberPool::current() == nullptr);

  log.push_back("reactor");
  pool.resume(fiber);
  CHECK(log == std::vector<std::string>{"before", "reactor", "middle"});
  CHECK(pool.busy() == 1);

  pool.resume(fiber);
  CHECK(log == std::vector<std::string>{"before", "reactor", "middle", "after"});
  CHECK(local_survives == 42);
  CHECK(pool.busy() == 0);
  CHECK(pool.size() == 1);
}

TEST_CASE("fiber_pool: a running suspended fiber is not handed to a new task") {
  FiberPool pool(kStack);
  Fiber* first = nullptr;
  Fiber* second = nullptr;
  bool first_done = false;
  pool.start([&] {
    first = FiberPool::current();
    FiberPool::suspend();
    first_done = true;
  });
  pool.start([&] { second = FiberPool::current(); });
  REQUIRE(first != nullptr);
  REQUIRE(second != nullptr);
  CHECK(first != second);
  CHECK(pool.size() == 2);
  CHECK(pool.busy() == 1);
  CHECK_FALSE(first_done);
  pool.resume(first);
  CHECK(first_done);
  CHECK(pool.busy() == 0);
}

TEST_CASE("fiber_pool: 200 concurrent suspended fibers each resumed once complete") {
  constexpr int kFibers = 200;
  FiberPool pool(kStack);
  std::vector<Fiber*> fibers(kFibers, nullptr);
  std::vector<int> stage(kFibers, 0);
  std::vector<int> value(kFibers, 0);

  for (int i = 0; i < kFibers; ++i) {
    pool.start([&, i] {
      int mine = i * 3;  // lives on this fiber's stack across the suspension
      fibers[i] = FiberPool::current();
      stage[i] = 1;
      FiberPool::suspend();
      stage[i] = 2;
      value[i] = mine + 1;
    });
  }
  CHECK(pool.busy() == kFibers);
  CHECK(pool.size() == kFibers);
  const std::set<Fiber*> distinct(fibers.begin(), fibers.end());
  CHECK(distinct.size() == kFibers);
  CHECK(distinct.count(nullptr) == 0);
  for (int i = 0; i < kFibers; ++i) CHECK(stage[i] == 1);

  // Resume in an order unrelated to the start order.
  for (int k = 0; k < kFibers; ++k) {
    const int i = (k * 7) % kFibers;  // 7 and 200 are coprime: a permutation
    pool.resume(fibers[i]);
    CHECK(stage[i] == 2);
    CHECK(value[i] == i * 3 + 1);
  }
  CHECK(pool.busy() == 0);
  for (int i = 0; i < kFibers; ++i) {
    CAPTURE(i);
    CHECK(stage[i] == 2);
    CHECK(value[i] == i * 3 + 1);
  }
  CHECK(pool.size() == kFibers);

  // A second wave reuses the same fibers: the pool does not grow.
  std::vector<Fiber*> again(kFibers, nullptr);
  for (int i = 0; i < kFibers; ++i) {
    pool.start([&, i] {
      again[i] = FiberPool::current();
      FiberPool::suspend();
    });
  }
  CHECK(pool.size() == kFibers);
  CHECK(std::set<Fiber*>(again.begin(), again.end()) == distinct);
  for (Fiber* f : again) pool.resume(f);
  CHECK(pool.busy() == 0);
  CHECK(pool.size() == kFibers);
}

TEST_CASE("fiber_pool: the pool is bounded by peak concurrency") {
  FiberPool pool(kStack);
  auto batch = [&pool](int n) {
    std::vector<Fiber*> fibers;
    for (int i = 0; i < n; ++i) {
      pool.start([&fibers] {
        fibers.push_back(FiberPool::current());
        FiberPool::suspend();
      });
    }
    REQUIRE(fibers.size() == static_cast<size_t>(n));
    for (Fiber* f : fibers) pool.resume(f);
    CHECK(pool.busy() == 0);
    return fibers;
  };
  const auto first = batch(10);
  CHECK(pool.size() == 10);
  const auto second = batch(10);
  CHECK(pool.size() == 10);
  CHECK(std::set<Fiber*>(first.begin(), first.end()) ==
        std::set<Fiber*>(second.begin(), second.end()));
  batch(5);
  CHECK(pool.size() == 10);
  batch(12);
  CHECK(pool.size() == 12);

  // Sequential tasks that do not suspend need no more than one idle fiber.
  for (int i = 0; i < 100; ++i) pool.start([] {});
  CHECK(pool.size() == 12);
  CHECK(pool.busy() == 0);
}

TEST_CASE("fiber_pool: current() is null outside and the running fiber inside") {
  CHECK(FiberPool::current() == nullptr);
  FiberPool pool(kStack);
  CHECK(FiberPool::current() == nullptr);

  Fiber* seen_first = nullptr;
  Fiber* seen_after_resume = nullptr;
  FiberPool* owner = nullptr;
  pool.start([&] {
    seen_first = FiberPool::current();
    owner = seen_first != nullptr ? seen_first->pool : nullptr;
    FiberPool::suspend();
    seen_after_resume = FiberPool::current();
  });
  CHECK(FiberPool::current() == nullptr);
  REQUIRE(seen_first != nullptr);
  CHECK(owner == &pool);

  // Another fiber runs while the first is suspended: it sees itself.
  Fiber* seen_other = nullptr;
  pool.start([&] { seen_other = FiberPool::current(); });
  CHECK(seen_other != nullptr);
  CHECK(seen_other != seen_first);
  CHECK(FiberPool::current() == nullptr);

  pool.resume(seen_first);
  CHECK(seen_after_resume == seen_first);
  CHECK(FiberPool::current() == nullptr);
}

TEST_CASE("fiber_pool: an exception thrown in a task does not escape start()") {
  FiberPool pool(kStack);
  bool reached = false;
  CHECK_NOTHROW(pool.start([&] {
    reached = true;
    throw std::runtime_error("boom");
  }));
  CHECK(reached);
  CHECK(pool.busy() == 0);
  CHECK(FiberPool::current() == nullptr);

  // The fiber went back to the pool and still works.
  bool next_ran = false;
  pool.start([&] { next_ran = true; });
  CHECK(next_ran);
  CHECK(pool.size() == 1);
  CHECK(pool.busy() == 0);

  SUBCASE("thrown after a suspension: does not escape resume()") {
    Fiber* f = nullptr;
    pool.start([&] {
      f = FiberPool::current();
      FiberPool::suspend();
      throw std::logic_error("late boom");
    });
    REQUIRE(f != nullptr);
    CHECK(pool.busy() == 1);
    CHECK_NOTHROW(pool.resume(f));
    CHECK(pool.busy() == 0);
    CHECK(FiberPool::current() == nullptr);
  }
  SUBCASE("from the function-pointer form") {
    CHECK_NOTHROW(pool.start([](void*, uint64_t) { throw std::out_of_range("x"); }, nullptr, 0));
    CHECK(pool.busy() == 0);
  }
}

// The last two tests are at the end of the file on purpose: under
// AddressSanitizer they currently abort the process (library issues in
// lib/base/fiber_pool.cc, see the comments), and doctest runs the cases
// in file order, so every other case still reports first.

// Fiber stacks are unmapped when a pool goes away, and a later mmap (a new
// pool's stack, a slot ring) often gets the same addresses back.  Under ASan
// the shadow of the frames that never returned on the old stacks (Boost's
// fiber entry frames) must not stay poisoned there, or correct code on the
// new memory is reported as a stack-buffer-underflow.  Without ASan this
// checks that deep recursion within the configured stack works.
TEST_CASE("fiber_pool: stacks of a destroyed pool are clean when reused") {
  constexpr int kFibers = 8;
  // Pools of different stack sizes, so that a new stack overlaps the old
  // ones at different offsets.
  for (size_t stack : {size_t{64 * 1024}, size_t{256 * 1024}, size_t{128 * 1024},
                       size_t{256 * 1024}, size_t{64 * 1024}, size_t{256 * 1024}}) {
    CAPTURE(stack);
    FiberPool pool(stack);
    std::vector<Fiber*> fibers;
    std::vector<int> results(kFibers, -1);
    // Deep enough to cover a good part of the smallest stack.
    const int depth = stack == 64 * 1024 ? 40 : 150;
    for (int i = 0; i < kFibers; ++i) {
      pool.start([&fibers, &results, depth, i] {
        fibers.push_back(FiberPool::current());
        FiberPool::suspend();
        results[i] = recurse(depth + i);
      });
    }
    CHECK(pool.size() == kFibers);
    for (Fiber* f : fibers) pool.resume(f);
    for (int i = 0; i < kFibers; ++i) CHECK(results[i] == depth + i);
    CHECK(pool.busy() == 0);
  }
}

// Server::stop relies on this: handlers still suspended when the loops are
// destroyed are unwound (their destructors run).  Under ASan the unwind must
// happen on a stack switch ASan was told about, or it reports an error.
TEST_CASE("fiber_pool: destroying the pool unwinds a suspended task") {
  int destroyed = 0;
  bool finished = false;
  struct Guard {
    int* counter;
    ~Guard() { ++*counter; }
  };
  {
    FiberPool pool(kStack);
    pool.start([&destroyed, &finished] {
      Guard g{&destroyed};
      FiberPool::suspend();
      finished = true;  // never reached: the pool goes away first
    });
    pool.start([] {});  // an idle fiber next to the suspended one
    CHECK(pool.busy() == 1);
    CHECK(destroyed == 0);
  }
  CHECK(destroyed == 1);
  CHECK_FALSE(finished);
  CHECK(FiberPool::current() == nullptr);
}
