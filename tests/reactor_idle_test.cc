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

#include "bulk/tcp_world.h"
#include "reactor/reactor.h"
#include "rpc/loop_transports.h"

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

// Adaptive mode's spin budget (reactor/spin_budget.h): the policy, then the
// loop using it.
TEST_CASE("the adaptive spin doubles while sleeps end sooner than it, up to spin_max_us") {
  using slotrpc::reactor::SpinBudget;
  using std::chrono::microseconds;
  SpinBudget b(200, 1000);
  CHECK(b.budget() == microseconds(200));
  b.slept(microseconds(300));  // longer than the spin, shorter than the cap: kept
  CHECK(b.budget() == microseconds(200));
  b.slept(microseconds(150));  // the work came back within another spin
  CHECK(b.budget() == microseconds(400));
  b.slept(microseconds(10));
  CHECK(b.budget() == microseconds(800));
  b.slept(microseconds(10));
  CHECK(b.budget() == microseconds(1000));  // capped
  b.slept(microseconds(10));
  CHECK(b.budget() == microseconds(1000));
  b.slept(microseconds(999));
  CHECK(b.budget() == microseconds(1000));
  b.slept(microseconds(1000));  // a sleep as long as the cap: maybe idle, halved
  CHECK(b.budget() == microseconds(500));
  b.slept(microseconds(50'000));
  CHECK(b.budget() == microseconds(250));
  b.slept(microseconds(50'000));  // never below spin_us
  CHECK(b.budget() == microseconds(200));

  SpinBudget zero(0, 1000);  // spin_us = 0 sleeps at once, always
  zero.slept(microseconds(0));
  CHECK(zero.budget() == microseconds(0));
  SpinBudget fixed(500, 100);  // spin_max_us <= spin_us: no growth
  fixed.slept(microseconds(1));
  CHECK(fixed.budget() == microseconds(500));
}

TEST_CASE("an adaptive loop woken soon after each sleep spins longer; a loop left alone keeps spin_us") {
  Config cfg;
  cfg.poll_mode = PollMode::kAdaptive;
  cfg.spin_us = 1000;
  cfg.spin_max_us = 10'000'000;  // no sleep of the test is long enough to reset it
  Reactor loop(cfg, "spin-grows");
  loop.start();
  // A task every 1.2 ms: the loop spins 1 ms, sleeps, and wakes about
  // 0.2 ms later, sooner than its spin, so the spin doubles and then covers
  // the gaps.  The poster sleeps between posts (a busy wait could hold the
  // very core the loop needs to wake on).  On a loaded machine many
  // wake-ups come later than that; one in time is enough, so the poster goes
  // on until the spin has grown (or 4,000 tries, about 5 s, have passed).
  auto spin_of = [&] {
    std::promise<uint64_t> p;
    auto f = p.get_future();
    loop.post([&] { p.set_value(loop.stats().spin_us); });
    return f.get();
  };
  uint64_t spin = spin_of();
  for (int i = 0; i < 4000 && spin < 2000; ++i) {
    loop.post([] {});
    std::this_thread::sleep_for(std::chrono::microseconds(1200));
    if (i % 20 == 19) spin = spin_of();
  }
  loop.stop();
  CHECK(spin >= 2000);

  Reactor quiet(cfg, "spin-quiet");
  quiet.start();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // sleeps, unwoken
  std::promise<uint64_t> kept;
  quiet.post([&] { kept.set_value(quiet.stats().spin_us); });
  CHECK(kept.get_future().get() == 1000);
  quiet.stop();
}

// Work is not only completions: a bulk read's data arrives without one until
// its last byte.  The loop's peer here is a raw socket that answers the
// READ_REQ with a 64 KiB frame every 20 ms for 1.2 s, while the loop spins
// 200 ms before it sleeps.  Counting only completions, the loop slept each
// time 200 ms had passed since the last (and yielded on every turn after
// busy_yield_us), in the middle of the transfer.
TEST_CASE("an adaptive loop receiving bulk data counts it as work: it does not sleep while the data keeps coming") {
  using namespace tcp_world;
  Config cfg;
  cfg.poll_mode = PollMode::kAdaptive;
  cfg.spin_us = 200'000;
  cfg.spin_max_us = 200'000;
  Reactor loop(cfg, "idle-bulk");
  loop.start();
  auto on_loop = [&](auto fn) {
    std::promise<void> p;
    auto f = p.get_future();
    loop.post([&] {
      fn();
      p.set_value();
    });
    f.get();
  };
  auto [raw, fd] = loopback_pair();
  constexpr size_t kFrame = 64 * 1024, kFrames = 60;
  const std::vector<std::byte> src = pattern(kFrame * kFrames, 17);
  std::vector<std::byte> ring(size_t{kSlots} * kSlotSize), dst(src.size());
  std::unique_ptr<TcpLink> link;
  // On the loop thread (the link is the loop's); failures are reported
  // here, on the test's thread.
  std::string setup_error;
  on_loop([&] {
    auto r = slotrpc::rpc::loop_tcp(loop).adopt(fd, "idle-bulk");
    if (!r.ok()) {
      setup_error = "adopt: " + r.status().to_string();
      return;
    }
    link = std::move(r).value();
    auto rr = link->register_memory(ring, Access::kRemoteWrite);
    if (!rr.ok()) {
      setup_error = "register_memory: " + rr.status().to_string();
      return;
    }
    // No context: the loop hands the link's completions to no session.
    Status st = link->attach(rr.value(), MemoryRegion{}, kSlots, kSlotSize, nullptr);
    auto dreg = st.ok() ? link->register_bulk(BulkSource{dst.data(), dst.size()})
                        : Result<BulkRegistration>(st);
    if (dreg.ok()) st = link->read(dreg.value(), 0, RemoteSegment{0, src.size(), 1}, 0, src.size(), 1);
    if (!dreg.ok() || !st.ok()) setup_error = (dreg.ok() ? st : dreg.status()).to_string();
  });
  REQUIRE_MESSAGE(setup_error.empty(), setup_error);
  const PacedReadPeer peer{raw};
  const uint64_t tag = peer.take_request();
  uint64_t before = 0;
  on_loop([&] { before = loop.stats().sleeps; });
  REQUIRE(peer.send(tag, src, kFrame, std::chrono::milliseconds(20)));
  // Every frame is sent; the last ones may still be on their way.
  uint64_t during = 0;
  bool complete = false;
  const auto deadline = Clock::now() + kTimeout;
  while (!complete && Clock::now() < deadline) {
    on_loop([&] {
      during = loop.stats().sleeps - before;
      complete = std::memcmp(dst.data(), src.data(), dst.size()) == 0;
    });
    if (!complete) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(complete);
  CAPTURE(during);
  // 0 here; one sleep is allowed for a machine that stalls the peer's
  // thread for a whole spin once.  Counting completions only, it slept 5
  // times.
  CHECK(during <= 1);
  on_loop([&] { link.reset(); });
  ::close(raw);
  loop.stop();
}
