// Integration: a hostile TCP peer, speaking the real handshake and frames by
// hand (tests/raw_tcp_client.h), against a server that also serves a
// well-behaved Channel the whole time.
//
// For each attack the test asserts what the server does to the attacker's
// session (closes it, naming the reason in its log line, or answers it) and
// that nothing else is touched: the server's log names no other session, a
// bystander raw session still round-trips, and the Channel, calling without
// a pause from a thread of its own, completes every call OK.
//
// Every wait is bounded (wait on a condition, never a sleep) so a regression
// fails the test instead of hanging it.
#include <doctest/doctest.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <slotrpc/slotrpc.h>
#include <string>
#include <thread>
#include <vector>

#include "adversary_util.h"
#include "base/logging.h"
#include "process_util.h"
#include "raw_tcp_client.h"
#include "test_messages_generated.h"

namespace {

using namespace std::chrono_literals;
using namespace raw_tcp;
using slotrpc::Channel;
using slotrpc::Config;
using slotrpc::Future;
using slotrpc::Reply;
using slotrpc::Server;
using slotrpc::ServerCall;
using slotrpc::ServiceDefinition;
using slotrpc::Status;
using slotrpc::StatusCode;
using slotrpc::test::Ping;
using slotrpc::test::Pong;
namespace core = slotrpc::core;
namespace rpc = slotrpc::rpc;

constexpr uint32_t kEcho = slotrpc::method_id("slotrpc.test.Adversary.Echo");
constexpr uint32_t kSlow = slotrpc::method_id("slotrpc.test.Adversary.Slow");

// The server's liveness settings: short, so a slowloris is cut off quickly.
constexpr uint32_t kKeepaliveMs = 100;
constexpr uint32_t kPeerTimeoutMs = 1500;

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Bounded polling (10 s unless told): process_util.h.
using test_process::wait_until;

using adversary::ms_since;
using adversary::ping_bytes;

ServiceDefinition make_service() { return adversary::make_service("slotrpc.test.Adversary"); }

using adversary::CaptureSink;
using adversary::SteadyClient;

// Sends a request for `method` into `slot`.
void send_request(int fd, uint32_t method, uint64_t request_id, uint16_t slot, uint32_t generation,
                  uint32_t sleep_ms = 0) {
  const auto payload = ping_bytes(request_id, "raw-" + std::to_string(request_id), sleep_ms);
  const auto h = request_header(method, request_id, slot, generation, payload.size());
  send_bytes(fd, frame(false, core::make_imm(slot, generation), body_of(h, payload)));
}

// Reads the next reply and checks it answers (slot, generation, request_id).
void expect_reply(int fd, uint16_t slot, uint32_t generation, uint64_t request_id,
                  std::chrono::milliseconds limit = 5000ms) {
  const Frame f = read_slot_frame(fd, limit);
  CHECK(core::imm_slot(f.imm) == slot);
  CHECK(core::imm_generation(f.imm) == static_cast<uint16_t>(generation));
  const core::Header r = core::decode_header(f.body.data());
  REQUIRE(core::validate_header(r, f.body.size(), 64, 65536, slot) == core::HeaderError::kOk);
  CHECK(r.kind() == core::Kind::kReply);
  CHECK(r.request_id == request_id);
  CHECK(r.generation == generation);
  flatbuffers::Verifier v(reinterpret_cast<const uint8_t*>(f.body.data()) + core::kHeaderSize, r.payload_len);
  REQUIRE(v.VerifyBuffer<Pong>(nullptr));
  const Pong* pong = flatbuffers::GetRoot<Pong>(f.body.data() + core::kHeaderSize);
  CHECK(pong->seq() == request_id);
}

void round_trip(int fd, uint16_t slot, uint32_t generation, uint64_t request_id) {
  send_request(fd, kEcho, request_id, slot, generation);
  expect_reply(fd, slot, generation, request_id);
}

// The server, its log, a Channel calling throughout, and an idle bystander
// Channel that must outlive every attack.
struct Arena {
  std::shared_ptr<CaptureSink> log = std::make_shared<CaptureSink>();
  std::unique_ptr<Server> server;
  uint16_t port = 0;
  std::unique_ptr<SteadyClient> steady;
  std::unique_ptr<Channel> bystander;
  uint64_t bystander_seq = 0;

  Arena() {
    // Session closes are logged at info; the test environment sets warn.
    ::setenv("SLOTRPC_LOG_LEVEL", "info", 1);
    slotrpc::base::log().sinks().push_back(log);
    Config cfg;
    cfg.keepalive_ms = kKeepaliveMs;
    cfg.peer_timeout_ms = kPeerTimeoutMs;
    server = std::make_unique<Server>(cfg);
    REQUIRE(server->add_service(make_service()).ok());
    const Status st = server->start("127.0.0.1:0");
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    port = server->port();
    steady = std::make_unique<SteadyClient>("127.0.0.1:" + std::to_string(port), kEcho);
    auto b = Channel::connect("127.0.0.1:" + std::to_string(port));
    REQUIRE_MESSAGE(b.ok(), b.status().to_string());
    bystander = std::move(b).value();
    REQUIRE(wait_until([&] { return server->session_count() == 2; }));
    bystander_call();
    REQUIRE(steady->progresses());
  }
  ~Arena() {
    steady.reset();
    bystander.reset();
    server.reset();
    auto& sinks = slotrpc::base::log().sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), log), sinks.end());
    ::setenv("SLOTRPC_LOG_LEVEL", "warn", 1);
  }

  void bystander_call() {
    const uint64_t seq = ++bystander_seq;
    auto f = bystander->call_typed<Pong>(kEcho, [seq](flatbuffers::FlatBufferBuilder& fbb) {
      fbb.Finish(slotrpc::test::CreatePing(fbb, seq, fbb.CreateString("bystander")));
    });
    REQUIRE(f.wait_for(10000ms));
    Reply<Pong> r = f.get();
    CHECK_MESSAGE(r.ok(), r.status().to_string());
    if (r.ok()) CHECK(r->seq() == seq);
  }

  // Where the log is now: the checks below read only what came after, so
  // an earlier session that had the same port cannot confuse them.
  size_t mark() { return log->lines().size(); }

  // Lines since `from` that name `peer` ("127.0.0.1:PORT") with a close or
  // refusal.
  std::vector<std::string> closes_of(const std::string& peer, size_t from) {
    return adversary::closes_of(*log, peer, from);
  }
  // Lines since `from` that report any session closing.
  size_t close_lines(size_t from) { return adversary::close_lines(*log, from); }

  // The attack is over: whatever happened to the attacker, the server has
  // exactly the Channel's and the bystander's sessions, and both work.
  void check_others_unharmed() {
    CHECK(wait_until([&] { return server->session_count() == 2; }, 5000ms));
    bystander_call();
    CHECK_MESSAGE(steady->progresses(), "the well-behaved channel stalled or failed");
    const auto f = steady->failures();
    CHECK_MESSAGE(f.empty(), (f.empty() ? "" : f.front()));
  }

  // The attacker's connection `fd` is closed by the server, the server's
  // log says so naming the attacker's address, `reason` among its words
  // (unless `logged` is false), and no other session was closed.
  void check_closed_alone(int fd, const std::string& peer, const std::string& reason,
                          size_t from, std::chrono::milliseconds limit = 5000ms,
                          bool logged = true) {
    CHECK_MESSAGE(closed_by_peer(fd, limit), "the server did not close the attacker's connection");
    CHECK(wait_until([&] { return server->session_count() == 2; }, 5000ms));
    if (!logged) {
      CHECK_MESSAGE(close_lines(from) == 0, "a session was closed by another peer's junk");
      return;
    }
    std::vector<std::string> mine;
    CHECK(wait_until([&] {
      mine = closes_of(peer, from);
      for (const auto& l : mine)
        if (contains(l, reason)) return true;
      return false;
    }, 5000ms));
    std::string all;
    for (const auto& l : mine) all += "\n  " + l;
    CHECK_MESSAGE(!mine.empty(), "no log line names " << peer);
    bool named = false;
    for (const auto& l : mine) named = named || contains(l, reason);
    CHECK_MESSAGE(named, "expected '" << reason << "' in the close lines of " << peer << ":" << all);
    // Every close line since the attack began is about the attacker.
    size_t others = close_lines(from);
    for (const auto& l : mine)
      if (contains(l, "closed") || contains(l, "closing")) --others;
    CHECK_MESSAGE(others == 0, others << " close line(s) about other sessions");
  }
};

std::string random_bytes_text(std::mt19937& rng, size_t n, std::vector<std::byte>& out) {
  out.resize(n);
  for (auto& b : out) b = static_cast<std::byte>(rng() & 0xff);
  return std::to_string(n) + " random bytes";
}

}  // namespace

// ================================================================ the cases

TEST_CASE("adversary: garbage instead of a Hello is refused with a HelloReply; nothing else notices") {
  Arena a;
  std::mt19937 rng(12345);
  for (int round = 0; round < 5; ++round) {
    CAPTURE(round);
    const size_t lines_before = a.mark();
    Fd c(tcp_connect(a.port));
    const std::string peer = rpc::local_name(c.fd);
    std::vector<std::byte> junk;
    random_bytes_text(rng, core::kHelloSize + round * 7, junk);
    junk[0] = std::byte{0x00};  // never the Hello magic by chance
    send_bytes(c.fd, junk);
    // The refusal: a HelloReply with UNAVAILABLE and a message saying why.
    std::array<std::byte, core::kHelloSize> buf{};
    REQUIRE(rpc::read_exact(c.fd, buf, Clock::now() + 5s).ok());
    auto reply = core::decode_hello_reply(buf.data());
    REQUIRE_MESSAGE(reply.ok(), reply.status().to_string());
    CHECK(reply->status == static_cast<uint16_t>(StatusCode::kUnavailable));
    std::string message(reply->message_len, '\0');
    REQUIRE(rpc::read_exact(c.fd, std::as_writable_bytes(std::span(message)), Clock::now() + 5s).ok());
    CHECK_MESSAGE(contains(message, "bad hello magic"), message);
    // Refusals of junk Hellos are logged at most once a second (a peer can
    // provoke them at will: docs/design.md, "Limits and abuse"), so the
    // reply above, not the log, is where this one's reason is checked.
    a.check_closed_alone(c.fd, peer, "bad hello magic", lines_before, 5000ms, /*logged=*/false);
    a.check_others_unharmed();
  }
}

TEST_CASE("adversary: garbage after the handshake closes that session only") {
  Arena a;
  std::mt19937 rng(777);
  for (int round = 0; round < 8; ++round) {
    CAPTURE(round);
    const size_t lines_before = a.mark();
    Fd c(raw_connect(a.port));
    const std::string peer = rpc::local_name(c.fd);
    REQUIRE(wait_until([&] { return a.server->session_count() == 3; }));
    round_trip(c.fd, 0, 1, 1);
    std::vector<std::byte> junk;
    random_bytes_text(rng, 64 + round * 100, junk);
    send_bytes(c.fd, junk);
    // Whatever the bytes say, the session ends: at once on a prefix that
    // cannot be a frame, after peer_timeout_ms on one promising more bytes.
    a.check_closed_alone(c.fd, peer, "closed", lines_before, 5000ms);
    a.check_others_unharmed();
  }
}

TEST_CASE("adversary: slowloris frames are cut off by the peer timeout") {
  Arena a;
  SUBCASE("a header promising 60000 bytes, 100 sent, then silence") {
    const size_t lines_before = a.mark();
    Fd c(raw_connect(a.port));
    const std::string peer = rpc::local_name(c.fd);
    round_trip(c.fd, 0, 1, 1);
    const auto t0 = Clock::now();
    send_bytes(c.fd, frame(false, core::make_imm(1, 1), std::vector<std::byte>(100), 60000));
    a.check_closed_alone(c.fd, peer, "silent", lines_before, 5000ms);
    const double ms = ms_since(t0);
    CHECK(ms >= kPeerTimeoutMs * 0.8);  // it was the timeout, not a malformed prefix
    CHECK(ms < 4000);
    a.check_others_unharmed();
  }
  SUBCASE("the same frame trickled one byte per 20 ms") {
    // A trickle is not a message: bytes that never make a whole frame do
    // not keep a session alive.
    const size_t lines_before = a.mark();
    Fd c(raw_connect(a.port));
    const std::string peer = rpc::local_name(c.fd);
    round_trip(c.fd, 0, 1, 1);
    const auto t0 = Clock::now();
    const auto f = frame(false, core::make_imm(1, 1), std::vector<std::byte>(1000), 60000);
    bool closed = false;
    for (size_t i = 0; i < f.size() && !closed; ++i) {
      if (::send(c.fd, &f[i], 1, MSG_NOSIGNAL) != 1) break;  // reset by the server
      closed = closed_by_peer(c.fd, 20ms);
      if (ms_since(t0) > 5000) break;
    }
    CHECK_MESSAGE(ms_since(t0) < 5000, "a trickling peer kept its session for 5 s");
    a.check_closed_alone(c.fd, peer, "silent", lines_before, 5000ms);
    a.check_others_unharmed();
  }
}

TEST_CASE("adversary: a request into a slot without its credit (still busy) closes that session") {
  Arena a;
  const size_t lines_before = a.mark();
  Fd c(raw_connect(a.port));
  const std::string peer = rpc::local_name(c.fd);
  round_trip(c.fd, 0, 1, 1);
  send_request(c.fd, kSlow, 2, 1, 1, 5000);   // slot 1 busy for 5 s
  send_request(c.fd, kEcho, 3, 1, 2);          // and written again
  a.check_closed_alone(c.fd, peer, "not armed", lines_before);
  a.check_others_unharmed();
}

TEST_CASE("adversary: stale and backward generations") {
  Arena a;
  Fd c(raw_connect(a.port));
  const std::string peer = rpc::local_name(c.fd);
  const size_t lines_before = a.mark();
  SUBCASE("a request reusing a finished generation, or going backwards, is answered as sent") {
    // The server does not track generations: they protect the client from
    // late replies, and the reply carries the generation it was sent with,
    // so a client that reused one can tell.
    round_trip(c.fd, 0, 5, 1);
    round_trip(c.fd, 0, 5, 2);  // the same generation again
    round_trip(c.fd, 0, 3, 3);  // backwards
    round_trip(c.fd, 0, 0, 4);  // zero
  }
  SUBCASE("a CANCEL naming the previous generation of a running call does not cancel it") {
    round_trip(c.fd, 2, 1, 1);
    const auto t0 = Clock::now();
    send_request(c.fd, kSlow, 2, 2, 2, 600);
    send_bytes(c.fd, frame(true, 0, body_of(control_header(core::Kind::kCancel, 2, 1, 1), {})));
    expect_reply(c.fd, 2, 2, 2);
    CHECK(ms_since(t0) >= 550);  // ran its 600 ms
    // Control: the right generation does cancel (the handler returns early).
    const auto t1 = Clock::now();
    send_request(c.fd, kSlow, 3, 2, 3, 5000);
    send_bytes(c.fd, frame(true, 0, body_of(control_header(core::Kind::kCancel, 2, 3, 3), {})));
    expect_reply(c.fd, 2, 3, 3);
    CHECK(ms_since(t1) < 4000);
  }
  CHECK_FALSE(closed_by_peer(c.fd, 50ms));
  CHECK(a.closes_of(peer, lines_before).empty());
  CHECK(a.close_lines(lines_before) == 0);
  a.check_others_unharmed();
}

TEST_CASE("adversary: reply-type frames sent to a server close that session") {
  Arena a;
  for (const adversary::ReplyTypeCase& k : adversary::kReplyTypeCases) {
    CAPTURE(k.name);
    const size_t lines_before = a.mark();
    Fd c(raw_connect(a.port));
    const std::string peer = rpc::local_name(c.fd);
    round_trip(c.fd, 0, 1, 1);
    if (k.control) {
      send_bytes(c.fd, frame(true, 0, body_of(control_header(k.kind, 0, 1, 1), {})));
    } else {
      const auto p = ping_bytes(2, "x");
      auto h = request_header(kEcho, 2, 1, 1, p.size());
      h.flags = static_cast<uint8_t>(k.kind);
      if (k.kind == core::Kind::kError) h.status = static_cast<uint16_t>(StatusCode::kInternal);
      send_bytes(c.fd, frame(false, core::make_imm(1, 1), body_of(h, p)));
    }
    a.check_closed_alone(c.fd, peer, k.reason, lines_before);
    a.check_others_unharmed();
  }
}

TEST_CASE("adversary: one request id in two slots is answered in each slot") {
  // request_id is the client's key for matching; the server keys on the
  // slot, so a client reusing an id gets both answers, each in its slot.
  Arena a;
  const size_t lines_before = a.mark();
  Fd c(raw_connect(a.port));
  round_trip(c.fd, 0, 1, 1);
  send_request(c.fd, kSlow, 7, 2, 1, 200);
  send_request(c.fd, kEcho, 7, 3, 1);
  expect_reply(c.fd, 3, 1, 7);  // the echo first, the slow one after
  expect_reply(c.fd, 2, 1, 7);
  round_trip(c.fd, 2, 2, 8);  // both slots serve again
  round_trip(c.fd, 3, 2, 9);
  CHECK_FALSE(closed_by_peer(c.fd, 50ms));
  CHECK(a.close_lines(lines_before) == 0);
  a.check_others_unharmed();
}

TEST_CASE("adversary: cancels for unknown calls are harmless") {
  Arena a;
  const size_t lines_before = a.mark();
  Fd c(raw_connect(a.port));
  round_trip(c.fd, 0, 1, 1);
  // A call that must not be disturbed, running in slot 9.
  const auto t0 = Clock::now();
  send_request(c.fd, kSlow, 2, 9, 4, 600);
  std::mt19937 rng(4242);
  std::vector<std::byte> burst;
  for (int i = 0; i < 500; ++i) {
    uint16_t slot = static_cast<uint16_t>(rng() % 64);
    uint32_t gen = rng() % 1000;
    if (slot == 9 && gen == 4) gen = 5;  // not the running call
    const auto f = frame(true, 0, body_of(control_header(core::Kind::kCancel, slot, gen, 1000 + rng() % 100000), {}));
    burst.insert(burst.end(), f.begin(), f.end());
  }
  send_bytes(c.fd, burst);
  expect_reply(c.fd, 9, 4, 2);
  CHECK(ms_since(t0) >= 550);  // not cancelled
  round_trip(c.fd, 0, 2, 3);   // and the session serves on
  CHECK_FALSE(closed_by_peer(c.fd, 50ms));
  CHECK(a.close_lines(lines_before) == 0);
  a.check_others_unharmed();
}

TEST_CASE("status codes: a client that predates the full set gets the new ones as INTERNAL, named in the message") {
  // A client that does not announce kFeatureStatusCodes in its Hello closed
  // the session on a code outside the first version's eight; it gets
  // NOT_FOUND as INTERNAL "NOT_FOUND: ...".  One that announces it gets 5.
  slotrpc::Server server;
  ServiceDefinition svc("slotrpc.test.Codes");
  svc.add_method("NotFound", [](slotrpc::ServerCall&) {
    return slotrpc::Status(slotrpc::StatusCode::kNotFound, "no such key");
  });
  svc.add_method("Exhausted", [](slotrpc::ServerCall&) {
    return slotrpc::Status(slotrpc::StatusCode::kResourceExhausted, "full");
  });
  REQUIRE(server.add_service(std::move(svc)).ok());
  REQUIRE(server.start("127.0.0.1:0").ok());
  const uint32_t not_found = slotrpc::method_id("slotrpc.test.Codes.NotFound");
  const uint32_t exhausted = slotrpc::method_id("slotrpc.test.Codes.Exhausted");
  // error_reply: the next reply's status and message.
  auto error_reply = [](int fd) {
    const Frame f = read_slot_frame(fd);
    const core::Header r = core::decode_header(f.body.data());
    REQUIRE(r.kind() == core::Kind::kError);
    REQUIRE(f.body.size() >= core::kHeaderSize + r.payload_len);
    return std::pair<uint16_t, std::string>(
        r.status, std::string(reinterpret_cast<const char*>(f.body.data()) + core::kHeaderSize, r.payload_len));
  };
  {
    Fd old_client(raw_connect(server.port(), 64, 65536, /*features=*/0));
    send_request(old_client.fd, not_found, 1, 0, 1);
    const auto [status, message] = error_reply(old_client.fd);
    CHECK(status == static_cast<uint16_t>(slotrpc::StatusCode::kInternal));
    CHECK(message == "NOT_FOUND: no such key");
    // A first-version code goes as it is.
    send_request(old_client.fd, exhausted, 2, 1, 1);
    const auto [status2, message2] = error_reply(old_client.fd);
    CHECK(status2 == static_cast<uint16_t>(slotrpc::StatusCode::kResourceExhausted));
    CHECK(message2 == "full");
  }
  {
    Fd new_client(raw_connect(server.port(), 64, 65536, core::kFeatureStatusCodes));
    send_request(new_client.fd, not_found, 1, 0, 1);
    const auto [status, message] = error_reply(new_client.fd);
    CHECK(status == static_cast<uint16_t>(slotrpc::StatusCode::kNotFound));
    CHECK(message == "no such key");
  }
}
