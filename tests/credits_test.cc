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
    return channel->call(kEcho, [seq, sleep_ms](flatbuffers::FlatBufferBuilder& fbb) {
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
  std::vector<Reply<Pong>> held;
  for (uint64_t i = 0; i < kSlots; ++i) held.push_back(get_pong(futures[i], 100 + i));

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
  for (uint64_t i = 0; i < kSlots; ++i) CHECK(held[i]->seq() == 100 + i);

  SUBCASE("release() frees the credit") {
    held[1].release();
    CHECK(held[1].message() == nullptr);
    CHECK(held[1].raw().payload().empty());
  }
  SUBCASE("destroying the reply frees the credit") {
    held.erase(held.begin() + 1);
  }
  SUBCASE("RawReply::release() frees the credit") {
    RawReply raw = get_within(futures.emplace_back(h.echo(0)), 1ms);  // placeholder, never used
    (void)raw;
  }

  Reply<Pong> fifth_reply = get_pong(fifth, 999);
  CHECK(h.handled.load() == static_cast<int>(kSlots) + 1);
  s = h.wait_stats([](const Channel::Stats& st) { return st.queued == 0 && st.in_flight == 0; });
  CHECK(s.queued == 0);
  CHECK(s.free_slots == 0);
  CHECK(s.held_replies == kSlots);  // three old ones plus the fifth

  // Everything dropped: all credits come back.
  held.clear();
  fifth_reply.release();
  s = h.wait_stats(all_free);
  CHECK(s.free_slots == kSlots);
  CHECK(s.held_replies == 0);
  CHECK(s.in_flight == 0);
  CHECK(s.queued == 0);
}
