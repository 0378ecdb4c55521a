// TCP bulk lanes end to end (transport/tcp/bulk_lanes.h): a Channel opens
// its session's lane on the first call with a bulk segment of at least
// tcp_bulk_lane bytes and not before; large calls then move every byte
// over it; a lane Hello with a token no session offered is refused by the
// server, and the server's sessions go on; with lanes off on the server
// nothing is offered and large calls use the session's connection; a lane
// that cannot be opened leaves the session as it was.
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <slotrpc/slotrpc.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "core/handshake.h"
#include "transport/tcp/tcp_transport.h"
#include "../log_capture.h"
#include "../process_util.h"
#include "../raw_tcp_client.h"

namespace {

using namespace std::chrono_literals;
using slotrpc::CallOptions;
using slotrpc::Channel;
using slotrpc::Config;
using slotrpc::RawReply;
using slotrpc::Server;
using slotrpc::ServerCall;
using slotrpc::ServiceDefinition;
using slotrpc::Status;
using slotrpc::StatusCode;
using slotrpc::TransportKind;

constexpr uint32_t kEcho = slotrpc::method_id("slotrpc.test.Lane.Echo");

// Echo: the one incoming segment, XOR 0x5a, into the one outgoing segment.
ServiceDefinition echo_service() {
  ServiceDefinition svc("slotrpc.test.Lane");
  svc.add_method("Echo", [](ServerCall& call) -> Status {
    if (call.bulk_in_count() != 1 || call.bulk_out_count() != 1)
      return Status(StatusCode::kInvalidArgument, "want one segment each way");
    std::vector<std::byte> buf(call.bulk_in(0));
    if (Status st = call.read_bulk(0, buf); !st.ok()) return st;
    for (auto& b : buf) b ^= std::byte{0x5a};
    if (Status st = call.write_bulk(0, buf); !st.ok()) return st;
    call.reply().Finish(call.reply().CreateVector(std::vector<uint64_t>{buf.size()}));
    return {};
  });
  return svc;
}

// Threads of this process that serve bulk lanes (one per event loop with a lane).
int lane_threads() {
  int n = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::string name = test_process::read_file(task.path() / "comm");
    if (name.rfind("slotrpc-lanes", 0) == 0) ++n;
  }
  return n;
}

Config tcp_config(uint32_t lane_bytes) {
  Config c;
  c.transport = TransportKind::kTcp;
  c.tcp_bulk_lane = lane_bytes;
  return c;
}

// The channel's tcp transport metrics: its bulk lane (bulk_lanes: 1 while
// the session has it) and the bytes moved on it.
slotrpc::TransportMetrics tcp_metrics(const Channel& ch) {
  for (const auto& t : ch.metrics().transports)
    if (t.transport == "tcp") return t;
  FAIL("no tcp transport in the channel's metrics");
  return {};
}

// One echo of `size` bytes; every byte checked.
void echo(Channel& ch, size_t size, uint8_t seed) {
  std::vector<std::byte> out(size), in(size);
  for (size_t i = 0; i < size; ++i) out[i] = static_cast<std::byte>((i * 13 + seed) & 0xff);
  CallOptions o;
  o.send_bulk(std::span<std::byte>(out)).receive_bulk(std::span<std::byte>(in));
  RawReply r = slotrpc::raw::call(ch, kEcho, [](flatbuffers::FlatBufferBuilder& fbb) { fbb.Finish(fbb.CreateVector(std::vector<uint64_t>{0})); },
                       std::move(o))
                   .get();
  REQUIRE_MESSAGE(r.ok(), r.status().to_string());
  size_t bad = 0;
  for (size_t i = 0; i < size; ++i) bad += in[i] != (out[i] ^ std::byte{0x5a});
  CHECK_MESSAGE(bad == 0, bad << " of " << size << " bytes differ");
}

// Forwards the first connection it accepts to the server at `to`, both
// ways: the session.  What it does with the next ones (the client's lane):
//   kRefuse: closes each at once (a server whose lanes cannot be reached);
//   kHold: keeps the first and never answers it, so the client's lane
//     opener waits for its whole connect_timeout_ms;
//   kHoldAndDropSession: the same, and closes the session's pair as soon
//     as it arrives (the session dies while its lane is being opened).
class SessionProxy {
 public:
  enum class Later { kRefuse, kHold, kHoldAndDropSession };
  SessionProxy(uint16_t to, Later later) : later_(later) {
    lst_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(lst_ >= 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    REQUIRE(::bind(lst_, reinterpret_cast<sockaddr*>(&addr), len) == 0);
    REQUIRE(::listen(lst_, 8) == 0);
    REQUIRE(::getsockname(lst_, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this, to] { run(to); });
  }
  ~SessionProxy() {
    stop_ = true;
    thread_.join();
    ::close(lst_);
  }
  uint16_t port() const { return port_; }
  int refused() const { return refused_.load(); }
  bool lane_seen() const { return lane_seen_.load(); }

 private:
  static bool copy(int from, int to) {
    std::byte buf[65536];
    const ssize_t n = ::recv(from, buf, sizeof buf, 0);
    if (n <= 0) return false;
    for (ssize_t sent = 0; sent < n;) {
      const ssize_t k = ::send(to, buf + sent, static_cast<size_t>(n - sent), MSG_NOSIGNAL);
      if (k <= 0) return false;
      sent += k;
    }
    return true;
  }
  void run(uint16_t to) {
    int a = -1, b = -1, held = -1;
    auto drop_session = [&] {
      ::close(a);
      ::close(b);
      a = b = -1;
    };
    while (!stop_) {
      pollfd p[3] = {{lst_, POLLIN, 0}, {a, POLLIN, 0}, {b, POLLIN, 0}};
      if (::poll(p, 3, 20) <= 0) continue;  // 20 ms: how soon ~SessionProxy is noticed
      if (p[0].revents != 0) {
        const int c = ::accept4(lst_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c >= 0 && a < 0 && held < 0) {
          a = c;
          b = raw_tcp::tcp_connect(to);
        } else if (c >= 0 && later_ != Later::kRefuse && held < 0) {
          held = c;  // never answered
          lane_seen_ = true;
          if (later_ == Later::kHoldAndDropSession && a >= 0) drop_session();
        } else if (c >= 0) {
          ::close(c);
          ++refused_;
        }
      }
      if (a >= 0 && ((p[1].revents != 0 && !copy(a, b)) || (p[2].revents != 0 && !copy(b, a)))) drop_session();
    }
    for (int fd : {a, b, held})
      if (fd >= 0) ::close(fd);
  }
  Later later_;
  int lst_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> refused_{0};
  std::atomic<bool> lane_seen_{false};
  std::thread thread_;
};

// Each test runs on a Runtime of its own: its loops, and their lane
// threads, end with the test.

TEST_CASE("a channel opens its bulk lane on the first call with a segment of tcp_bulk_lane bytes, not before; large calls then use it") {
  const int before = lane_threads();
  slotrpc::Runtime rt(tcp_config(1 << 20));
  Server server(rt, tcp_config(1 << 20));
  REQUIRE(server.add_service(echo_service()).ok());
  REQUIRE(server.start("127.0.0.1:0").ok());
  auto ch = Channel::connect("127.0.0.1:" + std::to_string(server.port()), rt, tcp_config(1 << 20));
  REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
  echo(**ch, 64 * 1024, 1);       // under the threshold: no lane
  echo(**ch, (1 << 20) - 1, 2);
  CHECK(lane_threads() == before);
  CHECK(tcp_metrics(**ch).bulk_lanes == 0);
  // Opens the lane, and waits for it: this call's data moves there too.
  echo(**ch, 1 << 20, 3);
  CHECK(lane_threads() > before);
  auto st = tcp_metrics(**ch);
  REQUIRE(st.bulk_lanes == 1);
  CHECK(st.bulk_lane_bytes_sent >= (1u << 20));      // the request data the server read
  CHECK(st.bulk_lane_bytes_received >= (1u << 20));  // the reply data it wrote
  for (uint8_t k = 0; k < 4; ++k) echo(**ch, (size_t{8} << 20) + k, 10 + k);
  const auto before_small = tcp_metrics(**ch);
  CHECK(before_small.bulk_lane_bytes_received >= st.bulk_lane_bytes_received + (size_t{32} << 20));
  echo(**ch, 4096, 20);            // small segments stay on the connection
  CHECK(tcp_metrics(**ch).bulk_lane_bytes_received == before_small.bulk_lane_bytes_received);
  server.stop();
}

TEST_CASE("a lane hello with a token no session offered is refused; the server's sessions go on") {
  Server server(tcp_config(1 << 20));
  REQUIRE(server.add_service(echo_service()).ok());
  REQUIRE(server.start("127.0.0.1:0").ok());
  auto ch = Channel::connect("127.0.0.1:" + std::to_string(server.port()), tcp_config(1 << 20));
  REQUIRE(ch.ok());
  for (size_t ext : {size_t{8}, size_t{4}}) {
    CAPTURE(ext);
    const int fd = raw_tcp::tcp_connect(server.port());
    std::vector<std::byte> hello(slotrpc::core::kHelloSize + ext);
    slotrpc::core::Hello h;
    h.transport = slotrpc::core::WireTransport::kAttach;
    h.extension_len = static_cast<uint32_t>(ext);
    slotrpc::core::encode_hello(h, hello.data());
    if (ext == 8) slotrpc::transport::TcpLink::encode_lane_token(0x1234'5678'9abc'0000ull, hello.data() + slotrpc::core::kHelloSize);
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    REQUIRE(slotrpc::rpc::write_all(fd, hello, deadline).ok());
    std::array<std::byte, slotrpc::core::kHelloSize> buf;
    REQUIRE(slotrpc::rpc::read_exact(fd, buf, deadline).ok());
    auto reply = slotrpc::core::decode_hello_reply(buf.data());
    REQUIRE(reply.ok());
    CHECK(reply->status != 0);
    std::string message(reply->message_len, '\0');
    REQUIRE(slotrpc::rpc::read_exact(fd, std::as_writable_bytes(std::span(message)), deadline).ok());
    CHECK_MESSAGE(message.find("lane") != std::string::npos, message);
    ::close(fd);
  }
  echo(**ch, 2 << 20, 5);
  CHECK(server.session_count() == 1);
  server.stop();
}

TEST_CASE("with lanes off on the server, no lane is offered and large calls use the connection") {
  const int before = lane_threads();
  slotrpc::Runtime rt(tcp_config(1 << 20));
  Server server(rt, tcp_config(0));
  REQUIRE(server.add_service(echo_service()).ok());
  REQUIRE(server.start("127.0.0.1:0").ok());
  auto ch = Channel::connect("127.0.0.1:" + std::to_string(server.port()), rt, tcp_config(1 << 20));
  REQUIRE(ch.ok());
  echo(**ch, 4 << 20, 6);
  echo(**ch, 4 << 20, 7);
  CHECK(lane_threads() == before);
  CHECK(tcp_metrics(**ch).bulk_lanes == 0);
  server.stop();
}

TEST_CASE("a lane that cannot be opened leaves the session as it was: large calls run on its connection") {
  slotrpc::Runtime rt(tcp_config(1 << 20));
  Server server(rt, tcp_config(1 << 20));
  REQUIRE(server.add_service(echo_service()).ok());
  REQUIRE(server.start("127.0.0.1:0").ok());
  SessionProxy proxy(server.port(), SessionProxy::Later::kRefuse);
  slotrpc::test::LogCapture logs;
  auto ch = Channel::connect("127.0.0.1:" + std::to_string(proxy.port()), rt, tcp_config(1 << 20));
  REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
  // Waits for the lane attempt, which fails, then runs on the connection.
  echo(**ch, 2 << 20, 8);
  CHECK(proxy.refused() == 1);
  CHECK(tcp_metrics(**ch).bulk_lanes == 0);
  CHECK(logs.matching({"no bulk lane"}).size() == 1);
  // One attempt per session: the next large call goes straight on.
  echo(**ch, 2 << 20, 9);
  CHECK(proxy.refused() == 1);
  ch->reset();
}

// A call that waits for the lane being opened is bound by its deadline and
// by its session, not by the opener's connect_timeout_ms (20 s here).
// Before, both calls below took the whole 20 s: held calls went to the
// session only once the opener gave up.
TEST_CASE("a call waiting for its channel's lane fails at its deadline, or when the session dies, not when the lane's connect times out") {
  Config cfg = tcp_config(1 << 20);
  cfg.connect_timeout_ms = 20'000;
  slotrpc::Runtime rt(cfg);
  Server server(rt, tcp_config(1 << 20));
  REQUIRE(server.add_service(echo_service()).ok());
  REQUIRE(server.start("127.0.0.1:0").ok());
  auto large_call = [](Channel& ch, CallOptions o) {
    std::vector<std::byte> out(2 << 20), in(2 << 20);
    o.send_bulk(std::span<std::byte>(out)).receive_bulk(std::span<std::byte>(in));
    const auto t0 = std::chrono::steady_clock::now();
    RawReply r = slotrpc::raw::call(ch, kEcho, [](flatbuffers::FlatBufferBuilder& fbb) { fbb.Finish(fbb.CreateVector(std::vector<uint64_t>{0})); },
                         std::move(o))
                     .get();
    return std::make_pair(r.status(), std::chrono::steady_clock::now() - t0);
  };
  SUBCASE("the deadline") {
    auto proxy = std::make_unique<SessionProxy>(server.port(), SessionProxy::Later::kHold);
    auto ch = Channel::connect("127.0.0.1:" + std::to_string(proxy->port()), rt, cfg);
    REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
    auto [st, took] = large_call(**ch, CallOptions::with_timeout(std::chrono::milliseconds(300)));
    CAPTURE(st.to_string());
    CHECK(proxy->lane_seen());
    CHECK(st.code() == StatusCode::kDeadlineExceeded);
    CHECK(took < std::chrono::seconds(10));
    // Small calls never waited, and the session is still up.
    echo(**ch, 4096, 30);
    // The proxy goes first: the opener's socket closes, so the channel's
    // destructor (which joins the opener) does not wait out its timeout.
    proxy.reset();
    ch->reset();
  }
  SUBCASE("the session's end") {
    auto proxy = std::make_unique<SessionProxy>(server.port(), SessionProxy::Later::kHoldAndDropSession);
    auto ch = Channel::connect("127.0.0.1:" + std::to_string(proxy->port()), rt, cfg);
    REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
    auto [st, took] = large_call(**ch, CallOptions());
    CAPTURE(st.to_string());
    CHECK(proxy->lane_seen());
    CHECK(st.code() == StatusCode::kUnavailable);
    CHECK(took < std::chrono::seconds(10));
    proxy.reset();
    ch->reset();
  }
  server.stop();
}

}  // namespace
