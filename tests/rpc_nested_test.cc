// Integration: a handler that calls another service.
//
//   client --> server A (one event loop) --handler--> Channel --> server B
//
// A's handler waits for B with Future::get(), which suspends only its fiber:
// A's single loop must keep serving while handlers wait.  The proof is what
// happens, not how fast: 50 nested calls whose B side each sleeps 100 ms are
// all in A's handlers at the same time, finish together in about 100 ms
// (a blocked loop would need 50 x 100 ms), and a direct call to A is
// answered while they all wait.
#include <doctest/doctest.h>
#include <slotrpc/slotrpc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ping_payloads.h"
#include "test_messages_generated.h"

namespace {

using namespace slotrpc::test_payloads;  // ping, pong_error, echo_request, pattern

using namespace std::chrono_literals;
using slotrpc::Channel;
using slotrpc::Config;
using slotrpc::Future;
using slotrpc::RawReply;
using slotrpc::Reply;
using slotrpc::RequestWriter;
using slotrpc::Server;
using slotrpc::ServerCall;
using slotrpc::ServiceDefinition;
using slotrpc::Status;
using slotrpc::StatusCode;
using slotrpc::test::Ping;
using slotrpc::test::Pong;
using Clock = std::chrono::steady_clock;

constexpr uint32_t kBPong = slotrpc::method_id("slotrpc.test.NestedB.Pong");
constexpr uint32_t kBFail = slotrpc::method_id("slotrpc.test.NestedB.Fail");
constexpr uint32_t kAViaFuture = slotrpc::method_id("slotrpc.test.NestedA.ViaFuture");
constexpr uint32_t kAViaCallback = slotrpc::method_id("slotrpc.test.NestedA.ViaCallback");
constexpr uint32_t kAFailViaB = slotrpc::method_id("slotrpc.test.NestedA.FailViaB");
constexpr uint32_t kADirect = slotrpc::method_id("slotrpc.test.NestedA.Direct");

constexpr auto kWait = 10s;

void finish_pong(flatbuffers::FlatBufferBuilder& out, uint64_t seq, const std::string& text,
                 const uint8_t* data, size_t n) {
  static const uint8_t kNone = 0;
  auto t = out.CreateString(text);
  auto p = out.CreateVector(n != 0 ? data : &kNone, n);
  out.Finish(slotrpc::test::CreatePong(out, seq, t, p));
}

// Service B: replies "B:<text>" after sleeping sleep_ms in its fiber.
ServiceDefinition make_b() {
  ServiceDefinition svc("slotrpc.test.NestedB");
  svc.add_unary<Ping>("Pong", [](const Ping& req, flatbuffers::FlatBufferBuilder& out, ServerCall&) -> Status {
    if (req.sleep_ms() != 0) slotrpc::this_fiber::sleep_for(std::chrono::milliseconds(req.sleep_ms()));
    const auto* p = req.payload();
    finish_pong(out, req.seq(), "B:" + req.text()->str(), p ? p->data() : nullptr, p ? p->size() : 0);
    return {};
  });
  svc.add_unary<Ping>("Fail", [](const Ping& req, flatbuffers::FlatBufferBuilder&, ServerCall&) -> Status {
    return Status(StatusCode::kResourceExhausted, "B is out of " + req.text()->str());
  });
  return svc;
}

// What A's handlers observed.
struct AProbe {
  std::atomic<int> active{0};
  std::atomic<int> max_active{0};
  std::atomic<int> not_in_fiber{0};
  std::atomic<int> direct_calls{0};

  void enter() {
    if (!slotrpc::this_fiber::in_fiber()) ++not_in_fiber;
    const int now = ++active;
    int seen = max_active.load();
    while (now > seen && !max_active.compare_exchange_weak(seen, now)) {
    }
  }
  void leave() { --active; }
};

// The result of a callback-form call, waited for by polling from a fiber.
struct NestedResult {
  std::mutex mu;
  bool done = false;
  Status status;
  uint64_t seq = 0;
  std::string text;
  std::vector<uint8_t> payload;
};

// Service A: relays to B through `to_b` (owned by the test, outlives A).
ServiceDefinition make_a(Channel* to_b, std::shared_ptr<AProbe> probe) {
  ServiceDefinition svc("slotrpc.test.NestedA");
  // Future form: get() inside the handler suspends only this fiber.
  svc.add_unary<Ping>("ViaFuture", [to_b, probe](const Ping& req, flatbuffers::FlatBufferBuilder& out,
                                                 ServerCall&) -> Status {
    probe->enter();
    const auto* p = req.payload();
    auto f = to_b->call_typed<Pong>(kBPong, ping(req.seq(), req.text()->str(), p ? p->size() : 0, req.sleep_ms()));
    Reply<Pong> b = f.get();
    probe->leave();
    if (!b.ok()) return b.status();
    const auto* bp = b->payload();
    finish_pong(out, b->seq(), b->text()->str() + " via A", bp ? bp->data() : nullptr, bp ? bp->size() : 0);
    return {};
  });
  // Callback form: the sink (on the A->B channel's loop) stores the result;
  // the handler sleeps in its fiber until it is there (bounded).
  svc.add_unary<Ping>("ViaCallback", [to_b, probe](const Ping& req, flatbuffers::FlatBufferBuilder& out,
                                                   ServerCall&) -> Status {
    probe->enter();
    auto result = std::make_shared<NestedResult>();
    const auto* p = req.payload();
    slotrpc::raw::call(*to_b, kBPong, ping(req.seq(), req.text()->str(), p ? p->size() : 0, req.sleep_ms()), {},
               [result](RawReply&& raw) {
                 Reply<Pong> b(std::move(raw));
                 std::lock_guard<std::mutex> lock(result->mu);
                 result->status = b.status();
                 if (b.ok()) {
                   result->seq = b->seq();
                   result->text = b->text()->str();
                   if (b->payload() != nullptr) result->payload.assign(b->payload()->begin(), b->payload()->end());
                 }
                 result->done = true;
               });
    const auto give_up = Clock::now() + 5s;
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(result->mu);
        if (result->done) break;
      }
      if (Clock::now() >= give_up) {
        probe->leave();
        return Status(StatusCode::kDeadlineExceeded, "the nested callback never ran");
      }
      slotrpc::this_fiber::sleep_for(1ms);
    }
    probe->leave();
    std::lock_guard<std::mutex> lock(result->mu);
    if (!result->status.ok()) return result->status;
    finish_pong(out, result->seq, result->text + " via A (callback)", result->payload.data(), result->payload.size());
    return {};
  });
  // Relays B's error unchanged.
  svc.add_unary<Ping>("FailViaB", [to_b](const Ping& req, flatbuffers::FlatBufferBuilder&, ServerCall&) -> Status {
    auto f = to_b->call_typed<Pong>(kBFail, ping(req.seq(), req.text()->str()));
    Reply<Pong> b = f.get();
    if (b.ok()) return Status(StatusCode::kInternal, "B's Fail succeeded");
    return b.status();
  });
  svc.add_unary<Ping>("Direct", [probe](const Ping& req, flatbuffers::FlatBufferBuilder& out, ServerCall&) -> Status {
    ++probe->direct_calls;
    finish_pong(out, req.seq(), "direct " + req.text()->str(), nullptr, 0);
    return {};
  });
  return svc;
}

std::unique_ptr<Channel> connect(const std::string& address, Config config = {}) {
  auto ch = Channel::connect(address, config);
  REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
  return std::move(ch).value();
}

std::unique_ptr<Server> start_server(ServiceDefinition svc, Config config = {}) {
  auto server = std::make_unique<Server>(config);
  REQUIRE(server->add_service(std::move(svc)).ok());
  const Status st = server->start("127.0.0.1:0");
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  return server;
}

std::string address_of(const Server& s) { return "127.0.0.1:" + std::to_string(s.port()); }

// Members are destroyed bottom-up: server A (its handlers use a_to_b)
// first, then the channel, then server B.
struct Topology {
  std::unique_ptr<Server> b;
  std::unique_ptr<Channel> a_to_b;
  std::shared_ptr<AProbe> probe = std::make_shared<AProbe>();
  std::unique_ptr<Server> a;

  explicit Topology(uint32_t a_reactor_threads = 1) {
    b = start_server(make_b());
    a_to_b = connect(address_of(*b));
    Config a_cfg;
    a_cfg.reactor_threads = a_reactor_threads;
    a = start_server(make_a(a_to_b.get(), probe), a_cfg);
    REQUIRE(a->config().reactor_threads == a_reactor_threads);
  }
};

template <class T>
T get_within(Future<T>& f, std::chrono::milliseconds limit = std::chrono::duration_cast<std::chrono::milliseconds>(kWait)) {
  REQUIRE(f.valid());
  REQUIRE_MESSAGE(f.wait_for(limit), "call did not complete within " << limit.count() << " ms");
  return f.get();
}

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

}  // namespace

TEST_CASE("a handler calls another service with Future::get() and returns its answer") {
  Topology topo;
  auto client = connect(address_of(*topo.a));
  for (uint64_t seq = 1; seq <= 5; ++seq) {
    const std::string text = "hello-" + std::to_string(seq);
    auto f = client->call_typed<Pong>(kAViaFuture, ping(seq, text, seq * 64));
    auto r = get_within(f);
    const std::string err = pong_error(r, seq, "B:" + text + " via A", seq * 64);
    CHECK_MESSAGE(err.empty(), err);
  }
  CHECK(topo.probe->not_in_fiber.load() == 0);
}

TEST_CASE("one event loop keeps serving while 50 handlers wait for nested calls") {
  Topology topo(1);
  auto client = connect(address_of(*topo.a));
  // Warm-up: the first nested call also builds fibers and connections.
  {
    auto f = client->call_typed<Pong>(kAViaFuture, ping(0, "warm"));
    REQUIRE(get_within(f).ok());
  }
  constexpr int kCalls = 50;
  constexpr uint32_t kBSleepMs = 100;
  const auto t0 = Clock::now();
  std::vector<Future<Reply<Pong>>> futures;
  for (int i = 0; i < kCalls; ++i)
    futures.push_back(client->call_typed<Pong>(kAViaFuture, ping(100 + i, "n" + std::to_string(i), 16, kBSleepMs)));
  int bad = 0;
  for (int i = 0; i < kCalls; ++i) {
    auto r = get_within(futures[i]);
    const std::string err = pong_error(r, 100 + i, "B:n" + std::to_string(i) + " via A", 16);
    if (!err.empty() && bad++ < 3) FAIL_CHECK("call " << i << ": " << err);
  }
  const double elapsed = ms_since(t0);
  CHECK(bad == 0);
  // Serialised on a blocked loop this would take 50 x 100 ms = 5 s.
  CHECK(elapsed >= kBSleepMs);
  CHECK_MESSAGE(elapsed < 2500, "50 nested calls took " << elapsed << " ms");
  // Many handlers were suspended in get() at once, all on A's one loop.
  CHECK(topo.probe->max_active.load() >= 10);
  CHECK(topo.probe->not_in_fiber.load() == 0);
  CHECK(topo.probe->active.load() == 0);
}

TEST_CASE("a direct call to A is answered while its only loop has handlers waiting on B") {
  Topology topo(1);
  auto client = connect(address_of(*topo.a));
  constexpr int kCalls = 10;
  std::vector<Future<Reply<Pong>>> nested;
  for (int i = 0; i < kCalls; ++i)
    nested.push_back(client->call_typed<Pong>(kAViaFuture, ping(i, "slow" + std::to_string(i), 0, 600)));
  // Wait (bounded) until all of them are inside A's handlers.
  const auto until = Clock::now() + 5s;
  while (topo.probe->active.load() < kCalls && Clock::now() < until) std::this_thread::sleep_for(1ms);
  REQUIRE(topo.probe->active.load() == kCalls);

  auto direct = client->call_typed<Pong>(kADirect, ping(99, "now"));
  auto d = get_within(direct);
  CHECK(pong_error(d, 99, "direct now", 0) == "");
  // Answered while every nested call was still waiting for B.
  int ready = 0;
  for (auto& f : nested) ready += f.ready() ? 1 : 0;
  CHECK(ready == 0);
  CHECK(topo.probe->active.load() == kCalls);

  for (int i = 0; i < kCalls; ++i) {
    auto r = get_within(nested[i]);
    CHECK(pong_error(r, i, "B:slow" + std::to_string(i) + " via A", 0) == "");
  }
}

TEST_CASE("a handler can make its nested call in callback form") {
  Topology topo(1);
  auto client = connect(address_of(*topo.a));
  {
    auto f = client->call_typed<Pong>(kAViaCallback, ping(1, "cb", 300));
    const std::string err = pong_error(get_within(f), 1, "B:cb via A (callback)", 300);
    CHECK_MESSAGE(err.empty(), err);
  }
  // Many at once, with B sleeping: they overlap on A's one loop too.
  constexpr int kCalls = 20;
  const auto t0 = Clock::now();
  std::vector<Future<Reply<Pong>>> futures;
  for (int i = 0; i < kCalls; ++i)
    futures.push_back(client->call_typed<Pong>(kAViaCallback, ping(10 + i, "c" + std::to_string(i), 8, 100)));
  for (int i = 0; i < kCalls; ++i) {
    const std::string err = pong_error(get_within(futures[i]), 10 + i, "B:c" + std::to_string(i) + " via A (callback)", 8);
    CHECK_MESSAGE(err.empty(), err);
  }
  CHECK(ms_since(t0) < 1500);  // 20 x 100 ms if they were serialised
  CHECK(topo.probe->max_active.load() >= 5);
  CHECK(topo.probe->not_in_fiber.load() == 0);
}

TEST_CASE("an error from the nested service reaches the outer caller") {
  Topology topo;
  auto client = connect(address_of(*topo.a));
  auto f = client->call_typed<Pong>(kAFailViaB, ping(3, "credits"));
  auto r = get_within(f);
  CHECK(r.status().code() == StatusCode::kResourceExhausted);
  CHECK(r.status().message() == "B is out of credits");
  // And a good nested call right after.
  auto g = client->call_typed<Pong>(kAViaFuture, ping(4, "fine", 4));
  CHECK(pong_error(get_within(g), 4, "B:fine via A", 4) == "");
}

TEST_CASE("nested calls from several A loops and several clients at once") {
  Topology topo(2);
  constexpr int kClients = 3;
  constexpr int kPerClient = 300;
  std::vector<std::unique_ptr<Channel>> clients;
  for (int c = 0; c < kClients; ++c) clients.push_back(connect(address_of(*topo.a)));
  std::atomic<int> ok{0};
  std::atomic<int> wrong{0};
  std::atomic<int> stuck{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      std::vector<Future<Reply<Pong>>> window;
      std::vector<uint64_t> seqs;
      for (int i = 0; i < kPerClient; ++i) {
        const uint64_t seq = uint64_t(c) * 10000 + uint64_t(i);
        const uint32_t method = (i % 3 == 0) ? kAViaCallback : kAViaFuture;
        window.push_back(clients[c]->call_typed<Pong>(method, ping(seq, "x" + std::to_string(seq), i % 50)));
        seqs.push_back(seq);
        if (window.size() == 16 || i + 1 == kPerClient) {
          for (size_t k = 0; k < window.size(); ++k) {
            if (!window[k].wait_for(kWait)) {
              ++stuck;
              return;
            }
            Reply<Pong> r = window[k].get();
            const uint64_t s = seqs[k];
            const std::string suffix = (s % 10000) % 3 == 0 ? " via A (callback)" : " via A";
            if (pong_error(r, s, "B:x" + std::to_string(s) + suffix, (s % 10000) % 50).empty()) ++ok; else ++wrong;
          }
          window.clear();
          seqs.clear();
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(stuck.load() == 0);
  CHECK(wrong.load() == 0);
  CHECK(ok.load() == kClients * kPerClient);
}
