// Caller turns (lib/reactor/caller_turns.cc): a thread blocked in
// Future::get() runs its channel's loop itself while the loop thread
// parks.  These cases fail when a caller never drives (replies always
// delivered by the loop thread), on a hang (a turn never handed back, a
// loop thread that never comes back: the watchdog ends the process naming
// the case), on a wait_for() that overruns its deadline while driving, and
// on a wrong reply under many callers taking turns.
#include <doctest/doctest.h>
#include <slotrpc/slotrpc.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
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

constexpr uint32_t kEcho = slotrpc::method_id("slotrpc.test.Turns.Echo");
constexpr uint32_t kRelay = slotrpc::method_id("slotrpc.test.Turns.Relay");

using Watchdog = slotrpc::test::ProgressWatchdog;

std::unique_ptr<Channel> connect(const std::string& address) {
  auto ch = Channel::connect(address);
  REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
  return std::move(ch).value();
}

slotrpc::Future<slotrpc::Reply<Pong>> call(Channel& ch, uint32_t method, uint64_t seq, uint32_t sleep_ms = 0) {
  return ch.unary<Ping, Pong>(method, [seq, sleep_ms](flatbuffers::FlatBufferBuilder& fbb) {
    return slotrpc::test::CreatePing(fbb, seq, 0, 0, sleep_ms);
  });
}

// Echo answers at once (or after sleep_ms, its fiber asleep); Relay makes
// a nested call to `next` with get() inside its handler and answers with
// that reply's seq.
struct TestServer {
  std::unique_ptr<Server> server = std::make_unique<Server>();
  std::string address;
  Channel* next = nullptr;
  TestServer() {
    ServiceDefinition svc("slotrpc.test.Turns");
    svc.add_unary<Ping>("Echo", [](const Ping& req, flatbuffers::FlatBufferBuilder& out, ServerCall&) -> Status {
      if (req.sleep_ms() != 0) slotrpc::this_fiber::sleep_for(std::chrono::milliseconds(req.sleep_ms()));
      out.Finish(slotrpc::test::CreatePong(out, req.seq()));
      return {};
    });
    svc.add_unary<Ping>("Relay", [this](const Ping& req, flatbuffers::FlatBufferBuilder& out, ServerCall&) -> Status {
      auto r = call(*next, kEcho, req.seq()).get();  // suspends this handler's fiber, not its loop
      if (!r.ok()) return r.status();
      out.Finish(slotrpc::test::CreatePong(out, r->seq()));
      return {};
    });
    REQUIRE(server->add_service(std::move(svc)).ok());
    const Status st = server->start("127.0.0.1:0");
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    address = "127.0.0.1:" + std::to_string(server->port());
  }
};

}  // namespace

TEST_CASE("caller turns: a thread waiting in get() delivers its channel's replies itself") {
  // Call B goes out with a callback, then call A, and the thread waits in
  // A's get().  The server answers in order, so B's reply arrives no later
  // than A's: when the waiting thread runs the loop's turns, B's callback
  // runs on it.  Without caller turns every callback runs on the loop
  // thread.  The loop thread takes its loop back whenever the caller
  // pauses long enough (a descheduled test thread on a loaded host), so
  // the check asks for a quarter (without caller turns: none at all).
  TestServer srv;
  auto ch = connect(srv.address);
  Watchdog dog("callbacks beside get()", 20s);
  for (uint64_t i = 0; i < 50; ++i) REQUIRE(call(*ch, kEcho, i).get().ok());
  constexpr int kRounds = 200;
  int on_caller = 0;
  for (int i = 0; i < kRounds; ++i) {
    std::atomic<bool> done{false};
    std::atomic<bool> here{false};
    const auto me = std::this_thread::get_id();
    ch->unary<Ping, Pong>(
        kEcho, [i](flatbuffers::FlatBufferBuilder& fbb) { return slotrpc::test::CreatePing(fbb, i); }, {},
        [&](slotrpc::Reply<Pong>&& r) {
          here.store(std::this_thread::get_id() == me);
          done.store(r.ok());
        });
    auto r = call(*ch, kEcho, 1000 + i).get();
    REQUIRE_MESSAGE(r.ok(), r.status().to_string());
    CHECK(r->seq() == uint64_t(1000 + i));
    while (!done.load()) std::this_thread::yield();  // the loop thread delivers it, if not us
    if (here.load()) ++on_caller;
    dog.step();
  }
  MESSAGE("callbacks run by the waiting thread: " << on_caller << " of " << kRounds);
  CHECK(on_caller >= kRounds / 4);
}

TEST_CASE("caller turns: no callback of another call runs inside the call that issues one") {
  // Call B goes out with a callback; its reply has time to arrive (a spin
  // of 10 to 80 µs: longer, and the parked loop thread takes its loop back
  // and delivers it); then call A is issued with a flag up around it.  Issuing A may
  // send it from this thread's stack, but must hand out no completion
  // there: B's callback runs in A's get() or on the loop thread, never
  // inside A's call (whose caller may hold a lock such a callback takes).
  TestServer srv;
  auto ch = connect(srv.address);
  Watchdog dog("callbacks inside a call", 20s);
  for (uint64_t i = 0; i < 20; ++i) REQUIRE(call(*ch, kEcho, i).get().ok());
  const auto me = std::this_thread::get_id();
  std::atomic<bool> issuing{false};
  std::atomic<int> inside{0};
  for (int i = 0; i < 2000; ++i) {
    std::atomic<bool> done{false};
    ch->unary<Ping, Pong>(
        kEcho, [i](flatbuffers::FlatBufferBuilder& fbb) { return slotrpc::test::CreatePing(fbb, i); }, {},
        [&](slotrpc::Reply<Pong>&&) {
          if (issuing.load() && std::this_thread::get_id() == me) inside.fetch_add(1);
          done.store(true);
        });
    const auto until = Clock::now() + std::chrono::microseconds(10 << (i % 4));  // 10 to 80 µs
    while (Clock::now() < until) {
    }
    issuing.store(true);
    auto f = call(*ch, kEcho, 1000 + i);
    issuing.store(false);
    REQUIRE(f.get().ok());
    while (!done.load()) std::this_thread::yield();
    dog.step();
  }
  CHECK(inside.load() == 0);
}

TEST_CASE("caller turns: many threads get(), wait_for() and poll ready() on one channel") {
  // Eight threads on one channel take the loop's turn from each other and
  // from the loop thread; each reply must reach its own caller.
  TestServer srv;
  auto ch = connect(srv.address);
  constexpr int kThreads = 8;
  constexpr int kCalls = 300;
  Watchdog dog("many callers taking turns", 20s);
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kCalls; ++i) {
        const uint64_t seq = uint64_t(t) * 100000 + i;
        auto f = call(*ch, kEcho, seq);
        switch ((i + t) % 3) {
          case 0:
            break;
          case 1:
            if (!f.wait_for(20s)) wrong.fetch_add(1);
            break;
          case 2:
            while (!f.ready()) {
            }
            break;
        }
        auto r = f.get();
        if (!r.ok() || r->seq() != seq) wrong.fetch_add(1);
        dog.step();
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(wrong.load() == 0);
}

TEST_CASE("caller turns: get() inside a handler suspends its fiber, while callers drive the client loop") {
  // A handler's nested call waits on its fiber (server loops run fibers,
  // so no caller ever takes their turns); the client side meanwhile is
  // driven by the waiting test threads.
  TestServer back;
  TestServer front;
  auto to_back = connect(back.address);
  front.next = to_back.get();
  auto ch = connect(front.address);
  Watchdog dog("nested get() in handlers", 20s);
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const uint64_t seq = uint64_t(t) * 1000 + i;
        auto r = call(*ch, kRelay, seq).get();
        if (!r.ok() || r->seq() != seq) wrong.fetch_add(1);
        dog.step();
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(wrong.load() == 0);
}

TEST_CASE("caller turns: a callback calls get() on a call another loop delivers") {
  // Callbacks run on the loop (or on the thread that drives it); a get()
  // in one does not drive (it is already on a loop) and blocks that
  // thread until the other loop's reply comes.  (Waiting there for a reply
  // the same loop must deliver would block that loop for good, caller
  // turns or not: the callback form or a handler is the way to chain
  // calls on one loop.)
  TestServer srv;
  auto ch = connect(srv.address);
  auto other_rt = slotrpc::Runtime::create(slotrpc::Config{});
  REQUIRE(other_rt.ok());
  auto other = Channel::connect(srv.address, other_rt.value());
  REQUIRE_MESSAGE(other.ok(), other.status().to_string());
  Watchdog dog("get() inside a callback", 20s);
  for (int i = 0; i < 100; ++i) {
    std::atomic<int> inner{-1};
    ch->unary<Ping, Pong>(
        kEcho, [i](flatbuffers::FlatBufferBuilder& fbb) { return slotrpc::test::CreatePing(fbb, i); }, {},
        [&, i](slotrpc::Reply<Pong>&&) {
          auto r = call(**other, kEcho, 500 + i).get();
          inner.store(r.ok() ? static_cast<int>(r->seq()) : -2);
        });
    auto r = call(*ch, kEcho, i).get();  // this thread may be the one running that callback
    REQUIRE(r.ok());
    while (inner.load() == -1) std::this_thread::yield();
    CHECK(inner.load() == 500 + i);
    dog.step();
  }
}

TEST_CASE("caller turns: wait_for() keeps its deadline while it drives the loop") {
  TestServer srv;
  auto ch = connect(srv.address);
  for (uint64_t i = 0; i < 20; ++i) REQUIRE(call(*ch, kEcho, i).get().ok());
  auto f = call(*ch, kEcho, 77, 50);  // the handler sleeps 50 ms
  int timeouts = 0;
  for (;;) {
    const auto t0 = Clock::now();
    if (f.wait_for(2ms)) break;
    const auto waited = Clock::now() - t0;
    CHECK(waited >= 2ms);
    CHECK(waited < 2s);
    ++timeouts;
    REQUIRE(timeouts < 5000);
  }
  CHECK(timeouts >= 1);
  auto r = f.get();
  REQUIRE_MESSAGE(r.ok(), r.status().to_string());
  CHECK(r->seq() == 77);
}

TEST_CASE("caller turns: the loop thread takes its loop back once callers stop") {
  // After get()s left the loop thread parked, calls with callbacks from a
  // thread that never waits in get(): only the loop thread can deliver
  // their replies.
  TestServer srv;
  auto ch = connect(srv.address);
  Watchdog dog("the loop thread taking its loop back", 10s);
  for (int round = 0; round < 50; ++round) {
    for (uint64_t i = 0; i < 20; ++i) REQUIRE(call(*ch, kEcho, i).get().ok());
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    ch->unary<Ping, Pong>(
        kEcho, [](flatbuffers::FlatBufferBuilder& fbb) { return slotrpc::test::CreatePing(fbb, 1); }, {},
        [&](slotrpc::Reply<Pong>&&) {
          std::lock_guard<std::mutex> lock(mu);
          done = true;
          cv.notify_all();
        });
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
    dog.step();
  }
}

TEST_CASE("caller turns: the channel destroyed while callers drive its loop") {
  // Threads call and wait in a loop; the channel is destroyed under them
  // (its close runs on the loop: a driving caller may run it).  Every wait
  // must end, with the reply or CANCELLED, and nothing may hang.
  // Odd rounds: the channel on a runtime of its own, destroyed right
  // after it while the threads may still be in get() (a loop ends under
  // the threads that may drive it).
  TestServer srv;
  Watchdog dog("channel destroyed under callers", 20s);
  for (int round = 0; round < 10; ++round) {
    std::optional<slotrpc::Runtime> rt;
    if (round % 2 == 1) rt = slotrpc::Runtime::create(slotrpc::Config{}).value();
    std::unique_ptr<Channel> ch;
    if (rt) {
      auto c = Channel::connect(srv.address, *rt);
      REQUIRE_MESSAGE(c.ok(), c.status().to_string());
      ch = std::move(c).value();
    } else {
      ch = connect(srv.address);
    }
    REQUIRE(call(*ch, kEcho, 1).get().ok());  // this thread's last call went through that loop
    std::shared_mutex mu;  // the channel's lifetime against the calls
    std::atomic<bool> closing{false};
    std::atomic<int> bad{0};
    std::atomic<int> calls{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (uint64_t i = 0;; ++i) {
          slotrpc::Future<slotrpc::Reply<Pong>> f;
          {
            std::shared_lock<std::shared_mutex> lock(mu);
            if (closing.load()) return;
            f = call(*ch, kEcho, uint64_t(t) * 100000 + i);
          }
          auto r = f.get();
          if (!r.ok() && r.status().code() != slotrpc::StatusCode::kCancelled &&
              r.status().code() != slotrpc::StatusCode::kUnavailable)
            bad.fetch_add(1);
          calls.fetch_add(1);
          dog.step();
        }
      });
    }
    while (calls.load() < 100) std::this_thread::yield();
    {
      std::unique_lock<std::shared_mutex> lock(mu);
      closing.store(true);
      ch.reset();
    }
    rt.reset();
    for (auto& th : threads) th.join();
    CHECK(bad.load() == 0);
    // This thread's last call went through a loop that may be gone now: a
    // wait must not touch it (AddressSanitizer builds see it if it does).
    auto state = std::make_shared<slotrpc::detail::SharedState<int>>();
    std::thread producer([state] {
      std::this_thread::sleep_for(1ms);
      state->set(5);
    });
    CHECK(slotrpc::Future<int>(state).get() == 5);
    producer.join();
  }
}
