// Future<T>'s waits: get() spins briefly then sleeps on the result's word,
// ready() is a plain load, wait_for() sleeps with a deadline.  These cases
// fail on a lost wake-up (a watchdog ends the process with the iteration),
// on a ready() that never turns true, and on a wait_for() that ignores its
// deadline or misses its result.
#include <doctest/doctest.h>
#include <slotrpc/slotrpc.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "progress_watchdog.h"
#include "test_messages_generated.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using slotrpc::Channel;
using slotrpc::Server;
using slotrpc::ServerCall;
using slotrpc::ServiceDefinition;
using slotrpc::Status;
using slotrpc::test::Ping;
using slotrpc::test::Pong;

constexpr uint32_t kEcho = slotrpc::method_id("slotrpc.test.Wait.Echo");

using Watchdog = slotrpc::test::ProgressWatchdog;

struct EchoServer {
  std::unique_ptr<Server> server = std::make_unique<Server>();
  std::string address;
  EchoServer() {
    ServiceDefinition svc("slotrpc.test.Wait");
    svc.add_unary<Ping>("Echo", [](const Ping& req, flatbuffers::FlatBufferBuilder& out, ServerCall&) -> Status {
      if (req.sleep_ms() != 0) slotrpc::this_fiber::sleep_for(std::chrono::milliseconds(req.sleep_ms()));
      out.Finish(slotrpc::test::CreatePong(out, req.seq()));
      return {};
    });
    REQUIRE(server->add_service(std::move(svc)).ok());
    const Status st = server->start("127.0.0.1:0");
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    address = "127.0.0.1:" + std::to_string(server->port());
  }
};

std::unique_ptr<Channel> connect(const std::string& address) {
  auto ch = Channel::connect(address);
  REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
  return std::move(ch).value();
}

slotrpc::Future<slotrpc::Reply<Pong>> echo(Channel& ch, uint64_t seq, uint32_t sleep_ms = 0) {
  return ch.unary<Ping, Pong>(kEcho, [seq, sleep_ms](flatbuffers::FlatBufferBuilder& fbb) {
    return slotrpc::test::CreatePing(fbb, seq, 0, 0, sleep_ms);
  });
}

}  // namespace

TEST_CASE("SharedState: no lost wake-up between a producer and a waiting thread") {
  // A producer sets each result after a delay drawn from 0 to 60 µs: about
  // the spin (get() has spun and finds it), just past it (get() went to
  // sleep, or is going to sleep as the result arrives: the window a lost
  // wake-up needs), and long (the learned spin falls to zero: it sleeps at
  // once).  A lost wake-up hangs one get(): the watchdog fails the test.
  // 5,000 rounds: a lost wake-up showed within seconds when the wake was removed,
  // and on a loaded CI host each round can cost a scheduler tick.
  constexpr int kRounds = 5000;
  using State = slotrpc::detail::SharedState<int>;
  std::vector<std::shared_ptr<State>> states(kRounds);
  for (auto& s : states) s = std::make_shared<State>();
  std::atomic<int> consumer_at{-1};  // the round the consumer waits on
  Watchdog dog("SharedState get()", 10s);

  std::thread producer([&] {
    std::mt19937 rng(12345);
    std::uniform_int_distribution<int> delay_ns(0, 60000);
    for (int i = 0; i < kRounds; ++i) {
      while (consumer_at.load(std::memory_order_acquire) < i) {
      }
      const auto until = Clock::now() + std::chrono::nanoseconds(delay_ns(rng));
      while (Clock::now() < until) {
      }
      states[i]->set(i);
    }
  });
  int64_t sum = 0;
  for (int i = 0; i < kRounds; ++i) {
    consumer_at.store(i, std::memory_order_release);
    slotrpc::Future<int> f(states[i]);
    sum += f.get();
    dog.step();
  }
  producer.join();
  CHECK(sum == int64_t{kRounds} * (kRounds - 1) / 2);
}

TEST_CASE("SharedState: many threads get() and wait_for() the same kind of results") {
  // Eight consumer threads, each waiting on its own stream of results set
  // by one producer in turn: wake-ups cross threads with other sleepers
  // around, and wait_for() with a deadline mixes in.
  constexpr int kThreads = 8;
  constexpr int kRounds = 2000;
  using State = slotrpc::detail::SharedState<int>;
  std::vector<std::vector<std::shared_ptr<State>>> states(kThreads, std::vector<std::shared_ptr<State>>(kRounds));
  for (auto& row : states)
    for (auto& s : row) s = std::make_shared<State>();
  Watchdog dog("threads waiting on results", 10s);
  std::atomic<int> bad{0};
  std::vector<std::thread> consumers;
  for (int t = 0; t < kThreads; ++t) {
    consumers.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        slotrpc::Future<int> f(states[t][i]);
        if (i % 3 == 1 && !f.wait_for(20s)) bad.fetch_add(1);
        if (f.get() != t * kRounds + i) bad.fetch_add(1);
        dog.step();
      }
    });
  }
  std::thread producer([&] {
    for (int i = 0; i < kRounds; ++i)
      for (int t = 0; t < kThreads; ++t) {
        if ((i + t) % 5 == 0) std::this_thread::yield();
        states[t][i]->set(t * kRounds + i);
      }
  });
  producer.join();
  for (auto& c : consumers) c.join();
  CHECK(bad.load() == 0);
}

TEST_CASE("Future::wait_for: false at its deadline, true once the result is there") {
  using State = slotrpc::detail::SharedState<int>;
  auto state = std::make_shared<State>();
  slotrpc::Future<int> f(state);
  const auto t0 = Clock::now();
  CHECK_FALSE(f.wait_for(30ms));
  const auto waited = Clock::now() - t0;
  CHECK(waited >= 30ms);
  CHECK(waited < 5s);
  CHECK_FALSE(f.ready());
  CHECK_FALSE(f.wait_for(0ms));
  CHECK_FALSE(f.wait_for(-5ms));
  std::thread producer([&] {
    std::this_thread::sleep_for(20ms);
    state->set(7);
  });
  CHECK(f.wait_for(std::chrono::hours::max()));  // a huge timeout must not wrap to "expired"
  CHECK(f.ready());
  CHECK(f.get() == 7);
  producer.join();
}

TEST_CASE("calls: get() from many threads over one channel, each reply its own") {
  EchoServer srv;
  auto ch = connect(srv.address);
  constexpr int kThreads = 6;
  constexpr int kCalls = 400;
  Watchdog dog("get() from many threads", 20s);
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kCalls; ++i) {
        const uint64_t seq = uint64_t(t) * 100000 + i;
        auto r = echo(*ch, seq).get();
        if (!r.ok() || r->seq() != seq) wrong.fetch_add(1);
        dog.step();
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(wrong.load() == 0);
}

TEST_CASE("calls: polling ready() makes progress, and get() after it returns the reply") {
  EchoServer srv;
  auto ch = connect(srv.address);
  for (uint64_t seq = 1; seq <= 200; ++seq) {
    auto f = echo(*ch, seq);
    const auto until = Clock::now() + 10s;
    bool late = false;
    while (!f.ready() && !late) late = Clock::now() > until;
    REQUIRE_MESSAGE(!late, "ready() still false after 10 s, call " << seq);
    auto r = f.get();
    REQUIRE_MESSAGE(r.ok(), r.status().to_string());
    CHECK(r->seq() == seq);
  }
}

TEST_CASE("calls: wait_for() on a slow call times out, then sees the reply") {
  EchoServer srv;
  auto ch = connect(srv.address);
  auto f = echo(*ch, 9, 300);  // the handler sleeps 300 ms
  CHECK_FALSE(f.wait_for(20ms));
  CHECK_FALSE(f.ready());
  REQUIRE(f.wait_for(20s));
  auto r = f.get();
  REQUIRE_MESSAGE(r.ok(), r.status().to_string());
  CHECK(r->seq() == 9);
}
