// Multi-endpoint channels over server processes: round_robin spreads calls
// evenly; a server killed with SIGKILL costs no idempotent call; a server
// drained with shutdown(grace) under load costs no call at all, its health
// watch says NOT_SERVING and the channel stops sending there; pick_first
// and p2c pick as documented.
#include <doctest/doctest.h>
#include <slotrpc/slotrpc.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "env_var.h"
#include "fleet_util.h"

namespace {

using namespace fleet_test;
using slotrpc::Channel;
using slotrpc::Config;
using slotrpc::Reply;
using slotrpc::ServingStatus;
using slotrpc::StatusCode;
using slotrpc::test::Pong;

std::unique_ptr<Channel> connect(const std::string& target, Config c = {}) {
  auto ch = Channel::connect(target, c);
  REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
  return std::move(ch.value());
}

// Calls from `threads` threads, one at a time each, until stop(); counts
// the replies per server tag and keeps every failure.
class Load {
 public:
  Load(Channel& ch, int threads, slotrpc::CallOptions options) {
    for (int t = 0; t < threads; ++t) {
      workers_.emplace_back([this, &ch, options, t] {
        uint64_t seq = uint64_t(t) << 40;
        while (!stop_.load()) {
          slotrpc::CallOptions o = options;
          o.deadline = slotrpc::Clock::now() + 10s;
          auto r = ch.call_typed<Pong>(kWho, who(++seq), o).get();
          std::lock_guard<std::mutex> lock(mu_);
          if (r.ok()) {
            ++by_tag_[r->text()->str()];
          } else {
            failures_.push_back(r.status().to_string());
          }
        }
      });
    }
  }
  ~Load() { stop(); }
  void stop() {
    stop_ = true;
    for (auto& w : workers_)
      if (w.joinable()) w.join();
  }
  std::map<std::string, uint64_t> by_tag() {
    std::lock_guard<std::mutex> lock(mu_);
    return by_tag_;
  }
  uint64_t total() {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t n = failures_.size();
    for (auto& [t, c] : by_tag_) n += c;
    return n;
  }
  std::vector<std::string> failures() {
    std::lock_guard<std::mutex> lock(mu_);
    return failures_;
  }

 private:
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::map<std::string, uint64_t> by_tag_;
  std::vector<std::string> failures_;
  std::vector<std::thread> workers_;
};

std::map<std::string, uint64_t> minus(std::map<std::string, uint64_t> a, const std::map<std::string, uint64_t>& b) {
  for (auto& [t, c] : b) a[t] -= c;
  return a;
}

void check_even(const std::map<std::string, uint64_t>& counts, const std::vector<std::string>& tags) {
  uint64_t total = 0;
  for (auto& [t, c] : counts) total += c;
  REQUIRE(total > 0);
  const double share = double(total) / double(tags.size());
  for (const auto& t : tags) {
    const auto it = counts.find(t);
    const uint64_t got = it == counts.end() ? 0 : it->second;
    CHECK_MESSAGE(std::abs(double(got) - share) <= 0.1 * share,
                  t << " served " << got << " of " << total << " calls (a fair share is " << share << ")");
  }
  for (const auto& [t, c] : counts) {
    if (std::find(tags.begin(), tags.end(), t) == tags.end())
      CHECK_MESSAGE(c == 0, t << " served " << c << " calls, expected none");
  }
}

void wait_for_calls(Load& load, uint64_t at_least) {
  REQUIRE_MESSAGE(test_process::wait_until([&] { return load.total() >= at_least; }, 30000ms),
                  "only " << load.total() << " calls completed");
}

}  // namespace

TEST_CASE("helper: fleet server" * doctest::skip()) { run_fleet_server(); }

TEST_CASE("round_robin over list:// of three server processes: even spread, and SIGKILL of one costs no idempotent call") {
  test_process::TempDir dir("slotrpc-fleet");
  std::vector<FleetServer> servers;
  for (const char* tag : {"s0", "s1", "s2"}) servers.push_back(start_fleet_server(dir.path, tag));
  Config c;
  c.lb_policy = slotrpc::LbPolicy::kRoundRobin;
  auto ch = connect(list_target(servers), c);
  CHECK(ch->peer() == list_target(servers));

  slotrpc::CallOptions idempotent;
  idempotent.idempotent = true;
  idempotent.max_retries = 3;
  Load load(*ch, 4, idempotent);
  wait_for_calls(load, 3000);
  const auto before_kill = load.by_tag();
  check_even(before_kill, {"s0", "s1", "s2"});

  // Killed under load: calls in flight there, and calls picked for it
  // before the channel noticed, move to the others.
  REQUIRE(servers[1].child->kill_and_reap());
  const uint64_t at_kill = load.total();
  wait_for_calls(load, at_kill + 1000);  // the channel has noticed by then
  const auto settled = load.by_tag();
  wait_for_calls(load, load.total() + 3000);
  load.stop();
  CHECK_MESSAGE(load.failures().empty(), load.failures().size() << " calls failed, first: "
                                                                 << load.failures().front());
  check_even(minus(load.by_tag(), settled), {"s0", "s2"});
  // The sums over the endpoints the channel has now: each one's health
  // watch is a call in flight.
  const auto stats = ch->stats();
  CHECK(stats.in_flight == 2);
  CHECK(!stats.closed);
}

TEST_CASE("a server drained with shutdown(grace) under load: zero failed calls, NOT_SERVING, no calls sent there after") {
  test_process::TempDir dir("slotrpc-fleet");
  std::vector<FleetServer> servers;
  for (const char* tag : {"d0", "d1", "d2"}) servers.push_back(start_fleet_server(dir.path, tag));
  auto ch = connect(list_target(servers));

  // A watch of d0's health of our own, beside the channel's.
  auto direct = connect(servers[0].address());
  std::mutex mu;
  std::vector<ServingStatus> seen;
  std::atomic<bool> watch_ended{false};
  auto handle = slotrpc::watch_health(
      *direct, "",
      [&](ServingStatus s) {
        std::lock_guard<std::mutex> lock(mu);
        seen.push_back(s);
      },
      [&](slotrpc::Status) { watch_ended = true; });
  REQUIRE(test_process::wait_until([&] {
    std::lock_guard<std::mutex> lock(mu);
    return !seen.empty();
  }));

  // Not idempotent: nothing may be retried, so nothing may fail.
  Load load(*ch, 4, {});
  wait_for_calls(load, 2000);
  REQUIRE(servers[0].child->signal(SIGTERM));
  REQUIRE_MESSAGE(test_process::wait_until([&] { return watch_ended.load(); }), "d0's health watch did not end");
  {
    std::lock_guard<std::mutex> lock(mu);
    REQUIRE(seen.size() >= 2);
    CHECK(seen.front() == ServingStatus::kServing);
    CHECK(seen.back() == ServingStatus::kNotServing);
  }
  int status = 0;
  REQUIRE_MESSAGE(servers[0].child->wait(10000ms, &status), "d0 did not finish its drain");
  CHECK(WIFEXITED(status));
  const auto after_drain = load.by_tag();
  wait_for_calls(load, load.total() + 3000);
  load.stop();
  CHECK_MESSAGE(load.failures().empty(), load.failures().size() << " calls failed, first: "
                                                                 << load.failures().front());
  const auto later = minus(load.by_tag(), after_drain);
  check_even(later, {"d1", "d2"});
  CHECK(after_drain.at("d0") > 0);
}

TEST_CASE("pick_first sends every call to the first endpoint; p2c spreads them") {
  auto a = start_who("a"), b = start_who("b");
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  const std::string target = "list://127.0.0.1:" + std::to_string(a->port()) + ",127.0.0.1:" + std::to_string(b->port());
  for (auto policy : {slotrpc::LbPolicy::kPickFirst, slotrpc::LbPolicy::kP2c}) {
    CAPTURE(slotrpc::to_string(policy));
    Config c;
    c.lb_policy = policy;
    auto ch = connect(target, c);
    std::map<std::string, int> by_tag;
    for (int i = 0; i < 400; ++i) {
      auto r = ch->call_typed<Pong>(kWho, who(i)).get();
      REQUIRE_MESSAGE(r.ok(), r.status().to_string());
      ++by_tag[r->text()->str()];
    }
    if (policy == slotrpc::LbPolicy::kPickFirst) {
      CHECK(by_tag["a"] == 400);
    } else {
      CHECK(by_tag["a"] > 40);
      CHECK(by_tag["b"] > 40);
    }
  }
}

TEST_CASE("set_serving(\"\", false) takes an endpoint out of the rotation; true puts it back") {
  auto a = start_who("a"), b = start_who("b");
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  auto ch = connect("list://127.0.0.1:" + std::to_string(a->port()) + ",127.0.0.1:" + std::to_string(b->port()));
  auto tally = [&](int n) {
    std::map<std::string, int> by_tag;
    for (int i = 0; i < n; ++i) {
      auto r = ch->call_typed<Pong>(kWho, who(i)).get();
      REQUIRE_MESSAGE(r.ok(), r.status().to_string());
      ++by_tag[r->text()->str()];
    }
    return by_tag;
  };
  REQUIRE(a->set_serving("", false).ok());
  // The watch's NOT_SERVING reaches the channel within a round trip or so.
  REQUIRE(test_process::wait_until([&] { return tally(20)["a"] == 0; }));
  CHECK(tally(200)["a"] == 0);
  REQUIRE(a->set_serving("", true).ok());
  REQUIRE(test_process::wait_until([&] { return tally(20)["a"] > 0; }));
}

TEST_CASE("stats() and metrics() sum over the endpoints") {
  auto a = start_who("a"), b = start_who("b");
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  auto ch = connect("list://127.0.0.1:" + std::to_string(a->port()) + ",127.0.0.1:" + std::to_string(b->port()));
  for (int i = 0; i < 100; ++i) REQUIRE(ch->call_typed<Pong>(kWho, who(i)).get().ok());
  CHECK(ch->stats().messages_sent >= 100);
  CHECK(ch->stats().in_flight == 2);  // the endpoints' health watches
  const auto m = ch->metrics();
  uint64_t calls = 0;
  for (const auto& meth : m.methods)
    if (!meth.server && meth.id == kWho) calls += meth.started;
  CHECK(calls == 100);
}

TEST_CASE("a server started again after shutdown(grace) reports SERVING") {
  auto s = start_who("r");
  REQUIRE(s != nullptr);
  const uint16_t port = s->port();
  s->shutdown(0ms);
  REQUIRE(s->start("127.0.0.1:" + std::to_string(port)).ok());
  auto ch = connect("127.0.0.1:" + std::to_string(port));
  auto st = slotrpc::check_health(*ch, "");
  REQUIRE_MESSAGE(st.ok(), st.status().to_string());
  CHECK(st.value() == ServingStatus::kServing);
}

TEST_CASE("each endpoint picks its own transport: shm to a replica with a Unix socket, tcp to one without") {
  // The suite turns shm off for every process (SLOTRPC_UNIX_PATH=off);
  // this case needs it on.
  slotrpc::test::EnvVar unix_path("SLOTRPC_UNIX_PATH", std::nullopt);
  slotrpc::Server with_shm, tcp_only(([] {
    Config c;
    c.unix_path = "off";
    return c;
  })());
  REQUIRE(with_shm.add_service(who_service("shm")).ok());
  REQUIRE(tcp_only.add_service(who_service("tcp")).ok());
  REQUIRE(with_shm.start("127.0.0.1:0").ok());
  REQUIRE(tcp_only.start("127.0.0.1:0").ok());
  auto ch = connect("list://127.0.0.1:" + std::to_string(with_shm.port()) + ",127.0.0.1:" +
                    std::to_string(tcp_only.port()));
  std::map<std::string, int> by_tag;
  for (int i = 0; i < 20; ++i) {
    auto r = ch->call_typed<Pong>(kWho, who(i)).get();
    REQUIRE_MESSAGE(r.ok(), r.status().to_string());
    ++by_tag[r->text()->str()];
  }
  CHECK(by_tag["shm"] == 10);
  CHECK(by_tag["tcp"] == 10);
  const auto m = ch->metrics();
  const auto* shm = m.transport("shm");
  const auto* tcp = m.transport("tcp");
  REQUIRE(shm != nullptr);
  REQUIRE(tcp != nullptr);
  CHECK(shm->sessions == 1);
  CHECK(tcp->sessions == 1);
}

TEST_CASE("a stream stays on the endpoint it started on; streams are balanced like calls") {
  auto a = start_who("a"), b = start_who("b"), c = start_who("c");
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  REQUIRE(c != nullptr);
  auto ch = connect("list://127.0.0.1:" + std::to_string(a->port()) + ",127.0.0.1:" + std::to_string(b->port()) +
                    ",127.0.0.1:" + std::to_string(c->port()));
  std::map<std::string, int> streams_by_tag;
  for (int s = 0; s < 6; ++s) {
    auto reader = ch->server_stream<slotrpc::test::Ping, Pong>(kTags, [](flatbuffers::FlatBufferBuilder& fbb) {
      return slotrpc::test::CreatePing(fbb, 50);
    });
    std::set<std::string> tags;
    int n = 0;
    while (auto m = reader.Read()) {
      REQUIRE(m->ok());
      tags.insert((*m)->text()->str());
      ++n;
    }
    CHECK_MESSAGE(reader.status().ok(), reader.status().to_string());
    CHECK(n == 50);
    REQUIRE(tags.size() == 1);
    ++streams_by_tag[*tags.begin()];
  }
  CHECK(streams_by_tag["a"] == 2);
  CHECK(streams_by_tag["b"] == 2);
  CHECK(streams_by_tag["c"] == 2);
}

TEST_CASE("p2c counts open streams as outstanding: streams held open alternate between two endpoints") {
  auto a = start_who("a"), b = start_who("b");
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  Config c;
  c.lb_policy = slotrpc::LbPolicy::kP2c;
  auto ch = connect("list://127.0.0.1:" + std::to_string(a->port()) + ",127.0.0.1:" + std::to_string(b->port()), c);
  // Each stream asks for more messages than its window: the server waits
  // for credit, so the stream stays open while we hold its reader.  With
  // the streams counted, the least loaded of the two takes the next one,
  // and the counts never differ by more than one; picked at random (not
  // counted), 20 streams stay that balanced with probability 2^-10.
  // A window of one message: each open stream holds one of the channel's
  // slots, not a window's worth.
  std::vector<slotrpc::ClientReader<Pong>> open;
  std::map<std::string, int> by_tag;
  slotrpc::CallOptions one;
  one.stream_window = 1;
  for (int s = 0; s < 20; ++s) {
    open.push_back(ch->server_stream<slotrpc::test::Ping, Pong>(
        kTags, [](flatbuffers::FlatBufferBuilder& fbb) { return slotrpc::test::CreatePing(fbb, 1'000'000); }, one));
    auto m = open.back().Read();
    REQUIRE(m.has_value());
    REQUIRE_MESSAGE(m->ok(), m->status().to_string());
    ++by_tag[(*m)->text()->str()];
    CHECK_MESSAGE(std::abs(by_tag["a"] - by_tag["b"]) <= 1,
                  "after " << s + 1 << " streams: a " << by_tag["a"] << ", b " << by_tag["b"]);
  }
  for (auto& r : open) r.Cancel();
  open.clear();
}

TEST_CASE("stats() keeps the counts of an endpoint after it is ejected") {
  auto a = start_who("a"), b = start_who("b");
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  auto ch = connect("list://127.0.0.1:" + std::to_string(a->port()) + ",127.0.0.1:" + std::to_string(b->port()));
  for (int i = 0; i < 200; ++i) REQUIRE(ch->call_typed<Pong>(kWho, who(i)).get().ok());
  const uint64_t before = ch->stats().messages_sent;
  CHECK(before >= 200);
  a->stop();
  // Ejected once the channel notices its session closed (at most a tick).
  slotrpc::CallOptions idempotent;
  idempotent.idempotent = true;
  idempotent.max_retries = 3;
  REQUIRE(test_process::wait_until([&] {
    std::map<std::string, int> by_tag;
    for (int i = 0; i < 10; ++i) {
      auto r = ch->call_typed<Pong>(kWho, who(i), idempotent).get();
      REQUIRE_MESSAGE(r.ok(), r.status().to_string());
      ++by_tag[r->text()->str()];
    }
    return by_tag["b"] == 10;
  }));
  // a's 100 calls still count, now and once the fleet has let it go.
  for (int i = 0; i < 100; ++i) REQUIRE(ch->call_typed<Pong>(kWho, who(i)).get().ok());
  CHECK(ch->stats().messages_sent >= before + 100);
  uint64_t last = 0;
  REQUIRE(test_process::wait_until([&] {
    last = ch->stats().messages_sent;
    return ch->stats().in_flight == 1;  // b's health watch only: a's channel is gone
  }));
  CHECK(last >= before + 100);
  for (int i = 0; i < 10; ++i) REQUIRE(ch->call_typed<Pong>(kWho, who(i)).get().ok());
  CHECK(ch->stats().messages_sent >= before + 110);
}

TEST_CASE("p2c counts open bidi streams too") {
  auto a = start_who("a"), b = start_who("b");
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  Config c;
  c.lb_policy = slotrpc::LbPolicy::kP2c;
  auto ch = connect("list://127.0.0.1:" + std::to_string(a->port()) + ",127.0.0.1:" + std::to_string(b->port()), c);
  // As with server streams above: each stream is open until WritesDone,
  // and the least loaded endpoint takes the next one.
  std::vector<slotrpc::ClientReaderWriter<slotrpc::test::Ping, Pong>> open;
  std::map<std::string, int> by_tag;
  slotrpc::CallOptions one;
  one.stream_window = 1;
  for (int s = 0; s < 20; ++s) {
    open.push_back(ch->bidi_stream<slotrpc::test::Ping, Pong>(kChat, one));
    REQUIRE(open.back().Write([s](flatbuffers::FlatBufferBuilder& fbb) { return slotrpc::test::CreatePing(fbb, s); }));
    auto m = open.back().Read();
    REQUIRE(m.has_value());
    REQUIRE_MESSAGE(m->ok(), m->status().to_string());
    ++by_tag[(*m)->text()->str()];
    CHECK_MESSAGE(std::abs(by_tag["a"] - by_tag["b"]) <= 1,
                  "after " << s + 1 << " streams: a " << by_tag["a"] << ", b " << by_tag["b"]);
  }
  for (auto& st : open) CHECK(st.Finish().ok());
}
