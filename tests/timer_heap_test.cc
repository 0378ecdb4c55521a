// TimerHeap: deadline order, cancellation (also stale and zero ids),
// callbacks that add or cancel timers, next_deadline() and slab reuse;
// cancelled timers leave the heap at once (memory follows live timers), and
// a randomized run against a reference model.
// No real time passes: every test drives run_expired() with explicit times.
#include "base/timer_heap.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <random>
#include <unistd.h>
#include <vector>

#include "process_util.h"

using slotrpc::base::Clock;
using slotrpc::base::TimerHeap;
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
    // B reuses A's entry; A's id must not reach it.
    const auto b = heap.add(t0 + 30ms, &Log::record, &log, 2);
    CHECK(b != a);
    heap.cancel(a);
    CHECK(heap.live() == 1);
    // A's old deadline (10 ms) must not fire B early.
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

TEST_CASE("timer_heap: cancelled timers leave the heap at once (memory follows live timers)") {
  // The call path: every call arms a deadline timer and nearly every call
  // completes first and cancels it, beside a session's long-lived keepalive.
  // With lazy deletion each cancelled 60 s timer stayed in the heap for 60 s:
  // 5 million pairs held millions of nodes (RSS 3 MB -> 81 MB).
  TimerHeap heap;
  Log log;
  heap.add(t0 + 1s, &Log::record, &log, 1);  // the keepalive
  const long rss_before = test_process::rss_kib(::getpid());
  constexpr int kPairs = 5'000'000;
  size_t max_nodes = 0;
  for (int i = 0; i < kPairs; ++i) {
    const auto id = heap.add(t0 + 60s + std::chrono::microseconds(i), &Log::record, &log, 2);
    max_nodes = std::max(max_nodes, heap.heap_nodes());
    heap.cancel(id);
    max_nodes = std::max(max_nodes, heap.heap_nodes());
  }
  const long rss_after = test_process::rss_kib(::getpid());
  MESSAGE("5M add+cancel: max heap nodes " << max_nodes << ", slab entries " << heap.slab_size()
          << ", RSS " << rss_before << " KiB -> " << rss_after << " KiB");
  CHECK(max_nodes <= 2);
  CHECK(heap.heap_nodes() == 1);
  CHECK(heap.slab_size() <= 2);  // the free list recycles the one entry
  CHECK(heap.live() == 1);
  CHECK(heap.next_deadline() == t0 + 1s);
  heap.run_expired(t0 + 1h);
  CHECK(log.fired == std::vector<uint64_t>{1});
  CHECK(heap.heap_nodes() == 0);
}

TEST_CASE("timer_heap: cancelling the earliest timer exposes the next one") {
  TimerHeap heap;
  Log log;
  std::vector<TimerHeap::TimerId> ids;
  for (uint64_t ms = 1; ms <= 9; ++ms) ids.push_back(heap.add(t0 + std::chrono::milliseconds(ms), &Log::record, &log, ms));
  for (uint64_t ms = 1; ms <= 8; ++ms) {
    CHECK(heap.next_deadline() == t0 + std::chrono::milliseconds(ms));
    heap.cancel(ids[ms - 1]);
    CHECK(heap.heap_nodes() == 9 - ms);
  }
  CHECK(heap.next_deadline() == t0 + 9ms);
  heap.run_expired(t0 + 1h);
  CHECK(log.fired == std::vector<uint64_t>{9});
}

namespace {

// The reference model: the live timers by id, with deadline and argument.
struct Model {
  std::map<TimerHeap::TimerId, std::pair<Clock::time_point, uint64_t>> live;
  Clock::time_point earliest() const {
    auto best = Clock::time_point::max();
    for (const auto& [id, t] : live) best = std::min(best, t.first);
    return best;
  }
};

struct Fuzz {
  TimerHeap heap;
  Model model;
  std::mt19937_64 rng{20261123};
  std::vector<TimerHeap::TimerId> dead;  // fired or cancelled ids
  Clock::time_point now = t0;
  Clock::time_point last_fired = t0;
  uint64_t next_arg = 0;
  int fired = 0;
  int errors = 0;

  uint64_t pick(uint64_t n) { return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng); }

  void add(Clock::time_point not_before) {
    const auto when = not_before + std::chrono::microseconds(pick(5000));
    const uint64_t arg = next_arg++;
    const auto id = heap.add(when, &Fuzz::on_fire, this, arg);
    if (id == 0 || model.live.count(id) != 0) ++errors;
    model.live[id] = {when, arg};
  }
  void cancel_some_live() {
    if (model.live.empty()) return;
    auto it = model.live.begin();
    std::advance(it, static_cast<long>(pick(model.live.size())));
    heap.cancel(it->first);
    dead.push_back(it->first);
    model.live.erase(it);
  }
  void cancel_some_dead() {
    if (!dead.empty()) heap.cancel(dead[pick(dead.size())]);  // must change nothing
  }

  // A firing timer: it must be live in the model, due, and not earlier than
  // the one before it; then it cancels and adds others, as callbacks do.
  static void on_fire(void* ctx, uint64_t arg) {
    auto& f = *static_cast<Fuzz*>(ctx);
    ++f.fired;
    auto it = f.model.live.begin();
    while (it != f.model.live.end() && it->second.second != arg) ++it;
    if (it == f.model.live.end()) {
      ++f.errors;  // fired a timer the model does not hold (cancelled, or twice)
      return;
    }
    const auto when = it->second.first;
    if (when > f.now || when < f.last_fired) ++f.errors;
    f.last_fired = when;
    f.dead.push_back(it->first);
    f.model.live.erase(it);
    const uint64_t action = f.pick(8);
    if (action == 0) f.cancel_some_live();  // possibly one due in this same pass
    if (action == 1) f.add(when);           // possibly due in this same pass
    if (action == 2) f.cancel_some_dead();  // e.g. its own id
  }

  void check_agrees() {
    if (heap.live() != model.live.size()) ++errors;
    if (heap.heap_nodes() != model.live.size()) ++errors;
    if (heap.next_deadline() != model.earliest()) ++errors;
  }
};

}  // namespace

TEST_CASE("timer_heap: randomized adds, cancels and expiries agree with a reference model") {
  Fuzz f;
  size_t peak_live = 0;
  for (int step = 0; step < 200'000; ++step) {
    const uint64_t op = f.pick(10);
    if (op < 4) {
      f.add(f.now);
    } else if (op < 7) {
      f.cancel_some_live();
    } else if (op < 8) {
      f.cancel_some_dead();
    } else {
      f.now += std::chrono::microseconds(f.pick(600));
      f.last_fired = Clock::time_point::min();
      f.heap.run_expired(f.now);
      // Nothing due may be left behind.
      for (const auto& [id, t] : f.model.live) {
        if (t.first <= f.now) ++f.errors;
      }
    }
    peak_live = std::max(peak_live, f.model.live.size());
    f.check_agrees();
    if (f.errors != 0) break;
  }
  CHECK(f.errors == 0);
  CHECK(f.fired > 10'000);  // the run did exercise expiry
  CHECK(f.heap.slab_size() <= peak_live + 1);
  // Drain: everything left fires, in order.
  f.now = t0 + 24h;
  f.last_fired = Clock::time_point::min();
  f.heap.run_expired(f.now);
  CHECK(f.errors == 0);
  CHECK(f.model.live.empty());
  CHECK(f.heap.live() == 0);
}
