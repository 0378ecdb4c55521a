// What a client sees when its server dies, over verbs
// (tests/client_failure_test.cc and tests/timeouts_test.cc do the same
// over TCP).  An application-style client keeps 8 or 256 calls in flight by
// issuing the next call from each callback, against an echo_server process
// (ECHO_SERVER) reached over verbs, that is killed (SIGKILL) or frozen
// (SIGSTOP): every call ends exactly once, with UNAVAILABLE (or
// DEADLINE_EXCEEDED), no callback runs inside another, nothing crashes; a
// frozen server is declared dead peer_timeout_ms after it was last heard,
// within 10 % + a tick.
//
// Needs an RDMA device: run by the `rxe` suite (see tests/rxe/README.md).
#include "verbs_test_util.h"

#include "../failure_util.h"

using namespace failure_test;
using slotrpc::Config;
using slotrpc::RawReply;
using slotrpc::StatusCode;
using slotrpc::TransportKind;

namespace {

// Failed calls the client keeps reissuing from its callbacks before it
// stops (a quarter under the sanitizers, VERBS_LOAD_DIVISOR): a callback run
// inside another shows as depth 2 at the first nesting, so the count only
// has to be large; at full count the sanitized run spent 51 s here.
uint64_t failures_to_reissue() { return verbs_test::load_calls(50'000); }

Config verbs_config() {
  auto cfg = Config{}.with_environment();  // the device the suite selected
  REQUIRE_MESSAGE(cfg.ok(), cfg.status().to_string());
  Config c = cfg.value();
  c.transport = TransportKind::kVerbs;
  c.keepalive_ms = 200;
  c.peer_timeout_ms = 1000;
  return c;
}

void killed_server(size_t window) {
  CAPTURE(window);
  EchoServerProcess server;
  auto ch = connect(server.address(), verbs_config());
  REQUIRE(ch->transport() == TransportKind::kVerbs);
  Reissuer client(*ch, window, failures_to_reissue());
  client.start();
  REQUIRE_MESSAGE(wait_until([&] { return client.ok() >= verbs_test::load_calls(2000); }, 60000ms),
                  "calls make no progress: " << client.ok() << " ok");
  const auto t0 = Clock::now();
  server.kill();
  REQUIRE_MESSAGE(wait_until([&] { return client.finished(); }, 30000ms),
                  "the client did not stop: " << client.failures() << " failures");
  CHECK(ms_between(t0, Clock::now()) < 20000);
  client.check_every_call_ended_once();
  const std::string first = client.first_unavailable();
  INFO(first);
  CHECK(contains(first, "lost"));
  auto f = slotrpc::raw::call(*ch, kEcho, echo_request(1, 8));
  REQUIRE(f.wait_for(5000ms));
  CHECK(f.get().status().to_string() == first);
}

}  // namespace

TEST_CASE("verbs: reissuing client with 8 in flight; server killed (SIGKILL)") { killed_server(8); }
TEST_CASE("verbs: reissuing client with 256 in flight; server killed (SIGKILL)") { killed_server(256); }

TEST_CASE("verbs: reissuing client; server frozen (SIGSTOP): dead within 10 % + a tick of peer_timeout_ms") {
  for (size_t window : {size_t{8}, size_t{256}}) {
    CAPTURE(window);
    EchoServerProcess server;
    auto ch = connect(server.address(), verbs_config());
    REQUIRE(ch->transport() == TransportKind::kVerbs);
    Reissuer client(*ch, window, failures_to_reissue());
    client.start();
    REQUIRE(wait_until([&] { return client.ok() >= verbs_test::load_calls(2000); }, 60000ms));
    const Clock::time_point stopped = server.freeze();
    REQUIRE_MESSAGE(wait_until([&] { return client.finished(); }, 30000ms),
                    "the client did not stop: " << client.failures() << " failures");
    client.check_every_call_ended_once();
    const std::string why = client.first_unavailable();
    INFO(why);
    CHECK(contains(why, "silent for "));
    const double since_heard = ms_between(client.last_ok(), client.first_unavailable_at());
    const double since_stopped = ms_between(stopped, client.first_unavailable_at());
    MESSAGE("verbs, peer timeout 1000 ms (keepalive 200), " << window << " in flight: dead " << since_heard
                                                            << " ms after the last reply, " << since_stopped
                                                            << " ms after SIGSTOP was observed");
    CHECK(since_heard >= 1000);
    CHECK(since_stopped <= 1000 * 1.1 + 1);
  }
}

int main(int argc, char** argv) { return verbs_test::main(argc, argv); }
