// The monitor's shared per-port sampler (lib/transport/verbs/monitor.h) against fake
// sysfs trees: one sampler per device port for the whole process, one
// reading per interval however many loops ask, and one warning per interval
// per RNR / retry / sequence counter that rose, naming device, port,
// counter, delta and the settings to change.  The per-loop Monitor needs a
// verbs transport: tests/verbs/verbs_monitor_test.cc runs it on rxe.
#include <doctest/doctest.h>

#include <chrono>
#include <string>

#include "fake_sysfs.h"
#include "../log_capture.h"
#include "transport/verbs/monitor.h"

using slotrpc::Config;
using slotrpc::HwCounter;
using slotrpc::monitor::Clock;
using slotrpc::monitor::PortSampler;
using slotrpc::test::FakeSysfs;
using slotrpc::test::LogCapture;
using namespace std::chrono_literals;

namespace {

const HwCounter* find(const std::vector<HwCounter>& v, const std::string& name) {
  for (const auto& c : v)
    if (c.name == name) return &c;
  return nullptr;
}

}  // namespace

TEST_CASE("one sampler per device port and sysfs root, shared, released with its last user") {
  FakeSysfs fs;
  fs.set("rxe0", 1, "rcvd_rnr_err", 0);
  fs.set("rxe0", 2, "rcvd_rnr_err", 0);
  auto a = PortSampler::acquire("rxe0", 1, fs.root());
  auto b = PortSampler::acquire("rxe0", 1, fs.root());
  auto c = PortSampler::acquire("rxe0", 2, fs.root());
  CHECK(a.get() == b.get());
  CHECK(a.get() != c.get());
  CHECK(a->reading().sequence == 1);  // opened: the baseline reading

  // Gone with its last user: the next one opens the files again (it sees a
  // counter file added since).
  fs.set("rxe0", 1, "send_rnr_err", 5);
  a.reset();
  b.reset();
  auto d = PortSampler::acquire("rxe0", 1, fs.root());
  REQUIRE(find(d->reading().counters, "send_rnr_err") != nullptr);
  CHECK(find(d->reading().counters, "send_rnr_err")->value == 5);
}

TEST_CASE("one reading per interval however many loops ask; one warning per rising counter") {
  FakeSysfs fs;
  fs.set("rxe0", 1, "rcvd_rnr_err", 10);
  fs.set("rxe0", 1, "retry_exceeded_err", 0);
  fs.set("rxe0", 1, "duplicate_request", 0);
  fs.set("rxe0", 1, "sent_pkts", 0);
  Config cfg;
  cfg.srq_depth = 4096;
  cfg.qp_timeout = 17;
  LogCapture log;
  auto s = PortSampler::acquire("rxe0", 1, fs.root());
  const auto t0 = Clock::now();

  // Too soon after the baseline: nothing read.
  fs.set("rxe0", 1, "rcvd_rnr_err", 13);
  CHECK_FALSE(s->maybe_sample(t0 + 100ms, 1000ms, cfg));
  CHECK(s->reading().sequence == 1);

  // Due: read once; three loops asking in the same interval read once.
  fs.set("rxe0", 1, "sent_pkts", 1000);  // kOther: never warned about
  CHECK(s->maybe_sample(t0 + 1000ms, 1000ms, cfg));
  CHECK_FALSE(s->maybe_sample(t0 + 1001ms, 1000ms, cfg));
  CHECK_FALSE(s->maybe_sample(t0 + 1500ms, 1000ms, cfg));
  CHECK(s->reading().sequence == 2);
  CHECK(find(s->reading().counters, "rcvd_rnr_err")->delta == 3);
  auto rnr = log.matching({"rcvd_rnr_err"});
  REQUIRE(rnr.size() == 1);
  CHECK(rnr[0].find("RDMA rxe0 port 1: rcvd_rnr_err rose by 3 in") != std::string::npos);
  CHECK(rnr[0].find("receiver-not-ready") != std::string::npos);
  CHECK(rnr[0].find("SLOTRPC_SRQ_DEPTH = 4096") != std::string::npos);
  CHECK(rnr[0].find("SLOTRPC_SLOT_COUNT") != std::string::npos);
  CHECK(log.matching({"sent_pkts"}).empty());
  CHECK(s->warnings() == 1);

  // Next interval: no growth, no warning.
  CHECK(s->maybe_sample(t0 + 2000ms, 1000ms, cfg));
  CHECK(log.matching({"rose by"}).size() == 1);

  // A retry and a sequence error: one warning each, with their own advice.
  fs.set("rxe0", 1, "retry_exceeded_err", 2);
  fs.set("rxe0", 1, "duplicate_request", 7);
  CHECK(s->maybe_sample(t0 + 3000ms, 1000ms, cfg));
  auto retry = log.matching({"retry_exceeded_err rose by 2"});
  REQUIRE(retry.size() == 1);
  CHECK(retry[0].find("SLOTRPC_QP_TIMEOUT (= 17") != std::string::npos);
  CHECK(retry[0].find("SLOTRPC_RETRY_COUNT") != std::string::npos);
  auto seq = log.matching({"duplicate_request rose by 7"});
  REQUIRE(seq.size() == 1);
  CHECK(seq[0].find("sequence errors") != std::string::npos);
  CHECK(s->warnings() == 3);

  // A counter that keeps rising is warned about once per interval, not once
  // per loop that asks.
  for (int i = 1; i <= 3; ++i) {
    fs.set("rxe0", 1, "rcvd_rnr_err", 13 + i);
    const auto t = t0 + 3000ms + i * 1000ms;
    CHECK(s->maybe_sample(t, 1000ms, cfg));
    CHECK_FALSE(s->maybe_sample(t + 10ms, 1000ms, cfg));
    CHECK_FALSE(s->maybe_sample(t + 400ms, 1000ms, cfg));
  }
  CHECK(log.matching({"rcvd_rnr_err rose by 1 in"}).size() == 3);

  // A reset (the counter goes backwards): the delta counts from 0.
  fs.set("rxe0", 1, "rcvd_rnr_err", 2);
  CHECK(s->maybe_sample(t0 + 7000ms, 1000ms, cfg));
  CHECK(find(s->reading().counters, "rcvd_rnr_err")->delta == 2);
  CHECK(log.matching({"rcvd_rnr_err rose by 2 in"}).size() == 1);
}

TEST_CASE("congestion counters are reported, not warned about") {
  FakeSysfs fs;
  fs.set("mlx5_0", 1, "np_cnp_sent", 0);
  LogCapture log;
  auto s = PortSampler::acquire("mlx5_0", 1, fs.root());
  fs.set("mlx5_0", 1, "np_cnp_sent", 50);
  CHECK(s->maybe_sample(Clock::now() + 2s, 1000ms, Config{}));
  CHECK(find(s->reading().counters, "np_cnp_sent")->delta == 50);
  CHECK(log.matching({"np_cnp_sent"}).empty());
  CHECK(s->warnings() == 0);
  // The absent mlx5 names are listed.
  CHECK(s->reading().absent.size() == 8);
}

TEST_CASE("a port without counters: one clear warning, then nothing") {
  FakeSysfs fs;
  fs.bare_port("rxe0", 1);
  LogCapture log;
  auto s = PortSampler::acquire("rxe0", 1, fs.root());
  auto lines = log.matching({"no hardware counters for rxe0 port 1", "exposes no counters"});
  CHECK(lines.size() == 1);
  CHECK_FALSE(s->maybe_sample(Clock::now() + 10s, 1000ms, Config{}));
  CHECK(s->reading().sequence == 0);
  CHECK(s->reading().counters.empty());
  CHECK(log.lines().size() == 1);
}

TEST_CASE("a counter that turns unreadable is logged once, not every interval") {
  FakeSysfs fs;
  fs.set("rxe0", 1, "rcvd_rnr_err", 1);
  LogCapture log;
  auto s = PortSampler::acquire("rxe0", 1, fs.root());
  fs.set("rxe0", 1, "hw_counters", "rcvd_rnr_err", "oops");
  const auto t0 = Clock::now();
  for (int i = 1; i <= 3; ++i) CHECK(s->maybe_sample(t0 + i * 1s, 1000ms, Config{}));
  CHECK(log.matching({"cannot read counter rcvd_rnr_err", "not a number: 'oops'"}).size() == 1);
}
