// Integration: the server's admission path under abuse and at its limits
// (docs/design.md, "Limits and abuse").
//
//   * 200 idle and 200 slow junk sockets do not keep a client out or slow
//     its calls down (handshakes are asynchronous, the oldest pending one
//     is evicted at the cap);
//   * SLOTRPC_MAX_SESSIONS and SLOTRPC_MAX_RING_MEMORY refuse the session
//     beyond them with RESOURCE_EXHAUSTED naming the setting, and a closed
//     session frees its place;
//   * at the file-descriptor limit a client is refused at once, the server
//     does not spin, and it serves again once descriptors are back.
// Out of memory is in tests/admission_oom_test.cc (it forks first).
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <memory>
#include <random>

#include "admission_util.h"
#include "core/handshake.h"
#include "test_messages_generated.h"

namespace {

using namespace admission_test;
using slotrpc::Channel;
using slotrpc::Config;
using slotrpc::Server;
using slotrpc::ServerCall;
using slotrpc::ServiceDefinition;
using slotrpc::Status;
using slotrpc::StatusCode;
using slotrpc::test::Ping;

constexpr uint32_t kEcho = slotrpc::method_id("slotrpc.test.Admission.Echo");

ServiceDefinition echo_service() {
  ServiceDefinition svc("slotrpc.test.Admission");
  svc.add_unary<Ping>("Echo", [](const Ping& req, flatbuffers::FlatBufferBuilder& out,
                                 ServerCall&) -> Status {
    out.Finish(slotrpc::test::CreatePong(out, req.seq()));
    return {};
  });
  return svc;
}

struct TestServer {
  std::unique_ptr<Server> server;
  std::string address;
  explicit TestServer(Config config = {}) {
    server = std::make_unique<Server>(config);
    REQUIRE(server->add_service(echo_service()).ok());
    const Status st = server->start("127.0.0.1:0");
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    address = "127.0.0.1:" + std::to_string(server->port());
  }
};

// Runs `n` calls one after another; returns each one's latency in µs.
std::vector<double> timed_calls(Channel& ch, int n) {
  std::vector<double> us;
  us.reserve(n);
  for (int i = 0; i < n; ++i) {
    const auto t0 = Clock::now();
    auto f = ch.call_typed<slotrpc::test::Pong>(kEcho, [i](flatbuffers::FlatBufferBuilder& fbb) {
      fbb.Finish(slotrpc::test::CreatePing(fbb, static_cast<uint64_t>(i)));
    });
    REQUIRE_MESSAGE(f.wait_for(10s), "call " << i << " did not complete");
    auto r = f.get();
    REQUIRE_MESSAGE(r.ok(), "call " << i << ": " << r.status().to_string());
    REQUIRE(r->seq() == static_cast<uint64_t>(i));
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  return us;
}

double p99(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, v.size() * 99 / 100)];
}

int tcp_socket_to(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE_MESSAGE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0, std::strerror(errno));
  return fd;
}

// 200 sockets that send nothing and 200 that dribble a byte every 50 ms:
// half of those pure noise (closed by the server at once, and reconnected
// here), half a valid hello prefix followed by noise (they stay pending
// for 1.6 s before the server can judge them).
class JunkCrowd {
 public:
  explicit JunkCrowd(uint16_t port) : port_(port) {
    for (int i = 0; i < 200; ++i) idle_.push_back(tcp_socket_to(port));
    for (int i = 0; i < 200; ++i) slow_.push_back({tcp_socket_to(port), 0, i % 2 == 0});
    thread_ = std::thread([this] { dribble(); });
  }
  ~JunkCrowd() {
    stop_ = true;
    thread_.join();
    for (int fd : idle_) ::close(fd);
    for (auto& s : slow_) ::close(s.fd);
  }
  uint64_t reconnects() const { return reconnects_.load(); }

 private:
  struct Slow {
    int fd;
    size_t sent;
    bool valid_prefix;
  };
  void dribble() {
    // The attacker's CPU is not the server's: this thread, which stands in
    // for remote machines, yields to the server and the measured client.
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 19);
    std::mt19937 rng(42);
    std::array<std::byte, slotrpc::core::kHelloSize> hello{};
    slotrpc::core::encode_hello(slotrpc::core::Hello{}, hello.data());
    while (!stop_) {
      for (auto& s : slow_) {
        uint8_t b = static_cast<uint8_t>(rng());
        if (s.valid_prefix && s.sent < 6) b = std::to_integer<uint8_t>(hello[s.sent]);
        if (::send(s.fd, &b, 1, MSG_NOSIGNAL | MSG_DONTWAIT) == 1) {
          ++s.sent;
        } else if (errno != EAGAIN) {
          ::close(s.fd);
          s.fd = tcp_socket_to(port_);
          s.sent = 0;
          ++reconnects_;
        }
      }
      std::this_thread::sleep_for(50ms);
    }
  }
  uint16_t port_;
  std::vector<int> idle_;
  std::vector<Slow> slow_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> reconnects_{0};
  std::thread thread_;
};

}  // namespace

TEST_CASE("idle and slow sockets neither keep a client out nor slow its calls") {
  Config cfg;
  cfg.poll_mode = slotrpc::PollMode::kBlocking;  // two cores, shared: do not spin
  TestServer ts(cfg);
  // 5 rounds of 2,000 calls each way, alternating, so that the load of the
  // rest of the machine falls on both sides alike: undisturbed on a channel
  // connected before any junk; disturbed on a channel that connects while
  // 400 junk sockets are open and calls while they stay.
  constexpr int kRounds = 5;
  constexpr int kPerRound = 2'000;
  auto quiet = Channel::connect(ts.address, cfg);
  REQUIRE_MESSAGE(quiet.ok(), quiet.status().to_string());
  std::vector<double> undisturbed, disturbed;
  double worst_connect_ms = 0;
  uint64_t reconnects = 0;
  for (int round = 0; round < kRounds; ++round) {
    auto u = timed_calls(**quiet, kPerRound);
    undisturbed.insert(undisturbed.end(), u.begin(), u.end());
    JunkCrowd crowd(ts.server->port());
    const auto t0 = Clock::now();
    auto ch = Channel::connect(ts.address, cfg);
    const double connect_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
    worst_connect_ms = std::max(worst_connect_ms, connect_ms);
    auto d = timed_calls(**ch, kPerRound);
    disturbed.insert(disturbed.end(), d.begin(), d.end());
    reconnects += crowd.reconnects();
  }
  const double p99_quiet = p99(undisturbed);
  const double p99_junk = p99(disturbed);
  MESSAGE("slowest connect beside 400 junk sockets: " << worst_connect_ms
          << " ms (connect_timeout_ms " << ts.server->config().connect_timeout_ms << ")");
  MESSAGE("p99 of " << disturbed.size() << " calls: undisturbed " << p99_quiet
          << " us, beside the junk " << p99_junk << " us; junk reconnects " << reconnects);
  // Promptly: a fifth of the deadline a blocked accept path would need.
  CHECK(worst_connect_ms < ts.server->config().connect_timeout_ms / 5.0);
  // Calls are not held up by the junk.  What this guards against is an
  // accept or handshake path that waits on an idle socket: calls then stall
  // for up to connect_timeout_ms (5 s) each time.  A bound of a twentieth
  // of that catches it and nothing else: a ratio to the quiet p99 (tried
  // first) failed in CI when a parallel test loaded both cores (2.9 ms
  // against 0.23 ms quiet, a scheduling figure, not a stall).
  CHECK(p99_junk < ts.server->config().connect_timeout_ms * 1000.0 / 20);
}

TEST_CASE("SLOTRPC_MAX_SESSIONS refuses the session beyond it, and a closed one frees its place") {
  Config cfg;
  cfg.max_sessions = 3;
  TestServer ts(cfg);
  std::vector<std::unique_ptr<Channel>> open;
  for (int i = 0; i < 3; ++i) {
    auto ch = Channel::connect(ts.address);
    REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
    open.push_back(std::move(ch).value());
  }
  auto extra = Channel::connect(ts.address);
  REQUIRE_FALSE(extra.ok());
  CHECK(extra.status().code() == StatusCode::kResourceExhausted);
  CHECK_MESSAGE(contains(extra.status().message(), "SLOTRPC_MAX_SESSIONS = 3"),
                extra.status().message());
  for (auto& ch : open) CHECK(timed_calls(*ch, 10).size() == 10);  // the admitted ones serve
  open.pop_back();
  const auto until = Clock::now() + 10s;
  while (ts.server->session_count() != 2 && Clock::now() < until) std::this_thread::sleep_for(1ms);
  REQUIRE(ts.server->session_count() == 2);
  auto again = Channel::connect(ts.address);
  REQUIRE_MESSAGE(again.ok(), again.status().to_string());
}

TEST_CASE("SLOTRPC_MAX_RING_MEMORY refuses the session whose rings do not fit") {
  // 4 slots of 4 KiB each way: 32 KiB of server rings per session; room for 3.
  Config cfg;
  cfg.slot_count = 4;
  cfg.slot_size = 4096;
  const uint64_t per_session = 2 * 4 * 4096;
  cfg.max_ring_memory = 3 * per_session + 100;
  TestServer ts(cfg);
  std::vector<std::unique_ptr<Channel>> open;
  for (int i = 0; i < 3; ++i) {
    auto ch = Channel::connect(ts.address, cfg);
    REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
    open.push_back(std::move(ch).value());
  }
  auto extra = Channel::connect(ts.address, cfg);
  REQUIRE_FALSE(extra.ok());
  CHECK(extra.status().code() == StatusCode::kResourceExhausted);
  CHECK_MESSAGE(contains(extra.status().message(),
                         "SLOTRPC_MAX_RING_MEMORY = " + std::to_string(3 * per_session + 100)),
                extra.status().message());
  // A smaller session still fits the remaining 100 bytes? No: 2 x 1 x 256 = 512.
  Config small = cfg;
  small.slot_count = 1;
  small.slot_size = 256;
  auto tiny = Channel::connect(ts.address, small);
  CHECK(tiny.status().code() == StatusCode::kResourceExhausted);
  for (auto& ch : open) CHECK(timed_calls(*ch, 10).size() == 10);
  open.erase(open.begin());
  const auto until = Clock::now() + 10s;
  while (ts.server->session_count() != 2 && Clock::now() < until) std::this_thread::sleep_for(1ms);
  REQUIRE(ts.server->session_count() == 2);
  auto again = Channel::connect(ts.address, cfg);
  REQUIRE_MESSAGE(again.ok(), again.status().to_string());
}

TEST_CASE("SLOTRPC_MAX_RING_MEMORY and the handshake caps are validated") {
  Config cfg;
  cfg.max_ring_memory = 100;
  const Status st = cfg.validate();
  CHECK(st.code() == StatusCode::kInvalidArgument);
  CHECK_MESSAGE(contains(st.message(), "SLOTRPC_MAX_RING_MEMORY"), st.message());
  ::setenv("SLOTRPC_MAX_RING_MEMORY", "12x", 1);
  auto bad = Config{}.with_environment();
  CHECK(bad.status().code() == StatusCode::kInvalidArgument);
  CHECK_MESSAGE(contains(bad.status().message(), "auto or a whole number of bytes"), bad.status().message());
  ::setenv("SLOTRPC_MAX_RING_MEMORY", "auto", 1);
  auto autod = Config{}.with_environment();
  REQUIRE(autod.ok());
  CHECK(autod->max_ring_memory == 0);
  ::setenv("SLOTRPC_MAX_RING_MEMORY", "1048576", 1);
  auto set = Config{}.with_environment();
  REQUIRE(set.ok());
  CHECK(set->max_ring_memory == 1048576);
  ::unsetenv("SLOTRPC_MAX_RING_MEMORY");
  ::setenv("SLOTRPC_MAX_PENDING_HANDSHAKES_PER_HOST", "0", 1);
  CHECK(Config{}.with_environment().status().code() == StatusCode::kInvalidArgument);
  ::unsetenv("SLOTRPC_MAX_PENDING_HANDSHAKES_PER_HOST");
}

TEST_CASE("at the file-descriptor limit clients are refused at once and the server does not spin") {
  // A server with 64 descriptors; the client side (this process) has its own.
  LimitedEchoServer server(RLIMIT_NOFILE, 64);
  Config cfg;
  cfg.slot_count = 4;
  cfg.slot_size = 4096;
  std::vector<std::unique_ptr<Channel>> open;
  Status refused;
  double refused_ms = 0;
  for (int i = 0; i < 80 && refused.ok(); ++i) {
    const auto t0 = Clock::now();
    auto ch = Channel::connect(server.address(), cfg);
    if (ch.ok()) {
      open.push_back(std::move(ch).value());
    } else {
      refused = ch.status();
      refused_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    }
  }
  MESSAGE(open.size() << " sessions held; then: " << refused.to_string() << " after " << refused_ms << " ms");
  // Seen once in CI (ASan build, under load): the connection was reset and
  // every held session lost, as if the server had died.  Its log (kept in
  // a temporary directory) says why; print it when the refusal is not the
  // expected one.
  CHECK_MESSAGE(server.alive(), "server log:\n" << server.log());
  if (refused.code() != StatusCode::kResourceExhausted) MESSAGE("server log:\n" << server.log());
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.code() == StatusCode::kResourceExhausted);
  CHECK_MESSAGE(contains(refused.message(), "file descriptors"), refused.message());
  CHECK(refused_ms < 1000);  // an answer, not the 5 s handshake timeout
  REQUIRE(open.size() >= 10);
  for (size_t i = 0; i < open.size(); i += 7) CHECK(echo_once(*open[i], i) == "");

  // A connection that stays open at the limit (the old accept loop spun on
  // it at a full core): the server's CPU over one second stays small.
  const int waiting = tcp_socket_to(server.port);
  std::this_thread::sleep_for(50ms);
  const double cpu0 = cpu_seconds(server.pid);
  std::this_thread::sleep_for(1s);
  const double cpu = cpu_seconds(server.pid) - cpu0;
  MESSAGE("server CPU over 1 s at the descriptor limit: " << cpu << " s");
  CHECK(cpu < 0.1);  // fixed: 0.02-0.03 s here; the old accept loop: 0.2 s and up (a core when it gets one)
  ::close(waiting);
  CHECK(server.alive());

  // Free some descriptors: a new client gets in at once.
  open.resize(open.size() - 5);
  const auto until = Clock::now() + 5s;
  slotrpc::Result<std::unique_ptr<Channel>> again = Status(StatusCode::kUnavailable, "not tried");
  double again_ms = 0;
  while (Clock::now() < until) {
    const auto t0 = Clock::now();
    again = Channel::connect(server.address(), cfg);
    again_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (again.ok()) break;
    // Refused while the server has not yet seen the closes: try again.
    REQUIRE(again.status().code() == StatusCode::kResourceExhausted);
    std::this_thread::sleep_for(5ms);
  }
  REQUIRE_MESSAGE(again.ok(), again.status().to_string());
  CHECK(again_ms < 1000);
  CHECK(echo_once(**again, 7) == "");
  CHECK(contains(server.log(), "out of file descriptors"));
}
