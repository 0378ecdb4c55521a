// Thread placement (base/cpu_list.h, transport/tcp/lane_placement.h):
// SLOTRPC_LOOP_CPUS puts event-loop threads on the listed CPUs,
// SLOTRPC_TCP_LANE_CPUS bulk lane threads, and with only the first set,
// lane threads go to the process's other CPUs; with neither, a lane thread
// keeps off the first CPU while small calls go by
// (SLOTRPC_TCP_LANE_SPARE_RATE).
// Each check reads the kernel's own mask for the thread
// (sched_getaffinity), so it fails if the setting is not applied.  Needs
// two online CPUs (a CPU list of one could not tell pinned from unpinned);
// the machines the suite runs on have them.
#include <doctest/doctest.h>

#include <sched.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include "base/cpu_list.h"
#include "reactor/reactor.h"
#include "transport/tcp/bulk_lanes.h"
#include "transport/tcp/lane_placement.h"

namespace {

using slotrpc::Config;
using namespace slotrpc::core;
using namespace slotrpc::base;
using slotrpc::transport::BulkLanes;
using slotrpc::transport::lane_placement;
using slotrpc::transport::LaneSpare;
using namespace std::chrono_literals;

cpu_set_t parse(const char* text) {
  auto r = parse_cpu_list("test", text);
  REQUIRE_MESSAGE(r.ok(), r.status().to_string());
  return r.value();
}

std::string affinity_of(pid_t tid) {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(::sched_getaffinity(tid, sizeof set, &set) == 0);
  return format_cpu_list(set);
}

// The highest online CPU this process may use: a one-CPU list that
// differs from an unpinned thread's mask.
unsigned last_cpu() {
  const cpu_set_t online = online_cpus();
  const cpu_set_t mine = process_cpus();
  REQUIRE_MESSAGE(CPU_COUNT(&online) >= 2, "the placement tests need two online CPUs");
  for (unsigned c = CPU_SETSIZE; c-- > 0;)
    if (CPU_ISSET(c, &online) && CPU_ISSET(c, &mine)) return c;
  FAIL("no online CPU this process may use");
  return 0;
}

// Lanes for a loop with `config` and no lane attached: the thread runs,
// places itself, and sleeps in epoll_wait (100 ms at a time), looking at
// the spare rule each time it wakes.
struct IdleLanes {
  explicit IdleLanes(const Config& config, uint64_t slot_frames = 0) : epoll_fd(::epoll_create1(EPOLL_CLOEXEC)) {
    REQUIRE(epoll_fd >= 0);
    auto started = BulkLanes::start(config, epoll_fd, slot_frames);
    REQUIRE_MESSAGE(started.ok(), started.status().to_string());
    lanes = std::move(started).value();
    // The thread publishes its id, then places itself, then polls and
    // sleeps: its first sleep means the placement is done.
    const auto until = std::chrono::steady_clock::now() + 10s;
    while ((lanes->thread_id() == 0 || lanes->sleeps() == 0) && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(1ms);
    REQUIRE(lanes->sleeps() > 0);
  }
  ~IdleLanes() {
    lanes.reset();  // joins the thread, which uses epoll_fd
    ::close(epoll_fd);
  }
  std::string cpus() const { return affinity_of(lanes->thread_id()); }

  int epoll_fd;
  std::unique_ptr<BulkLanes> lanes;
};

// The lane thread's mask once it has placed itself.
std::string lane_thread_cpus(const Config& config) { return IdleLanes(config).cpus(); }

}  // namespace

TEST_CASE("cpu lists: ranges and single CPUs, in any order, print back canonically") {
  CHECK(format_cpu_list(parse("0")) == "0");
  CHECK(format_cpu_list(parse("0-2,5,7-8")) == "0-2,5,7-8");
  CHECK(format_cpu_list(parse("8,7,5,2-2,0-1")) == "0-2,5,7-8");
  CHECK(format_cpu_list(parse("1023")) == "1023");
  for (const char* bad : {"", "a", "1-0", "0,", ",0", "0 1", "-1", "1-", "0--1", "1024", "0-1024",
                          "99999999999999999999", "0x1", "+1"}) {
    CAPTURE(bad);
    auto r = parse_cpu_list("Config.loop_cpus (SLOTRPC_LOOP_CPUS)", bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == slotrpc::StatusCode::kInvalidArgument);
    const std::string m = r.status().message();
    CHECK(m.find("Config.loop_cpus (SLOTRPC_LOOP_CPUS)='" + std::string(bad) + "'") != std::string::npos);
    CHECK(m.find("0-3,8") != std::string::npos);  // the syntax, by example
  }
  CHECK(parse_cpu_list("S", "0-1024").status().message() ==
        "invalid setting S='0-1024': CPU 1024 is too large; allowed CPU numbers and ranges such as 0-3,8 "
        "(comma-separated, no spaces, each below 1024)");
  CHECK(parse_cpu_list("S", "2,x").status().message().find("expected a CPU number") != std::string::npos);
}

TEST_CASE("cpu lists: a list with no online CPU is refused, naming the online ones") {
  CHECK(check_cpu_list("X", "").ok());  // no placement
  CHECK(check_cpu_list("X", "0").ok());
  const std::string online = format_cpu_list(online_cpus());
  auto st = check_cpu_list("Config.tcp_lane_cpus (SLOTRPC_TCP_LANE_CPUS)", "1000-1001");
  REQUIRE_FALSE(st.ok());
  CHECK(st.message() == "invalid setting Config.tcp_lane_cpus (SLOTRPC_TCP_LANE_CPUS)='1000-1001': none of "
                        "these CPUs is online; allowed CPUs from " + online);
  // Config::validate checks both lists.
  Config c;
  c.loop_cpus = "7-x";
  CHECK(c.validate().message().find("Config.loop_cpus (SLOTRPC_LOOP_CPUS)='7-x'") != std::string::npos);
  c.loop_cpus = "0";
  c.tcp_lane_cpus = "1000";
  CHECK(c.validate().message().find("Config.tcp_lane_cpus (SLOTRPC_TCP_LANE_CPUS)='1000'") != std::string::npos);
}

TEST_CASE("an event loop runs on SLOTRPC_LOOP_CPUS") {
  const unsigned cpu = last_cpu();
  Config c;
  c.loop_cpus = std::to_string(cpu);
  slotrpc::reactor::Reactor loop(c, "placed-loop");
  loop.start();
  std::promise<std::string> p;
  auto f = p.get_future();
  loop.post([&p] { p.set_value(affinity_of(0)); });
  REQUIRE(f.wait_for(10s) == std::future_status::ready);
  CHECK(f.get() == std::to_string(cpu));
  loop.stop();
}

TEST_CASE("lane threads: SLOTRPC_TCP_LANE_CPUS, else off SLOTRPC_LOOP_CPUS, else where they were started") {
  const unsigned cpu = last_cpu();
  const std::string unpinned = affinity_of(0);  // this thread starts them
  Config c;
  SUBCASE("a lane list: exactly that") {
    c.tcp_lane_cpus = std::to_string(cpu);
    CHECK(lane_thread_cpus(c) == std::to_string(cpu));
  }
  SUBCASE("a loop list only: the process's CPUs without it") {
    c.loop_cpus = std::to_string(cpu);
    cpu_set_t rest = process_cpus();
    CPU_CLR(cpu, &rest);
    CHECK(lane_thread_cpus(c) == format_cpu_list(rest));
  }
  SUBCASE("neither: the starting thread's mask") { CHECK(lane_thread_cpus(c) == unpinned); }
}

TEST_CASE("lane_placement: the lane list wins; a loop list leaves the rest of the process; nothing left, nothing") {
  const cpu_set_t process = parse("0-3");
  std::string error;
  auto p = lane_placement("2", "0-1", process, &error);
  REQUIRE(p.has_value());
  CHECK(format_cpu_list(*p) == "2");
  p = lane_placement("", "0-1", process, &error);
  REQUIRE(p.has_value());
  CHECK(format_cpu_list(*p) == "2-3");
  CHECK_FALSE(lane_placement("", "0-3", process, &error).has_value());  // loops have them all
  CHECK_FALSE(lane_placement("", "", process, &error).has_value());
  CHECK(error.empty());
  CHECK_FALSE(lane_placement("x", "", process, &error).has_value());
  CHECK(error.find("SLOTRPC_TCP_LANE_CPUS='x'") != std::string::npos);
}

// The spare rule on made-up times: 800 frames a second is 4 in a 5 ms
// window.
TEST_CASE("LaneSpare: spares the first CPU at the rate, keeps it through a short pause, gives it back after two quiet windows") {
  using Change = LaneSpare::Change;
  const auto t0 = LaneSpare::Clock::now();
  auto at = [t0](int ms) { return t0 + std::chrono::milliseconds(ms); };
  LaneSpare spare(parse("3,5-6"), 800, t0);
  REQUIRE(spare.enabled());
  CHECK(format_cpu_list(spare.spare_mask()) == "5-6");  // the first CPU, not CPU 0
  CHECK(format_cpu_list(spare.full_mask()) == "3,5-6");

  CHECK(spare.observe(at(0), 1000) == Change::kNone);  // the baseline: a count, not a rate
  CHECK(spare.observe(at(5), 1003) == Change::kNone);  // 600 a second: below
  CHECK(spare.observe(at(9), 1100) == Change::kNone);  // the window has not ended
  CHECK(spare.observe(at(10), 1100) == Change::kSpare);  // 97 frames in 5 ms
  CHECK(spare.sparing());
  CHECK(spare.observe(at(15), 1104) == Change::kNone);  // still busy
  CHECK(spare.observe(at(20), 1104) == Change::kNone);  // one quiet window: a pause
  CHECK(spare.observe(at(25), 1110) == Change::kNone);  // busy again: the count starts over
  CHECK(spare.observe(at(30), 1110) == Change::kNone);
  CHECK(spare.observe(at(35), 1111) == Change::kRestore);  // two quiet windows in a row
  CHECK_FALSE(spare.sparing());
  CHECK(spare.observe(at(40), 1111) == Change::kNone);  // quiet and not sparing: nothing to do

  // A thread that slept: the rate over the whole time since the last look.
  CHECK(spare.observe(at(140), 1151) == Change::kNone);   // 40 in 100 ms: 400 a second
  CHECK(spare.observe(at(240), 1251) == Change::kSpare);  // 100 in 100 ms: 1,000 a second
}

TEST_CASE("LaneSpare: off at rate 0 and for a process of one CPU") {
  const auto t0 = LaneSpare::Clock::now();
  for (auto [cpus, rate] : {std::pair{"0-3", 0u}, std::pair{"2", 800u}}) {
    CAPTURE(cpus);
    LaneSpare spare(parse(cpus), rate, t0);
    CHECK_FALSE(spare.enabled());
    CHECK(spare.observe(t0, 0) == LaneSpare::Change::kNone);
    CHECK(spare.observe(t0 + 10ms, 1'000'000) == LaneSpare::Change::kNone);
  }
}

// The rule on a real lane thread: frames the loop notes move it off the
// process's first CPU and back.  Each check reads the kernel's mask.
TEST_CASE("a lane thread keeps off the first CPU while slot frames go by, and returns when they stop") {
  (void)last_cpu();  // two CPUs, or the rule has nothing to spare
  const cpu_set_t process = process_cpus();
  LaneSpare shape(process, 800, LaneSpare::Clock::now());
  const std::string full = format_cpu_list(process);
  const std::string spared = format_cpu_list(shape.spare_mask());
  Config c;
  c.tcp_lane_spare_rate = 800;
  IdleLanes idle(c);
  CHECK(idle.cpus() == full);  // nothing went by yet

  // 10 frames a millisecond (10,000 a second) until the thread moves;
  // it looks at least every 100 ms, when its epoll_wait times out.
  const auto until = std::chrono::steady_clock::now() + 10s;
  uint64_t frames = 0;
  std::string now_cpus;
  while ((now_cpus = idle.cpus()) != spared && std::chrono::steady_clock::now() < until) {
    idle.lanes->note_slot_frames(frames += 10);
    std::this_thread::sleep_for(1ms);
  }
  CHECK(now_cpus == spared);
  // Quiet: two windows (at most two 100 ms sleeps) and it is back.
  while ((now_cpus = idle.cpus()) != full && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(1ms);
  CHECK(now_cpus == full);
}

TEST_CASE("a lane thread with a fixed placement, or at rate 0, stays where it is while slot frames go by") {
  const unsigned cpu = last_cpu();
  Config c;
  c.tcp_lane_spare_rate = 800;  // on (the default is off), unless a case says otherwise
  std::string expected = format_cpu_list(process_cpus());
  SUBCASE("rate 0") { c.tcp_lane_spare_rate = 0; }
  SUBCASE("loop list") {
    c.loop_cpus = std::to_string(cpu);
    cpu_set_t rest = process_cpus();
    CPU_CLR(cpu, &rest);
    expected = format_cpu_list(rest);
  }
  // The loops have every CPU, so lane_placement() has nothing to give the
  // lanes and they stay where they started; the user placed threads all
  // the same, and the rule stays off.
  SUBCASE("loop list of every CPU") { c.loop_cpus = format_cpu_list(process_cpus()); }
  IdleLanes idle(c);
  // Long enough for three of its looks (100 ms sleeps), each of which
  // would have moved it at this rate.
  const auto until = std::chrono::steady_clock::now() + 10s;
  const uint64_t looks = idle.lanes->sleeps() + 3;
  uint64_t frames = 0;
  while (idle.lanes->sleeps() < looks && std::chrono::steady_clock::now() < until) {
    idle.lanes->note_slot_frames(frames += 10);
    std::this_thread::sleep_for(1ms);
  }
  REQUIRE(idle.lanes->sleeps() >= looks);
  CHECK(idle.cpus() == expected);
}

// The loop's count when its first lane starts is the rule's baseline: a
// session that sent a million frames before its first transfer is no
// burst.  (Counted from 0, the first look after the loop noted the count
// saw a million frames at once and spared a CPU for nothing.)
TEST_CASE("a lane thread started on a loop with a long past does not take that past for a burst") {
  (void)last_cpu();
  Config c;
  c.tcp_lane_spare_rate = 800;
  IdleLanes idle(c, 1'000'000);
  const std::string full = idle.cpus();
  const uint64_t asleep = idle.lanes->sleeps();
  idle.lanes->note_slot_frames(1'000'000);  // what the loop's next poll does
  // Its next look, and the one after, would have been the spurious one's
  // verdict and its first quiet window.
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (idle.lanes->sleeps() < asleep + 2 && std::chrono::steady_clock::now() < until) {
    CHECK(idle.cpus() == full);
    std::this_thread::sleep_for(1ms);
  }
  REQUIRE(idle.lanes->sleeps() >= asleep + 2);
}
