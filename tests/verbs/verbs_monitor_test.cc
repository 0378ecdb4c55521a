// The monitor (lib/transport/verbs/monitor.h) on a real device: real receiver-not-ready NAKs,
// provoked on purpose, seen in the device's counters, in the monitor's
// deltas and in its warnings (one per interval per counter, however many
// loops share the port); and the loop's receive pool with its low-water mark.
//
// RNR: a queue pair pair on one device whose receiver is never polled, so it
// never reposts a receive.  The sender uses up the receives it had posted
// with control SENDs, then one RDMA WRITE_WITH_IMM finds none: the receiver
// answers with an RNR NAK (rxe: send_rnr_err), the sender counts it
// (rcvd_rnr_err) and retries for ever (rnr_retry 7), so the counters keep
// rising while the test samples.
//
// Needs an RDMA device: run by the `rxe` suite (this host's device, else the
// Soft-RoCE VM; see tests/rxe/README.md).
#include "verbs_test_util.h"

#include <algorithm>
#include <atomic>
#include <array>
#include <memory>
#include <mutex>
#include <regex>
#include <string>
#include <vector>

#include "../log_capture.h"
#include "core/wire_format.h"
#include "transport/verbs/monitor.h"
#include "reactor/reactor.h"
#include "rpc/loop_transports.h"
#include "slotrpc/channel.h"
#include "slotrpc/server.h"
#include "transport/verbs/verbs_transport.h"

int main(int argc, char** argv) { return verbs_test::main(argc, argv); }

namespace {

using namespace std::chrono_literals;
using slotrpc::Config;
using slotrpc::HwCounter;
using slotrpc::MetricsSnapshot;
using slotrpc::transport::Access;
using slotrpc::transport::Completion;
using slotrpc::transport::Delivery;
using slotrpc::transport::MemoryRegion;
using slotrpc::transport::Outgoing;
using namespace slotrpc::transport::verbs;
using CKind = Completion::Kind;

Config test_config() {
  auto c = Config{}.with_environment();
  REQUIRE_MESSAGE(c.ok(), c.status().to_string());
  Config cfg = c.value();
  // Per-session receive queues: the receiver's pool is its own queue, which
  // the sender can empty.
  cfg.srq = slotrpc::SharedReceiveQueue::kOff;
  cfg.monitor_interval_ms = 200;
  // The receiver asks for the shortest RNR delay: NAKs come often.
  cfg.min_rnr_timer = 1;
  return cfg;
}

// One end of a raw link pair (as in verbs_transport_test.cc).
struct End {
  uint32_t slots;
  uint32_t size;
  std::unique_ptr<VerbsLink> link;
  std::vector<std::byte> recv;
  std::vector<std::byte> send;
  MemoryRegion recv_mr{};
  MemoryRegion send_mr{};
  std::vector<Completion> got;

  ~End() {
    if (!link) return;
    link->deregister(recv_mr);
    link->deregister(send_mr);
  }
  size_t count(CKind k) const {
    return static_cast<size_t>(std::count_if(got.begin(), got.end(), [k](const Completion& c) { return c.kind == k; }));
  }
};

std::unique_ptr<End> make_end(VerbsTransport& t, uint32_t slots, uint32_t size, const std::string& name) {
  auto e = std::make_unique<End>();
  e->slots = slots;
  e->size = size;
  auto l = t.create_link(name, slots);
  REQUIRE_MESSAGE(l.ok(), l.status().to_string());
  e->link = std::move(l).value();
  e->recv.assign(size_t{slots} * size, std::byte{0});
  e->send.assign(size_t{slots} * size, std::byte{0});
  auto r = e->link->register_memory(e->recv, Access::kRemoteWrite);
  REQUIRE_MESSAGE(r.ok(), r.status().to_string());
  e->recv_mr = r.value();
  auto s = e->link->register_memory(e->send, Access::kLocalSend);
  REQUIRE_MESSAGE(s.ok(), s.status().to_string());
  e->send_mr = s.value();
  auto st = e->link->attach(e->recv_mr, e->send_mr, slots, size, e.get());
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  for (uint32_t i = 0; i < slots; ++i) e->link->arm(static_cast<uint16_t>(i));
  return e;
}

void connect_pair(End& a, End& b) {
  auto st = a.link->connect(b.link->local_info(), -1, "b");
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  st = b.link->connect(a.link->local_info(), -1, "a");
  REQUIRE_MESSAGE(st.ok(), st.to_string());
}

// Polls `t` for `d`, handing completions to their End.
void pump(VerbsTransport& t, std::chrono::milliseconds d) {
  const auto until = std::chrono::steady_clock::now() + d;
  std::array<Completion, 16> buf;
  while (std::chrono::steady_clock::now() < until) {
    const size_t n = t.poll(buf);
    for (size_t i = 0; i < n; ++i) static_cast<End*>(buf[i].context)->got.push_back(buf[i]);
  }
}

const HwCounter* find(const std::vector<HwCounter>& v, const std::string& name) {
  for (const auto& c : v)
    if (c.name == name) return &c;
  return nullptr;
}

// "rose by N" of every warning about `counter`, in order.
std::vector<uint64_t> warned_deltas(const slotrpc::test::LogCapture& log, const std::string& device,
                                    const std::string& counter) {
  std::vector<uint64_t> out;
  const std::regex re("RDMA " + device + " port 1: " + counter + " rose by ([0-9]+) in ");
  for (const auto& line : log.lines()) {
    std::smatch m;
    if (std::regex_search(line, m, re)) out.push_back(std::stoull(m[1]));
  }
  return out;
}

}  // namespace

TEST_CASE("monitor: real RNR NAKs move the counters, the monitor reports them, one warning per interval") {
  const std::string dev = verbs_test::usable_device().value();
  const auto rcvd_before = verbs_test::hw_counter(dev, "rcvd_rnr_err");
  const auto send_before = verbs_test::hw_counter(dev, "send_rnr_err");
  REQUIRE_MESSAGE(rcvd_before.has_value(), dev << " has no hw_counters/rcvd_rnr_err (not rxe?)");
  REQUIRE(send_before.has_value());

  slotrpc::test::LogCapture log;
  const Config cfg = test_config();

  // The monitored loop, driven by this thread (never started).  Its verbs
  // transport hosts the receiver, so its receive pool is the one that runs
  // dry.  The monitor's timer is not used: the test ticks it itself, one
  // interval apart on the clock it passes, so every tick is a reading.
  slotrpc::reactor::Reactor loop(cfg, "mon-test");
  auto hook = std::make_shared<slotrpc::monitor::SampleHook>();
  std::vector<MetricsSnapshot> samples;
  hook->set([&](const MetricsSnapshot& s) { samples.push_back(s); });
  slotrpc::rpc::set_monitor_hook(loop, hook);
  auto vt = slotrpc::rpc::loop_verbs(loop);
  REQUIRE_MESSAGE(vt.ok(), vt.status().to_string());
  slotrpc::monitor::Monitor* mon = slotrpc::rpc::loop_monitor(loop);
  REQUIRE(mon != nullptr);
  CHECK(mon->sampler().device() == dev);
  const auto base = mon->sampler().reading();
  REQUIRE(base.sequence >= 1);
  REQUIRE(find(base.counters, "rcvd_rnr_err") != nullptr);
  const uint64_t monitor_base = find(base.counters, "rcvd_rnr_err")->value;

  Config sender_cfg = cfg;
  sender_cfg.rnr_retry = 7;  // retry for ever: NAKs keep coming
  auto ta = VerbsTransport::create(sender_cfg);
  REQUIRE_MESSAGE(ta.ok(), ta.status().to_string());
  constexpr uint32_t kSlots = 4;
  auto a = make_end(*ta.value(), kSlots, 1024, "sender");
  auto b = make_end(*vt.value(), kSlots, 1024, "receiver");
  connect_pair(*a, *b);
  const uint32_t receives = b->link->receive_queue_depth();

  // Use up every receive the receiver posted, then one WRITE_WITH_IMM.
  std::vector<std::array<std::byte, 32>> bodies(receives);
  std::vector<Outgoing> batch;
  for (auto& body : bodies) batch.push_back(Outgoing{body.data(), 32, 0, Delivery::kControl});
  a->link->post(batch);
  const Outgoing write{a->send.data(), 64, slotrpc::core::make_imm(0, 1), Delivery::kSlot};
  a->link->post(std::span<const Outgoing>(&write, 1));

  // The NAKs show in the device's counters.
  CHECK(verbs_test::wait_until(
      [&] {
        pump(*ta.value(), 5ms);
        return verbs_test::hw_counter(dev, "rcvd_rnr_err").value_or(0) > *rcvd_before;
      },
      20000ms));

  // Five intervals of the monitor while the sender keeps being NAKed.
  const auto t0 = slotrpc::monitor::Clock::now();
  const auto interval = std::chrono::milliseconds(cfg.monitor_interval_ms);
  for (int i = 1; i <= 5; ++i) {
    pump(*ta.value(), 150ms);
    mon->tick(t0 + i * interval);
  }
  REQUIRE(samples.size() == 5);
  CHECK(a->count(CKind::kLinkDown) == 0);  // NAKed, not failed

  // The device's counters moved (both sides of the NAK are on this device).
  const uint64_t rcvd_after = verbs_test::hw_counter(dev, "rcvd_rnr_err").value_or(0);
  const uint64_t send_after = verbs_test::hw_counter(dev, "send_rnr_err").value_or(0);
  MESSAGE(dev << ": rcvd_rnr_err " << *rcvd_before << " -> " << rcvd_after << ", send_rnr_err " << *send_before
              << " -> " << send_after);
  CHECK(rcvd_after > *rcvd_before);
  CHECK(send_after > *send_before);

  // The monitor's deltas add up to the growth it saw, and it saw growth.
  uint64_t sum = 0;
  std::vector<uint64_t> rising;
  for (const auto& s : samples) {
    const HwCounter* c = find(s.hw_counters, "rcvd_rnr_err");
    REQUIRE(c != nullptr);
    CHECK(c->kind == HwCounter::Kind::kRnr);
    CHECK(c->device == dev);
    CHECK(c->port == 1);
    sum += c->delta;
    if (c->delta != 0) rising.push_back(c->delta);
  }
  const uint64_t last_value = find(samples.back().hw_counters, "rcvd_rnr_err")->value;
  CHECK(sum == last_value - monitor_base);
  CHECK(sum > 0);
  MESSAGE("monitor: rcvd_rnr_err deltas over 5 intervals add up to " << sum << " (" << rising.size()
                                                                     << " intervals rising)");
  CHECK(rising.size() >= 3);  // NAKs all along, not a single burst

  // One warning per interval in which the counter rose, with its delta.
  CHECK(warned_deltas(log, dev, "rcvd_rnr_err") == rising);
  CHECK_FALSE(warned_deltas(log, dev, "send_rnr_err").empty());
  CHECK(warned_deltas(log, dev, "send_rnr_err").size() <= samples.size());
  const auto lines = log.matching({"rcvd_rnr_err rose by", "SLOTRPC_SRQ_DEPTH", "SLOTRPC_SLOT_COUNT"});
  CHECK(lines.size() == rising.size());

  // A second loop on the same port shares the reading and the warnings: both
  // loops' ticks in one interval make one reading and one warning per
  // counter.
  slotrpc::reactor::Reactor loop2(cfg, "mon-test2");
  REQUIRE(slotrpc::rpc::loop_verbs(loop2).ok());
  slotrpc::monitor::Monitor* mon2 = slotrpc::rpc::loop_monitor(loop2);
  REQUIRE(mon2 != nullptr);
  CHECK(&mon2->sampler() == &mon->sampler());
  const uint64_t seq = mon->sampler().reading().sequence;
  const size_t warned = warned_deltas(log, dev, "rcvd_rnr_err").size();
  pump(*ta.value(), 150ms);
  mon->tick(t0 + 6 * interval);
  mon2->tick(t0 + 6 * interval + 10ms);
  mon2->tick(t0 + 6 * interval + interval / 2);
  CHECK(mon->sampler().reading().sequence == seq + 1);
  CHECK(warned_deltas(log, dev, "rcvd_rnr_err").size() <= warned + 1);
  // The second loop's own view starts at its creation: no double counting.
  MetricsSnapshot both;
  mon->fill(both);
  mon2->fill(both);
  CHECK(std::count_if(both.hw_counters.begin(), both.hw_counters.end(),
                      [](const HwCounter& c) { return c.name == "rcvd_rnr_err"; }) == 1);

  // The receive pool: the receiver's own queue, as the loop sees it.  Until
  // the loop polls, it cannot know the NIC took the receives; once it polls,
  // the batch it reposts shows in the low-water mark.
  auto pool_of = [&](const MetricsSnapshot& s) -> const slotrpc::ReceivePool* {
    for (const auto& p : s.receive_pools)
      if (p.queue == b->link->describe()) return &p;
    return nullptr;
  };
  const slotrpc::ReceivePool* p0 = pool_of(samples.back());
  REQUIRE(p0 != nullptr);
  CHECK(p0->loop == "mon-test");
  CHECK(p0->capacity == receives);
  CHECK(p0->low_water == receives);
  REQUIRE(verbs_test::wait_until(
      [&] {
        pump(*vt.value(), 5ms);
        return b->count(CKind::kControl) >= receives;
      },
      10000ms));
  mon->tick(t0 + 8 * interval);
  const slotrpc::ReceivePool* p1 = pool_of(samples.back());
  REQUIRE(p1 != nullptr);
  MESSAGE("receive pool " << p1->queue << ": capacity " << p1->capacity << ", posted " << p1->posted
                          << ", low water " << p1->low_water);
  CHECK(p1->low_water < receives);
  CHECK(p1->posted <= receives);

  // The sender's write finally lands (the receives are back): no failure.
  CHECK(verbs_test::wait_until(
      [&] {
        pump(*ta.value(), 5ms);
        pump(*vt.value(), 5ms);
        return b->count(CKind::kMessage) >= 1;
      },
      10000ms));
  CHECK(a->count(CKind::kLinkDown) == 0);
}

TEST_CASE("monitor: off with SLOTRPC_MONITOR_INTERVAL_MS = 0; with it on, the loop's own timer ticks") {
  Config cfg = test_config();
  cfg.monitor_interval_ms = 0;
  {
    slotrpc::reactor::Reactor loop(cfg, "mon-off");
    REQUIRE(slotrpc::rpc::loop_verbs(loop).ok());
    CHECK(slotrpc::rpc::loop_monitor(loop) == nullptr);
  }
  cfg.monitor_interval_ms = 50;
  slotrpc::reactor::Reactor loop(cfg, "mon-on");
  auto hook = std::make_shared<slotrpc::monitor::SampleHook>();
  std::atomic<int> calls{0};
  hook->set([&](const MetricsSnapshot& s) {
    CHECK_FALSE(s.hw_counters.empty());
    ++calls;
  });
  slotrpc::rpc::set_monitor_hook(loop, hook);
  REQUIRE(slotrpc::rpc::loop_verbs(loop).ok());
  REQUIRE(slotrpc::rpc::loop_monitor(loop) != nullptr);
  CHECK(verbs_test::wait_until(
      [&] {
        loop.run_one_turn();
        return calls >= 3;
      },
      10000ms));
  CHECK(slotrpc::rpc::loop_monitor(loop)->ticks() >= 3);
}

TEST_CASE("monitor: Server and Channel over verbs call on_monitor_sample with counters and pools") {
  Config cfg = test_config();
  cfg.srq = slotrpc::SharedReceiveQueue::kAuto;
  cfg.transport = slotrpc::TransportKind::kVerbs;
  cfg.monitor_interval_ms = 50;
  cfg.reactor_threads = 2;
  // Declared before the server and channel, so they outlive their loops,
  // which call the callbacks below.
  std::mutex mu;
  std::vector<MetricsSnapshot> server_samples;
  std::vector<MetricsSnapshot> channel_samples;
  slotrpc::Server server(cfg);
  server.on_monitor_sample([&](const MetricsSnapshot& s) {
    std::lock_guard lock(mu);
    server_samples.push_back(s);
  });
  REQUIRE(server.start("127.0.0.1:0").ok());
  auto ch = slotrpc::Channel::connect("127.0.0.1:" + std::to_string(server.port()), cfg);
  REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
  CHECK(ch.value()->transport() == slotrpc::TransportKind::kVerbs);
  ch.value()->on_monitor_sample([&](const MetricsSnapshot& s) {
    std::lock_guard lock(mu);
    channel_samples.push_back(s);
  });
  CHECK(verbs_test::wait_until([&] {
    std::lock_guard lock(mu);
    return server_samples.size() >= 3 && channel_samples.size() >= 3;
  }));
  std::lock_guard lock(mu);
  for (const auto* v : {&server_samples, &channel_samples}) {
    const MetricsSnapshot& s = v->back();
    CHECK(find(s.hw_counters, "rcvd_rnr_err") != nullptr);
    REQUIRE(s.receive_pools.size() == 1);  // the loop's SRQ
    CHECK(s.receive_pools[0].queue == "srq");
    CHECK(s.receive_pools[0].capacity > 0);
    CHECK(s.receive_pools[0].posted == s.receive_pools[0].capacity);
  }
  // Only the loop that serves the session uses verbs (and has a monitor).
  CHECK(server_samples.back().receive_pools[0].loop == "slotrpc-srv0");
  CHECK(channel_samples.back().receive_pools[0].loop == "slotrpc-chan");
}
