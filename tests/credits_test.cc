// Credits: a Channel has one credit per slot; a call takes one, and it comes
// back only when the reply has arrived and the application has dropped it.
// A real Server and Channel over loopback TCP with 4 slots.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "slotrpc/slotrpc.h"
#include "test_messages_generated.h"

using namespace std::chrono_literals;
using slotrpc::Channel;
using slotrpc::Config;
using slotrpc::Future;
using slotrpc::RawReply;
using slotrpc::Reply;
using slotrpc::StatusCode;
using slotrpc::test::Ping;
using slotrpc::test::Pong;

namespace {

constexpr uint32_t kEcho = slotrpc::method_id("test.Svc.Echo");
constexpr uint32_t kSlots = 4;
// Upper bound for anything that should happen promptly; never a hang.
constexpr auto kWait = 10s;

// The SLOTRPC_* variables that would change these tests are cleared while a
// test runs and restored afterwards (SLOTRPC_LOG_LEVEL is left alone).
class ClearTuningEnv {
 public:
  ClearTuningEnv() {
    for (const char* n : kNames) {
      const char* v = std::getenv(n);
      saved_.emplace_back(v != nullptr ? std::optional<std::string>(v) : std::nullopt);
      ::unsetenv(n);
    }
  }
  ~ClearTuningEnv() {
    for (size_t i = 0; i < std::size(kNames); ++i) {
      if (saved_[i]) ::setenv(kNames[i], saved_[i]->c_str(), 1);
    }
  }

 private:
  static constexpr const char* kNames[] = {
      "SLOTRPC_SLOT_COUNT",     "SLOTRPC_SLOT_SIZE",       "SLOTRPC_MAX_QUEUED_CALLS",
      "SLOTRPC_REACTOR_THREADS", "SLOTRPC_KEEPALIVE_MS",   "SLOTRPC_PEER_TIMEOUT_MS",
      "SLOTRPC_TRANSPORT",      "SLOTRPC_POLL_MODE",       "SLOTRPC_CONNECT_TIMEOUT_MS"};
  std::vector<std::optional<std::string>> saved_;
};

struct Harness {
  ClearTuningEnv env;
  std::atomic<int> handled{0};
  slotrpc::Server server;
  std::unique_ptr<Channel> channel;

  explicit Harness(uint32_t max_queued_calls = 65536) : server(server_config()) {
    slotrpc::ServiceDefinition svc("test.Svc");
    svc.add_unary<Ping>("Echo", [this](const Ping& req, flatbuffers::FlatBufferBuilder& out,
                                       slotrpc::ServerCall&) -> slotrpc::Status {
      handled.fetch_add(1);
      if (req.sleep_ms() != 0) slotrpc::this_fiber::sleep_for(std::chrono::milliseconds(req.sleep_ms()));
      out.Finish(slotrpc::test::CreatePong(out, req.seq()));
      return {};
    });
    REQUIRE(svc.methods().size() == 1);
    REQUIRE(svc.methods()[0].id == kEcho);
    slotrpc::Status st = server.add_service(std::move(svc));
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    st = server.start("127.0.0.1:0");
    REQUIRE_MESSAGE(st.ok(), st.to_string());

    Config cc;
    cc.slot_count = kSlots;
    cc.max_queued_calls = max_queued_calls;
    auto ch = Channel::connect("127.0.0.1:" + std::to_string(server.port()), cc);
    REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
    channel = std::move(ch.value());
    REQUIRE(channel->slot_count() == kSlots);
  }
  ~Harness() {
    channel.reset();
    server.stop();
  }

  static Config server_config() {
    Config c;
    c.slot_count = kSlots;
    return c;
  }

  Future<RawReply> echo(uint64_t seq, uint32_t sleep_ms = 0) {
    return slotrpc::raw::call(*channel, kEcho, [seq, sleep_ms](flatbuffers::FlatBufferBuilder& fbb) {
      fbb.Finish(slotrpc::test::CreatePing(fbb, seq, 0, 0, sleep_ms));
    });
  }

  // Polls stats() until `pred` holds or kWait passes; returns the last stats.
  template <class Pred>
  Channel::Stats wait_stats(Pred pred) {
    const auto give_up = std::chrono::steady_clock::now() + kWait;
    Channel::Stats s = channel->stats();
    while (!pred(s) && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(1ms);
      s = channel->stats();
    }
    return s;
  }
};

// get() with a bound: fails the test instead of hanging.
RawReply get_within(Future<RawReply>& f, std::chrono::milliseconds limit = kWait) {
  REQUIRE(f.valid());
  REQUIRE_MESSAGE(f.wait_for(limit), "call did not complete in time");
  return f.get();
}

Reply<Pong> get_pong(Future<RawReply>& f, uint64_t expect_seq) {
  Reply<Pong> r(get_within(f));
  REQUIRE_MESSAGE(r.ok(), r.status().to_string());
  REQUIRE(r.message() != nullptr);
  CHECK(r->seq() == expect_seq);
  return r;
}

// Verifies a raw reply as Pong and returns its seq.
uint64_t seq_of(const RawReply& r) {
  REQUIRE(r.ok());
  flatbuffers::Verifier v(r.data(), r.size());
  REQUIRE(v.VerifyBuffer<Pong>(nullptr));
  return flatbuffers::GetRoot<Pong>(r.data())->seq();
}

bool all_free(const Channel::Stats& s) {
  return s.free_slots == kSlots && s.in_flight == 0 && s.queued == 0 && s.held_replies == 0 &&
         s.zombies == 0;
}

}  // namespace

TEST_CASE("credits: a fresh channel has one free credit per slot") {
  Harness h;
  const auto s = h.channel->stats();
  CHECK(s.free_slots == kSlots);
  CHECK(s.in_flight == 0);
  CHECK(s.held_replies == 0);
  CHECK(s.queued == 0);
  CHECK(s.zombies == 0);
  CHECK_FALSE(s.closed);
}

TEST_CASE("credits: held replies consume credits; a release lets a queued call go") {
  Harness h;
  std::vector<Future<RawReply>> futures;
  for (uint64_t i = 0; i < kSlots; ++i) futures.push_back(h.echo(100 + i));
  std::vector<RawReply> held;
  for (uint64_t i = 0; i < kSlots; ++i) {
    held.push_back(get_within(futures[i]));
    REQUIRE_MESSAGE(held.back().ok(), held.back().status().to_string());
    CHECK(seq_of(held.back()) == 100 + i);
  }

  auto s = h.channel->stats();
  CHECK(s.free_slots == 0);
  CHECK(s.held_replies == kSlots);
  CHECK(s.in_flight == 0);
  CHECK(s.queued == 0);
  CHECK(h.handled.load() == static_cast<int>(kSlots));

  // A fifth call has no credit: it waits in the channel's queue, unsent.
  Future<RawReply> fifth = h.echo(999);
  s = h.channel->stats();
  CHECK(s.queued == 1);
  CHECK(s.free_slots == 0);
  CHECK(s.held_replies == kSlots);
  CHECK_FALSE(fifth.wait_for(100ms));
  CHECK_FALSE(fifth.ready());
  CHECK(h.handled.load() == static_cast<int>(kSlots));  // the server never saw it
  CHECK(h.channel->stats().queued == 1);

  // The held replies are intact: nothing overwrote their slots.
  for (uint64_t i = 0; i < kSlots; ++i) CHECK(seq_of(held[i]) == 100 + i);

  SUBCASE("RawReply::release() frees the credit") {
    held[1].release();
    CHECK(held[1].payload().empty());
    CHECK(held[1].ok());  // the status stays
    held[1].release();    // twice is harmless
  }
  SUBCASE("destroying the RawReply frees the credit") {
    held.erase(held.begin() + 1);
  }
  SUBCASE("move-assigning over the RawReply frees the credit") {
    held[1] = RawReply();
  }
  SUBCASE("Reply<T>::release() frees the credit") {
    Reply<Pong> typed(std::move(held[1]));
    REQUIRE(typed.ok());
    CHECK(typed->seq() == 101);
    typed.release();
    CHECK(typed.message() == nullptr);
  }

  Reply<Pong> fifth_reply = get_pong(fifth, 999);
  CHECK(h.handled.load() == static_cast<int>(kSlots) + 1);
  s = h.wait_stats([](const Channel::Stats& st) { return st.queued == 0 && st.in_flight == 0; });
  CHECK(s.queued == 0);
  CHECK(s.in_flight == 0);
  CHECK(s.free_slots == 0);
  CHECK(s.held_replies == kSlots);  // three old ones plus the fifth

  // The replies still held were not disturbed by the fifth call.
  for (const RawReply& r : held) {
    if (!r.payload().empty()) {
      const uint64_t seq = seq_of(r);
      CHECK(seq >= 100);
      CHECK(seq < 100 + kSlots);
      CHECK(seq != 101);
    }
  }

  // Everything dropped: all credits come back.
  held.clear();
  fifth_reply.release();
  s = h.wait_stats(all_free);
  CHECK(s.free_slots == kSlots);
  CHECK(s.held_replies == 0);
  CHECK(s.in_flight == 0);
  CHECK(s.queued == 0);
  CHECK(s.zombies == 0);
}

TEST_CASE("credits: 200 calls through 4 slots all complete (future form)") {
  Harness h;
  constexpr uint64_t kCalls = 200;
  std::vector<Future<RawReply>> futures;
  futures.reserve(kCalls);
  // Submitted all at once: at most 4 are in flight, the rest queue.
  for (uint64_t i = 0; i < kCalls; ++i) futures.push_back(h.echo(i, i % 3 == 0 ? 1 : 0));
  // No reply has been taken out of its future yet, so no credit can have
  // come back: 4 calls hold the slots (in flight or answered) and 196 wait.
  const auto during = h.channel->stats();
  CHECK(during.free_slots == 0);
  CHECK(during.in_flight + during.held_replies == kSlots);
  CHECK(during.queued == kCalls - kSlots);

  for (uint64_t i = 0; i < kCalls; ++i) {
    CAPTURE(i);
    Reply<Pong> r = get_pong(futures[i], i);  // dropped at once: its credit returns
  }
  CHECK(h.handled.load() == static_cast<int>(kCalls));
  const auto s = h.wait_stats(all_free);
  CHECK(s.free_slots == kSlots);
  CHECK(s.in_flight == 0);
  CHECK(s.queued == 0);
  CHECK(s.held_replies == 0);
  CHECK(s.zombies == 0);
  CHECK_FALSE(s.closed);
}

TEST_CASE("credits: 200 calls through 4 slots all complete (callback form)") {
  Harness h;
  constexpr uint64_t kCalls = 200;
  std::atomic<uint64_t> done{0};
  std::atomic<uint64_t> wrong{0};
  std::vector<std::atomic<int>> seen(kCalls);
  for (uint64_t i = 0; i < kCalls; ++i) {
    slotrpc::raw::call(*h.channel,
        kEcho,
        [i](flatbuffers::FlatBufferBuilder& fbb) {
          fbb.Finish(slotrpc::test::CreatePing(fbb, i, 0, 0, i % 5 == 0 ? 1 : 0));
        },
        {},
        [&, i](RawReply&& raw) {
          // Dropping the reply here (on the loop) returns its credit at once.
          Reply<Pong> r(std::move(raw));
          if (!r.ok() || r->seq() != i) wrong.fetch_add(1);
          if (r.ok() && r->seq() < kCalls) seen[r->seq()].fetch_add(1);
          done.fetch_add(1);
        });
  }
  {
    // Sinks drop their replies at once, so nothing is held between turns;
    // every slot is either free or carries a call.
    const auto s = h.channel->stats();
    CHECK(s.held_replies == 0);
    CHECK(s.free_slots + s.in_flight == kSlots);
    CHECK(s.queued <= kCalls - kSlots);
  }
  const auto give_up = std::chrono::steady_clock::now() + kWait;
  while (done.load() < kCalls && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(1ms);
  }
  REQUIRE(done.load() == kCalls);
  CHECK(wrong.load() == 0);
  for (uint64_t i = 0; i < kCalls; ++i) {
    CAPTURE(i);
    CHECK(seen[i].load() == 1);
  }
  const auto s = h.wait_stats(all_free);
  CHECK(s.free_slots == kSlots);
  CHECK(s.in_flight == 0);
  CHECK(s.queued == 0);
  CHECK(s.held_replies == 0);
}

TEST_CASE("credits: queued calls run in submission order") {
  Harness h;
  // Hold all credits so that the next calls queue, then let them go one by
  // one: each release must complete the oldest queued call.
  std::vector<Future<RawReply>> first;
  for (uint64_t i = 0; i < kSlots; ++i) first.push_back(h.echo(i));
  std::vector<RawReply> held;
  for (auto& f : first) held.push_back(get_within(f));

  std::vector<Future<RawReply>> queued;
  for (uint64_t i = 0; i < 3; ++i) queued.push_back(h.echo(50 + i));
  CHECK(h.channel->stats().queued == 3);

  for (uint64_t i = 0; i < 3; ++i) {
    CAPTURE(i);
    held[i].release();
    RawReply r = get_within(queued[i]);
    REQUIRE(r.ok());
    CHECK(seq_of(r) == 50 + i);
    // The later ones are still waiting.
    for (uint64_t j = i + 1; j < 3; ++j) CHECK_FALSE(queued[j].ready());
    held[i] = std::move(r);  // keep the credit held again
  }
  held.clear();
  CHECK(all_free(h.wait_stats(all_free)));
}

TEST_CASE("credits: max_queued_calls bounds the queue") {
  Harness h(/*max_queued_calls=*/2);
  std::vector<Future<RawReply>> futures;
  for (uint64_t i = 0; i < kSlots; ++i) futures.push_back(h.echo(i));
  std::vector<RawReply> held;
  for (auto& f : futures) {
    held.push_back(get_within(f));
    REQUIRE(held.back().ok());
  }
  CHECK(h.channel->stats().free_slots == 0);

  Future<RawReply> q1 = h.echo(201);
  Future<RawReply> q2 = h.echo(202);
  CHECK(h.channel->stats().queued == 2);

  // The third one fails at once: it neither waits nor reaches the server.
  Future<RawReply> rejected = h.echo(203);
  RawReply r = get_within(rejected, 5s);
  CHECK_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kResourceExhausted);
  CHECK(r.status().message().find("max_queued_calls") != std::string::npos);
  CHECK(r.payload().empty());
  CHECK(h.channel->stats().queued == 2);
  CHECK(h.handled.load() == static_cast<int>(kSlots));
  CHECK_FALSE(q1.ready());
  CHECK_FALSE(q2.ready());

  // Freeing credits lets the two queued calls through.
  held.clear();
  Reply<Pong> r1 = get_pong(q1, 201);
  Reply<Pong> r2 = get_pong(q2, 202);
  CHECK(h.handled.load() == static_cast<int>(kSlots) + 2);
  r1.release();
  r2.release();
  CHECK(all_free(h.wait_stats(all_free)));

  // With room in the queue again, calls are accepted.
  Future<RawReply> later = h.echo(204);
  get_pong(later, 204);
}

TEST_CASE("credits: max_queued_calls = 0 fails any call that finds no credit") {
  Harness h(/*max_queued_calls=*/0);
  std::vector<Future<RawReply>> futures;
  for (uint64_t i = 0; i < kSlots; ++i) futures.push_back(h.echo(i));
  std::vector<RawReply> held;
  for (auto& f : futures) held.push_back(get_within(f));
  Future<RawReply> extra = h.echo(9);
  RawReply r = get_within(extra, 5s);
  CHECK(r.status().code() == StatusCode::kResourceExhausted);
  CHECK(r.status().message().find("max_queued_calls") != std::string::npos);
  CHECK(h.channel->stats().queued == 0);
  held.clear();
  CHECK(all_free(h.wait_stats(all_free)));
}

TEST_CASE("credits: a reply held past its channel stays readable") {
  Harness h;
  Future<RawReply> f = h.echo(77);
  RawReply r = get_within(f);
  REQUIRE(r.ok());
  h.channel.reset();      // the session closes while the reply is held
  CHECK(seq_of(r) == 77);  // the receive ring is still mapped
  r.release();             // harmless after the channel is gone
  CHECK(r.payload().empty());
}
