// Idempotent calls with max_retries survive a server restart: the channel
// reconnects to its address and sends them again.  Others fail with
// UNAVAILABLE.
#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <string>

#include <slotrpc/slotrpc.h>

#include "test_messages_generated.h"

namespace {

using slotrpc::test::Ping;
using slotrpc::test::Pong;
using namespace std::chrono_literals;

const uint32_t kEcho = slotrpc::method_id("test.Retry.Echo");

std::unique_ptr<slotrpc::Server> start_server(const std::string& address, std::string tag) {
  auto server = std::make_unique<slotrpc::Server>();
  slotrpc::ServiceDefinition svc("test.Retry");
  svc.add_typed_unary<Ping, Pong>(
      "Echo", [tag](const Ping& req, slotrpc::ReplyBuilder<Pong>& out, slotrpc::ServerCall&) {
        out.Finish(slotrpc::test::CreatePong(out.fbb(), req.seq(), out.fbb().CreateString(tag)));
        return slotrpc::Status();
      });
  REQUIRE(server->add_service(std::move(svc)).ok());
  auto st = server->start(address);
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  return server;
}

slotrpc::Reply<Pong> echo(slotrpc::Channel& ch, uint64_t seq, slotrpc::CallOptions o) {
  auto f = ch.unary<Ping, Pong>(kEcho, [seq](flatbuffers::FlatBufferBuilder& fbb) {
    return slotrpc::test::CreatePing(fbb, seq);
  }, o);
  REQUIRE(f.wait_for(10s));
  return f.get();
}

slotrpc::CallOptions idempotent(uint32_t retries) {
  slotrpc::CallOptions o;
  o.idempotent = true;
  o.max_retries = retries;
  return o;
}

}  // namespace

TEST_CASE("retry: an idempotent call reconnects after a server restart") {
  auto first = start_server("127.0.0.1:0", "first");
  const std::string address = "127.0.0.1:" + std::to_string(first->port());
  auto ch = slotrpc::Channel::connect(address);
  REQUIRE(ch.ok());
  auto r = echo(**ch, 1, idempotent(2));
  REQUIRE(r.ok());
  CHECK(r->text()->str() == "first");
  r.release();

  first->stop();
  first.reset();
  // The channel notices the closed connection.
  for (int i = 0; i < 200 && !(*ch)->stats().closed; ++i) std::this_thread::sleep_for(10ms);
  REQUIRE((*ch)->stats().closed);

  SUBCASE("without retries the call fails") {
    auto plain = echo(**ch, 2, {});
    CHECK(plain.status().code() == slotrpc::StatusCode::kUnavailable);
    // Retries are for idempotent methods only.
    auto not_idempotent = slotrpc::CallOptions();
    not_idempotent.max_retries = 3;
    CHECK(echo(**ch, 3, not_idempotent).status().code() == slotrpc::StatusCode::kUnavailable);
  }
  SUBCASE("with the server back, the retry succeeds on a new session") {
    auto second = start_server(address, "second");
    auto again = echo(**ch, 4, idempotent(2));
    REQUIRE_MESSAGE(again.ok(), again.status().to_string());
    CHECK(again->seq() == 4);
    CHECK(again->text()->str() == "second");
    again.release();
    CHECK_FALSE((*ch)->stats().closed);
    // Later plain calls use the new session too.
    CHECK(echo(**ch, 5, {}).ok());
  }
  SUBCASE("with the server gone, the retry reports why reconnecting failed") {
    auto failed = echo(**ch, 6, idempotent(1));
    CHECK(failed.status().code() == slotrpc::StatusCode::kUnavailable);
    CHECK_MESSAGE(failed.status().message().find("reconnect failed") != std::string::npos,
                  failed.status().to_string());
  }
}
