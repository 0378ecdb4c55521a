// Thread placement (base/cpu_list.h, transport/tcp/lane_placement.h):
// SLOTRPC_LOOP_CPUS puts event-loop threads on the listed CPUs,
// SLOTRPC_TCP_LANE_CPUS bulk lane threads, and with only the first set,
// lane threads go to the process's other CPUs; with neither, a lane thread
// stays where it was started.
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
// places itself, and sleeps in epoll_wait (100 ms at a time).
struct IdleLanes {
  explicit IdleLanes(const Config& config) : epoll_fd(::epoll_create1(EPOLL_CLOEXEC)) {
    REQUIRE(epoll_fd >= 0);
    auto started = BulkLanes::start(config, epoll_fd);
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
