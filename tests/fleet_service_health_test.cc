// Per-service health in a multi-endpoint channel, over server processes:
// a server whose slotrpc.Health says NOT_SERVING for one service gets no
// new calls of that service, and keeps getting the calls of its others.
#include <doctest/doctest.h>
#include <signal.h>
#include <slotrpc/slotrpc.h>

#include <map>
#include <string>
#include <vector>

#include "fleet_util.h"

namespace {

using namespace fleet_test;
using slotrpc::test::Pong;

// `n` calls of `method_id` named `name` (as a generated client names its
// calls); the replies per server tag.
std::map<std::string, int> tally(slotrpc::Channel& ch, uint32_t method_id, const char* name, int n) {
  std::map<std::string, int> by_tag;
  for (int i = 0; i < n; ++i) {
    slotrpc::CallOptions o;
    o.method_name = name;
    o.deadline = slotrpc::Clock::now() + 10s;
    auto r = ch.call_typed<Pong>(method_id, who(i), o).get();
    REQUIRE_MESSAGE(r.ok(), r.status().to_string());
    ++by_tag[r->text()->str()];
  }
  return by_tag;
}

}  // namespace

TEST_CASE("helper: fleet server" * doctest::skip()) { run_fleet_server(); }

TEST_CASE("an endpoint NOT_SERVING one service gets none of its calls and keeps serving the others") {
  test_process::TempDir dir("slotrpc-fleet-svc");
  std::vector<FleetServer> servers;
  for (const char* tag : {"p0", "p1"}) servers.push_back(start_fleet_server(dir.path, tag));
  auto connected = slotrpc::Channel::connect(list_target(servers));
  REQUIRE_MESSAGE(connected.ok(), connected.status().to_string());
  slotrpc::Channel& ch = **connected;

  // Both services on both servers to begin with.
  auto fleet = tally(ch, kWho, kWhoName, 40);
  CHECK(fleet["p0"] == 20);
  CHECK(fleet["p1"] == 20);
  auto other = tally(ch, kOtherWho, kOtherWhoName, 40);
  CHECK(other["p0"] == 20);
  CHECK(other["p1"] == 20);

  // p0: set_serving("slotrpc.test.Fleet", false); the server as a whole,
  // and slotrpc.test.Other, stay SERVING.
  REQUIRE(servers[0].child->signal(SIGUSR1));
  REQUIRE_MESSAGE(test_process::wait_until([&] { return tally(ch, kWho, kWhoName, 20)["p0"] == 0; }),
                  "p0 still got slotrpc.test.Fleet calls after reporting it NOT_SERVING");
  fleet = tally(ch, kWho, kWhoName, 200);
  CHECK(fleet["p0"] == 0);
  CHECK(fleet["p1"] == 200);
  other = tally(ch, kOtherWho, kOtherWhoName, 200);
  CHECK(other["p0"] == 100);
  CHECK(other["p1"] == 100);
  // Calls without a method name cannot be told apart by service: they
  // follow the health of whole servers, so both still get them.
  std::map<std::string, int> unnamed;
  for (int i = 0; i < 40; ++i) {
    auto r = ch.call_typed<Pong>(kWho, who(i)).get();
    REQUIRE_MESSAGE(r.ok(), r.status().to_string());
    ++unnamed[r->text()->str()];
  }
  CHECK(unnamed["p0"] == 20);

  // SERVING again: back in the rotation for that service.
  REQUIRE(servers[0].child->signal(SIGUSR2));
  REQUIRE_MESSAGE(test_process::wait_until([&] { return tally(ch, kWho, kWhoName, 20)["p0"] == 10; }),
                  "p0 got no slotrpc.test.Fleet calls back after reporting it SERVING");
}

TEST_CASE("a service no endpoint serves: calls wait for one, then fail naming the endpoints") {
  test_process::TempDir dir("slotrpc-fleet-svc");
  std::vector<FleetServer> servers;
  servers.push_back(start_fleet_server(dir.path, "only"));
  slotrpc::Config c;
  c.connect_timeout_ms = 300;  // how long a call waits for a usable endpoint
  auto connected = slotrpc::Channel::connect(list_target(servers), c);
  REQUIRE_MESSAGE(connected.ok(), connected.status().to_string());
  slotrpc::Channel& ch = **connected;
  CHECK(tally(ch, kWho, kWhoName, 2)["only"] == 2);
  REQUIRE(servers[0].child->signal(SIGUSR1));
  slotrpc::Status last;
  REQUIRE(test_process::wait_until([&] {
    slotrpc::CallOptions o;
    o.method_name = kWhoName;
    auto r = ch.call_typed<Pong>(kWho, who(1), o).get();
    last = r.status();
    return !r.ok();
  }));
  CHECK(last.code() == slotrpc::StatusCode::kUnavailable);
  CHECK_MESSAGE(last.message().find(servers[0].address()) != std::string::npos, last.to_string());
  // The other service of the same server is still called.
  CHECK(tally(ch, kOtherWho, kOtherWhoName, 2)["only"] == 2);
}
