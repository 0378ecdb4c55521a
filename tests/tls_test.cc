// TLS on TCP sessions (Config::tls; docs/design.md, "TLS"): calls of every
// kind over it, mutual TLS and the identity the server learns, the
// refusals (no certificate, another CA, expired, wrong name, plain vs TLS
// both ways), reloading the certificate, the settings' errors, and the
// handshake's defences (idle sockets, slowloris, junk) over TLS.
//
// Certificates are made for each test by tests/tls_util.h.  Every wait is
// bounded.
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <slotrpc/slotrpc.h>

#include "adversary_util.h"
#include "env_var.h"
#include "log_capture.h"
#include "process_util.h"
#include "raw_tcp_client.h"
#include "rpc/connector.h"
#include "test_messages_generated.h"
#include "tls_util.h"

namespace {

using namespace std::chrono_literals;
using slotrpc::CallOptions;
using slotrpc::Channel;
using slotrpc::Config;
using slotrpc::RawReply;
using slotrpc::Server;
using slotrpc::ServerCall;
using slotrpc::Status;
using slotrpc::StatusCode;
using slotrpc::TlsClientAuth;
using slotrpc::TransportKind;
using slotrpc::test::Ping;
using slotrpc::test::Pong;
using test_process::wait_until;

constexpr const char* kService = "slotrpc.test.Tls";
const uint32_t kEcho = slotrpc::method_id("slotrpc.test.Tls.Echo");
const uint32_t kCount = slotrpc::method_id("slotrpc.test.Tls.Count");
const uint32_t kFlip = slotrpc::method_id("slotrpc.test.Tls.Flip");

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The test's own settings only: no SLOTRPC_* from the suite's environment
// (its SLOTRPC_LOG_LEVEL=warn would hide the session lines read below).
const bool kNoOverlay = (slotrpc::set_environment_overlay(false), true);

slotrpc::ServiceDefinition make_service() {
  slotrpc::ServiceDefinition svc = adversary::make_service(kService);
  // Count: a stream of Pong{seq = 0..n-1}, n = request.seq.
  svc.add_server_stream<Ping, Pong>(
      "Count", [](const Ping& req, slotrpc::ServerWriter<Pong>& out, ServerCall&) {
        for (uint64_t i = 0; i < req.seq(); ++i) {
          if (!out.Write([i](flatbuffers::FlatBufferBuilder& fbb) { return slotrpc::test::CreatePong(fbb, i); }))
            return out.error();
        }
        return Status();
      });
  // Flip: reads incoming bulk segment 0, writes it XOR 0xff to outgoing 0.
  svc.add_method("Flip", [](ServerCall& call) -> Status {
    std::vector<std::byte> buf(call.bulk_in(0));
    if (Status st = call.read_bulk(0, buf); !st.ok()) return st;
    for (auto& b : buf) b ^= std::byte{0xff};
    if (Status st = call.write_bulk(0, buf); !st.ok()) return st;
    call.reply().Finish(slotrpc::test::CreatePong(call.reply(), buf.size()));
    return Status();
  });
  return svc;
}

Config server_config(const tls_test::Pki& p, TlsClientAuth auth = TlsClientAuth::kNone) {
  Config c;
  c.transport = TransportKind::kTcp;
  c.slot_count = 16;
  c.slot_size = 256 * 1024;
  c.tls = true;
  c.tls_cert = p.server.cert;
  c.tls_key = p.server.key;
  c.tls_ca = p.ca;
  c.tls_client_auth = auth;
  return c;
}

Config client_config(const tls_test::Pki& p, const tls_test::KeyPair* cert = nullptr) {
  Config c;
  c.transport = TransportKind::kTcp;
  c.slot_count = 16;
  c.slot_size = 256 * 1024;
  c.connect_timeout_ms = 3000;
  c.tls = true;
  c.tls_ca = p.ca;
  if (cert != nullptr) {
    c.tls_cert = cert->cert;
    c.tls_key = cert->key;
  }
  return c;
}

struct TlsServer {
  explicit TlsServer(const Config& c) : server(c) {
    REQUIRE(server.add_service(make_service()).ok());
    Status st = server.start("127.0.0.1:0");
    REQUIRE_MESSAGE(st.ok(), st.to_string());
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(server.port()); }
  Server server;
};

std::unique_ptr<Channel> connect_ok(const std::string& address, const Config& c) {
  auto ch = Channel::connect(address, c);
  REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
  return std::move(ch).value();
}

// An Echo of `payload_bytes`; the reply is checked.
void echo(Channel& ch, uint64_t seq, size_t payload_bytes = 64) {
  std::vector<uint8_t> payload(payload_bytes);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 7 + seq);
  auto f = ch.call_typed<Pong>(kEcho, [&](flatbuffers::FlatBufferBuilder& fbb) {
    fbb.Finish(slotrpc::test::CreatePing(fbb, seq, fbb.CreateString("tls"), fbb.CreateVector(payload)));
  });
  REQUIRE(f.wait_for(10s));
  auto r = f.get();
  REQUIRE_MESSAGE(r.ok(), r.status().to_string());
  CHECK(r->seq() == seq);
  REQUIRE(r->payload() != nullptr);
  CHECK(std::equal(payload.begin(), payload.end(), r->payload()->begin(), r->payload()->end()));
}

// A TCP socket to `port`, connected, blocking.
int tcp_to(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

// Waits (bounded) until the server closes `fd`: true when it did.
bool closed_by_server(int fd, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return true;
  }
}

}  // namespace

TEST_CASE("TLS: unary, server-streaming and bulk calls") {
  tls_test::Pki pki;
  tls_test::make_pki(pki);
  TlsServer ts(server_config(pki));
  auto ch = connect_ok(ts.address(), client_config(pki));
  CHECK(ch->transport() == TransportKind::kTcp);
  for (uint64_t i = 0; i < 50; ++i) echo(*ch, i, 64);
  echo(*ch, 1000, 200 * 1024);  // many records, read straight into the slot

  auto reader = ch->server_stream<Ping, Pong>(
      kCount, [](flatbuffers::FlatBufferBuilder& fbb) { return slotrpc::test::CreatePing(fbb, 2000); });
  uint64_t expected = 0;
  while (auto msg = reader.Read()) {
    REQUIRE(msg->ok());
    CHECK(msg->message()->seq() == expected);
    ++expected;
  }
  CHECK(expected == 2000);
  CHECK(reader.status().ok());

  for (const size_t n : {size_t{1}, size_t{100'000}, size_t{5 << 20}}) {
    CAPTURE(n);
    std::vector<std::byte> src(n), dst(n);
    for (size_t i = 0; i < n; ++i) src[i] = static_cast<std::byte>(i * 13 + 1);
    auto f = slotrpc::raw::call(*ch, kFlip, [](flatbuffers::FlatBufferBuilder& fbb) { fbb.Finish(slotrpc::test::CreatePing(fbb, 0)); },
                      CallOptions().send_bulk(std::span<const std::byte>(src)).receive_bulk(std::span<std::byte>(dst)));
    REQUIRE(f.wait_for(30s));
    RawReply r = f.get();
    REQUIRE_MESSAGE(r.ok(), r.status().to_string());
    CHECK(r.bulk_received(0) == n);
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) bad += dst[i] != (src[i] ^ std::byte{0xff});
    CHECK(bad == 0);
  }
}

TEST_CASE("mTLS: the client certificate's subject and SANs reach the server session") {
  tls_test::Pki pki;
  tls_test::make_pki(pki);
  slotrpc::test::LogCapture log;
  TlsServer ts(server_config(pki, TlsClientAuth::kRequired));
  auto ch = connect_ok(ts.address(), client_config(pki, &pki.client));
  echo(*ch, 1);
  std::vector<std::string> lines;
  CHECK(wait_until([&] { return !(lines = log.matching({"TLS session with"})).empty(); }));
  REQUIRE(lines.size() == 1);
  CHECK(contains(lines[0], "client certificate O=slotrpc tests,CN=client-1"));
  CHECK(contains(lines[0], "DNS:client-1.example"));
  CHECK(contains(lines[0], "URI:spiffe://slotrpc.test/client-1"));
}

TEST_CASE("TLS: a client whose certificate the server does not take is refused with UNAUTHENTICATED") {
  tls_test::Pki pki;
  tls_test::make_pki(pki);
  slotrpc::test::LogCapture log;
  struct Case {
    const char* name;
    const tls_test::KeyPair* cert;
    const char* reason;  // in the client's error
    const char* logged;  // in the server's log line
  };
  const Case cases[] = {
      {"no certificate", nullptr, "certificate required", "did not return a certificate"},
      {"another CA", &pki.other_client, "unknown ca", "unable to get local issuer certificate"},
      {"expired", &pki.expired, "certificate expired", "certificate has expired"},
  };
  for (const Case& c : cases) {
    const std::string name = c.name;
    CAPTURE(name);
    // A server each: its handshake warnings are rate-limited (one a second).
    TlsServer ts(server_config(pki, TlsClientAuth::kRequired));
    const size_t from = log.lines().size();
    const auto t0 = std::chrono::steady_clock::now();
    auto ch = Channel::connect(ts.address(), client_config(pki, c.cert));
    REQUIRE_FALSE(ch.ok());
    CHECK(ms_since(t0) < 2000);  // refused, not timed out
    CHECK(ch.status().code() == StatusCode::kUnauthenticated);
    CHECK_MESSAGE(contains(ch.status().message(), c.reason), ch.status().message());
    CHECK(wait_until([&] {
      const auto lines = log.lines();
      for (size_t i = from; i < lines.size(); ++i)
        if (contains(lines[i], "refused session from") && contains(lines[i], c.logged)) return true;
      return false;
    }, 5000ms));
    // The server is fine: a good client still gets in.
    auto ok = connect_ok(ts.address(), client_config(pki, &pki.client));
    echo(*ok, 7);
  }
}

TEST_CASE("TLS: a server certificate of another CA, or of another name, is refused by the client") {
  tls_test::Pki pki;
  tls_test::make_pki(pki);
  TlsServer ts(server_config(pki));
  Config other = client_config(pki);
  other.tls_ca = pki.other_ca;
  auto ch = Channel::connect(ts.address(), other);
  REQUIRE_FALSE(ch.ok());
  CHECK(ch.status().code() == StatusCode::kUnauthenticated);
  CHECK_MESSAGE(contains(ch.status().message(), "certificate verify failed"), ch.status().message());
  Config name = client_config(pki);
  name.tls_server_name = "db.example";
  ch = Channel::connect(ts.address(), name);
  REQUIRE_FALSE(ch.ok());
  CHECK(ch.status().code() == StatusCode::kUnauthenticated);
  CHECK_MESSAGE(contains(ch.status().message(), "hostname mismatch"), ch.status().message());
  name.tls_server_name = "localhost";  // a SAN of the certificate
  auto good = connect_ok(ts.address(), name);
  echo(*good, 3);
}

TEST_CASE("TLS: plain client to a TLS server and TLS client to a plain server fail at once, saying so") {
  tls_test::Pki pki;
  tls_test::make_pki(pki);
  {
    TlsServer ts(server_config(pki));
    Config plain;
    plain.transport = TransportKind::kTcp;
    plain.connect_timeout_ms = 5000;
    const auto t0 = std::chrono::steady_clock::now();
    auto ch = Channel::connect(ts.address(), plain);
    REQUIRE_FALSE(ch.ok());
    CHECK(ms_since(t0) < 2000);
    CHECK_MESSAGE(contains(ch.status().message(), "requires TLS"), ch.status().message());
  }
  {
    Config plain;
    plain.transport = TransportKind::kTcp;
    Server server(plain);
    REQUIRE(server.add_service(make_service()).ok());
    REQUIRE(server.start("127.0.0.1:0").ok());
    Config c = client_config(pki);
    c.connect_timeout_ms = 5000;
    const auto t0 = std::chrono::steady_clock::now();
    auto ch = Channel::connect("127.0.0.1:" + std::to_string(server.port()), c);
    REQUIRE_FALSE(ch.ok());
    CHECK(ms_since(t0) < 2000);
    CHECK_MESSAGE(contains(ch.status().message(), "does not speak TLS"), ch.status().message());
    CHECK_MESSAGE(contains(ch.status().message(), "TLS ClientHello on a plain port"), ch.status().message());
  }
}

TEST_CASE("TLS: reload_tls() serves new connections with the new certificate; open sessions stay") {
  tls_test::Pki pki;
  tls_test::make_pki(pki);
  // The server's files, which the test replaces.
  const std::string cert = (pki.dir / "live.crt").string();
  const std::string key = (pki.dir / "live.key").string();
  std::filesystem::copy_file(pki.server.cert, cert);
  std::filesystem::copy_file(pki.server.key, key);
  Config sc = server_config(pki);
  sc.tls_cert = cert;
  sc.tls_key = key;
  TlsServer ts(sc);
  auto before = connect_ok(ts.address(), client_config(pki));
  echo(*before, 1);

  // The certificate of the other CA replaces it.
  std::filesystem::copy_file(pki.other_server.cert, cert, std::filesystem::copy_options::overwrite_existing);
  std::filesystem::copy_file(pki.other_server.key, key, std::filesystem::copy_options::overwrite_existing);
  Status st = ts.server.reload_tls();
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  echo(*before, 2);  // the open session stays up
  auto old_trust = Channel::connect(ts.address(), client_config(pki));
  REQUIRE_FALSE(old_trust.ok());
  CHECK(old_trust.status().code() == StatusCode::kUnauthenticated);
  Config new_trust = client_config(pki);
  new_trust.tls_ca = pki.other_ca;
  auto after = connect_ok(ts.address(), new_trust);
  echo(*after, 3);

  // A bad key file: the reload fails naming it, the certificate stays.
  { std::ofstream(key, std::ios::trunc) << "not a key\n"; }
  st = ts.server.reload_tls();
  REQUIRE_FALSE(st.ok());
  CHECK_MESSAGE(contains(st.message(), "Config.tls_key (SLOTRPC_TLS_KEY) '" + key + "'"), st.message());
  auto still = connect_ok(ts.address(), new_trust);
  echo(*still, 4);
  echo(*before, 5);
}

TEST_CASE("TLS settings: bad values and unreadable files are named") {
  tls_test::Pki pki;
  tls_test::make_pki(pki);
  {
    slotrpc::set_environment_overlay(true);
    slotrpc::test::EnvVar v("SLOTRPC_TLS", "yes");
    slotrpc::test::EnvVar u("SLOTRPC_UNIX_PATH", "off");
    auto r = Config{}.with_environment();
    slotrpc::set_environment_overlay(false);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().message() == "invalid setting Config.tls (SLOTRPC_TLS)='yes': allowed one of off on");
  }
  {
    slotrpc::set_environment_overlay(true);
    slotrpc::test::EnvVar v("SLOTRPC_TLS_CLIENT_AUTH", "always");
    slotrpc::test::EnvVar u("SLOTRPC_UNIX_PATH", "off");
    auto r = Config{}.with_environment();
    slotrpc::set_environment_overlay(false);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().message() ==
          "invalid setting Config.tls_client_auth (SLOTRPC_TLS_CLIENT_AUTH)='always': allowed one of none optional required");
  }
  Config c = server_config(pki);
  c.tls_cert = (pki.dir / "missing.crt").string();
  Server s1(c);
  Status st = s1.start("127.0.0.1:0");
  REQUIRE_FALSE(st.ok());
  CHECK(st.code() == StatusCode::kInvalidArgument);
  CHECK_MESSAGE(contains(st.message(), "cannot load Config.tls_cert (SLOTRPC_TLS_CERT) '" + c.tls_cert + "'"),
                st.message());
  const bool says_why = contains(st.message(), "system lib") || contains(st.message(), "No such file");
  CHECK_MESSAGE(says_why, st.message());

  c = server_config(pki);
  c.tls_key = pki.client.key;  // another certificate's key
  Server s2(c);
  st = s2.start("127.0.0.1:0");
  REQUIRE_FALSE(st.ok());
  CHECK_MESSAGE(contains(st.message(), "does not belong to the certificate"), st.message());

  c = server_config(pki, TlsClientAuth::kRequired);
  c.tls_ca.clear();
  Server s3(c);
  st = s3.start("127.0.0.1:0");
  REQUIRE_FALSE(st.ok());
  CHECK_MESSAGE(contains(st.message(), "Config.tls_ca (SLOTRPC_TLS_CA)"), st.message());

  c = server_config(pki);
  c.tls_key.clear();
  CHECK(c.validate().message() ==
        "invalid setting Config.tls_key (SLOTRPC_TLS_KEY)='': allowed a PEM file path, since tls_cert is set");
}

TEST_CASE("TLS adversaries: idle sockets, slowloris ClientHellos and junk are closed; a TLS client is served throughout") {
  tls_test::Pki pki;
  tls_test::make_pki(pki);
  slotrpc::test::LogCapture log;
  Config sc = server_config(pki);
  // Long enough that "at once" (junk) and "at the deadline" (idle, a
  // trickle) stay apart on a loaded machine.
  sc.connect_timeout_ms = 1000;
  TlsServer ts(sc);
  adversary::SteadyClient steady(ts.address(), kEcho, client_config(pki));
  REQUIRE(steady.progresses());

  SUBCASE("an idle socket is closed after connect_timeout_ms") {
    const int fd = tcp_to(ts.server.port());
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(closed_by_server(fd, 5000ms));
    CHECK(ms_since(t0) >= 950);
    ::close(fd);
    CHECK(wait_until([&] { return !log.matching({"no complete hello within 1000 ms"}).empty(); }, 5000ms));
  }
  SUBCASE("a ClientHello sent a byte at a time is cut off at connect_timeout_ms") {
    const int fd = tcp_to(ts.server.port());
    const auto t0 = std::chrono::steady_clock::now();
    // A TLS record header and then a trickle: the handshake never completes.
    const unsigned char head[] = {0x16, 0x03, 0x01, 0x02, 0x00, 0x01};
    bool closed = false;
    for (size_t i = 0; i < 400 && !closed; ++i) {
      const unsigned char b = i < sizeof head ? head[i] : 0x00;
      if (::send(fd, &b, 1, MSG_NOSIGNAL) != 1) break;
      closed = closed_by_server(fd, 50ms);
    }
    closed = closed || closed_by_server(fd, 5000ms);
    CHECK(closed);
    CHECK(ms_since(t0) >= 950);
    CHECK(ms_since(t0) < 5000);
    ::close(fd);
  }
  SUBCASE("junk before the ClientHello is closed at once") {
    const int fd = tcp_to(ts.server.port());
    const std::string junk = "GET / HTTP/1.1\r\n\r\n";
    REQUIRE(::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(junk.size()));
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(closed_by_server(fd, 5000ms));
    CHECK(ms_since(t0) < 800);  // not at the 1000 ms deadline
    ::close(fd);
    CHECK(wait_until([&] { return !log.matching({"junk before the TLS ClientHello"}).empty(); }, 5000ms));
  }
  SUBCASE("a broken handshake record is refused at once") {
    const int fd = tcp_to(ts.server.port());
    std::vector<unsigned char> bad = {0x16, 0x03, 0x01, 0x00, 0x20};
    bad.resize(bad.size() + 0x20, 0xab);
    REQUIRE(::send(fd, bad.data(), bad.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bad.size()));
    CHECK(closed_by_server(fd, 800ms));  // refused, not left to the deadline
    ::close(fd);
  }
  CHECK(steady.progresses());
  CHECK(steady.failures().empty());
  CHECK(wait_until([&] { return ts.server.session_count() == 1; }, 5000ms));
}

TEST_CASE("TLS: what the acceptor's stream read ahead reaches the session (a PING right behind the Hello is answered)") {
  // The Hello and a PING go in one TLS record: the acceptor's read of the
  // 32-byte Hello leaves the PING decrypted inside OpenSSL, where epoll
  // cannot see it.  The server's link must read it anyway.
  tls_test::Pki pki;
  tls_test::make_pki(pki);
  Config sc = server_config(pki);
  sc.keepalive_ms = 20'000;  // the server sends no PING of its own meanwhile
  sc.peer_timeout_ms = 60'000;
  TlsServer ts(sc);
  const int fd = tcp_to(ts.server.port());
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  auto tls = slotrpc::rpc::tls_connect(fd, client_config(pki), "127.0.0.1", deadline);
  REQUIRE_MESSAGE(tls.ok(), tls.status().to_string());
  slotrpc::core::Hello hello;
  hello.transport = slotrpc::core::WireTransport::kTcp;
  hello.slot_count = 4;
  hello.slot_size = 4096;
  std::vector<std::byte> out(slotrpc::core::kHelloSize);
  slotrpc::core::encode_hello(hello, out.data());
  const auto ping = raw_tcp::frame(
      true, 0, raw_tcp::body_of(raw_tcp::control_header(slotrpc::core::Kind::kPing, 0, 0, 0), {}));
  out.insert(out.end(), ping.begin(), ping.end());
  REQUIRE(slotrpc::rpc::write_all(fd, out, deadline, tls.value().get()).ok());
  std::array<std::byte, slotrpc::core::kHelloSize> head{};
  REQUIRE(slotrpc::rpc::read_exact(fd, head, deadline, tls.value().get()).ok());
  auto reply = slotrpc::core::decode_hello_reply(head.data());
  REQUIRE(reply.ok());
  REQUIRE(reply->status == 0);
  std::vector<std::byte> rest(reply->message_len + reply->extension_len);
  REQUIRE(slotrpc::rpc::read_exact(fd, rest, deadline, tls.value().get()).ok());
  // The PONG, within 3 s (well before any keepalive).
  const auto until = std::chrono::steady_clock::now() + 3s;
  bool pong = false;
  while (!pong) {
    std::array<std::byte, 8 + slotrpc::core::kHeaderSize> f{};
    Status st = slotrpc::rpc::read_exact(fd, std::span(f).first(8), until, tls.value().get());
    if (!st.ok()) break;
    const uint32_t len = raw_tcp::load_u32(f.data()) & ~raw_tcp::kControlLane;
    REQUIRE(len == slotrpc::core::kHeaderSize);
    REQUIRE(slotrpc::rpc::read_exact(fd, std::span(f).subspan(8), until, tls.value().get()).ok());
    pong = slotrpc::core::decode_header(f.data() + 8).kind() == slotrpc::core::Kind::kPong;
  }
  CHECK_MESSAGE(pong, "no PONG: the PING stayed in the acceptor's TLS buffer");
  ::close(fd);
}

TEST_CASE("TLS: neither end uses shm unless SLOTRPC_UNIX_PATH is set explicitly") {
  tls_test::Pki pki;
  tls_test::make_pki(pki);
  Config sc = server_config(pki);
  sc.transport = TransportKind::kAuto;  // would serve shm on @slotrpc-<port> without TLS
  TlsServer ts(sc);
  Config cc = client_config(pki);
  cc.transport = TransportKind::kAuto;  // would try shm first towards 127.0.0.1
  auto ch = connect_ok(ts.address(), cc);
  CHECK(ch->transport() == TransportKind::kTcp);
  echo(*ch, 1);
  // The server opened no Unix socket: an explicit shm client finds none.
  Config shm;
  shm.transport = TransportKind::kShm;
  shm.connect_timeout_ms = 2000;
  auto direct = Channel::connect(ts.address(), shm);
  REQUIRE_FALSE(direct.ok());
  CHECK_MESSAGE(contains(direct.status().message(), "unix:@slotrpc-" + std::to_string(ts.server.port())),
                direct.status().message());

  // An explicit SLOTRPC_UNIX_PATH opts back in: shm there, outside TLS.
  Config sc2 = server_config(pki);
  sc2.transport = TransportKind::kAuto;
  sc2.unix_path = "@slotrpc-tls-test-" + std::to_string(::getpid());
  TlsServer ts2(sc2);
  Config cc2 = client_config(pki);
  cc2.transport = TransportKind::kAuto;
  cc2.unix_path = sc2.unix_path;
  auto local = connect_ok(ts2.address(), cc2);
  CHECK(local->transport() == TransportKind::kShm);
  echo(*local, 2);
}
