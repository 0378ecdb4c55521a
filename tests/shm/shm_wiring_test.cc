// The shared-memory transport wired into Channel and Server:
//
//   * transport=auto picks shm for a server on this host (the client
//     connects to 127.0.0.1:PORT and finds @slotrpc-PORT), and calls run
//     over it; every poll mode (busy, adaptive, blocking: the eventfd
//     wake-up of a sleeping loop) answers;
//   * unix:/path and unix:@name work for Server::start and Channel::connect;
//   * auto falls back to tcp when the server serves no shm;
//     SLOTRPC_TRANSPORT=shm fails naming the socket; a bad
//     SLOTRPC_UNIX_PATH fails naming the setting;
//   * a client process killed (SIGKILL) mid-run: the server closes that
//     session at once (the Unix socket's hang-up) and serves the others.
//
// The TCP suites run over shm too (tests/meson.build, *_shm registrations
// with SLOTRPC_TRANSPORT=shm); this file covers what only shm has.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <signal.h>
#include <slotrpc/slotrpc.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../env_var.h"
#include "../ping_payloads.h"
#include "../process_util.h"
#include "test_messages_generated.h"

namespace {

using namespace std::chrono_literals;
using namespace slotrpc::test_payloads;
using slotrpc::Channel;
using slotrpc::Config;
using slotrpc::PollMode;
using slotrpc::Server;
using slotrpc::ServerCall;
using slotrpc::ServiceDefinition;
using slotrpc::Status;
using slotrpc::StatusCode;
using slotrpc::TransportKind;
using slotrpc::test::EnvVar;
using slotrpc::test::Ping;
using slotrpc::test::Pong;
using test_process::wait_until;

constexpr uint32_t kEcho = slotrpc::method_id("slotrpc.test.ShmWiring.Echo");

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

ServiceDefinition make_service(std::shared_ptr<std::atomic<uint64_t>> calls) {
  ServiceDefinition svc("slotrpc.test.ShmWiring");
  svc.add_unary<Ping>("Echo", [calls](const Ping& req, flatbuffers::FlatBufferBuilder& out,
                                      ServerCall&) -> Status {
    calls->fetch_add(1);
    auto text = out.CreateString(req.text() != nullptr ? req.text()->str() : std::string());
    static const uint8_t kNone = 0;
    const auto* p = req.payload();
    auto payload = p != nullptr ? out.CreateVector(p->data(), p->size()) : out.CreateVector(&kNone, 0);
    out.Finish(slotrpc::test::CreatePong(out, req.seq(), text, payload));
    return {};
  });
  return svc;
}

struct TestServer {
  std::shared_ptr<std::atomic<uint64_t>> calls = std::make_shared<std::atomic<uint64_t>>(0);
  std::unique_ptr<Server> server;
  std::string address;

  explicit TestServer(const std::string& listen = "127.0.0.1:0", Config config = {}) {
    server = std::make_unique<Server>(config);
    REQUIRE(server->add_service(make_service(calls)).ok());
    const Status st = server->start(listen);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    address = listen.starts_with("unix:") ? listen : "127.0.0.1:" + std::to_string(server->port());
  }
};

// Checked echoes of `n` calls: sizes from inline (under 40 bytes) to a
// slot-sized one, so both descriptor kinds of the link are used.
void check_echoes(Channel& ch, uint64_t n) {
  const size_t sizes[] = {0, 16, 100, 4000, 60000};
  for (uint64_t seq = 1; seq <= n; ++seq) {
    const size_t size = sizes[seq % std::size(sizes)];
    auto f = ch.call_typed<Pong>(kEcho, ping_bytes(seq, size));
    REQUIRE_MESSAGE(f.wait_for(10s), "call " << seq << " did not complete");
    const std::string err = pong_error(f.get(), seq, size);
    REQUIRE_MESSAGE(err.empty(), err);
  }
}

// The tests below decide the transport themselves: the suite's own
// SLOTRPC_TRANSPORT / SLOTRPC_UNIX_PATH (tests/meson.build) must not.
struct DefaultTransportEnv {
  EnvVar transport{"SLOTRPC_TRANSPORT", std::nullopt};
  EnvVar unix_path{"SLOTRPC_UNIX_PATH", std::nullopt};
};

}  // namespace

TEST_CASE("auto: a server on this host is reached over shm, and calls run over it") {
  DefaultTransportEnv env;
  TestServer ts;
  auto ch = Channel::connect(ts.address);
  REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
  CHECK((*ch)->transport() == TransportKind::kShm);
  CHECK((*ch)->peer() == "unix:@slotrpc-" + std::to_string(ts.server->port()));
  check_echoes(**ch, 50);
  CHECK(ts.calls->load() == 50);
  CHECK(ts.server->session_count() == 1);
  const auto stats = (*ch)->stats();
  CHECK(stats.messages_sent >= 50);
  CHECK_FALSE(stats.closed);
}

TEST_CASE("zero copy: requests over shm are built in the shared segment, post() copies none") {
  // The session's send ring maps the link's send_slots() (core/slot_ring.h):
  // the link counts a slot message read by the peer in place as a
  // noninline send; one copied into the segment (or sent from a private
  // ring) is not counted, so this fails if the copy comes back.
  DefaultTransportEnv env;
  TestServer ts;
  auto ch = Channel::connect(ts.address);
  REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
  REQUIRE((*ch)->transport() == TransportKind::kShm);
  constexpr uint64_t kCalls = 20;
  for (uint64_t seq = 1; seq <= kCalls; ++seq) {
    auto f = (*ch)->call_typed<Pong>(kEcho, ping_bytes(seq, 4000));  // past the descriptor's 40 bytes
    REQUIRE_MESSAGE(f.wait_for(10s), "call " << seq << " did not complete");
    const std::string err = pong_error(f.get(), seq, 4000);
    REQUIRE_MESSAGE(err.empty(), err);  // the server's replies, built in its segment, arrive intact
  }
  const auto metrics = (*ch)->metrics();
  const slotrpc::TransportMetrics* shm = metrics.transport("shm");
  REQUIRE(shm != nullptr);
  CHECK(shm->noninline_sends == kCalls);
  CHECK(shm->inline_sends == 0);
}

TEST_CASE("every poll mode answers over shm (blocking: a sleeping loop is woken by the eventfd)") {
  DefaultTransportEnv env;
  for (PollMode mode : {PollMode::kBusy, PollMode::kAdaptive, PollMode::kBlocking}) {
    CAPTURE(slotrpc::to_string(mode));
    Config cfg;
    cfg.poll_mode = mode;
    cfg.spin_us = 10;          // adaptive: asleep between calls
    cfg.busy_sleep_us = 1000;  // busy: asleep after 1 ms idle as well
    TestServer ts("127.0.0.1:0", cfg);
    auto ch = Channel::connect(ts.address, cfg);
    REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
    REQUIRE((*ch)->transport() == TransportKind::kShm);
    check_echoes(**ch, 20);
    // Idle long enough for both loops to sleep, then a call must wake them.
    std::this_thread::sleep_for(20ms);
    check_echoes(**ch, 5);
  }
}

TEST_CASE("unix:/path and unix:@name: Server::start listens there, Channel::connect uses it") {
  DefaultTransportEnv env;
  test_process::TempDir dir("slotrpc-shm");
  const std::string path = (dir.path / "server.sock").string();
  SUBCASE("a path") {
    {
      TestServer ts("unix:" + path);
      CHECK(ts.server->port() == 0);
      CHECK(std::filesystem::exists(path));
      auto ch = Channel::connect("unix:" + path);
      REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
      CHECK((*ch)->transport() == TransportKind::kShm);
      check_echoes(**ch, 10);
      ch.value().reset();
      ts.server->stop();
      CHECK_FALSE(std::filesystem::exists(path));  // stop() removes its socket file
    }
    // A socket file left behind (a server that died) is replaced.
    auto fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strcpy(a.sun_path, path.c_str());
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    ::close(fd);
    TestServer again("unix:" + path);
    auto ch = Channel::connect("unix:" + path);
    REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
    check_echoes(**ch, 3);
  }
  SUBCASE("an abstract name") {
    const std::string name = "unix:@slotrpc-test-" + std::to_string(::getpid());
    TestServer ts(name);
    auto ch = Channel::connect(name);
    REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
    CHECK((*ch)->transport() == TransportKind::kShm);
    check_echoes(**ch, 10);
  }
  SUBCASE("SLOTRPC_UNIX_PATH on both ends: a TCP server's shm socket at a path") {
    EnvVar p("SLOTRPC_UNIX_PATH", path);
    TestServer ts;
    CHECK(std::filesystem::exists(path));
    auto ch = Channel::connect(ts.address);
    REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
    CHECK((*ch)->transport() == TransportKind::kShm);
    CHECK((*ch)->peer() == "unix:" + path);
    check_echoes(**ch, 3);
  }
  SUBCASE("bad unix: addresses are INVALID_ARGUMENT") {
    for (const char* bad : {"unix:", "unix:relative/path", "unix:x"}) {
      CAPTURE(bad);
      auto ch = Channel::connect(bad);
      REQUIRE_FALSE(ch.ok());
      CHECK(ch.status().code() == StatusCode::kInvalidArgument);
      Server server;
      CHECK(server.start(bad).code() == StatusCode::kInvalidArgument);
    }
  }
}

TEST_CASE("auto falls back to tcp when the server serves no shm; the reason is the server's socket") {
  DefaultTransportEnv env;
  Config no_shm;
  no_shm.unix_path = "off";
  TestServer ts("127.0.0.1:0", no_shm);
  auto ch = Channel::connect(ts.address);
  REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
  CHECK((*ch)->transport() == TransportKind::kTcp);
  check_echoes(**ch, 5);
  // transport=tcp on the client: tcp even though the server serves shm.
  TestServer both;
  Config tcp;
  tcp.transport = TransportKind::kTcp;
  auto t = Channel::connect(both.address, tcp);
  REQUIRE_MESSAGE(t.ok(), t.status().to_string());
  CHECK((*t)->transport() == TransportKind::kTcp);
  check_echoes(**t, 5);
}

TEST_CASE("transport=shm fails clearly when the server's Unix socket cannot be reached") {
  DefaultTransportEnv env;
  Config no_shm;
  no_shm.unix_path = "off";
  TestServer ts("127.0.0.1:0", no_shm);
  Config cfg;
  cfg.transport = TransportKind::kShm;
  auto ch = Channel::connect(ts.address, cfg);
  REQUIRE_FALSE(ch.ok());
  CHECK(ch.status().code() == StatusCode::kUnavailable);
  const std::string m = ch.status().message();
  CHECK_MESSAGE(contains(m, "transport 'shm' was requested"), m);
  CHECK_MESSAGE(contains(m, "unix:@slotrpc-" + std::to_string(ts.server->port())), m);
  // And through the environment.
  EnvVar forced("SLOTRPC_TRANSPORT", "shm");
  auto e = Channel::connect(ts.address);
  REQUIRE_FALSE(e.ok());
  CHECK_MESSAGE(contains(e.status().message(), "unix:@slotrpc-"), e.status().message());
}

TEST_CASE("a bad SLOTRPC_UNIX_PATH is an error naming the setting") {
  DefaultTransportEnv env;
  for (const std::string& bad : {std::string("relative.sock"), std::string("@"), std::string(200, '/')}) {
    CAPTURE(bad);
    EnvVar p("SLOTRPC_UNIX_PATH", bad);
    auto ch = Channel::connect("127.0.0.1:1");
    REQUIRE_FALSE(ch.ok());
    CHECK(ch.status().code() == StatusCode::kInvalidArgument);
    CHECK_MESSAGE(contains(ch.status().message(), "SLOTRPC_UNIX_PATH"), ch.status().message());
    Server server;
    const Status st = server.start("127.0.0.1:0");
    CHECK(st.code() == StatusCode::kInvalidArgument);
    CHECK_MESSAGE(contains(st.message(), "SLOTRPC_UNIX_PATH"), st.message());
  }
}

// The child of the kill test: 32 calls in flight forever, over `transport`.
int run_client(const std::string& address, const std::string& transport) {
  ::setenv("SLOTRPC_TRANSPORT", transport.c_str(), 1);
  auto ch = Channel::connect(address);
  if (!ch.ok()) {
    std::fprintf(stderr, "client: %s\n", ch.status().to_string().c_str());
    return 1;
  }
  std::atomic<uint64_t> seq{0};
  std::function<void()> issue = [&] {
    const uint64_t s = ++seq;
    slotrpc::raw::call(**ch, kEcho, ping_bytes(s, 64), {}, [&](slotrpc::RawReply&&) { issue(); });
  };
  for (int i = 0; i < 32; ++i) issue();
  for (;;) std::this_thread::sleep_for(1s);
}

TEST_CASE("a client process killed (SIGKILL) mid-run: its session closes at once, others go on") {
  for (const char* transport : {"shm", "tcp"}) {
    CAPTURE(transport);
    DefaultTransportEnv env;
    TestServer ts;  // default peer_timeout_ms: 5000
    Config cfg;
    cfg.transport = std::string(transport) == "shm" ? TransportKind::kShm : TransportKind::kTcp;
    auto other = Channel::connect(ts.address, cfg);
    REQUIRE_MESSAGE(other.ok(), other.status().to_string());
    test_process::Child child({test_process::self_exe(), "--client", ts.address, transport});
    REQUIRE_MESSAGE(wait_until([&] { return ts.server->session_count() == 2 && ts.calls->load() > 1000; },
                               20000ms),
                    "the client process did not get going");
    const auto t0 = std::chrono::steady_clock::now();
    REQUIRE(child.kill_and_reap());
    REQUIRE_MESSAGE(wait_until([&] { return ts.server->session_count() == 1; }, 10000ms),
                    "the server kept the dead client's session");
    // The hang-up, not the 5 s keepalive.
    CHECK(std::chrono::steady_clock::now() - t0 < 2500ms);
    CHECK((*other)->transport() == cfg.transport);
    check_echoes(**other, 20);
  }
}

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--client") return run_client(argv[2], argv[3]);
  doctest::Context context(argc, argv);
  return context.run();
}
