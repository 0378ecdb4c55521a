// Integration over verbs: a hostile verbs peer against a server that also
// serves a well-behaved verbs Channel the whole time (tests/adversarial_test.cc
// is the TCP twin).
//
// The raw peer does the real handshake by hand (a Hello proposing verbs with
// its own QpInfo as the extension, over TCP) and then is a queue pair of its
// own (a VerbsLink of this process's VerbsTransport, the same code the
// library uses, driven directly): it writes what a Channel never would into
// the server's slots with RDMA WRITE_WITH_IMM, and sends control headers.
// For each attack the test asserts what the server does to the attacker's
// session (closes it, naming the reason in its log line, or answers it), and
// that nothing else is touched: no other session is closed, an idle
// bystander Channel still calls, and the steady Channel, calling from a
// thread of its own, completes every call OK.
//
// What applies over verbs, and what does not:
//   * garbage after the handshake: a message with random bytes in a slot;
//     also what only verbs has: an immediate naming a slot outside the ring,
//     and a write longer than a slot (both reach the server's link, which
//     fails it before the core sees the message);
//   * a write into a slot without its credit (the slot not armed);
//   * stale and backward generations; a CANCEL of a previous generation;
//   * reply-type frames to the server, in a slot and on the control lane;
//   * one request id in two slots; cancels for unknown calls;
//   * a handshake whose verbs extension is malformed (size, magic, version,
//     MTU code, QP number, ring address, ring geometry): refused in the
//     HelloReply.
// Not over verbs:
//   * slowloris (a header promising bytes that never come, or trickled one
//     byte at a time): a WRITE_WITH_IMM lands whole or not at all, and the
//     receiver sees it only by its completion, so there is no partial frame
//     to hold a session open with;
//   * length-prefix lies: there is no prefix; the length is the NIC's
//     byte_len, checked against the slot size (the case above);
//   * garbage instead of a Hello: the handshake is TCP on both transports,
//     and the acceptor is the same code, covered by adversarial_test.
//
// Every wait is bounded (a condition polled with a deadline, never a
// sleep).  Needs an RDMA device: run by the `rxe` suite.
#include "verbs_test_util.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <array>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "../adversary_util.h"
#include "../raw_tcp_client.h"
#include "core/handshake.h"
#include "base/logging.h"
#include "core/wire_format.h"
#include "rpc/connector.h"
#include "test_messages_generated.h"
#include "transport/verbs/verbs_transport.h"

int main(int argc, char** argv) { return verbs_test::main(argc, argv); }

namespace {

using namespace std::chrono_literals;
using adversary::CaptureSink;
using adversary::contains;
using adversary::SteadyClient;
using slotrpc::Channel;
using slotrpc::Config;
using slotrpc::Reply;
using slotrpc::Server;
using slotrpc::ServerCall;
using slotrpc::ServiceDefinition;
using slotrpc::Status;
using slotrpc::StatusCode;
using slotrpc::TransportKind;
using slotrpc::test::Ping;
using slotrpc::test::Pong;
using slotrpc::transport::Access;
using slotrpc::transport::Completion;
using slotrpc::transport::Delivery;
using slotrpc::transport::MemoryRegion;
using slotrpc::transport::Outgoing;
using slotrpc::transport::verbs::QpInfo;
using slotrpc::transport::verbs::VerbsLink;
using slotrpc::transport::verbs::VerbsTransport;
using Clock = std::chrono::steady_clock;
using test_process::wait_until;
namespace core = slotrpc::core;
namespace rpc = slotrpc::rpc;
namespace verbs = slotrpc::transport::verbs;

constexpr uint32_t kEcho = slotrpc::method_id("slotrpc.test.VerbsAdversary.Echo");
constexpr uint32_t kSlow = slotrpc::method_id("slotrpc.test.VerbsAdversary.Slow");

// The raw peer's rings: small, so each attack costs little to set up.
constexpr uint32_t kSlots = 16;
constexpr uint32_t kSlotSize = 4096;

using adversary::ms_since;
using adversary::ping_bytes;

// --------------------------------------------------------------- the server

// Calls of Slow that have started (the handler runs, its slot is busy).
std::atomic<int> g_slow_started{0};

ServiceDefinition make_service() { return adversary::make_service("slotrpc.test.VerbsAdversary", &g_slow_started); }

Config test_config() {
  auto c = Config{}.with_environment();
  REQUIRE_MESSAGE(c.ok(), c.status().to_string());
  Config cfg = c.value();
  cfg.transport = TransportKind::kVerbs;
  cfg.slot_count = 64;
  cfg.slot_size = 8192;
  // Nothing here depends on the peer timeout (no slowloris over verbs): a
  // long one, so a raw peer that answers no PING is never closed for
  // silence in the slow emulated VM.
  cfg.keepalive_ms = 500;
  cfg.peer_timeout_ms = 30000;
  return cfg;
}

// ----------------------------------------------------------- the raw peer

// The Hello and its verbs extension as a peer sends them; a case may break
// either before they go out.
struct HelloBytes {
  core::Hello hello;
  std::vector<std::byte> extension;
};

// A verbs peer driven by hand: its own queue pair (a VerbsLink) with a
// receive ring and a send ring of kSlots x kSlotSize, connected to the
// server through the real handshake.
class RawVerbsPeer {
 public:
  RawVerbsPeer(VerbsTransport& t, const std::string& name) : t_(t) {
    auto l = t.create_link(name, kSlots);
    REQUIRE_MESSAGE(l.ok(), l.status().to_string());
    link_ = std::move(l).value();
    recv_.assign(size_t{kSlots} * kSlotSize, std::byte{0});
    send_.assign(size_t{kSlots} * kSlotSize, std::byte{0});
    auto r = link_->register_memory(recv_, Access::kRemoteWrite);
    REQUIRE_MESSAGE(r.ok(), r.status().to_string());
    recv_mr_ = r.value();
    auto s = link_->register_memory(send_, Access::kLocalSend);
    REQUIRE_MESSAGE(s.ok(), s.status().to_string());
    send_mr_ = s.value();
    const Status st = link_->attach(recv_mr_, send_mr_, kSlots, kSlotSize, this);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    for (uint16_t i = 0; i < kSlots; ++i) link_->arm(i);
  }
  ~RawVerbsPeer() {
    if (fd_ >= 0) ::close(fd_);
    link_->deregister(recv_mr_);
    link_->deregister(send_mr_);
    link_.reset();
    // What the destroyed queue pair still had in the shared completion
    // queue is dropped with it (its wr ids name a retired link).
    std::array<Completion, 16> buf;
    while (t_.poll(buf) > 0) {
    }
  }
  RawVerbsPeer(const RawVerbsPeer&) = delete;
  RawVerbsPeer& operator=(const RawVerbsPeer&) = delete;

  // The Hello a well-behaved client sends for these rings.
  HelloBytes hello() const {
    HelloBytes h;
    h.hello.transport = core::WireTransport::kVerbs;
    h.hello.slot_count = kSlots;
    h.hello.slot_size = kSlotSize;
    h.extension.resize(verbs::kQpInfoSize);
    verbs::encode_qp_info(link_->local_info(), h.extension.data());
    h.hello.extension_len = static_cast<uint32_t>(h.extension.size());
    return h;
  }

  // Sends `h` to the server at `port` and reads its HelloReply; `message`
  // and `extension` get the reply's.
  core::HelloReply handshake(uint16_t port, const HelloBytes& h, std::string* message,
                             std::vector<std::byte>* extension) {
    fd_ = raw_tcp::tcp_connect(port);
    peer_ = rpc::local_name(fd_);  // how the server names this session
    const auto deadline = Clock::now() + 10s;
    std::vector<std::byte> out(core::kHelloSize + h.extension.size());
    core::encode_hello(h.hello, out.data());
    std::copy(h.extension.begin(), h.extension.end(), out.begin() + core::kHelloSize);
    Status st = rpc::write_all(fd_, out, deadline);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    std::array<std::byte, core::kHelloSize> buf{};
    st = rpc::read_exact(fd_, buf, deadline);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    auto reply = core::decode_hello_reply(buf.data());
    REQUIRE_MESSAGE(reply.ok(), reply.status().to_string());
    message->assign(reply->message_len, '\0');
    st = rpc::read_exact(fd_, std::as_writable_bytes(std::span(*message)), deadline);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    extension->resize(reply->extension_len);
    st = rpc::read_exact(fd_, *extension, deadline);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    return reply.value();
  }

  // The real handshake, then the queue pair connected to the server's.
  void connect(uint16_t port) {
    std::string message;
    std::vector<std::byte> ext;
    const core::HelloReply r = handshake(port, hello(), &message, &ext);
    REQUIRE_MESSAGE(r.status == 0, "refused: " << message);
    REQUIRE(r.transport == core::WireTransport::kVerbs);
    REQUIRE(r.slot_count == kSlots);
    REQUIRE(r.slot_size == kSlotSize);
    auto info = verbs::decode_qp_info(ext);
    REQUIRE_MESSAGE(info.ok(), info.status().to_string());
    server_info = info.value();
    const Status st = link_->connect(server_info, fd_, "server");
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    fd_ = -1;  // the link owns it now: EOF on it fails the link
  }
  QpInfo server_info;  // the server's end, from its HelloReply

  const std::string& peer() const { return peer_; }
  VerbsLink& link() { return *link_; }

  // `bytes` in send slot `slot` of ours, written into the server's slot
  // `slot` with the immediate (slot, generation).
  void send_slot(uint16_t slot, uint32_t generation, const std::vector<std::byte>& bytes) {
    REQUIRE(bytes.size() <= kSlotSize);
    std::byte* p = send_.data() + size_t{slot} * kSlotSize;
    std::memcpy(p, bytes.data(), bytes.size());
    const Outgoing o{p, static_cast<uint32_t>(bytes.size()), core::make_imm(slot, generation), Delivery::kSlot};
    link_->post(std::span<const Outgoing>(&o, 1));
  }
  void send_request(uint32_t method, uint64_t request_id, uint16_t slot, uint32_t generation,
                    uint32_t sleep_ms = 0) {
    const auto payload = ping_bytes(request_id, "raw-" + std::to_string(request_id), sleep_ms);
    send_slot(slot, generation,
              raw_tcp::body_of(raw_tcp::request_header(method, request_id, slot, generation, payload.size()), payload));
  }
  // Control headers, in one post.
  void send_control(const std::vector<core::Header>& headers) {
    std::vector<std::array<std::byte, core::kHeaderSize>> bytes(headers.size());
    std::vector<Outgoing> batch;
    for (size_t i = 0; i < headers.size(); ++i) {
      core::encode_header(headers[i], bytes[i].data());
      batch.push_back(Outgoing{bytes[i].data(), core::kHeaderSize, core::make_imm(0, 0), Delivery::kControl});
    }
    link_->post(batch);  // copies control headers before it returns
  }

  // Polls this process's transport until `done` (completions of this peer
  // are kept; the server's PINGs are counted and dropped).
  bool pump(const std::function<bool()>& done, std::chrono::milliseconds limit) {
    return wait_until(
        [&] {
          std::array<Completion, 16> buf;
          const size_t n = t_.poll(buf);
          for (size_t i = 0; i < n; ++i) {
            if (buf[i].context != this) continue;  // a peer torn down in this loop
            if (buf[i].kind == Completion::Kind::kLinkDown) down_ = true;
            if (buf[i].kind == Completion::Kind::kMessage) messages_.push_back(buf[i]);
          }
          return done();
        },
        limit, 0ms);
  }

  // The next reply (in arrival order); checks it answers (slot,
  // generation, request_id) with the Pong of that request, and re-arms the
  // slot for the next one.
  void expect_reply(uint16_t slot, uint32_t generation, uint64_t request_id,
                    std::chrono::milliseconds limit = 10000ms) {
    REQUIRE_MESSAGE(pump([&] { return !messages_.empty() || down_; }, limit),
                    "no reply within " << limit.count() << " ms");
    REQUIRE_MESSAGE(!messages_.empty(), "the link went down: " << link_->down_reason());
    const Completion c = messages_.front();
    messages_.erase(messages_.begin());
    CHECK(c.slot == slot);
    CHECK(core::imm_generation(c.imm) == static_cast<uint16_t>(generation));
    const std::byte* body = recv_.data() + size_t{c.slot} * kSlotSize;
    const core::Header r = core::decode_header(body);
    REQUIRE(core::validate_header(r, c.length, kSlots, kSlotSize, c.slot) == core::HeaderError::kOk);
    CHECK(r.kind() == core::Kind::kReply);
    CHECK(r.request_id == request_id);
    CHECK(r.generation == generation);
    flatbuffers::Verifier v(reinterpret_cast<const uint8_t*>(body) + core::kHeaderSize, r.payload_len);
    REQUIRE(v.VerifyBuffer<Pong>(nullptr));
    const Pong* pong = flatbuffers::GetRoot<Pong>(body + core::kHeaderSize);
    CHECK(pong->seq() == request_id);
    link_->arm(c.slot);
  }
  void round_trip(uint16_t slot, uint32_t generation, uint64_t request_id) {
    send_request(kEcho, request_id, slot, generation);
    expect_reply(slot, generation, request_id);
  }
  // True once the server has closed this session: the link fails when the
  // handshake's connection, which the server keeps for this, reaches EOF
  // (or its queue pair reports the error).
  bool closed_by_server(std::chrono::milliseconds limit) {
    return pump([&] { return down_; }, limit);
  }
  // The control headers posted so far have all been handed to the network
  // (none waits in the link's backlog).
  bool sent_all_control(uint64_t n, std::chrono::milliseconds limit) {
    return pump([&] { return link_->stats().control_sends >= n || down_; }, limit) && !down_;
  }
  bool down() const { return down_; }

  // Test hook of the link: `length` bytes from our send slot 0 to the
  // server's slot `at_slot` with an immediate of (imm_slot, 1).
  void raw_write(uint16_t at_slot, uint32_t length, uint16_t imm_slot, const QpInfo& server) {
    const Status st = link_->post_raw_write(send_.data(), length, server.ring_addr + uint64_t{at_slot} * kSlotSize,
                                            server.ring_rkey, core::make_imm(imm_slot, 1));
    REQUIRE_MESSAGE(st.ok(), st.to_string());
  }

 private:
  VerbsTransport& t_;
  std::unique_ptr<VerbsLink> link_;
  std::vector<std::byte> recv_, send_;
  MemoryRegion recv_mr_{}, send_mr_{};
  int fd_ = -1;
  std::string peer_;
  bool down_ = false;
  std::vector<Completion> messages_;
};

// The server, its log, a steady verbs Channel calling throughout, an idle
// bystander verbs Channel, and the transport the raw peers live on.
struct Arena {
  std::shared_ptr<CaptureSink> log = std::make_shared<CaptureSink>();
  std::unique_ptr<Server> server;
  uint16_t port = 0;
  std::unique_ptr<SteadyClient> steady;
  std::unique_ptr<Channel> bystander;
  uint64_t bystander_seq = 0;
  std::unique_ptr<VerbsTransport> raw_transport;

  Arena() {
    // Session closes are logged at info; the test environment sets warn.
    ::setenv("SLOTRPC_LOG_LEVEL", "info", 1);
    slotrpc::base::log().sinks().push_back(log);
    const Config cfg = test_config();
    server = std::make_unique<Server>(cfg);
    REQUIRE(server->add_service(make_service()).ok());
    const Status st = server->start("127.0.0.1:0");
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    port = server->port();
    const std::string address = "127.0.0.1:" + std::to_string(port);
    steady = std::make_unique<SteadyClient>(address, kEcho, cfg);
    REQUIRE(steady->channel().transport() == TransportKind::kVerbs);
    auto b = Channel::connect(address, cfg);
    REQUIRE_MESSAGE(b.ok(), b.status().to_string());
    bystander = std::move(b).value();
    REQUIRE(bystander->transport() == TransportKind::kVerbs);
    REQUIRE(wait_until([&] { return server->session_count() == 2; }));
    bystander_call();
    REQUIRE(steady->progresses());
    auto t = VerbsTransport::create(cfg);
    REQUIRE_MESSAGE(t.ok(), t.status().to_string());
    raw_transport = std::move(t).value();
  }
  ~Arena() {
    steady.reset();
    bystander.reset();
    server.reset();
    raw_transport.reset();
    auto& sinks = slotrpc::base::log().sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), log), sinks.end());
    ::setenv("SLOTRPC_LOG_LEVEL", "warn", 1);
  }

  std::unique_ptr<RawVerbsPeer> raw_peer() {
    auto p = std::make_unique<RawVerbsPeer>(*raw_transport, "raw verbs peer");
    p->connect(port);
    REQUIRE(wait_until([&] { return server->session_count() == 3; }));
    return p;
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

  size_t mark() { return log->lines().size(); }

  // The attack is over: the server has exactly the steady Channel's and the
  // bystander's sessions, and both work.
  void check_others_unharmed() {
    CHECK(wait_until([&] { return server->session_count() == 2; }, 10000ms));
    bystander_call();
    CHECK_MESSAGE(steady->progresses(), "the well-behaved channel stalled or failed");
    const auto f = steady->failures();
    CHECK_MESSAGE(f.empty(), (f.empty() ? "" : f.front()));
  }

  // The server closed the attacker's session (its link went down), its log
  // says so naming the attacker, `reason` among the words, and no other
  // session was closed.
  void check_closed_alone(RawVerbsPeer& p, const std::string& reason, size_t from) {
    CHECK_MESSAGE(p.closed_by_server(10000ms), "the server did not close the attacker's session");
    CHECK(wait_until([&] { return server->session_count() == 2; }, 10000ms));
    std::vector<std::string> mine;
    const bool named = wait_until(
        [&] {
          mine = adversary::closes_of(*log, p.peer(), from);
          for (const auto& l : mine)
            if (contains(l, reason)) return true;
          return false;
        },
        5000ms);
    std::string all;
    for (const auto& l : mine) all += "\n  " + l;
    CHECK_MESSAGE(!mine.empty(), "no log line names " << p.peer());
    CHECK_MESSAGE(named, "expected '" << reason << "' in the close lines of " << p.peer() << ":" << all);
    size_t others = adversary::close_lines(*log, from);
    for (const auto& l : mine)
      if (contains(l, "closed") || contains(l, "closing")) --others;
    CHECK_MESSAGE(others == 0, others << " close line(s) about other sessions");
  }
  // The attacker's session is still open and nothing was closed.
  void check_nothing_closed(RawVerbsPeer& p, size_t from) {
    CHECK_FALSE(p.closed_by_server(50ms));
    CHECK(adversary::close_lines(*log, from) == 0);
  }
};

}  // namespace

// ================================================================ the cases

TEST_CASE("verbs adversary: garbage in a slot closes that session only") {
  Arena a;
  std::mt19937 rng(777);
  for (int round = 0; round < 6; ++round) {
    CAPTURE(round);
    const size_t lines_before = a.mark();
    auto p = a.raw_peer();
    p->round_trip(0, 1, 1);
    std::vector<std::byte> junk(64 + round * 300);
    for (auto& b : junk) b = static_cast<std::byte>(rng() & 0xff);
    p->send_slot(1, 1, junk);
    a.check_closed_alone(*p, "closed", lines_before);
    a.check_others_unharmed();
  }
}

TEST_CASE("verbs adversary: an immediate outside the ring, or a write longer than a slot, fails that link") {
  // Only verbs has these: the bytes land (inside the peer's own ring, which
  // is all its rkey reaches), and the server's link checks the completion
  // before the core sees it.
  Arena a;
  SUBCASE("immediate naming slot 99 of 16") {
    const size_t lines_before = a.mark();
    auto p = a.raw_peer();
    p->round_trip(0, 1, 1);
    p->raw_write(1, 64, 99, p->server_info);
    a.check_closed_alone(*p, "outside the ring", lines_before);
    a.check_others_unharmed();
  }
  SUBCASE("two slots' worth of bytes at slot 1") {
    const size_t lines_before = a.mark();
    auto p = a.raw_peer();
    p->round_trip(0, 1, 1);
    p->raw_write(1, 2 * kSlotSize, 1, p->server_info);
    a.check_closed_alone(*p, "bytes into a slot of", lines_before);
    a.check_others_unharmed();
  }
}

TEST_CASE("verbs adversary: a request into a slot without its credit (still busy) closes that session") {
  Arena a;
  const size_t lines_before = a.mark();
  auto p = a.raw_peer();
  p->round_trip(0, 1, 1);
  const int started = g_slow_started.load();
  p->send_request(kSlow, 2, 1, 1, 5000);  // slot 1 busy for 5 s
  // Once its handler runs: a write that lands before the server has seen
  // the first one's completion overwrites it in place (the bytes are in the
  // ring before either completion is polled), and the server closes the
  // session on the first one's header instead ("payload length
  // disagrees"), so wait until the slot is certainly busy.
  REQUIRE(wait_until([&] { return g_slow_started.load() > started; }));
  p->send_request(kEcho, 3, 1, 2);        // and written again
  a.check_closed_alone(*p, "not armed", lines_before);
  a.check_others_unharmed();
}

TEST_CASE("verbs adversary: stale and backward generations") {
  Arena a;
  const size_t lines_before = a.mark();
  auto p = a.raw_peer();
  SUBCASE("a request reusing a finished generation, or going backwards, is answered as sent") {
    p->round_trip(0, 5, 1);
    p->round_trip(0, 5, 2);  // the same generation again
    p->round_trip(0, 3, 3);  // backwards
    p->round_trip(0, 0, 4);  // zero
  }
  SUBCASE("a CANCEL naming the previous generation of a running call does not cancel it") {
    p->round_trip(2, 1, 1);
    const auto t0 = Clock::now();
    p->send_request(kSlow, 2, 2, 2, 600);
    p->send_control({raw_tcp::control_header(core::Kind::kCancel, 2, 1, 1)});
    p->expect_reply(2, 2, 2);
    CHECK(ms_since(t0) >= 550);  // ran its 600 ms
    // Control: the right generation does cancel (the handler returns early).
    const auto t1 = Clock::now();
    p->send_request(kSlow, 3, 2, 3, 5000);
    p->send_control({raw_tcp::control_header(core::Kind::kCancel, 2, 3, 3)});
    p->expect_reply(2, 3, 3);
    CHECK(ms_since(t1) < 4000);
  }
  a.check_nothing_closed(*p, lines_before);
  CHECK(adversary::closes_of(*a.log, p->peer(), lines_before).empty());
  p.reset();  // its session ends ("peer closed the connection"): the server has 2 again
  a.check_others_unharmed();
}

TEST_CASE("verbs adversary: reply-type frames sent to a server close that session") {
  Arena a;
  for (const adversary::ReplyTypeCase& k : adversary::kReplyTypeCases) {
    CAPTURE(k.name);
    const size_t lines_before = a.mark();
    auto p = a.raw_peer();
    p->round_trip(0, 1, 1);
    if (k.control) {
      p->send_control({raw_tcp::control_header(k.kind, 0, 1, 1)});
    } else {
      const auto payload = ping_bytes(2, "x");
      auto h = raw_tcp::request_header(kEcho, 2, 1, 1, payload.size());
      h.flags = static_cast<uint8_t>(k.kind);
      if (k.kind == core::Kind::kError) h.status = static_cast<uint16_t>(StatusCode::kInternal);
      p->send_slot(1, 1, raw_tcp::body_of(h, payload));
    }
    a.check_closed_alone(*p, k.reason, lines_before);
    a.check_others_unharmed();
  }
}

TEST_CASE("verbs adversary: one request id in two slots is answered in each slot") {
  // request_id is the client's key for matching; the server keys on the
  // slot, so a client reusing an id gets both answers, each in its slot.
  Arena a;
  const size_t lines_before = a.mark();
  auto p = a.raw_peer();
  p->round_trip(0, 1, 1);
  p->send_request(kSlow, 7, 2, 1, 200);
  p->send_request(kEcho, 7, 3, 1);
  p->expect_reply(3, 1, 7);  // the echo first, the slow one after
  p->expect_reply(2, 1, 7);
  p->round_trip(2, 2, 8);  // both slots serve again
  p->round_trip(3, 2, 9);
  a.check_nothing_closed(*p, lines_before);
  p.reset();
  a.check_others_unharmed();
}

TEST_CASE("verbs adversary: cancels for unknown calls are harmless") {
  Arena a;
  const size_t lines_before = a.mark();
  auto p = a.raw_peer();
  p->round_trip(0, 1, 1);
  // A call that must not be disturbed, running in slot 9.
  const auto t0 = Clock::now();
  p->send_request(kSlow, 2, 9, 4, 600);
  std::mt19937 rng(4242);
  // 300 cancels in posts of 30, each post handed to the network before the
  // next (the link's backlog is bounded by what the credit rules allow:
  // 5 x 16 + 64 messages for this peer's 16 slots).
  const uint64_t control_before = p->link().stats().control_sends;
  uint64_t posted = 0;
  for (int batch = 0; batch < 10; ++batch) {
    std::vector<core::Header> cancels;
    for (int i = 0; i < 30; ++i) {
      uint16_t slot = static_cast<uint16_t>(rng() % kSlots);
      uint32_t gen = rng() % 1000;
      if (slot == 9 && gen == 4) gen = 5;  // not the running call
      cancels.push_back(raw_tcp::control_header(core::Kind::kCancel, slot, gen, 1000 + rng() % 100000));
    }
    p->send_control(cancels);
    posted += cancels.size();
    REQUIRE_MESSAGE(p->sent_all_control(control_before + posted, 10000ms),
                    "cancels not sent: " << p->link().down_reason());
  }
  p->expect_reply(9, 4, 2);
  CHECK(ms_since(t0) >= 550);  // not cancelled
  p->round_trip(0, 2, 3);     // and the session serves on
  a.check_nothing_closed(*p, lines_before);
  p.reset();
  a.check_others_unharmed();
}

TEST_CASE("verbs adversary: a malformed verbs extension is refused in the HelloReply") {
  Arena a;
  struct Case {
    const char* name;
    std::function<void(HelloBytes&)> spoil;
    const char* reason;
  };
  auto put32 = [](std::vector<std::byte>& e, size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) e[at + i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
  };
  const Case cases[] = {
      {"20 bytes", [](HelloBytes& h) { h.extension.resize(20); }, "20 bytes, expected"},
      {"no extension", [](HelloBytes& h) { h.extension.clear(); }, "0 bytes, expected"},
      {"bad magic", [&](HelloBytes& h) { put32(h.extension, 0, 0x12345678); }, "bad magic"},
      {"version 99", [](HelloBytes& h) { h.extension[4] = std::byte{99}; h.extension[5] = std::byte{0}; },
       "version 99"},
      {"MTU code 0", [](HelloBytes& h) { h.extension[6] = std::byte{0}; }, "unknown path MTU code 0"},
      {"QP number 0", [&](HelloBytes& h) { put32(h.extension, 8, 0); }, "invalid QP number 0"},
      {"PSN over 24 bits", [&](HelloBytes& h) { put32(h.extension, 12, 0x01000000); }, "exceeds 24 bits"},
      {"ring address 0", [&](HelloBytes& h) { put32(h.extension, 40, 0); put32(h.extension, 44, 0); },
       "no receive ring address"},
      {"ring geometry unlike the Hello's", [&](HelloBytes& h) { put32(h.extension, 48, kSlots / 2); },
       "ring geometry differs"},
  };
  for (const Case& k : cases) {
    CAPTURE(k.name);
    RawVerbsPeer p(*a.raw_transport, "raw verbs peer");
    HelloBytes h = p.hello();
    k.spoil(h);
    h.hello.extension_len = static_cast<uint32_t>(h.extension.size());
    std::string message;
    std::vector<std::byte> ext;
    const core::HelloReply r = p.handshake(a.port, h, &message, &ext);
    CHECK(r.status == static_cast<uint16_t>(StatusCode::kUnavailable));
    CHECK_MESSAGE(contains(message, k.reason), message);
    CHECK(ext.empty());
    a.check_others_unharmed();
  }
}
