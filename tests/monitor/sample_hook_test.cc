// SampleHook (lib/transport/verbs/monitor.h): the monitor callback of a Server or
// Channel, called on loop threads.  Its owner's destructor close()s it, and
// from then on the callback must not run: it typically points at the
// application's state, which dies right after the owner.  (It once did run:
// tests/verbs/verbs_runtime_test's callbacks kept being called after their
// state was freed, and under ASan the loop then waited forever on the freed
// mutex, holding the runtime's stop.)
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "transport/verbs/monitor.h"

using slotrpc::MetricsSnapshot;
using slotrpc::monitor::SampleHook;
using namespace std::chrono_literals;

namespace {
template <class Pred>
bool wait_until(Pred pred, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}
}  // namespace

TEST_CASE("close() waits for a call running on another thread; nothing runs after it") {
  SampleHook hook;
  std::atomic<bool> entered{false}, closed{false}, saw_closed{false};
  hook.set([&](const MetricsSnapshot&) {
    entered = true;
    // Give close() time to return early, if it would (bounded: with a
    // close() that waits, this wait is what it waits for).
    wait_until([&] { return closed.load(); }, 500ms);
    saw_closed = closed.load();
  });
  std::thread loop([&] { hook.call(MetricsSnapshot{}); });
  REQUIRE(wait_until([&] { return entered.load(); }, 10s));
  hook.close();
  closed = true;
  loop.join();
  CHECK_MESSAGE(!saw_closed, "the callback was still running after close() returned");

  int calls = 0;
  hook.set([&](const MetricsSnapshot&) { ++calls; });  // too late: ignored
  hook.call(MetricsSnapshot{});
  CHECK(calls == 0);
  CHECK(hook.empty());
}

TEST_CASE("close() from inside the callback (it destroys its owner) returns") {
  SampleHook hook;
  int calls = 0;
  hook.set([&](const MetricsSnapshot&) {
    ++calls;
    hook.close();  // would wait for itself forever
  });
  hook.call(MetricsSnapshot{});
  hook.call(MetricsSnapshot{});
  CHECK(calls == 1);
}

TEST_CASE("close() with no call running returns at once, and set() before it works as before") {
  SampleHook hook;
  int calls = 0;
  hook.set([&](const MetricsSnapshot&) { ++calls; });
  hook.call(MetricsSnapshot{});
  hook.set(nullptr);
  hook.call(MetricsSnapshot{});
  CHECK(calls == 1);
  hook.close();
  CHECK(hook.empty());
}
