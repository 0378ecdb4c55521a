// Integration: SLOTRPC_METRICS_ADDRESS.  The setting is validated like every
// other; a Server with it serves GET /metrics (Prometheus text with its live
// counters), 404 elsewhere, 405 for other methods; a second Server on the
// same address fails start() with an error naming the setting.
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <slotrpc/slotrpc.h>
#include <sys/socket.h>
#include <unistd.h>
#include <arpa/inet.h>

#include <chrono>
#include <string>

#include "env_var.h"

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

}  // namespace

TEST_CASE("metrics port: the setting is validated") {
  for (const char* ok : {"127.0.0.1:0", "127.0.0.1:9100", "[::1]:9100", "localhost:9464", "0.0.0.0:65535"}) {
    EnvVar v("SLOTRPC_METRICS_ADDRESS", ok);
    auto c = Config{}.with_environment();
    CAPTURE(ok);
    REQUIRE(c.ok());
    CHECK(c->metrics_address == ok);
  }
  for (const char* bad : {"9100", "127.0.0.1", "127.0.0.1:", ":9100", "127.0.0.1:65536",
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
    auto r = ch->call(id, [](flatbuffers::FlatBufferBuilder& fbb) {
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
