// The event loop's idle policy (lib/reactor/reactor.cc, Reactor::loop):
// which poll modes give the CPU away with sched_yield() while they spin.
//
// Why it matters (docs/benchmarks.md, "Spinning loops yield"): a loop that
// spins without yielding right after it sent a request keeps its peer, which
// loopback TCP wakes onto the sender's CPU, waiting until the spin ends; one
// echo every 2 ms took 475 us at p50 in adaptive mode before adaptive
// yielded.  The latency itself is a benchmark figure; what a test can hold
// the loop to is the policy: adaptive and busy loops yield once idle for
// busy_yield_us, blocking loops and busy_yield_us = 0 never do.
#include <doctest/doctest.h>

#include <chrono>
#include <future>
#include <thread>

#include "reactor/reactor.h"

namespace {

using slotrpc::Config;
using slotrpc::PollMode;
using slotrpc::reactor::Reactor;

// The loop's yield count, read on the loop thread (its stats are the loop's).
uint64_t yields_of(Reactor& loop) {
  std::promise<uint64_t> p;
  auto f = p.get_future();
  loop.post([&] { p.set_value(loop.stats().yields); });
  return f.get();
}

// Polls the loop until it has yielded or `limit` passed; each poll is work
// for the loop, after which it idles (and spins) again.
uint64_t wait_for_yields(Reactor& loop, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  uint64_t n = 0;
  while ((n = yields_of(loop)) == 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return n;
}

Config idle_config(PollMode mode, uint32_t yield_us) {
  Config cfg;
  cfg.poll_mode = mode;
  cfg.spin_us = 1'000'000;        // adaptive: a whole second of spinning per idle spell
  cfg.busy_sleep_us = 1'000'000;  // busy: likewise
  cfg.busy_yield_us = yield_us;
  return cfg;
}

}  // namespace

TEST_CASE("an adaptive loop yields the CPU while it spins") {
  Reactor loop(idle_config(PollMode::kAdaptive, 5), "idle-adaptive");
  loop.start();
  CHECK(wait_for_yields(loop, std::chrono::seconds(10)) > 0);
  loop.stop();
}

TEST_CASE("a busy loop yields the CPU while it spins") {
  Reactor loop(idle_config(PollMode::kBusy, 5), "idle-busy");
  loop.start();
  CHECK(wait_for_yields(loop, std::chrono::seconds(10)) > 0);
  loop.stop();
}

TEST_CASE("busy_yield_us = 0 spins without yielding; a blocking loop never spins") {
  for (PollMode mode : {PollMode::kAdaptive, PollMode::kBusy, PollMode::kBlocking}) {
    CAPTURE(static_cast<int>(mode));
    Reactor loop(idle_config(mode, mode == PollMode::kBlocking ? 5 : 0), "idle-none");
    loop.start();
    // Idle spells of a few milliseconds each: thousands of idle turns, past
    // any yield threshold the loop might wrongly apply.
    for (int i = 0; i < 20; ++i) {
      CHECK(yields_of(loop) == 0);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    loop.stop();
    CHECK(loop.stats().yields == 0);
  }
}
