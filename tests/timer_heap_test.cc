// TimerHeap: deadline order, cancellation (also stale and zero ids),
// callbacks that add or cancel timers, next_deadline() and slab reuse.
// No real time passes: every test drives run_expired() with explicit times.
#include "reactor/timer_heap.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

using slotrpc::reactor::Clock;
using slotrpc::reactor::TimerHeap;
using namespace std::chrono_literals;

namespace {

// Records the `arg` of each timer that fires.
struct Log {
  std::vector<uint64_t> fired;
  static void record(void* ctx, uint64_t arg) { static_cast<Log*>(ctx)->fired.push_back(arg); }
};

// Runs an arbitrary std::function (ctx) with arg.
struct Action {
  std::function<void(uint64_t)> fn;
  static void run(void* ctx, uint64_t arg) { static_cast<Action*>(ctx)->fn(arg); }
};

const Clock::time_point t0 = Clock::now();

}  // namespace

TEST_CASE("timer_heap: empty heap") {
  TimerHeap heap;
  CHECK(heap.live() == 0);
  CHECK(heap.next_deadline() == Clock::time_point::max());
  heap.run_expired(t0 + 1h);  // nothing to do
  CHECK(heap.live() == 0);
}

TEST_CASE("timer_heap: timers fire in deadline order") {
  TimerHeap heap;
  Log log;
  // Added out of order.
  const int offsets_ms[] = {50, 10, 40, 20, 30, 60, 5};
  for (int ms : offsets_ms) {
    const auto id = heap.add(t0 + std::chrono::milliseconds(ms), &Log::record, &log, uint64_t(ms));
    CHECK(id != 0);
  }
  CHECK(heap.live() == 7);
  CHECK(heap.next_deadline() == t0 + 5ms);

  heap.run_expired(t0);  // nothing due yet
  CHECK(log.fired.empty());
  CHECK(heap.live() == 7);

  heap.run_expired(t0 + 25ms);
  CHECK(log.fired == std::vector<uint64_t>{5, 10, 20});
  CHECK(heap.live() == 4);
  CHECK(heap.next_deadline() == t0 + 30ms);

  heap.run_expired(t0 + 30ms);  // due exactly now fires
  CHECK(log.fired == std::vector<uint64_t>{5, 10, 20, 30});

  heap.run_expired(t0 + 1h);
  CHECK(log.fired == std::vector<uint64_t>{5, 10, 20, 30, 40, 50, 60});
  CHECK(heap.live() == 0);
  CHECK(heap.next_deadline() == Clock::time_point::max());

  heap.run_expired(t0 + 2h);  // each timer fires once
  CHECK(log.fired.size() == 7);
}

TEST_CASE("timer_heap: many timers in pseudo-random order fire sorted") {
  TimerHeap heap;
  Log log;
  uint64_t x = 12345;
  std::vector<uint64_t> deadlines;
  for (int i = 0; i < 1000; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const uint64_t us = (x >> 33) % 1'000'000;
    deadlines.push_back(us);
    heap.add(t0 + std::chrono::microseconds(us), &Log::record, &log, us);
  }
  CHECK(heap.live() == 1000);
  heap.run_expired(t0 + 2s);
  REQUIRE(log.fired.size() == 1000);
  for (size_t i = 1; i < log.fired.size(); ++i) CHECK(log.fired[i - 1] <= log.fired[i]);
  std::sort(deadlines.begin(), deadlines.end());
  CHECK(log.fired == deadlines);
}

TEST_CASE("timer_heap: cancelled timers never fire") {
  TimerHeap heap;
  Log log;
  const auto a = heap.add(t0 + 10ms, &Log::record, &log, 1);
  const auto b = heap.add(t0 + 20ms, &Log::record, &log, 2);
  const auto c = heap.add(t0 + 30ms, &Log::record, &log, 3);
  CHECK(a != b);
  CHECK(b != c);
  CHECK(a != c);

  heap.cancel(b);
  CHECK(heap.live() == 2);
  heap.cancel(a);
  CHECK(heap.live() == 1);
  // The earliest live deadline skips the cancelled ones.
  CHECK(heap.next_deadline() == t0 + 30ms);

  heap.run_expired(t0 + 1h);
  CHECK(log.fired == std::vector<uint64_t>{3});
  CHECK(heap.live() == 0);
}

TEST_CASE("timer_heap: cancel of a zero, stale or unknown id is harmless") {
  TimerHeap heap;
  Log log;
  heap.cancel(0);  // on an empty heap
  heap.cancel(12345);
  heap.cancel(UINT64_MAX);

  const auto a = heap.add(t0 + 10ms, &Log::record, &log, 1);
  const auto b = heap.add(t0 + 20ms, &Log::record, &log, 2);
  heap.cancel(0);
  heap.cancel(b + 1000);          // index beyond the slab
  heap.cancel(b + (1ull << 32));  // right index, wrong generation
  CHECK(heap.live() == 2);

  heap.cancel(a);
  heap.cancel(a);  // twice
  CHECK(heap.live() == 1);

  heap.run_expired(t0 + 1h);
  CHECK(log.fired == std::vector<uint64_t>{2});
  heap.cancel(b);  // after it fired
  CHECK(heap.live() == 0);

  // The heap still works normally.
  heap.add(t0 + 5ms, &Log::record, &log, 3);
  CHECK(heap.live() == 1);
  heap.run_expired(t0 + 1h);
  CHECK(log.fired == std::vector<uint64_t>{2, 3});
}

TEST_CASE("timer_heap: ids of reused slab entries do not cancel new timers") {
  TimerHeap heap;
  Log log;

  SUBCASE("after firing") {
    const auto a = heap.add(t0 + 10ms, &Log::record, &log, 1);
    heap.run_expired(t0 + 10ms);
    REQUIRE(log.fired == std::vector<uint64_t>{1});
    const auto b = heap.add(t0 + 20ms, &Log::record, &log, 2);  // reuses A's entry
    CHECK(b != a);
    heap.cancel(a);  // stale: must not touch B
    CHECK(heap.live() == 1);
    CHECK(heap.next_deadline() == t0 + 20ms);
    heap.run_expired(t0 + 1h);
    CHECK(log.fired == std::vector<uint64_t>{1, 2});
  }
  SUBCASE("after cancelling") {
    const auto a = heap.add(t0 + 10ms, &Log::record, &log, 1);
    heap.cancel(a);
    // B reuses A's entry while A's heap node is still there (lazy deletion).
    const auto b = heap.add(t0 + 30ms, &Log::record, &log, 2);
    CHECK(b != a);
    heap.cancel(a);
    CHECK(heap.live() == 1);
    // A's old node (10 ms) must not fire B early.
    heap.run_expired(t0 + 15ms);
    CHECK(log.fired.empty());
    CHECK(heap.next_deadline() == t0 + 30ms);
    heap.run_expired(t0 + 30ms);
    CHECK(log.fired == std::vector<uint64_t>{2});
    CHECK(heap.live() == 0);
  }
  SUBCASE("many generations of one entry") {
    std::vector<TimerHeap::TimerId> old_ids;
    for (uint64_t i = 0; i < 100; ++i) {
      old_ids.push_back(heap.add(t0 + 1ms, &Log::record, &log, i));
      heap.run_expired(t0 + 1ms);
    }
    CHECK(log.fired.size() == 100);
    const auto live = heap.add(t0 + 5ms, &Log::record, &log, 1000);
    for (auto id : old_ids) {
      CHECK(id != live);
      heap.cancel(id);
    }
    CHECK(heap.live() == 1);
    heap.run_expired(t0 + 1h);
    CHECK(log.fired.back() == 1000);
  }
}

TEST_CASE("timer_heap: a callback may add timers") {
  TimerHeap heap;
  Log log;
  Action chain;
  int remaining = 3;
  chain.fn = [&](uint64_t arg) {
    log.fired.push_back(arg);
    if (remaining-- > 0) heap.add(t0 + std::chrono::milliseconds(arg + 1), &Action::run, &chain, arg + 1);
  };
  heap.add(t0 + 10ms, &Action::run, &chain, 10);
  heap.add(t0 + 100ms, &Log::record, &log, 100);

  // Timers added by callbacks that are already due run in the same pass.
  heap.run_expired(t0 + 12ms);
  CHECK(log.fired == std::vector<uint64_t>{10, 11, 12});
  CHECK(heap.live() == 2);  // chain at 13 ms and the 100 ms timer
  CHECK(heap.next_deadline() == t0 + 13ms);

  heap.run_expired(t0 + 1h);
  CHECK(log.fired == std::vector<uint64_t>{10, 11, 12, 13, 100});
  CHECK(heap.live() == 0);
}

TEST_CASE("timer_heap: a callback may cancel other timers, including due ones") {
  TimerHeap heap;
  Log log;
  Action canceller;
  TimerHeap::TimerId victim_due = 0;
  TimerHeap::TimerId victim_later = 0;
  canceller.fn = [&](uint64_t arg) {
    log.fired.push_back(arg);
    heap.cancel(victim_due);
    heap.cancel(victim_later);
  };
  heap.add(t0 + 10ms, &Action::run, &canceller, 1);
  victim_due = heap.add(t0 + 11ms, &Log::record, &log, 2);    // due in the same pass
  victim_later = heap.add(t0 + 50ms, &Log::record, &log, 3);  // due later
  heap.add(t0 + 12ms, &Log::record, &log, 4);

  heap.run_expired(t0 + 20ms);
  CHECK(log.fired == std::vector<uint64_t>{1, 4});
  CHECK(heap.live() == 0);
  heap.run_expired(t0 + 1h);
  CHECK(log.fired == std::vector<uint64_t>{1, 4});
  CHECK(heap.next_deadline() == Clock::time_point::max());
}

TEST_CASE("timer_heap: a callback cancelling its own (already fired) id is harmless") {
  TimerHeap heap;
  Log log;
  Action self;
  TimerHeap::TimerId own = 0;
  TimerHeap::TimerId replacement = 0;
  self.fn = [&](uint64_t arg) {
    log.fired.push_back(arg);
    // Re-arm (likely reusing this entry), then cancel the old id.
    replacement = heap.add(t0 + 50ms, &Log::record, &log, 2);
    heap.cancel(own);
  };
  own = heap.add(t0 + 10ms, &Action::run, &self, 1);
  heap.run_expired(t0 + 10ms);
  CHECK(log.fired == std::vector<uint64_t>{1});
  CHECK(replacement != own);
  CHECK(heap.live() == 1);
  heap.run_expired(t0 + 50ms);
  CHECK(log.fired == std::vector<uint64_t>{1, 2});
}

TEST_CASE("timer_heap: next_deadline") {
  TimerHeap heap;
  Log log;
  CHECK(heap.next_deadline() == Clock::time_point::max());
  const auto late = heap.add(t0 + 30ms, &Log::record, &log, 30);
  CHECK(heap.next_deadline() == t0 + 30ms);
  const auto early = heap.add(t0 + 10ms, &Log::record, &log, 10);
  CHECK(heap.next_deadline() == t0 + 10ms);
  heap.add(t0 + 20ms, &Log::record, &log, 20);
  CHECK(heap.next_deadline() == t0 + 10ms);
  heap.cancel(early);
  CHECK(heap.next_deadline() == t0 + 20ms);
  heap.run_expired(t0 + 20ms);
  CHECK(log.fired == std::vector<uint64_t>{20});
  CHECK(heap.next_deadline() == t0 + 30ms);
  heap.cancel(late);
  CHECK(heap.next_deadline() == Clock::time_point::max());
  CHECK(heap.live() == 0);
  CHECK(log.fired == std::vector<uint64_t>{20});
}

TEST_CASE("timer_heap: equal deadlines all fire") {
  TimerHeap heap;
  Log log;
  for (uint64_t i = 0; i < 10; ++i) heap.add(t0 + 5ms, &Log::record, &log, i);
  heap.run_expired(t0 + 5ms - 1ns);
  CHECK(log.fired.empty());
  heap.run_expired(t0 + 5ms);
  CHECK(log.fired.size() == 10);
  std::sort(log.fired.begin(), log.fired.end());
  for (uint64_t i = 0; i < 10; ++i) CHECK(log.fired[i] == i);
}

TEST_CASE("timer_heap: callback context and argument are passed through") {
  TimerHeap heap;
  Log a, b;
  heap.add(t0 + 1ms, &Log::record, &a, 0xdeadbeefcafef00dull);
  heap.add(t0 + 2ms, &Log::record, &b, 7);
  heap.run_expired(t0 + 1h);
  CHECK(a.fired == std::vector<uint64_t>{0xdeadbeefcafef00dull});
  CHECK(b.fired == std::vector<uint64_t>{7});
}
