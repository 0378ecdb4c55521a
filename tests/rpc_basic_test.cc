// Integration: one in-process Server and Channels over loopback TCP.
//
// Covers the two call forms, many outstanding calls (most of them queued for
// a credit), deadlines, late replies after a deadline, cancellation (of a
// sent and of a queued call), concurrent callers, calls made from reply
// callbacks, and how handler failures reach the caller.
//
// Every wait is bounded: a hang shows up as a failed check, never as a
// stuck test.  No assertion is about speed, only about what happened; the
// few upper time bounds below are an order of magnitude above what the
// behaviour needs, so they hold on a loaded 2-core machine and under
// sanitizers.
#include <doctest/doctest.h>
#include <slotrpc/slotrpc.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "log_capture.h"
#include "process_util.h"
#include "ping_payloads.h"
#include "test_messages_generated.h"

namespace {

using namespace slotrpc::test_payloads;  // ping, pong_error, echo_request, pattern

using namespace std::chrono_literals;
using slotrpc::CallOptions;
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

constexpr const char* kService = "slotrpc.test.Basic";
constexpr uint32_t kEcho = slotrpc::method_id("slotrpc.test.Basic.Echo");
constexpr uint32_t kSlow = slotrpc::method_id("slotrpc.test.Basic.Slow");
constexpr uint32_t kThrow = slotrpc::method_id("slotrpc.test.Basic.Throw");
constexpr uint32_t kFail = slotrpc::method_id("slotrpc.test.Basic.Fail");
constexpr uint32_t kNoFinish = slotrpc::method_id("slotrpc.test.Basic.NoFinish");

// Generous bound for anything that should complete "now".
constexpr auto kWait = 10s;

// What the handlers observed, shared with the test body.
struct Probe {
  std::atomic<int> slow_started{0};
  std::atomic<int> slow_saw_cancel{0};
  std::atomic<int> slow_finished_uncancelled{0};
  std::mutex mu;
  std::set<std::string> echo_texts;  // every text the Echo handler was given

  bool saw_text(const std::string& t) {
    std::lock_guard<std::mutex> lock(mu);
    return echo_texts.count(t) != 0;
  }
};

slotrpc::Status write_pong(const Ping& req, flatbuffers::FlatBufferBuilder& out) {
  auto text = out.CreateString(req.text() != nullptr ? req.text()->str() : std::string());
  const auto* p = req.payload();
  static const uint8_t kNone = 0;
  auto payload = p != nullptr ? out.CreateVector(p->data(), p->size()) : out.CreateVector(&kNone, 0);
  out.Finish(slotrpc::test::CreatePong(out, req.seq(), text, payload));
  return {};
}

ServiceDefinition make_service(std::shared_ptr<Probe> probe) {
  ServiceDefinition svc(kService);
  // Echo: sleeps req.sleep_ms (suspending only its fiber), then echoes.
  svc.add_unary<Ping>("Echo", [probe](const Ping& req, flatbuffers::FlatBufferBuilder& out,
                                      ServerCall&) -> Status {
    if (req.text() != nullptr) {
      std::lock_guard<std::mutex> lock(probe->mu);
      probe->echo_texts.insert(req.text()->str());
    }
    if (req.sleep_ms() != 0) slotrpc::this_fiber::sleep_for(std::chrono::milliseconds(req.sleep_ms()));
    return write_pong(req, out);
  });
  // Slow: up to req.sleep_ms in 5 ms steps, watching ServerCall::cancelled().
  svc.add_unary<Ping>("Slow", [probe](const Ping& req, flatbuffers::FlatBufferBuilder& out,
                                      ServerCall& call) -> Status {
    ++probe->slow_started;
    const auto until = Clock::now() + std::chrono::milliseconds(req.sleep_ms());
    while (Clock::now() < until) {
      if (call.cancelled()) {
        ++probe->slow_saw_cancel;
        return Status(StatusCode::kCancelled, "Slow handler saw the cancellation");
      }
      slotrpc::this_fiber::sleep_for(5ms);
    }
    ++probe->slow_finished_uncancelled;
    return write_pong(req, out);
  });
  svc.add_unary<Ping>("Throw", [](const Ping& req, flatbuffers::FlatBufferBuilder&,
                                  ServerCall&) -> Status {
    throw std::runtime_error("boom-" + std::to_string(req.seq()));
  });
  // Fail: returns the status code given in seq, with the text as message.
  svc.add_unary<Ping>("Fail", [](const Ping& req, flatbuffers::FlatBufferBuilder&,
                                 ServerCall&) -> Status {
    return Status(static_cast<StatusCode>(req.seq()),
                  "handler says: " + (req.text() != nullptr ? req.text()->str() : std::string()));
  });
  // NoFinish: builds part of a reply, then returns OK without Finish().
  svc.add_unary<Ping>("NoFinish", [](const Ping&, flatbuffers::FlatBufferBuilder& out,
                                     ServerCall&) -> Status {
    out.CreateString("never finished");
    return {};
  });
  return svc;
}

struct TestServer {
  std::shared_ptr<Probe> probe = std::make_shared<Probe>();
  std::unique_ptr<Server> server;
  std::string address;

  explicit TestServer(Config config = {}) {
    server = std::make_unique<Server>(config);
    REQUIRE(server->add_service(make_service(probe)).ok());
    const Status st = server->start("127.0.0.1:0");
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    REQUIRE(server->port() != 0);
    address = "127.0.0.1:" + std::to_string(server->port());
  }
};

// The suite runs over tcp and, registered again with SLOTRPC_TRANSPORT=shm
// (tests/meson.build), over shared memory: every channel must really use
// the transport of the run, so that the shm run cannot pass over tcp.
slotrpc::TransportKind transport_of_run() {
  const char* t = std::getenv("SLOTRPC_TRANSPORT");
  return t != nullptr && std::string(t) == "shm" ? slotrpc::TransportKind::kShm : slotrpc::TransportKind::kTcp;
}

std::unique_ptr<Channel> connect(const std::string& address, Config config = {}) {
  auto ch = Channel::connect(address, config);
  REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
  REQUIRE((*ch)->transport() == transport_of_run());
  return std::move(ch).value();
}

// Waits (bounded) for a future; fails the test instead of hanging.
template <class T>
T get_within(Future<T>& f, std::chrono::milliseconds limit = std::chrono::duration_cast<std::chrono::milliseconds>(kWait)) {
  REQUIRE(f.valid());
  REQUIRE_MESSAGE(f.wait_for(limit), "call did not complete within " << limit.count() << " ms");
  return f.get();
}

// Bounded polling (10 s unless told): process_util.h.
using test_process::wait_until;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// A one-shot flag with a bounded wait, for callback-form calls.
struct Latch {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  void set() {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
    cv.notify_all();
  }
  bool wait_for(std::chrono::milliseconds limit) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, limit, [&] { return done; });
  }
};

}  // namespace

TEST_CASE("future form: a Ping is answered by its own Pong") {
  TestServer ts;
  auto ch = connect(ts.address);
  CHECK(ch->transport() == transport_of_run());
  CHECK(ch->slot_count() == 64);

  for (uint64_t seq = 1; seq <= 5; ++seq) {
    const std::string text = "hello " + std::to_string(seq);
    const size_t n = seq * 100;
    auto f = ch->call_typed<Pong>(kEcho, ping(seq, text, n));
    auto reply = get_within(f);
    CHECK_MESSAGE(pong_error(reply, seq, text, n) == "", pong_error(reply, seq, text, n));
    CHECK_FALSE(f.valid());
  }

  // The untyped form hands back the raw FlatBuffer.
  auto f = slotrpc::raw::call(*ch, kEcho, ping(42, "raw", 3));
  RawReply raw = get_within(f);
  REQUIRE_MESSAGE(raw.ok(), raw.status().to_string());
  REQUIRE(raw.size() > 0);
  flatbuffers::Verifier v(raw.data(), raw.size());
  REQUIRE(v.VerifyBuffer<Pong>(nullptr));
  const Pong* pong = flatbuffers::GetRoot<Pong>(raw.data());
  CHECK(pong->seq() == 42);
  CHECK(pong->text()->str() == "raw");
  raw.release();
  CHECK(raw.size() == 0);

  const auto stats = ch->stats();
  CHECK(stats.in_flight == 0);
  CHECK(stats.queued == 0);
  CHECK(stats.free_slots == 64);
  CHECK_FALSE(stats.closed);
}

TEST_CASE("logging: the library logs through its own 'slotrpc' logger and leaves the application's alone") {
  // The application's default logger at debug, with a sink of its own.
  auto app = spdlog::default_logger();
  const auto app_level = app->level();
  std::ostringstream app_lines;
  auto app_sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(app_lines);
  app->sinks().push_back(app_sink);
  app->set_level(spdlog::level::debug);
  // The library at info (the test environment says warn), for the server's
  // "listening" line.
  ::setenv("SLOTRPC_LOG_LEVEL", "info", 1);

  {
    TestServer ts;
    auto ch = connect(ts.address);
    auto f = ch->call_typed<Pong>(kEcho, ping(1, "x", 1));
    CHECK(get_within(f).ok());
  }

  ::setenv("SLOTRPC_LOG_LEVEL", "warn", 1);
  const auto app_level_after = app->level();
  app->sinks().pop_back();
  app->set_level(app_level);

  CHECK(app_level_after == spdlog::level::debug);  // before: reset to the library's level
  auto lib = spdlog::get("slotrpc");
  REQUIRE(lib != nullptr);
  CHECK(lib->level() == spdlog::level::info);
  CHECK(lib != app);
  // The library's lines went to its own logger, not the application's.
  CHECK(app_lines.str().find("slotrpc: server listening") == std::string::npos);
}

TEST_CASE("callback form: the sink runs once on the channel's loop with the reply") {
  TestServer ts;
  auto ch = connect(ts.address);

  struct Seen {
    std::atomic<int> runs{0};
    std::string error = "sink never ran";
    std::thread::id thread;
    Latch latch;
  };
  auto seen = std::make_shared<Seen>();
  slotrpc::CallHandle handle =
      slotrpc::raw::call(*ch, kEcho, ping(7, "callback", 512), {}, [seen](RawReply&& raw) {
        seen->thread = std::this_thread::get_id();
        seen->error = pong_error(Reply<Pong>(std::move(raw)), 7, "callback", 512);
        ++seen->runs;
        seen->latch.set();
      });
  REQUIRE(seen->latch.wait_for(10s));
  CHECK_MESSAGE(seen->error == "", seen->error);
  CHECK(seen->thread != std::this_thread::get_id());
  // Cancelling after completion is harmless and the sink does not run again.
  handle.cancel();
  std::this_thread::sleep_for(20ms);
  CHECK(seen->runs.load() == 1);
  // A non-OK status reaches a callback-form call the same way.
  auto failed = std::make_shared<Seen>();
  slotrpc::raw::call(*ch, kFail, ping(static_cast<uint64_t>(StatusCode::kUnavailable), "cb-fail"), {},
           [failed](RawReply&& raw) {
             failed->error = raw.ok() ? "unexpected OK" : raw.status().to_string();
             if (raw.size() != 0) failed->error += " (with a payload)";
             ++failed->runs;
             failed->latch.set();
           });
  REQUIRE(failed->latch.wait_for(10s));
  CHECK(failed->error == "UNAVAILABLE: handler says: cb-fail");
  CHECK(failed->runs.load() == 1);
}

TEST_CASE("1000 outstanding calls on one channel: most queue for a credit, all correct") {
  TestServer ts;
  auto ch = connect(ts.address);
  REQUIRE(ch->slot_count() == 64);
  constexpr int kCalls = 1000;

  std::vector<Future<Reply<Pong>>> futures;
  futures.reserve(kCalls);
  for (int i = 0; i < kCalls; ++i) {
    futures.push_back(ch->call_typed<Pong>(kEcho, ping(1000 + i, "n" + std::to_string(i), i % 200)));
  }
  // Replies stay held in their futures until taken, so exactly 64 calls got
  // a credit and the other 936 wait in the queue (stats() is posted after
  // every submit, in order).
  const auto during = ch->stats();
  CHECK(during.queued == kCalls - 64);
  CHECK(during.free_slots == 0);
  CHECK(during.in_flight + during.held_replies == 64);

  int bad = 0;
  for (int i = 0; i < kCalls; ++i) {
    REQUIRE_MESSAGE(futures[i].wait_for(kWait), "call " << i << " did not complete");
    auto reply = futures[i].get();
    const std::string err = pong_error(reply, 1000 + i, "n" + std::to_string(i), i % 200);
    if (!err.empty() && bad++ < 5) FAIL_CHECK("call " << i << ": " << err);
    // Dropping `reply` here returns its credit, which sends the next queued call.
  }
  CHECK(bad == 0);
  const auto after = ch->stats();
  CHECK(after.queued == 0);
  CHECK(after.in_flight == 0);
  CHECK(after.held_replies == 0);
  CHECK(after.free_slots == 64);
  CHECK(after.messages_sent >= kCalls);
}

TEST_CASE("deadline: a call to a handler that sleeps 300 ms fails at its 50 ms deadline") {
  TestServer ts;
  auto ch = connect(ts.address);
  // Warm up the connection so the measurement is about the deadline only.
  {
    auto f = ch->call_typed<Pong>(kEcho, ping(1, "warm"));
    REQUIRE(get_within(f).ok());
  }
  const auto t0 = Clock::now();
  auto f = ch->call_typed<Pong>(kEcho, ping(2, "sleepy", 0, 300), CallOptions::with_timeout(50ms));
  auto reply = get_within(f);
  const double elapsed = ms_since(t0);
  CHECK_MESSAGE(reply.status().code() == StatusCode::kDeadlineExceeded, reply.status().to_string());
  CHECK(reply.message() == nullptr);
  CHECK(elapsed >= 45);   // not before the deadline
  CHECK(elapsed < 250);   // well before the handler's 300 ms
  CHECK(ts.probe->saw_text("sleepy"));  // it was sent, then abandoned

  // A deadline already passed fails without sending.
  const auto sent_before = ch->stats().messages_sent;
  CallOptions past;
  past.deadline = Clock::now() - 1ms;
  auto g = ch->call_typed<Pong>(kEcho, ping(3, "too-late"), past);
  CHECK(get_within(g).status().code() == StatusCode::kDeadlineExceeded);

  // The late reply arrives after ~300 ms and is dropped; the slot comes back.
  REQUIRE(wait_until([&] { return ch->stats().zombies == 0; }));
  const auto st = ch->stats();
  CHECK(st.late_replies_dropped == 1);
  CHECK(st.free_slots == 64);
  CHECK(st.messages_sent - sent_before <= 1);  // at most a keepalive, never the request
  CHECK_FALSE(ts.probe->saw_text("too-late"));
}

TEST_CASE("deadline: a reply the loop gets to only after the deadline passed ends DEADLINE_EXCEEDED") {
  // The channel's loop is held (an application callback that blocks it, as
  // a descheduled thread would) from before call B's deadline until after
  // B's reply has arrived.  The turn that follows polls before it runs
  // timers, so it finds the reply first: B must still end with
  // DEADLINE_EXCEEDED, not OK 250 ms after its deadline.
  TestServer ts;
  auto ch = connect(ts.address);
  {
    auto f = ch->call_typed<Pong>(kEcho, ping(1, "warm"));
    REQUIRE(get_within(f).ok());
  }
  Latch blocker_done;
  // C: its 10 ms deadline runs this callback on the loop, which holds the
  // loop for 300 ms.
  slotrpc::raw::call(*ch, kEcho, ping(2, "blocker", 0, 1000), CallOptions::with_timeout(10ms), [&](RawReply&& r) {
    CHECK(r.status().code() == StatusCode::kDeadlineExceeded);
    std::this_thread::sleep_for(300ms);
    blocker_done.set();
  });
  // B: answered (OK) by the server after 80 ms, while the loop is held;
  // its deadline is 40 ms.
  auto f = ch->call_typed<Pong>(kEcho, ping(3, "late", 0, 80), CallOptions::with_timeout(40ms));
  auto reply = get_within(f);
  CHECK_MESSAGE(reply.status().code() == StatusCode::kDeadlineExceeded, reply.status().to_string());
  REQUIRE(blocker_done.wait_for(kWait));
  // Both replies are dropped as late ones; every slot comes back.
  REQUIRE(wait_until([&] { return ch->stats().zombies == 0; }));
  CHECK(ch->stats().late_replies_dropped == 2);
  CHECK(ch->stats().free_slots == 64);
}

TEST_CASE("late replies: with one slot, a reply that arrives after its deadline never reaches the next call") {
  Config one;
  one.slot_count = 1;
  TestServer ts(one);
  auto ch = connect(ts.address, one);
  REQUIRE(ch->slot_count() == 1);

  auto fa = ch->call_typed<Pong>(kEcho, ping(111, "call-A", 64, 200), CallOptions::with_timeout(30ms));
  auto a = get_within(fa);
  CHECK_MESSAGE(a.status().code() == StatusCode::kDeadlineExceeded, a.status().to_string());

  // B is issued at once; its only slot is still A's (a zombie) until A's
  // late reply arrives and is dropped.
  const auto tb = Clock::now();
  auto fb = ch->call_typed<Pong>(kEcho, ping(222, "call-B", 100));
  auto b = get_within(fb);
  const double b_ms = ms_since(tb);
  CHECK_MESSAGE(pong_error(b, 222, "call-B", 100) == "", pong_error(b, 222, "call-B", 100));
  // B could not go out before A's handler (200 ms from its start) replied.
  CHECK(b_ms >= 100);

  const auto st = ch->stats();
  CHECK(st.late_replies_dropped == 1);
  CHECK(st.zombies == 0);
  b.release();
  REQUIRE(wait_until([&] { return ch->stats().free_slots == 1; }));

  // And the slot keeps working.
  auto fc = ch->call_typed<Pong>(kEcho, ping(333, "call-C", 5));
  auto c = get_within(fc);
  CHECK(pong_error(c, 333, "call-C", 5) == "");
  CHECK(ch->stats().late_replies_dropped == 1);
}

TEST_CASE("cancellation: Future::cancel fails a slow call promptly and the handler sees cancelled()") {
  TestServer ts;
  auto ch = connect(ts.address);

  auto f = ch->call_typed<Pong>(kSlow, ping(9, "slow", 0, 5000));
  REQUIRE(wait_until([&] { return ts.probe->slow_started.load() == 1; }));
  const auto t0 = Clock::now();
  f.cancel();
  auto reply = get_within(f, 2000ms);
  CHECK(ms_since(t0) < 1000);
  CHECK_MESSAGE(reply.status().code() == StatusCode::kCancelled, reply.status().to_string());

  // The cancel reaches the server: the handler's cancelled() turns true.
  REQUIRE(wait_until([&] { return ts.probe->slow_saw_cancel.load() == 1; }, 3000ms));
  CHECK(ts.probe->slow_finished_uncancelled.load() == 0);
  // Its (error) reply arrives for an abandoned call and is dropped.
  REQUIRE(wait_until([&] { return ch->stats().zombies == 0; }));
  CHECK(ch->stats().late_replies_dropped == 1);

  // The same through a CallHandle (callback form).
  Latch latch;
  Status got;
  slotrpc::CallHandle h = slotrpc::raw::call(*ch, kSlow, ping(10, "slow-cb", 0, 5000), {}, [&](RawReply&& raw) {
    got = raw.status();
    latch.set();
  });
  REQUIRE(wait_until([&] { return ts.probe->slow_started.load() == 2; }));
  h.cancel();
  REQUIRE(latch.wait_for(2000ms));
  CHECK(got.code() == StatusCode::kCancelled);
  REQUIRE(wait_until([&] { return ts.probe->slow_saw_cancel.load() == 2; }, 3000ms));

  // The channel is fine afterwards.
  auto g = ch->call_typed<Pong>(kEcho, ping(11, "after-cancel", 10));
  CHECK(pong_error(get_within(g), 11, "after-cancel", 10) == "");
}

TEST_CASE("cancellation of a queued call: it fails with CANCELLED and is never sent") {
  TestServer ts;
  Config one;
  one.slot_count = 1;
  auto ch = connect(ts.address, one);

  auto first = ch->call_typed<Pong>(kEcho, ping(1, "first", 8, 300));
  REQUIRE(wait_until([&] { return ts.probe->saw_text("first"); }));
  auto victim = ch->call_typed<Pong>(kEcho, ping(2, "queued-victim", 8));
  CHECK(ch->stats().queued == 1);

  const auto t0 = Clock::now();
  victim.cancel();
  auto v = get_within(victim, 2000ms);
  CHECK(ms_since(t0) < 1000);
  CHECK_MESSAGE(v.status().code() == StatusCode::kCancelled, v.status().to_string());
  CHECK(ch->stats().queued == 0);

  auto f = get_within(first);
  CHECK(pong_error(f, 1, "first", 8) == "");
  f.release();
  auto after = ch->call_typed<Pong>(kEcho, ping(3, "after", 8));
  CHECK(pong_error(get_within(after), 3, "after", 8) == "");

  CHECK_FALSE(ts.probe->saw_text("queued-victim"));
  CHECK(ch->stats().late_replies_dropped == 0);
}

TEST_CASE("concurrent callers: 4 threads x 2000 calls on one channel, every reply correct") {
  TestServer ts;
  auto ch = connect(ts.address);
  constexpr int kThreads = 4;
  constexpr int kPerThread = 2000;
  std::atomic<int> ok{0};
  std::atomic<int> wrong{0};
  std::atomic<int> stuck{0};
  std::mutex first_error_mu;
  std::string first_error;

  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const uint64_t seq = uint64_t(t) * 1'000'000 + uint64_t(i);
        const std::string text = "t" + std::to_string(t) + "-" + std::to_string(i);
        const size_t n = size_t(i % 97);
        auto f = ch->call_typed<Pong>(kEcho, ping(seq, text, n));
        if (!f.wait_for(kWait)) {
          ++stuck;
          return;
        }
        const std::string err = pong_error(f.get(), seq, text, n);
        if (err.empty()) {
          ++ok;
        } else if (wrong++ == 0) {
          std::lock_guard<std::mutex> lock(first_error_mu);
          first_error = text + ": " + err;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(stuck.load() == 0);
  CHECK_MESSAGE(wrong.load() == 0, first_error);
  CHECK(ok.load() == kThreads * kPerThread);
  const auto st = ch->stats();
  CHECK(st.free_slots == 64);
  CHECK(st.queued == 0);
}

TEST_CASE("chaining: a reply callback issues the next call") {
  TestServer ts;
  auto ch = connect(ts.address);
  constexpr uint64_t kLinks = 25;

  struct Chain {
    Channel* ch = nullptr;
    std::atomic<uint64_t> completed{0};
    std::mutex mu;
    std::string error;
    std::vector<uint64_t> order;
    Latch latch;

    void issue(uint64_t n) {
      // Alternate payload sizes; the callback form and the future form both
      // work from the loop (the future form is only never waited on here).
      slotrpc::raw::call(*ch, kEcho, ping(n, "link-" + std::to_string(n), n * 10), {}, [this, n](RawReply&& raw) {
        const std::string err = pong_error(Reply<Pong>(std::move(raw)), n, "link-" + std::to_string(n), n * 10);
        {
          std::lock_guard<std::mutex> lock(mu);
          order.push_back(n);
          if (!err.empty() && error.empty()) error = "link " + std::to_string(n) + ": " + err;
        }
        ++completed;
        if (n < kLinks && err.empty()) {
          issue(n + 1);
        } else {
          latch.set();
        }
      });
    }
  };
  Chain chain;
  chain.ch = ch.get();
  chain.issue(1);
  REQUIRE(chain.latch.wait_for(10s));
  std::lock_guard<std::mutex> lock(chain.mu);
  CHECK_MESSAGE(chain.error.empty(), chain.error);
  CHECK(chain.completed.load() == kLinks);
  REQUIRE(chain.order.size() == kLinks);
  for (uint64_t i = 0; i < kLinks; ++i) CHECK(chain.order[i] == i + 1);
}

TEST_CASE("calls from a reply callback that fail at once still report their own error") {
  // On the loop thread Channel::call submits inline, so these calls fail
  // (and their sinks run) before call() has even returned.
  TestServer ts;
  auto ch = connect(ts.address);
  struct Outcome {
    std::mutex mu;
    std::vector<std::string> results;
    Latch latch;
  };
  auto out = std::make_shared<Outcome>();
  Channel* c = ch.get();
  slotrpc::raw::call(*ch, kEcho, ping(1, "outer", 8), {}, [c, out](RawReply&& raw) {
    const std::string outer = pong_error(Reply<Pong>(std::move(raw)), 1, "outer", 8);
    auto record = [out](std::string s) {
      std::lock_guard<std::mutex> lock(out->mu);
      out->results.push_back(std::move(s));
    };
    record(outer.empty() ? "outer ok" : "outer: " + outer);
    CallOptions past;
    past.deadline = Clock::now() - 1ms;
    slotrpc::raw::call(*c, kEcho, ping(2, "expired"), past, [record](RawReply&& r) {
      record(std::string(slotrpc::status_code_name(r.status().code())));
    });
    slotrpc::raw::call(*c, kEcho, [](flatbuffers::FlatBufferBuilder& fbb) { fbb.CreateString("unfinished"); }, {},
            [record](RawReply&& r) { record(std::string(slotrpc::status_code_name(r.status().code()))); });
    slotrpc::raw::call(*c, kEcho, ping(3, "inner", 4), {}, [record, out](RawReply&& r) {
      const std::string inner = pong_error(Reply<Pong>(std::move(r)), 3, "inner", 4);
      record(inner.empty() ? "inner ok" : "inner: " + inner);
      out->latch.set();
    });
  });
  REQUIRE(out->latch.wait_for(10s));
  std::lock_guard<std::mutex> lock(out->mu);
  const std::vector<std::string> expected = {"outer ok", "DEADLINE_EXCEEDED", "INVALID_ARGUMENT", "inner ok"};
  CHECK(out->results == expected);
  CHECK_FALSE(ts.probe->saw_text("expired"));
}

TEST_CASE("a handler that throws produces INTERNAL with the exception text") {
  TestServer ts;
  auto ch = connect(ts.address);
  auto f = ch->call_typed<Pong>(kThrow, ping(5, "x"));
  auto reply = get_within(f);
  CHECK(reply.status().code() == StatusCode::kInternal);
  CHECK_MESSAGE(reply.status().message().find("boom-5") != std::string::npos, reply.status().to_string());
  CHECK(reply.status().message().find("slotrpc.test.Basic.Throw") != std::string::npos);
  CHECK(reply.message() == nullptr);
  // The session is unharmed.
  auto g = ch->call_typed<Pong>(kEcho, ping(6, "after-throw", 4));
  CHECK(pong_error(get_within(g), 6, "after-throw", 4) == "");
}

TEST_CASE("a handler's non-OK status reaches the caller with its code and message: all 16 of gRPC's") {
  TestServer ts;
  auto ch = connect(ts.address);
  for (uint16_t raw = 1; raw <= 16; ++raw) {
    const auto code = static_cast<StatusCode>(raw);
    CHECK((slotrpc::status_code_name(code) != "UNKNOWN" || code == StatusCode::kUnknown));
    CAPTURE(slotrpc::status_code_name(code));
    const std::string text = "reason for " + std::string(slotrpc::status_code_name(code));
    auto f = ch->call_typed<Pong>(kFail, ping(static_cast<uint64_t>(code), text));
    auto reply = get_within(f);
    CHECK(reply.status().code() == code);
    CHECK(reply.status().message() == "handler says: " + text);
  }
  CHECK(ch->stats().free_slots == 64);
}

TEST_CASE("a handler that returns OK without Finish() produces INTERNAL") {
  TestServer ts;
  auto ch = connect(ts.address);
  auto f = ch->call_typed<Pong>(kNoFinish, ping(1, "nf"));
  auto reply = get_within(f);
  CHECK(reply.status().code() == StatusCode::kInternal);
  CHECK_MESSAGE(reply.status().message().find("without finishing") != std::string::npos,
                reply.status().to_string());
  auto g = ch->call_typed<Pong>(kEcho, ping(2, "after-nf", 4));
  CHECK(pong_error(get_within(g), 2, "after-nf", 4) == "");
}

TEST_CASE("the server logs a handler's mistakes with the method's name, once per method and then rarely") {
  slotrpc::test::LogCapture logs;
  slotrpc::Server server;
  // Names of their own: the log's limit is per method name, process-wide.
  slotrpc::ServiceDefinition svc("test.Mistakes");
  svc.add_method("Throws", [](slotrpc::ServerCall&) -> slotrpc::Status { throw std::runtime_error("boom"); });
  svc.add_method("NoFinish", [](slotrpc::ServerCall&) { return slotrpc::Status(); });
  svc.add_method("OddCode", [](slotrpc::ServerCall&) {
    return slotrpc::Status(static_cast<slotrpc::StatusCode>(99), "odd");
  });
  svc.add_method("Fails", [](slotrpc::ServerCall&) {
    return slotrpc::Status(StatusCode::kNotFound, "an ordinary error is no mistake");
  });
  REQUIRE(server.add_service(std::move(svc)).ok());
  REQUIRE(server.start("127.0.0.1:0").ok());
  auto ch = slotrpc::Channel::connect("127.0.0.1:" + std::to_string(server.port()));
  REQUIRE(ch.ok());
  auto empty = [](flatbuffers::FlatBufferBuilder& fbb) { fbb.Finish(slotrpc::test::CreatePing(fbb, 1)); };
  for (const char* m : {"Throws", "NoFinish", "OddCode", "Fails"}) {
    for (int i = 0; i < 3; ++i) {
      auto r = slotrpc::raw::call(**ch, slotrpc::method_id(std::string("test.Mistakes.") + m), empty).get();
      CHECK_FALSE(r.ok());
    }
  }
  CHECK(logs.matching({"handler mistake in test.Mistakes.Throws", "INTERNAL", "threw: boom"}).size() == 1);
  CHECK(logs.matching({"handler mistake in test.Mistakes.NoFinish", "without finishing"}).size() == 1);
  CHECK(logs.matching({"handler mistake in test.Mistakes.OddCode", "unknown status code 99"}).size() == 1);
  CHECK(logs.matching({"test.Mistakes.Fails"}).empty());
}

TEST_CASE("a handler returning an unknown status code becomes INTERNAL, and the session lives on") {
  slotrpc::Server server;
  slotrpc::ServiceDefinition svc("test.Odd");
  svc.add_method("Weird", [](slotrpc::ServerCall&) {
    return slotrpc::Status(static_cast<slotrpc::StatusCode>(77), "odd code");
  });
  svc.add_method("Fine", [](slotrpc::ServerCall& call) {
    call.reply().Finish(slotrpc::test::CreatePong(call.reply(), 7));
    return slotrpc::Status();
  });
  svc.add_method("Throws42", [](slotrpc::ServerCall&) -> slotrpc::Status { throw 42; });
  REQUIRE(server.add_service(std::move(svc)).ok());
  REQUIRE(server.start("127.0.0.1:0").ok());
  auto ch = slotrpc::Channel::connect("127.0.0.1:" + std::to_string(server.port()));
  REQUIRE(ch.ok());
  auto empty = [](flatbuffers::FlatBufferBuilder& fbb) { fbb.Finish(slotrpc::test::CreatePing(fbb, 1)); };
  auto weird = slotrpc::raw::call(**ch, slotrpc::method_id("test.Odd.Weird"), empty).get();
  CHECK(weird.status().code() == slotrpc::StatusCode::kInternal);
  CHECK(weird.status().message().find("unknown status code 77") != std::string::npos);
  auto thrown = slotrpc::raw::call(**ch, slotrpc::method_id("test.Odd.Throws42"), empty).get();
  CHECK(thrown.status().code() == slotrpc::StatusCode::kInternal);
  CHECK(thrown.status().message().find("non-standard exception") != std::string::npos);
  auto fine = slotrpc::raw::call(**ch, slotrpc::method_id("test.Odd.Fine"), empty).get();
  CHECK(fine.ok());
  CHECK_FALSE((*ch)->stats().closed);
}
