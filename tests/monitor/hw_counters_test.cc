// The sysfs counter reader (lib/transport/verbs/hw_counters.h) against fake trees:
// classification, absent names, pread re-reads of files held open, missing
// directories, unreadable files, non-numeric content, counters that go
// backwards (a device reset) or wrap, and unknown devices and ports.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "fake_sysfs.h"
#include "transport/verbs/hw_counters.h"

using slotrpc::HwCounter;
using slotrpc::StatusCode;
using slotrpc::monitor::PortCounters;
using slotrpc::test::FakeSysfs;
using Kind = HwCounter::Kind;
using namespace std::chrono_literals;

namespace {

const HwCounter* find(const std::vector<HwCounter>& v, const std::string& name) {
  auto it = std::find_if(v.begin(), v.end(), [&](const HwCounter& c) { return c.name == name; });
  return it == v.end() ? nullptr : &*it;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

bool any_contains(const std::vector<std::string>& v, const std::string& part) {
  return std::any_of(v.begin(), v.end(), [&](const std::string& s) { return contains(s, part); });
}

// A file that can be opened but whose read fails (EIO), like an mlx5 PMA
// counter the device does not support (EINVAL on read).
constexpr const char* kReadFails = "/proc/self/mem";

}  // namespace

TEST_CASE("classification of the known names") {
  using slotrpc::monitor::classify_counter;
  CHECK(classify_counter("out_of_buffer") == Kind::kRnr);
  CHECK(classify_counter("rnr_nak_retry_err") == Kind::kRnr);
  CHECK(classify_counter("local_ack_timeout_err") == Kind::kRetry);
  CHECK(classify_counter("out_of_sequence") == Kind::kSequence);
  CHECK(classify_counter("packet_seq_err") == Kind::kSequence);
  CHECK(classify_counter("implied_nak_seq_err") == Kind::kSequence);
  CHECK(classify_counter("np_cnp_sent") == Kind::kCongestion);
  CHECK(classify_counter("rp_cnp_handled") == Kind::kCongestion);
  CHECK(classify_counter("np_ecn_marked_roce_packets") == Kind::kCongestion);
  CHECK(classify_counter("rcvd_rnr_err") == Kind::kRnr);
  CHECK(classify_counter("send_rnr_err") == Kind::kRnr);
  CHECK(classify_counter("retry_rnr_exceeded_err") == Kind::kRnr);
  CHECK(classify_counter("retry_exceeded_err") == Kind::kRetry);
  CHECK(classify_counter("rcvd_seq_err") == Kind::kSequence);
  CHECK(classify_counter("duplicate_request") == Kind::kSequence);
  CHECK(classify_counter("sent_pkts") == Kind::kOther);
  CHECK(classify_counter("") == Kind::kOther);
}

TEST_CASE("parse_counter accepts a number and nothing else") {
  uint64_t v = 7;
  CHECK(slotrpc::monitor::parse_counter("123\n", v));
  CHECK(v == 123);
  CHECK(slotrpc::monitor::parse_counter("18446744073709551615", v));
  CHECK(v == UINT64_MAX);
  v = 7;
  CHECK_FALSE(slotrpc::monitor::parse_counter("", v));
  CHECK_FALSE(slotrpc::monitor::parse_counter("\n", v));
  CHECK_FALSE(slotrpc::monitor::parse_counter("N/A (no PMA)\n", v));
  CHECK_FALSE(slotrpc::monitor::parse_counter("-1", v));
  CHECK_FALSE(slotrpc::monitor::parse_counter("12abc", v));
  CHECK_FALSE(slotrpc::monitor::parse_counter("18446744073709551616", v));  // overflow
  CHECK(v == 7);
}

TEST_CASE("an rxe port: every file read, kinds, absent names, deltas and rates") {
  FakeSysfs fs;
  fs.set("rxe0", 1, "rcvd_rnr_err", 5);
  fs.set("rxe0", 1, "send_rnr_err", 0);
  fs.set("rxe0", 1, "retry_exceeded_err", 1);
  fs.set("rxe0", 1, "duplicate_request", 0);
  fs.set("rxe0", 1, "sent_pkts", 100);
  fs.set("rxe0", 1, "hw_counters", "lifespan", "10\n");
  fs.set("rxe0", 1, "counters", "port_xmit_data", "4000\n");

  auto opened = PortCounters::open("rxe0", 1, fs.root());
  REQUIRE_MESSAGE(opened.ok(), opened.status().to_string());
  PortCounters& pc = *opened.value();
  CHECK(pc.family() == "rxe");
  CHECK(pc.counters().size() == 6);  // lifespan is not a counter
  CHECK(find(pc.counters(), "lifespan") == nullptr);
  REQUIRE(find(pc.counters(), "rcvd_rnr_err") != nullptr);
  CHECK(find(pc.counters(), "rcvd_rnr_err")->kind == Kind::kRnr);
  CHECK(find(pc.counters(), "rcvd_rnr_err")->value == 5);
  CHECK(find(pc.counters(), "rcvd_rnr_err")->delta == 0);  // baseline
  CHECK(find(pc.counters(), "rcvd_rnr_err")->device == "rxe0");
  CHECK(find(pc.counters(), "rcvd_rnr_err")->port == 1);
  CHECK(find(pc.counters(), "retry_exceeded_err")->kind == Kind::kRetry);
  CHECK(find(pc.counters(), "duplicate_request")->kind == Kind::kSequence);
  CHECK(find(pc.counters(), "sent_pkts")->kind == Kind::kOther);
  REQUIRE(find(pc.counters(), "port_xmit_data") != nullptr);
  CHECK(find(pc.counters(), "port_xmit_data")->value == 4000);
  CHECK(pc.errors().empty());

  // The known rxe names the fake port lacks, and only those.
  std::vector<std::string> absent = pc.absent();
  std::sort(absent.begin(), absent.end());
  CHECK(absent == std::vector<std::string>{"rxe0/1: rcvd_seq_err", "rxe0/1: retry_rnr_exceeded_err"});

  // Files stay open: rewritten in place, the next sample sees the change.
  fs.set("rxe0", 1, "rcvd_rnr_err", 17);
  fs.set("rxe0", 1, "sent_pkts", 400);
  const auto t0 = PortCounters::Clock::now();
  pc.sample(t0);
  fs.set("rxe0", 1, "rcvd_rnr_err", 21);
  auto errors = pc.sample(t0 + 2s);
  CHECK(errors.empty());
  const HwCounter* rnr = find(pc.counters(), "rcvd_rnr_err");
  CHECK(rnr->value == 21);
  CHECK(rnr->delta == 4);
  CHECK(rnr->per_second == doctest::Approx(2.0));
  CHECK(find(pc.counters(), "sent_pkts")->delta == 0);
}

TEST_CASE("files are opened once: a replaced file is not seen, a rewritten one is") {
  FakeSysfs fs;
  fs.set("rxe0", 1, "rcvd_rnr_err", 1);
  auto opened = PortCounters::open("rxe0", 1, fs.root());
  REQUIRE(opened.ok());
  PortCounters& pc = *opened.value();
  // Replace the file (new inode): the held descriptor still reads the old one.
  const std::string path = fs.dir("rxe0", 1, "hw_counters") + "/rcvd_rnr_err";
  std::filesystem::remove(path);
  fs.set("rxe0", 1, "rcvd_rnr_err", 99);
  pc.sample();
  CHECK(find(pc.counters(), "rcvd_rnr_err")->value == 1);
}

TEST_CASE("mlx5: known names, absent list and the PMA directory") {
  FakeSysfs fs;
  fs.set("mlx5_0", 1, "out_of_buffer", 3);
  fs.set("mlx5_0", 1, "np_cnp_sent", 2);
  fs.set("mlx5_0", 1, "local_ack_timeout_err", 0);
  fs.set("mlx5_0", 1, "counters", "port_rcv_data", "12\n");
  auto opened = PortCounters::open("mlx5_0", 1, fs.root());
  REQUIRE(opened.ok());
  PortCounters& pc = *opened.value();
  CHECK(pc.family() == "mlx5");
  CHECK(find(pc.counters(), "out_of_buffer")->kind == Kind::kRnr);
  CHECK(find(pc.counters(), "np_cnp_sent")->kind == Kind::kCongestion);
  CHECK(find(pc.counters(), "local_ack_timeout_err")->kind == Kind::kRetry);
  CHECK(pc.absent().size() == 6);
  CHECK(any_contains(pc.absent(), "mlx5_0/1: rnr_nak_retry_err"));
  CHECK(any_contains(pc.absent(), "mlx5_0/1: np_ecn_marked_roce_packets"));
  CHECK_FALSE(any_contains(pc.absent(), "out_of_buffer"));
  CHECK_FALSE(any_contains(pc.absent(), "rcvd_rnr_err"));  // not the family's
}

TEST_CASE("a renamed device: the family comes from the names it exposes") {
  FakeSysfs fs;
  fs.set("roce_a", 1, "rcvd_rnr_err", 0);
  auto opened = PortCounters::open("roce_a", 1, fs.root());
  REQUIRE(opened.ok());
  CHECK(opened.value()->family() == "rxe");
  CHECK(opened.value()->absent().size() == 5);
}

TEST_CASE("a device reset: a counter that goes backwards counts from 0, no huge delta") {
  FakeSysfs fs;
  fs.set("rxe0", 1, "rcvd_rnr_err", 1000);
  fs.set("rxe0", 1, "counters", "port_rcv_packets", "4294967290\n");
  auto opened = PortCounters::open("rxe0", 1, fs.root());
  REQUIRE(opened.ok());
  PortCounters& pc = *opened.value();
  fs.set("rxe0", 1, "rcvd_rnr_err", 7);  // reset, then 7 more
  fs.set("rxe0", 1, "counters", "port_rcv_packets", "5\n");  // a 32-bit counter wrapped
  const auto t0 = PortCounters::Clock::now();
  pc.sample(t0 + 1s);
  CHECK(find(pc.counters(), "rcvd_rnr_err")->value == 7);
  CHECK(find(pc.counters(), "rcvd_rnr_err")->delta == 7);
  CHECK(find(pc.counters(), "port_rcv_packets")->delta == 5);
  fs.set("rxe0", 1, "rcvd_rnr_err", 10);
  pc.sample(t0 + 2s);
  CHECK(find(pc.counters(), "rcvd_rnr_err")->delta == 3);
}

TEST_CASE("non-numeric content: an error naming the counter, once, and the value is kept") {
  FakeSysfs fs;
  fs.set("rxe0", 1, "rcvd_rnr_err", 10);
  fs.set("rxe0", 1, "hw_counters", "weird", "N/A\n");
  auto opened = PortCounters::open("rxe0", 1, fs.root());
  REQUIRE(opened.ok());
  PortCounters& pc = *opened.value();
  // Bad from the start: present, listed as an error, value 0.
  REQUIRE(find(pc.counters(), "weird") != nullptr);
  CHECK(find(pc.counters(), "weird")->value == 0);
  REQUIRE(pc.errors().size() == 1);
  CHECK(contains(pc.errors()[0], "rxe0/1: cannot read counter weird"));
  CHECK(contains(pc.errors()[0], "not a number: 'N/A\\n'"));

  // A good counter turns bad: reported once, value kept, delta 0.
  fs.set("rxe0", 1, "hw_counters", "rcvd_rnr_err", "garbage");
  auto fresh = pc.sample();
  REQUIRE(fresh.size() == 1);
  CHECK(contains(fresh[0], "cannot read counter rcvd_rnr_err"));
  CHECK(contains(fresh[0], "'garbage'"));
  CHECK(find(pc.counters(), "rcvd_rnr_err")->value == 10);
  CHECK(find(pc.counters(), "rcvd_rnr_err")->delta == 0);
  CHECK(pc.sample().empty());  // still bad: not reported again
  CHECK(pc.errors().size() == 2);

  // It recovers: delta against the last good value.
  fs.set("rxe0", 1, "rcvd_rnr_err", 15);
  CHECK(pc.sample().empty());
  CHECK(find(pc.counters(), "rcvd_rnr_err")->value == 15);
  CHECK(find(pc.counters(), "rcvd_rnr_err")->delta == 5);
  CHECK(pc.errors().size() == 1);
  // The one that was bad from the start: its first good value is a baseline.
  fs.set("rxe0", 1, "hw_counters", "weird", "1000000\n");
  pc.sample();
  CHECK(find(pc.counters(), "weird")->value == 1000000);
  CHECK(find(pc.counters(), "weird")->delta == 0);
  CHECK(pc.errors().empty());
}

TEST_CASE("unreadable files: one that cannot be opened is skipped, one whose read fails is an error") {
  FakeSysfs fs;
  fs.set("rxe0", 1, "rcvd_rnr_err", 2);
  if (::geteuid() == 0) {
    // Root opens any mode-000 file; a write-only proc file refuses even root.
    fs.symlink("rxe0", 1, "hw_counters", "locked", "/proc/sys/vm/compact_memory");
  } else {
    fs.set("rxe0", 1, "hw_counters", "locked", "1\n");
    std::filesystem::permissions(fs.dir("rxe0", 1, "hw_counters") + "/locked", std::filesystem::perms::none);
  }
  fs.symlink("rxe0", 1, "counters", "VL15_dropped", kReadFails);
  auto opened = PortCounters::open("rxe0", 1, fs.root());
  REQUIRE_MESSAGE(opened.ok(), opened.status().to_string());
  PortCounters& pc = *opened.value();
  CHECK(find(pc.counters(), "locked") == nullptr);
  CHECK(find(pc.counters(), "rcvd_rnr_err")->value == 2);
  const auto errors = pc.errors();
  REQUIRE(errors.size() == 2);
  CHECK(any_contains(errors, "cannot open " + fs.dir("rxe0", 1, "hw_counters") + "/locked: Permission denied"));
  CHECK(any_contains(errors, "cannot read counter VL15_dropped"));
  CHECK(any_contains(errors, "Input/output error"));
  fs.set("rxe0", 1, "rcvd_rnr_err", 3);
  CHECK(pc.sample().empty());  // the failing one was reported at open already
  CHECK(find(pc.counters(), "rcvd_rnr_err")->delta == 1);
}

TEST_CASE("missing directories") {
  FakeSysfs fs;
  SUBCASE("unknown device: named, and the devices that exist listed") {
    fs.set("rxe0", 1, "rcvd_rnr_err", 0);
    fs.set("mlx5_1", 1, "out_of_buffer", 0);
    auto r = PortCounters::open("mlx5_0", 1, fs.root());
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK(contains(r.status().message(), "unknown RDMA device 'mlx5_0'"));
    CHECK(contains(r.status().message(), "devices under " + fs.root() + ": mlx5_1, rxe0"));
  }
  SUBCASE("no devices at all") {
    auto r = PortCounters::open("rxe0", 1, fs.root() + "/nonexistent");
    REQUIRE_FALSE(r.ok());
    CHECK(contains(r.status().message(), "no RDMA devices under " + fs.root() + "/nonexistent"));
  }
  SUBCASE("unknown port") {
    fs.set("rxe0", 1, "rcvd_rnr_err", 0);
    auto r = PortCounters::open("rxe0", 2, fs.root());
    REQUIRE_FALSE(r.ok());
    CHECK(contains(r.status().message(), "RDMA device rxe0 has no port 2 (ports: 1)"));
  }
  SUBCASE("a port without hw_counters: the PMA counters, every known name absent") {
    fs.set("rxe0", 1, "counters", "port_xmit_data", "1\n");
    auto r = PortCounters::open("rxe0", 1, fs.root());
    REQUIRE(r.ok());
    CHECK(r.value()->counters().size() == 1);
    CHECK(r.value()->absent().size() == 6);
  }
  SUBCASE("a port with neither directory") {
    fs.bare_port("rxe0", 1);
    auto r = PortCounters::open("rxe0", 1, fs.root());
    REQUIRE_FALSE(r.ok());
    CHECK(contains(r.status().message(), "RDMA device rxe0 port 1 exposes no counters"));
    CHECK(contains(r.status().message(), "hw_counters"));
  }
}

TEST_CASE("read_device_counters: every port of a device; unknown devices listed") {
  FakeSysfs fs;
  fs.set("mlx5_0", 1, "out_of_buffer", 4);
  fs.set("mlx5_0", 2, "out_of_buffer", 9);
  fs.set("rxe0", 1, "rcvd_rnr_err", 0);
  auto r = slotrpc::monitor::read_device_counters("mlx5_0", fs.root());
  REQUIRE(r.ok());
  REQUIRE(r.value().size() == 2);
  CHECK(r.value()[0].port == 1);
  CHECK(r.value()[0].value == 4);
  CHECK(r.value()[1].port == 2);
  CHECK(r.value()[1].value == 9);

  auto d = slotrpc::monitor::read_device("mlx5_0", fs.root());
  REQUIRE(d.ok());
  CHECK(d.value().absent.size() == 16);  // 8 known names missing on each of 2 ports

  auto bad = slotrpc::monitor::read_device_counters("rxe9", fs.root());
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message() ==
        "unknown RDMA device 'rxe9' (devices under " + fs.root() + ": mlx5_0, rxe0)");
  CHECK_FALSE(slotrpc::monitor::read_device_counters("../rxe0", fs.root() + "/mlx5_0").ok());
}
