// The line a channel logs when it connects (lib/rpc/channel.cc, with the
// note lib/rpc/client_connect.cc gives it) names the transport that was
// requested once: it once read "transport=tcp; transport=tcp;".
#include <doctest/doctest.h>
#include <slotrpc/slotrpc.h>

#include <string>
#include <vector>

#include "env_var.h"
#include "log_capture.h"

namespace {

size_t count(const std::string& s, const std::string& part) {
  size_t n = 0;
  for (size_t at = s.find(part); at != std::string::npos; at = s.find(part, at + part.size())) ++n;
  return n;
}

// Connects with `transport` at log level info and returns the channel's
// "channel to ... uses ..." line.
std::string connect_line(slotrpc::TransportKind transport, const std::string& address) {
  // The line is at info; the suite runs at warn (SLOTRPC_LOG_LEVEL, which
  // wins over the Config).
  slotrpc::test::EnvVar level("SLOTRPC_LOG_LEVEL", std::string("info"));
  slotrpc::test::LogCapture logs;
  slotrpc::Config cfg;
  cfg.transport = transport;
  auto ch = slotrpc::Channel::connect(address, cfg);
  REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
  const std::vector<std::string> lines = logs.matching({"channel to ", " uses "});
  REQUIRE(lines.size() == 1);
  return lines[0];
}

}  // namespace

TEST_CASE("the channel's connect log line says the requested transport once") {
  slotrpc::Server server;
  slotrpc::ServiceDefinition svc("slotrpc.test.Log");
  svc.add_method("Nop", [](slotrpc::ServerCall&) { return slotrpc::Status(); });
  REQUIRE(server.add_service(std::move(svc)).ok());
  REQUIRE(server.start("127.0.0.1:0").ok());
  const std::string address = "127.0.0.1:" + std::to_string(server.port());

  const std::string tcp = connect_line(slotrpc::TransportKind::kTcp, address);
  INFO(tcp);
  CHECK(count(tcp, "transport=") == 1);
  CHECK(count(tcp, "transport=tcp") == 1);
  CHECK(count(tcp, "tcp") == 2);  // "uses tcp" and "transport=tcp"

  // auto (the suite's SLOTRPC_UNIX_PATH=off: no shm): the line says why
  // not shm or verbs, and the request once.
  const std::string chosen = connect_line(slotrpc::TransportKind::kAuto, address);
  INFO(chosen);
  CHECK(count(chosen, "transport=") == 1);
  CHECK(count(chosen, "transport=auto") == 1);
}
