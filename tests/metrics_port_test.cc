// Integration: SLOTRPC_METRICS_ADDRESS.  The setting is validated like every
// other; a Server with it serves GET /metrics (Prometheus text with its live
// counters), 404 elsewhere, 405 for other methods; a second Server on the
// same address fails start() with an error naming the setting.
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <slotrpc/slotrpc.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <arpa/inet.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "env_var.h"
#include "process_util.h"
#include "rpc/admin/admin.h"

namespace {

using slotrpc::Channel;
using slotrpc::Config;
using slotrpc::Server;
using slotrpc::ServerCall;
using slotrpc::ServiceDefinition;
using slotrpc::Status;
using slotrpc::test::EnvVar;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// One HTTP exchange over a plain socket; returns everything the server sent.
std::string http(uint16_t port, const std::string& request) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  timeval tv{10, 0};  // a bound, not a timing: the answer comes at once
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size()));
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

std::string get(uint16_t port, const std::string& path) {
  return http(port, "GET " + path + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
}

// The local addresses (hex, as the kernel writes them: "0100007F" is
// 127.0.0.1) of this process's IPv4 and IPv6 sockets listening on `port`.
std::vector<std::string> listening_addresses(uint16_t port) {
  std::vector<std::string> out;
  for (const char* table : {"/proc/self/net/tcp", "/proc/self/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the column names
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string slot, local, remote, state;
      f >> slot >> local >> remote >> state;
      const size_t colon = local.find(':');
      if (state != "0A" || colon == std::string::npos) continue;  // 0A: LISTEN
      if (std::stoul(local.substr(colon + 1), nullptr, 16) == port) out.push_back(local.substr(0, colon));
    }
  }
  return out;
}

// A free TCP port on 127.0.0.1 (bound, read and released: another process
// could take it first, which the caller sees as a failed start).
uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

}  // namespace

TEST_CASE("metrics port: the setting is validated") {
  for (const char* ok : {"127.0.0.1:0", "127.0.0.1:9100", "[::1]:9100", "localhost:9464", "0.0.0.0:65535",
                         "9100", ":9100", ":0"}) {
    EnvVar v("SLOTRPC_METRICS_ADDRESS", ok);
    auto c = Config{}.with_environment();
    CAPTURE(ok);
    REQUIRE(c.ok());
    CHECK(c->metrics_address == ok);
  }
  for (const char* bad : {"127.0.0.1", "127.0.0.1:", ":", "65536", ":port", "127.0.0.1:65536",
                          "127.0.0.1:port", "host name:1", "[::1:9100", "a/b:1", "127.0.0.1:-1"}) {
    EnvVar v("SLOTRPC_METRICS_ADDRESS", bad);
    auto c = Config{}.with_environment();
    CAPTURE(bad);
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().code() == slotrpc::StatusCode::kInvalidArgument);
    CHECK(contains(c.status().message(), "SLOTRPC_METRICS_ADDRESS"));
    CHECK(contains(c.status().message(), std::string("'") + bad + "'"));
    CHECK(contains(c.status().message(), "HOST:PORT"));
  }
  Config c;
  c.metrics_address = "nonsense";
  const Status st = c.validate();
  REQUIRE_FALSE(st.ok());
  CHECK(contains(st.message(), "metrics_address"));
  CHECK(Config{}.metrics_address.empty());  // off by default
}

TEST_CASE("metrics port: GET /metrics serves the server's live counters") {
  ServiceDefinition svc("slotrpc.test.Port");
  svc.add_method("Echo", [](ServerCall& call) -> Status {
    call.reply().PushFlatBuffer(reinterpret_cast<const uint8_t*>(call.request().data()), call.request().size());
    return {};
  });
  Server server;  // from the environment, as an operator would set it
  REQUIRE(server.add_service(std::move(svc)).ok());
  {
    EnvVar v("SLOTRPC_METRICS_ADDRESS", "127.0.0.1:0");
    REQUIRE(server.start("127.0.0.1:0").ok());
  }
  const uint16_t port = server.metrics_port();
  REQUIRE(port != 0);
  CHECK(port != server.port());

  auto ch = Channel::connect("127.0.0.1:" + std::to_string(server.port())).value();
  const uint32_t id = slotrpc::method_id("slotrpc.test.Port.Echo");
  for (int i = 0; i < 7; ++i) {
    auto r = slotrpc::raw::call(*ch, id, [](flatbuffers::FlatBufferBuilder& fbb) {
      const uint8_t b[24] = {1};
      fbb.PushFlatBuffer(b, sizeof b);
    }).get();
    REQUIRE(r.ok());
  }

  const std::string res = get(port, "/metrics");
  CAPTURE(res.substr(0, 400));
  CHECK(res.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK(contains(res, "Content-Type: text/plain; version=0.0.4"));
  const std::string body = res.substr(res.find("\r\n\r\n") + 4);
  CHECK(contains(body, "# TYPE slotrpc_calls_started_total counter\n"));
  CHECK(contains(body, "slotrpc_calls_started_total{side=\"server\"} 7\n"));
  CHECK(contains(body, "slotrpc_method_calls_finished_total{side=\"server\",method=\"slotrpc.test.Port/Echo\",code=\"OK\"} 7\n"));
  CHECK(contains(body, "slotrpc_method_latency_seconds_count{side=\"server\",method=\"slotrpc.test.Port/Echo\"} 7\n"));
  CHECK(contains(body, "slotrpc_transport_sessions{transport=\"tcp\"} 1\n"));
  // The same text as to_prometheus of a snapshot, minus what moved since.
  CHECK(contains(res, "Content-Length: "));

  const std::string with_query = get(port, "/metrics?name[]=x");
  CHECK(with_query.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);

  const std::string missing = get(port, "/");
  CHECK(missing.rfind("HTTP/1.1 404 Not Found\r\n", 0) == 0);
  CHECK(get(port, "/metricsx").rfind("HTTP/1.1 404", 0) == 0);
  const std::string post = http(port, "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
  CHECK(post.rfind("HTTP/1.1 405", 0) == 0);
  // Junk instead of HTTP: the connection is closed, the port keeps serving.
  (void)http(port, "\x01\x02 not http\r\n\r\n");
  CHECK(get(port, "/metrics").rfind("HTTP/1.1 200 OK\r\n", 0) == 0);

  server.stop();
  CHECK(server.metrics_port() == 0);
}

TEST_CASE("metrics port: two servers on one address: the second's start() says why") {
  Config c;
  c.metrics_address = "127.0.0.1:0";
  Server first(c);
  REQUIRE(first.start("127.0.0.1:0").ok());
  const std::string taken = "127.0.0.1:" + std::to_string(first.metrics_port());
  Config c2;
  c2.metrics_address = taken;
  Server second(c2);
  const Status st = second.start("127.0.0.1:0");
  REQUIRE_FALSE(st.ok());
  CHECK(contains(st.message(), "SLOTRPC_METRICS_ADDRESS"));
  CHECK(contains(st.message(), taken));
  CHECK(contains(st.message(), "in use"));
  CHECK(second.metrics_port() == 0);
  // The failed start undid itself; the first keeps serving.
  CHECK(get(first.metrics_port(), "/metrics").rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  // And a Server without the setting serves none.
  Server plain;
  REQUIRE(plain.start("127.0.0.1:0").ok());
  CHECK(plain.metrics_port() == 0);
}

TEST_CASE("metrics port: a port alone listens on loopback only") {
  for (const char* address : {":0", "0"}) {
    CAPTURE(address);
    Config c;
    c.metrics_address = address;
    Server server(c);
    const Status st = server.start("127.0.0.1:0");
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    REQUIRE(server.metrics_port() != 0);
    CHECK(listening_addresses(server.metrics_port()) == std::vector<std::string>{"0100007F"});
    CHECK(get(server.metrics_port(), "/metrics").rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  }
  // A named interface is taken as given.
  Config c;
  c.metrics_address = "0.0.0.0:0";
  Server server(c);
  REQUIRE(server.start("127.0.0.1:0").ok());
  CHECK(listening_addresses(server.metrics_port()) == std::vector<std::string>{"00000000"});
}

// A crowd of idle connections to the metrics port of a server at a low
// descriptor limit: the port keeps to its cap instead of taking every
// descriptor (the RPC port still takes clients) and does not spin on EMFILE.
TEST_CASE("metrics port: idle connections at RLIMIT_NOFILE 256 neither starve the RPC port nor spin") {
  // This process holds the crowd's 400 sockets: lift its own soft limit.
  rlimit rl{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &rl) == 0);
  if (rl.rlim_cur < 1024 && rl.rlim_max >= 1024) {
    rl.rlim_cur = 1024;
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &rl) == 0);
  }
  REQUIRE_MESSAGE(rl.rlim_cur >= 1024, "the test needs 1024 descriptors, RLIMIT_NOFILE is " << rl.rlim_cur);

  test_process::TempDir dir("slotrpc-metrics-fd");
  const uint16_t metrics = free_port();
  auto o = test_process::SpawnOptions::to_file(dir.path / "log");
  o.env = {"SLOTRPC_METRICS_ADDRESS=127.0.0.1:" + std::to_string(metrics)};
  o.rlimit_resource = RLIMIT_NOFILE;
  o.rlimit_value = 256;
  auto up = test_process::start_echo_server(dir.path, o);
  REQUIRE_MESSAGE(up.port != 0, up.error);
  const pid_t pid = up.child->pid;

  // 400 connections that never send a byte, one after the other: each
  // connect is given 200 ms to complete (the kernel completes it while the
  // backlog has room), so a burst does not overflow the backlog into SYN
  // retries; ten in a row that do not complete mean the port has stopped
  // taking connections (its backlog is full).
  std::vector<int> crowd;
  int stuck = 0;
  for (int i = 0; i < 400 && stuck < 10; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    REQUIRE(fd >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(metrics);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    REQUIRE((rc == 0 || errno == EINPROGRESS));
    crowd.push_back(fd);
    pollfd p{fd, POLLOUT, 0};
    stuck = ::poll(&p, 1, 200) == 1 ? 0 : stuck + 1;
  }
  struct Closer {
    std::vector<int>& fds;
    ~Closer() {
      for (int fd : fds) ::close(fd);
    }
  } closer{crowd};

  // The crowd is in once the server has closed most of it (a port with a
  // cap takes each off the backlog and closes the oldest for it), or sits
  // at its descriptor limit (a port without one takes all it can; the rest
  // wait in the backlog and in SYN retries).
  auto closed_by_server = [&] {
    int n = 0;
    for (int fd : crowd) {
      char c;
      if (::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0) ++n;
    }
    return n;
  };
  const bool in = test_process::wait_until(
      [&] { return closed_by_server() >= static_cast<int>(crowd.size()) - 100 || test_process::fd_count(pid) >= 250; },
      std::chrono::milliseconds(15000), std::chrono::milliseconds(20));
  CHECK(in);

  // The server's CPU time over 1.5 s of the crowd sitting there: an accept
  // loop retrying at EMFILE burns most of a core (~1 s of it here).
  const double cpu0 = test_process::cpu_seconds(pid);
  const auto t0 = test_process::Clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // a measuring window, not a wait for an event
  const double window = std::chrono::duration<double>(test_process::Clock::now() - t0).count();
  const double cpu = test_process::cpu_seconds(pid) - cpu0;
  CAPTURE(window);
  CHECK_MESSAGE(cpu < 0.15, "echo_server used " << cpu << " s of CPU in " << window << " s");
  // The metrics port holds at most its cap (16 of 256 descriptors).
  const int fds = test_process::fd_count(pid);
  CHECK_MESSAGE(fds < 100, "echo_server has " << fds << " descriptors open");

  // An RPC client still gets in, and a call goes through.
  Config cc;
  cc.transport = slotrpc::TransportKind::kTcp;
  auto ch = Channel::connect("127.0.0.1:" + std::to_string(up.port), cc);
  REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
  auto m = slotrpc::admin::fetch_metrics(**ch);
  CHECK_MESSAGE(m.ok(), m.status().to_string());

  // And a scrape past the crowd: the oldest idle connection makes room.
  CHECK(get(metrics, "/metrics").rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
}
