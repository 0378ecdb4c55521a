// Integration: servers and channels sharing the event loops of a Runtime
// (include/slotrpc/runtime.h).
//
//   * a handler that opens a channel to a backend on the same runtime makes
//     its nested calls without a cross-loop hand-off (Channel::Stats::
//     cross_loop_handoffs stays 0); on a separate runtime it cannot (> 0);
//   * 64 channels to 64 servers in 4 child processes, plus a server of this
//     process, all on a runtime of 2 loops: right answers, and exactly 2
//     event-loop threads in /proc/self/task;
//   * channels destroyed (from other threads and from their own loop) while
//     calls run on the other channels of the same loop: those go on.
//
// This binary never uses the default runtime, so the only loop threads are
// the ones each test makes.  The child servers are this binary re-run with
// the skipped helper case below.
#include <doctest/doctest.h>
#include <slotrpc/slotrpc.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "process_util.h"
#include "test_messages_generated.h"

namespace {

using namespace std::chrono_literals;
using slotrpc::Channel;
using slotrpc::Config;
using slotrpc::Future;
using slotrpc::RawReply;
using slotrpc::Reply;
using slotrpc::RequestWriter;
using slotrpc::Runtime;
using slotrpc::Server;
using slotrpc::ServerCall;
using slotrpc::ServiceDefinition;
using slotrpc::Status;
using slotrpc::StatusCode;
using slotrpc::test::Ping;
using slotrpc::test::Pong;
using Clock = std::chrono::steady_clock;

constexpr uint32_t kEcho = slotrpc::method_id("slotrpc.test.RtBackend.Echo");
constexpr uint32_t kRelay = slotrpc::method_id("slotrpc.test.RtFront.Relay");
constexpr auto kWait = 10s;

RequestWriter ping(uint64_t seq, std::string text, uint32_t sleep_ms = 0) {
  return [seq, text = std::move(text), sleep_ms](flatbuffers::FlatBufferBuilder& fbb) {
    auto t = fbb.CreateString(text);
    fbb.Finish(slotrpc::test::CreatePing(fbb, seq, t, 0, sleep_ms));
  };
}

void finish_pong(flatbuffers::FlatBufferBuilder& out, uint64_t seq, const std::string& text) {
  auto t = out.CreateString(text);
  out.Finish(slotrpc::test::CreatePong(out, seq, t));
}

// Echo: answers "<tag>:<text>" (after sleep_ms in its fiber).
ServiceDefinition make_backend(std::string tag) {
  ServiceDefinition svc("slotrpc.test.RtBackend");
  svc.add_unary<Ping>("Echo", [tag](const Ping& req, flatbuffers::FlatBufferBuilder& out, ServerCall&) -> Status {
    if (req.sleep_ms() != 0) slotrpc::this_fiber::sleep_for(std::chrono::milliseconds(req.sleep_ms()));
    finish_pong(out, req.seq(), tag + ":" + req.text()->str());
    return {};
  });
  return svc;
}

std::string pong_error(const Reply<Pong>& r, uint64_t seq, const std::string& text) {
  if (!r.ok()) return "status " + r.status().to_string();
  if (r->seq() != seq) return "seq " + std::to_string(r->seq()) + ", expected " + std::to_string(seq);
  if (r->text() == nullptr || r->text()->str() != text)
    return "text '" + (r->text() ? r->text()->str() : std::string("<null>")) + "', expected '" + text + "'";
  return "";
}

template <class T>
T get_within(Future<T>& f, std::chrono::milliseconds limit = std::chrono::duration_cast<std::chrono::milliseconds>(kWait)) {
  REQUIRE(f.valid());
  REQUIRE_MESSAGE(f.wait_for(limit), "call did not complete within " << limit.count() << " ms");
  return f.get();
}

Config runtime_config(uint32_t loops) {
  Config c;
  c.reactor_threads = loops;
  return c;
}

std::unique_ptr<Server> start_server(const Runtime& rt, ServiceDefinition svc) {
  auto server = std::make_unique<Server>(rt);
  REQUIRE(server->add_service(std::move(svc)).ok());
  const Status st = server->start("127.0.0.1:0");
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  return server;
}

std::string address_of(const Server& s) { return "127.0.0.1:" + std::to_string(s.port()); }

std::unique_ptr<Channel> connect(const std::string& address, const Runtime& rt) {
  auto ch = Channel::connect(address, rt);
  REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
  return std::move(ch).value();
}

// The names of this process's threads that are slotrpc event loops
// (Runtime loops "slotrpc-loopN"; private loops "slotrpc-chan", "slotrpc-srvN").
std::vector<std::string> loop_threads() {
  std::vector<std::string> out;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::string name = test_process::read_file(task.path() / "comm");
    while (!name.empty() && name.back() == '\n') name.pop_back();
    if (name.rfind("slotrpc-loop", 0) == 0 || name.rfind("slotrpc-chan", 0) == 0 ||
        name.rfind("slotrpc-srv", 0) == 0)
      out.push_back(name);
  }
  return out;
}

// What the front's handlers saw of their nested channels.
struct NestedProbe {
  std::atomic<int> relays{0};
  std::atomic<int> failures{0};
  std::atomic<uint64_t> handoffs{0};  // summed over the nested channels
  std::mutex mu;
  std::string first_error;
  void fail(const std::string& why) {
    ++failures;
    std::lock_guard<std::mutex> lock(mu);
    if (first_error.empty()) first_error = why;
  }
};

// Front: each Relay opens a channel to the backend on `nested_rt` from the
// handler, makes 3 calls with Future::get() (the fiber waits) and answers
// with the last one's text.
ServiceDefinition make_front(std::string backend, Runtime nested_rt, std::shared_ptr<NestedProbe> probe) {
  ServiceDefinition svc("slotrpc.test.RtFront");
  svc.add_unary<Ping>("Relay", [backend, nested_rt, probe](const Ping& req, flatbuffers::FlatBufferBuilder& out,
                                                         ServerCall&) -> Status {
    auto ch = Channel::connect(backend, nested_rt);
    if (!ch.ok()) {
      probe->fail("connect: " + ch.status().to_string());
      return ch.status();
    }
    std::string text;
    for (uint64_t i = 0; i < 3; ++i) {
      auto r = ch.value()->call_typed<Pong>(kEcho, ping(req.seq() * 10 + i, req.text()->str())).get();
      const std::string err = pong_error(r, req.seq() * 10 + i, "B:" + req.text()->str());
      if (!err.empty()) {
        probe->fail(err);
        return Status(StatusCode::kInternal, err);
      }
      text = r->text()->str();
    }
    probe->handoffs += ch.value()->stats().cross_loop_handoffs;
    ++probe->relays;
    finish_pong(out, req.seq(), text + " via front");
    return {};  // the nested channel is destroyed here, on the handler's loop
  });
  return svc;
}

// Runs `n` relays through `clients` (each call's reply checked) and returns
// the probe's total of nested hand-offs.
uint64_t run_relays(const std::vector<std::unique_ptr<Channel>>& clients, NestedProbe& probe, int n) {
  std::vector<Future<Reply<Pong>>> futures;
  for (int i = 0; i < n; ++i)
    futures.push_back(clients[i % clients.size()]->call_typed<Pong>(kRelay, ping(i + 1, "r" + std::to_string(i))));
  int bad = 0;
  for (int i = 0; i < n; ++i) {
    auto r = get_within(futures[i]);
    const std::string err = pong_error(r, i + 1, "B:r" + std::to_string(i) + " via front");
    if (!err.empty() && bad++ < 3) FAIL_CHECK("relay " << i << ": " << err);
  }
  CHECK(bad == 0);
  CHECK_MESSAGE(probe.failures.load() == 0, probe.first_error);
  CHECK(probe.relays.load() == n);
  return probe.handoffs.load();
}

}  // namespace

TEST_CASE("a channel opened in a handler stays on the handler's loop: no cross-loop hand-off") {
  Runtime rt(runtime_config(2));
  REQUIRE(rt.loop_count() == 2);
  auto backend = start_server(rt, make_backend("B"));
  auto probe = std::make_shared<NestedProbe>();
  auto front = start_server(rt, make_front(address_of(*backend), rt, probe));
  // Clients on a runtime of their own; four sessions, so the front's
  // handlers run on both of rt's loops.
  Runtime client_rt(runtime_config(1));
  std::vector<std::unique_ptr<Channel>> clients;
  for (int i = 0; i < 4; ++i) clients.push_back(connect(address_of(*front), client_rt));
  std::map<uint32_t, int> front_loops;
  for (auto& c : clients) ++front_loops[c->stats().loop_index];
  CHECK(run_relays(clients, *probe, 24) == 0);
  // The calls from this thread to the clients' loop were hand-offs: the
  // counter counts.
  uint64_t client_handoffs = 0;
  for (auto& c : clients) client_handoffs += c->stats().cross_loop_handoffs;
  CHECK(client_handoffs == 24);
}

TEST_CASE("channels to a server of their own process spread over every loop") {
  // Each connect places a client session and then (the server accepting)
  // a server session.  Placement that took turns across both sides put
  // every channel on loop 0 and every server session on loop 1.
  Runtime rt(runtime_config(2));
  auto server = start_server(rt, make_backend("B"));
  std::vector<std::unique_ptr<Channel>> channels;
  for (int i = 0; i < 8; ++i) channels.push_back(connect(address_of(*server), rt));
  std::map<uint32_t, int> per_loop;
  for (auto& c : channels) ++per_loop[c->stats().loop_index];
  CHECK(per_loop[0] == 4);
  CHECK(per_loop[1] == 4);
  for (size_t i = 0; i < channels.size(); ++i) {
    auto f = channels[i]->call_typed<Pong>(kEcho, ping(i, "x"));
    const std::string err = pong_error(get_within(f), i, "B:x");
    CHECK_MESSAGE(err.empty(), "channel " << i << ": " << err);
  }
}

TEST_CASE("the same nested calls on a separate runtime are handed across loops") {
  Runtime rt(runtime_config(2));
  Runtime other(runtime_config(1));
  auto backend = start_server(rt, make_backend("B"));
  auto probe = std::make_shared<NestedProbe>();
  // The old model: the handler's channel has a loop elsewhere.
  auto front = start_server(rt, make_front(address_of(*backend), other, probe));
  std::vector<std::unique_ptr<Channel>> clients;
  for (int i = 0; i < 2; ++i) clients.push_back(connect(address_of(*front), other));
  // Every nested call (3 per relay) was handed from the handler's loop to
  // the channel's.
  CHECK(run_relays(clients, *probe, 8) == 8 * 3);
}

TEST_CASE("Channel::connect on a runtime's loop outside a handler is refused, not a hang") {
  Runtime rt(runtime_config(1));
  auto backend = start_server(rt, make_backend("B"));
  auto ch = connect(address_of(*backend), rt);
  auto done = std::make_shared<std::atomic<int>>(0);
  auto code = std::make_shared<std::atomic<int>>(-1);
  const std::string address = address_of(*backend);
  // A reply callback runs on the loop, not in a fiber.
  slotrpc::raw::call(*ch, kEcho, ping(1, "x"), {}, [=](RawReply&&) {
    auto nested = Channel::connect(address, rt);
    code->store(nested.ok() ? 0 : static_cast<int>(nested.status().code()));
    ++*done;
  });
  REQUIRE(test_process::wait_until([&] { return done->load() == 1; }, 10000ms));
  CHECK(code->load() == static_cast<int>(StatusCode::kInvalidArgument));
}

// ---- 64 channels to 64 servers in 4 processes, on 2 loops -------------------

namespace {
constexpr int kChildren = 4;
constexpr int kServersPerChild = 16;
}  // namespace

TEST_CASE("helper: 16 servers in one process" * doctest::skip()) {
  const char* port_file = std::getenv("RT_PORT_FILE");
  const char* first = std::getenv("RT_FIRST_SERVER");
  REQUIRE(port_file != nullptr);
  REQUIRE(first != nullptr);
  Runtime rt(runtime_config(1));
  std::vector<std::unique_ptr<Server>> servers;
  std::string ports;
  for (int i = 0; i < kServersPerChild; ++i) {
    servers.push_back(start_server(rt, make_backend("s" + std::to_string(std::atoi(first) + i))));
    ports += std::to_string(servers.back()->port()) + "\n";
  }
  const std::string tmp = std::string(port_file) + ".tmp";
  {
    std::ofstream out(tmp);
    out << ports;
  }
  std::filesystem::rename(tmp, port_file);
  for (;;) ::pause();  // until the test kills it
}

TEST_CASE("64 channels to 64 servers in 4 processes and a server of its own run on a runtime's 2 loops") {
  test_process::TempDir dir;
  std::vector<std::unique_ptr<test_process::Child>> children;
  for (int c = 0; c < kChildren; ++c) {
    auto o = test_process::SpawnOptions::to_files(dir.path, "child" + std::to_string(c));
    o.env = {"RT_PORT_FILE=" + (dir.path / ("ports" + std::to_string(c))).string(),
             "RT_FIRST_SERVER=" + std::to_string(c * kServersPerChild)};
    children.push_back(std::make_unique<test_process::Child>(
        std::vector<std::string>{test_process::self_exe(), "--no-skip", "--test-case=helper: 16 servers in one process"},
        o));
  }
  std::vector<uint16_t> ports;
  for (int c = 0; c < kChildren; ++c) {
    const auto file = dir.path / ("ports" + std::to_string(c));
    REQUIRE_MESSAGE(test_process::wait_until([&] { return std::filesystem::exists(file); }, 20000ms),
                    "child " << c << " wrote no ports: " << children[c]->stderr_text());
    std::ifstream in(file);
    unsigned p = 0;
    while (in >> p) ports.push_back(static_cast<uint16_t>(p));
  }
  REQUIRE(ports.size() == size_t{kChildren * kServersPerChild});

  Runtime rt(runtime_config(2));
  auto own = start_server(rt, make_backend("own"));
  std::vector<std::unique_ptr<Channel>> channels;
  std::vector<std::string> tags;
  for (size_t i = 0; i < ports.size(); ++i) {
    channels.push_back(connect("127.0.0.1:" + std::to_string(ports[i]), rt));
    tags.push_back("s" + std::to_string(i));
  }
  channels.push_back(connect(address_of(*own), rt));
  tags.push_back("own");

  // Every channel: 8 outstanding calls, 4 rounds; every answer checked
  // (the tag proves which server answered).
  constexpr int kRounds = 4, kOutstanding = 8;
  int bad = 0, ok = 0;
  for (int round = 0; round < kRounds; ++round) {
    std::vector<Future<Reply<Pong>>> futures;
    for (size_t c = 0; c < channels.size(); ++c)
      for (int k = 0; k < kOutstanding; ++k) {
        const uint64_t seq = (c * 1000) + round * kOutstanding + k;
        futures.push_back(channels[c]->call_typed<Pong>(kEcho, ping(seq, "m" + std::to_string(seq))));
      }
    size_t f = 0;
    for (size_t c = 0; c < channels.size(); ++c)
      for (int k = 0; k < kOutstanding; ++k, ++f) {
        const uint64_t seq = (c * 1000) + round * kOutstanding + k;
        auto r = get_within(futures[f]);
        const std::string err = pong_error(r, seq, tags[c] + ":m" + std::to_string(seq));
        if (err.empty()) ++ok;
        else if (bad++ < 3) FAIL_CHECK("channel " << c << ": " << err);
      }
  }
  CHECK(bad == 0);
  CHECK(ok == int(channels.size()) * kRounds * kOutstanding);

  // Sessions were spread over both loops.
  std::map<uint32_t, int> per_loop;
  for (auto& ch : channels) ++per_loop[ch->stats().loop_index];
  CHECK(per_loop.size() == 2);
  // One process, one server and 65 channels: the runtime's 2 loops are its
  // only event-loop threads.
  const auto names = loop_threads();
  CHECK_MESSAGE(names.size() == 2, "loop threads: " << names.size());
  for (const auto& n : names) CHECK(n.rfind("slotrpc-loop", 0) == 0);
}

// ---- Destroying channels while the loop's other channels work ----------------

namespace {

// Keeps one call in flight on a channel, re-issued from each completion
// (on the loop), counting answers, until stopped.
struct Pump : std::enable_shared_from_this<Pump> {
  Channel* ch = nullptr;
  std::atomic<uint64_t> ok{0}, bad{0};
  std::atomic<bool> stop{false};
  std::atomic<bool> idle{false};
  void next(uint64_t seq) {
    if (stop.load()) {
      idle = true;
      return;
    }
    auto self = shared_from_this();
    slotrpc::raw::call(*ch, kEcho, ping(seq, "p"), {}, [self, seq](RawReply&& raw) {
      Reply<Pong> r(std::move(raw));
      if (pong_error(r, seq, "B:p").empty()) ++self->ok;
      else ++self->bad;
      self->next(seq + 1);
    });
  }
};

uint64_t total(const std::vector<std::shared_ptr<Pump>>& pumps) {
  uint64_t n = 0;
  for (auto& p : pumps) n += p->ok.load();
  return n;
}

}  // namespace

TEST_CASE("destroying channels while the other channels of their loop carry calls: no stall") {
  Runtime rt(runtime_config(1));  // one loop: every session shares it
  auto backend = start_server(rt, make_backend("B"));
  const std::string address = address_of(*backend);

  std::vector<std::unique_ptr<Channel>> busy;
  std::vector<std::shared_ptr<Pump>> pumps;
  for (int i = 0; i < 4; ++i) {
    busy.push_back(connect(address, rt));
    auto p = std::make_shared<Pump>();
    p->ch = busy.back().get();
    pumps.push_back(p);
    p->next(1);
  }
  auto progresses = [&] {
    const uint64_t before = total(pumps);
    return test_process::wait_until([&] { return total(pumps) >= before + 50; }, 10000ms);
  };
  REQUIRE(progresses());

  // From this thread: each victim has calls in flight (slow ones, so they
  // are still out) when it is destroyed; they end CANCELLED, and the pumps
  // go on.
  for (int round = 0; round < 8; ++round) {
    auto victim = connect(address, rt);
    std::vector<Future<Reply<Pong>>> out;
    for (int k = 0; k < 8; ++k) out.push_back(victim->call_typed<Pong>(kEcho, ping(k, "v", 200)));
    victim.reset();
    for (auto& f : out) {
      auto r = get_within(f);
      CHECK(r.status().code() == StatusCode::kCancelled);
    }
    CHECK_MESSAGE(progresses(), "the loop's other channels stalled after destroying channel " << round);
  }

  // On the loop itself: a reply callback destroys its own channel.
  for (int round = 0; round < 4; ++round) {
    auto holder = std::make_shared<std::unique_ptr<Channel>>(connect(address, rt));
    auto destroyed = std::make_shared<std::atomic<bool>>(false);
    auto pending = (*holder)->call_typed<Pong>(kEcho, ping(7, "slow", 300));
    slotrpc::raw::call(**holder, kEcho, ping(1, "now"), {}, [holder, destroyed](RawReply&&) {
      holder->reset();  // ~Channel on the channel's own loop
      *destroyed = true;
    });
    REQUIRE(test_process::wait_until([&] { return destroyed->load(); }, 10000ms));
    CHECK(get_within(pending).status().code() == StatusCode::kCancelled);
    CHECK_MESSAGE(progresses(), "the loop stalled after a channel was destroyed on it");
  }

  for (auto& p : pumps) p->stop = true;
  REQUIRE(test_process::wait_until([&] {
    for (auto& p : pumps)
      if (!p->idle.load()) return false;
    return true;
  }, 10000ms));
  for (auto& p : pumps) CHECK(p->bad.load() == 0);
}
