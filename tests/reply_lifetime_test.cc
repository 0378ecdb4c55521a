// A reply held after its Channel is gone: reading it stays valid, and
// dropping it frees the session's memory (the receive ring it points into
// and the rest).  Leaks show in the ASan/LSan build, which reports them when
// the process exits: scripts/test.sh runs this binary there too.
#include <doctest/doctest.h>
#include <slotrpc/slotrpc.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "test_messages_generated.h"

namespace {

using namespace std::chrono_literals;
using slotrpc::Channel;
using slotrpc::RawReply;
using slotrpc::Server;
using slotrpc::ServerCall;
using slotrpc::ServiceDefinition;
using slotrpc::Status;
using slotrpc::test::Ping;
using slotrpc::test::Pong;

const uint32_t kEcho = slotrpc::method_id("slotrpc.test.Held.Echo");
const uint32_t kScan = slotrpc::method_id("slotrpc.test.Held.Scan");
const uint32_t kFill = slotrpc::method_id("slotrpc.test.Held.Fill");
const uint32_t kSlow = slotrpc::method_id("slotrpc.test.Held.Slow");
const uint32_t kLoad = slotrpc::method_id("slotrpc.test.Held.Load");
const uint32_t kSync = slotrpc::method_id("slotrpc.test.Held.Sync");

struct Fixture {
  Server server;
  Fixture() {
    ServiceDefinition svc("slotrpc.test.Held");
    svc.add_method("Echo", [](ServerCall& call) -> Status {
      call.reply().PushFlatBuffer(reinterpret_cast<const uint8_t*>(call.request().data()),
                                  call.request().size());
      return {};
    });
    svc.add_server_stream<Ping, Pong>(
        "Scan", [](const Ping& req, slotrpc::ServerWriter<Pong>& out, ServerCall&) -> Status {
          for (uint64_t i = 0; i < req.seq(); ++i) {
            if (!out.Write([i](flatbuffers::FlatBufferBuilder& fbb) { return slotrpc::test::CreatePong(fbb, i); }))
              return out.error();
          }
          return {};
        });
    svc.add_method("Fill", [](ServerCall& call) -> Status {
      std::vector<std::byte> data(call.bulk_out(0), std::byte{0x42});
      if (Status st = call.write_bulk(0, data); !st.ok()) return st;
      call.reply().Finish(slotrpc::test::CreatePong(call.reply(), data.size()));
      return {};
    });
    svc.add_method("Slow", [](ServerCall& call) -> Status {
      while (!call.cancelled()) slotrpc::this_fiber::sleep_for(1ms);
      return Status(slotrpc::StatusCode::kCancelled, "cancelled");
    });
    svc.add_client_stream<Ping, Pong>(
        "Load", [](slotrpc::ServerReader<Ping>& in, slotrpc::ReplyBuilder<Pong>& out, ServerCall&) -> Status {
          uint64_t n = 0;
          while (in.Read() != nullptr) ++n;
          out.Finish(slotrpc::test::CreatePong(out.fbb(), n));
          return {};
        });
    svc.add_bidi_stream<Ping, Pong>(
        "Sync", [](slotrpc::ServerReaderWriter<Ping, Pong>& s, ServerCall&) -> Status {
          while (const Ping* p = s.Read()) {
            const uint64_t seq = p->seq();
            if (!s.Write([seq](flatbuffers::FlatBufferBuilder& fbb) { return slotrpc::test::CreatePong(fbb, seq); }))
              return s.write_error();
          }
          return s.read_status();
        });
    REQUIRE(server.add_service(std::move(svc)).ok());
    REQUIRE(server.start("127.0.0.1:0").ok());
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(server.port()); }
};

RawReply echo(Channel& ch, uint8_t fill) {
  auto f = slotrpc::raw::call(ch, kEcho, [fill](flatbuffers::FlatBufferBuilder& fbb) {
    const std::vector<uint8_t> body(64, fill);
    fbb.PushFlatBuffer(body.data(), body.size());
  });
  REQUIRE(f.wait_for(30s));
  RawReply r = f.get();
  REQUIRE(r.ok());
  return r;
}

}  // namespace

TEST_CASE("a reply held after its channel is destroyed stays readable and is freed when dropped") {
  Fixture fx;
  std::optional<RawReply> held;
  {
    auto ch = Channel::connect(fx.address()).value();
    held.emplace(echo(*ch, 7));
  }
  REQUIRE(held->size() == 64);
  CHECK(std::to_integer<int>(held->payload()[63]) == 7);
  held.reset();  // the last owner of the session's memory
}

TEST_CASE("replies held after their channel is destroyed, dropped on other threads") {
  Fixture fx;
  std::vector<RawReply> held;
  {
    auto ch = Channel::connect(fx.address()).value();
    for (uint8_t i = 0; i < 8; ++i) held.push_back(echo(*ch, i));
  }
  std::vector<std::thread> threads;
  for (auto& r : held) threads.emplace_back([r = std::move(r)]() mutable { r.release(); });
  for (auto& t : threads) t.join();
}

TEST_CASE("a typed reply and a stream message held after their channel is destroyed") {
  Fixture fx;
  std::optional<slotrpc::Reply<Pong>> message;
  {
    auto ch = Channel::connect(fx.address()).value();
    auto reader = ch->server_stream<Ping, Pong>(
        kScan, [](flatbuffers::FlatBufferBuilder& fbb) { return slotrpc::test::CreatePing(fbb, 3); });
    message = reader.Read();
    REQUIRE(message.has_value());
    REQUIRE(message->ok());
    // The channel goes with the stream still open and a message held.
  }
  CHECK((*message)->seq() == 0);
  message.reset();
}

TEST_CASE("a reply released on another thread while its channel is destroyed") {
  Fixture fx;
  for (int round = 0; round < 20; ++round) {
    auto ch = Channel::connect(fx.address()).value();
    std::vector<RawReply> held;
    for (uint8_t i = 0; i < 4; ++i) held.push_back(echo(*ch, i));
    std::atomic<bool> go{false};
    std::thread dropper([&] {
      while (!go.load()) std::this_thread::yield();
      held.clear();
    });
    go = true;
    ch.reset();
    dropper.join();
  }
}

TEST_CASE("a reply held after its channel, on a loop of its own, and its server are gone") {
  std::optional<RawReply> held;
  {
    Fixture fx;
    slotrpc::Config cfg;
    cfg.spin_us = 7;  // differs from the default runtime's: the channel gets loops of its own
    auto ch = Channel::connect(fx.address(), cfg).value();
    held.emplace(echo(*ch, 9));
  }
  CHECK(std::to_integer<int>(held->payload()[0]) == 9);
  held.reset();
}

TEST_CASE("a reply held after its channel, dropped only after the runtime it ran on") {
  std::optional<RawReply> held;
  {
    Fixture fx;
    slotrpc::Config cfg;
    cfg.reactor_threads = 1;
    slotrpc::Runtime rt(cfg);
    auto ch = Channel::connect(fx.address(), rt).value();
    held.emplace(echo(*ch, 5));
  }
  CHECK(std::to_integer<int>(held->payload()[0]) == 5);
  held.reset();
}

TEST_CASE("a client stream's reply and a bidi message held after their channel is destroyed") {
  for (int own_loop = 0; own_loop < 2; ++own_loop) {
    Fixture fx;
    slotrpc::Config cfg;
    if (own_loop) cfg.spin_us = 7;
    std::optional<slotrpc::Reply<Pong>> reply;
    std::optional<slotrpc::Reply<Pong>> message;
    {
      auto ch = Channel::connect(fx.address(), cfg).value();
      auto w = ch->client_stream<Ping, Pong>(kLoad);
      for (uint64_t i = 0; i < 3; ++i) {
        REQUIRE(w.Write([i](flatbuffers::FlatBufferBuilder& fbb) { return slotrpc::test::CreatePing(fbb, i); }));
      }
      reply.emplace(w.Finish());
      REQUIRE(reply->ok());
      auto s = ch->bidi_stream<Ping, Pong>(kSync);
      REQUIRE(s.Write([](flatbuffers::FlatBufferBuilder& fbb) { return slotrpc::test::CreatePing(fbb, 11); }));
      message = s.Read();
      REQUIRE(message.has_value());
      // The channel goes first, the bidi call still open.
      ch.reset();
    }
    CHECK((*reply)->seq() == 3);
    CHECK((*message)->seq() == 11);
    reply.reset();
    message.reset();
  }
}

TEST_CASE("a reply held while its channel is destroyed with a call in flight, or from its own loop") {
  Fixture fx;
  std::optional<RawReply> held;
  {
    auto ch = Channel::connect(fx.address()).value();
    held.emplace(echo(*ch, 3));
    auto slow = slotrpc::raw::call(*ch, kSlow, [](flatbuffers::FlatBufferBuilder& fbb) { fbb.Finish(slotrpc::test::CreatePing(fbb, 1)); });
    ch.reset();
    REQUIRE(slow.wait_for(30s));
    CHECK(slow.get().status().code() == slotrpc::StatusCode::kCancelled);
  }
  held.reset();

  // Destroyed on its own loop, from its reply's callback, which keeps the reply.
  std::shared_ptr<Channel> ch = Channel::connect(fx.address()).value();
  std::atomic<bool> done{false};
  auto kept = std::make_shared<std::optional<RawReply>>();
  auto self = std::make_shared<std::shared_ptr<Channel>>(ch);
  slotrpc::raw::call(*ch, kEcho, [](flatbuffers::FlatBufferBuilder& fbb) { fbb.Finish(slotrpc::test::CreatePing(fbb, 2)); }, {},
           [&done, kept, self](RawReply&& r) {
             kept->emplace(std::move(r));
             self->reset();  // the last owner: ~Channel on the loop
             done = true;
           });
  ch.reset();
  const auto end = std::chrono::steady_clock::now() + 30s;
  while (!done.load() && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(1ms);
  REQUIRE(done.load());
  CHECK((*kept)->ok());
  kept->reset();
}

TEST_CASE("a bulk call's reply held after its channel is destroyed") {
  for (int transport = 0; transport < 2; ++transport) {
    Fixture fx;
    std::vector<std::byte> into(1 << 20);
    std::optional<RawReply> held;
    {
      auto ch = Channel::connect(fx.address()).value();
      slotrpc::CallOptions o;
      if (transport == 0) {
        o.receive_bulk(std::span<std::byte>(into));
      } else {
        auto region = ch->register_memory(std::span<std::byte>(into)).value();
        o.receive_bulk(region, 0, into.size());
      }
      auto f = slotrpc::raw::call(*ch, kFill, [](flatbuffers::FlatBufferBuilder& fbb) { fbb.Finish(slotrpc::test::CreatePing(fbb, 1)); }, o);
      REQUIRE(f.wait_for(30s));
      held.emplace(f.get());
      REQUIRE_MESSAGE(held->ok(), held->status().to_string());
    }
    CHECK(held->bulk_received(0) == into.size());
    CHECK(into[12345] == std::byte{0x42});
    held.reset();
  }
}
