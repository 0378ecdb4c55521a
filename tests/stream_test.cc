// Server streaming over the slot rings: order, flow control through lent
// credits, end status, cancellation, and coexistence with unary calls.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include <slotrpc/slotrpc.h>

#include "test_messages_generated.h"

namespace {

using slotrpc::test::Ping;
using slotrpc::test::Pong;
using namespace std::chrono_literals;

constexpr const char* kService = "test.Streams";
const uint32_t kCount = slotrpc::method_id("test.Streams.Count");
const uint32_t kEcho = slotrpc::method_id("test.Streams.Echo");

// Count: streams Pong{seq = 0..n-1} where n = request.seq; a request with
// text "fail" ends with INVALID_ARGUMENT after n messages.
struct Fixture {
  std::atomic<uint64_t> written{0};
  std::atomic<bool> saw_cancel{false};
  std::atomic<bool> writer_stopped{false};
  slotrpc::Server server;
  std::unique_ptr<slotrpc::Channel> channel;

  explicit Fixture(uint32_t slots = 16, uint32_t window = 4) : server(config(slots, window)) {
    slotrpc::ServiceDefinition svc(kService);
    svc.add_server_stream<Ping, Pong>(
        "Count", [this](const Ping& req, slotrpc::ServerWriter<Pong>& out, slotrpc::ServerCall& call) {
          for (uint64_t i = 0; i < req.seq(); ++i) {
            const bool ok = out.Write([i](flatbuffers::FlatBufferBuilder& fbb) {
              return slotrpc::test::CreatePong(fbb, i, fbb.CreateString("item " + std::to_string(i)));
            });
            if (!ok) {
              writer_stopped = true;
              saw_cancel = call.cancelled();
              return out.error();
            }
            ++written;
          }
          if (req.text() != nullptr && req.text()->str() == "fail")
            return slotrpc::Status(slotrpc::StatusCode::kInvalidArgument, "asked to fail");
          return slotrpc::Status();
        });
    svc.add_typed_unary<Ping, Pong>(
        "Echo", [](const Ping& req, slotrpc::ReplyBuilder<Pong>& out, slotrpc::ServerCall&) {
          out.Finish(slotrpc::test::CreatePong(out.fbb(), req.seq()));
          return slotrpc::Status();
        });
    REQUIRE(server.add_service(std::move(svc)).ok());
    REQUIRE(server.start("127.0.0.1:0").ok());
    auto ch = slotrpc::Channel::connect("127.0.0.1:" + std::to_string(server.port()), config(slots, window));
    REQUIRE(ch.ok());
    channel = std::move(ch.value());
  }

  static slotrpc::Config config(uint32_t slots, uint32_t window) {
    slotrpc::Config c;
    c.slot_count = slots;
    c.slot_size = 4096;
    c.stream_window = window;
    return c;
  }

  slotrpc::ClientReader<Pong> count(uint64_t n, std::string text = "", slotrpc::CallOptions o = {}) {
    return channel->server_stream<Ping, Pong>(
        kCount,
        [n, text](flatbuffers::FlatBufferBuilder& fbb) {
          return slotrpc::test::CreatePing(fbb, n, fbb.CreateString(text));
        },
        o);
  }
};

}  // namespace

TEST_CASE("stream: 10,000 messages arrive in order, never more than the window ahead") {
  constexpr uint32_t kWindow = 4;
  Fixture f(16, kWindow);
  auto reader = f.count(10'000);
  uint64_t expected = 0;
  uint64_t max_ahead = 0;
  while (auto msg = reader.Read()) {
    REQUIRE(msg->ok());
    REQUIRE(msg->message() != nullptr);
    CHECK(msg->message()->seq() == expected);
    CHECK(msg->message()->text()->str() == "item " + std::to_string(expected));
    // We have read expected+1 messages and released `expected` of them:
    // the server can have been granted at most window + expected slots.
    const uint64_t written = f.written.load();
    max_ahead = std::max(max_ahead, written - std::min(written, expected));
    CHECK(written <= expected + kWindow);
    ++expected;
  }
  CHECK(expected == 10'000);
  CHECK(reader.status().ok());
  CHECK(max_ahead <= kWindow);
  // Every lent slot came back.
  const auto st = f.channel->stats();
  CHECK(st.free_slots == 16);
  CHECK(st.in_flight == 0);
}

TEST_CASE("stream: a slow reader holds the server back") {
  constexpr uint32_t kWindow = 3;
  Fixture f(8, kWindow);
  auto reader = f.count(100);
  std::this_thread::sleep_for(200ms);
  // Nothing read yet: the server filled exactly the window and waits.
  CHECK(f.written.load() == kWindow);
  int n = 0;
  while (auto msg = reader.Read()) ++n;
  CHECK(n == 100);
}

TEST_CASE("stream: an empty stream and an error at the end") {
  Fixture f;
  {
    auto reader = f.count(0);
    CHECK_FALSE(reader.Read().has_value());
    CHECK(reader.status().ok());
  }
  {
    auto reader = f.count(5, "fail");
    int n = 0;
    while (auto msg = reader.Read()) ++n;
    CHECK(n == 5);
    CHECK(reader.status().code() == slotrpc::StatusCode::kInvalidArgument);
    CHECK(reader.status().message() == "asked to fail");
  }
  CHECK(f.channel->stats().free_slots == 16);
}

TEST_CASE("stream: cancelling mid-stream stops the server's writer") {
  Fixture f(8, 2);
  auto reader = f.count(1'000'000);
  auto first = reader.Read();
  REQUIRE(first.has_value());
  first->release();
  reader.Cancel();
  while (auto msg = reader.Read()) {
  }
  CHECK(reader.status().code() == slotrpc::StatusCode::kCancelled);
  for (int i = 0; i < 200 && !f.writer_stopped; ++i) std::this_thread::sleep_for(10ms);
  CHECK(f.writer_stopped.load());
  CHECK(f.saw_cancel.load());
  // The call slot and lent slots come back once the server's final reply
  // arrives; then the channel is fully usable.
  for (int i = 0; i < 200 && f.channel->stats().free_slots != 8; ++i) std::this_thread::sleep_for(10ms);
  CHECK(f.channel->stats().free_slots == 8);
}

TEST_CASE("stream: deadline") {
  Fixture f(8, 2);
  auto reader = f.count(1'000'000, "", slotrpc::CallOptions::with_timeout(100ms));
  // Read nothing: the server stalls on the window and the deadline fires.
  std::this_thread::sleep_for(300ms);
  int n = 0;
  while (auto msg = reader.Read()) ++n;
  CHECK(n <= 2);
  CHECK(reader.status().code() == slotrpc::StatusCode::kDeadlineExceeded);
}

TEST_CASE("stream: unary calls share the channel with a stream") {
  Fixture f(6, 3);  // stream takes 1 + 3 slots, leaving 2 for unary calls
  auto reader = f.count(2000);
  std::vector<slotrpc::Future<slotrpc::Reply<Pong>>> calls;
  for (uint64_t i = 0; i < 200; ++i) {
    calls.push_back(f.channel->unary<Ping, Pong>(kEcho, [i](flatbuffers::FlatBufferBuilder& fbb) {
      return slotrpc::test::CreatePing(fbb, i);
    }));
  }
  uint64_t n = 0;
  while (auto msg = reader.Read()) {
    CHECK(msg->message()->seq() == n);
    ++n;
  }
  CHECK(n == 2000);
  for (uint64_t i = 0; i < calls.size(); ++i) {
    auto r = calls[i].get();
    REQUIRE(r.ok());
    CHECK(r->seq() == i);
  }
}

TEST_CASE("stream: calling a unary method as a stream, and a stream as unary") {
  Fixture f;
  auto reader = f.channel->server_stream<Ping, Pong>(kEcho, [](flatbuffers::FlatBufferBuilder& fbb) {
    return slotrpc::test::CreatePing(fbb, 1);
  });
  CHECK_FALSE(reader.Read().has_value());
  CHECK(reader.status().code() == slotrpc::StatusCode::kInvalidArgument);
  auto r = f.channel->unary<Ping, Pong>(kCount, [](flatbuffers::FlatBufferBuilder& fbb) {
    return slotrpc::test::CreatePing(fbb, 1);
  }).get();
  CHECK(r.status().code() == slotrpc::StatusCode::kInvalidArgument);
}

TEST_CASE("stream: with a single free slot beside the call, the window shrinks to 1") {
  Fixture f(2, 8);  // 2 slots: the call and one lent slot
  auto reader = f.count(300);
  uint64_t n = 0;
  while (auto msg = reader.Read()) {
    CHECK(msg->message()->seq() == n);
    ++n;
  }
  CHECK(n == 300);
  CHECK(reader.status().ok());
}
