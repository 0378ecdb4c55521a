// Liveness (core/liveness.h): when a session pings its peer and when it
// declares the peer dead -- the rule both ends' keepalive timers follow
// (docs/protocol.md, "Liveness").  No real time passes: every check is
// given its `now`.  tests/timeouts_test.cc checks the same rule end to end,
// against frozen peers.
#include "core/liveness.h"

#include <doctest/doctest.h>

#include <chrono>
#include <string>

using slotrpc::Config;
using slotrpc::core::Clock;
using slotrpc::core::Liveness;
using namespace std::chrono_literals;

namespace {

Config timing(uint32_t keepalive_ms, uint32_t peer_timeout_ms) {
  Config c;
  c.keepalive_ms = keepalive_ms;
  c.peer_timeout_ms = peer_timeout_ms;
  return c;
}

// A session's liveness timer as the on_timer cases drive it: keepalive
// 200 ms, peer timeout 1000 ms, last heard at t0, PINGs counted.
struct Timer {
  const Config cfg = timing(200, 1000);
  const Clock::time_point t0 = Clock::now();
  Clock::time_point last_heard;
  Liveness l{last_heard, t0};
  int pings = 0;
  std::string fire(std::chrono::milliseconds at, const std::string& peer, bool listening) {
    return l.on_timer(t0 + at, cfg, peer, listening, [this] { ++pings; });
  }
};

}  // namespace

TEST_CASE("check: quiet within keepalive_ms of the last word, PING from keepalive_ms, dead from peer_timeout_ms") {
  const Config cfg = timing(200, 1000);
  const Clock::time_point t0 = Clock::now();
  Clock::time_point last_heard;
  Liveness l(last_heard, t0);
  CHECK(l.check(t0 + 199ms, cfg) == Liveness::Verdict::kQuiet);
  CHECK(l.check(t0 + 200ms, cfg) == Liveness::Verdict::kPing);
  CHECK(l.check(t0 + 999ms, cfg) == Liveness::Verdict::kPing);
  CHECK(l.check(t0 + 1000ms, cfg) == Liveness::Verdict::kDead);
  // Hearing the peer starts the count again; an older stamp never moves it back.
  l.heard(t0 + 900ms);
  l.heard(t0 + 100ms);
  CHECK(l.last_heard() == t0 + 900ms);
  CHECK(last_heard == t0 + 900ms);  // the session's own stamp, which the reactor writes
  CHECK(l.check(t0 + 1000ms, cfg) == Liveness::Verdict::kQuiet);
  CHECK(l.check(t0 + 1899ms, cfg) == Liveness::Verdict::kPing);
  CHECK(l.check(t0 + 1900ms, cfg) == Liveness::Verdict::kDead);
}

TEST_CASE("next_check: the next PING while the peer was heard lately, then every keepalive_ms until its death, never in the past") {
  const Config cfg = timing(200, 1000);
  const Clock::time_point t0 = Clock::now();
  Clock::time_point last_heard;
  Liveness l(last_heard, t0);
  // Heard 50 ms ago: the PING is due when the silence reaches 200 ms.
  CHECK(l.next_check(t0 + 50ms, cfg) == t0 + 200ms);
  // Silent 300 ms (a PING just went): the next one 200 ms on.
  CHECK(l.next_check(t0 + 300ms, cfg) == t0 + 500ms);
  // Silent 900 ms: death (at 1000) comes before the next PING (at 1100).
  CHECK(l.next_check(t0 + 900ms, cfg) == t0 + 1000ms);
  // Past the death (a late timer): now, never earlier.
  CHECK(l.next_check(t0 + 1200ms, cfg) == t0 + 1200ms);
  // A peer timeout shorter than the keepalive: death first.
  CHECK(l.next_check(t0 + 10ms, timing(500, 300)) == t0 + 300ms);
}

TEST_CASE("on_timer: pings once when a PING is due, names the silence and the setting when the peer is dead, else does nothing") {
  Timer t;
  CHECK(t.fire(100ms, "10.0.0.7:5000", true).empty());
  CHECK(t.pings == 0);
  CHECK(t.fire(250ms, "10.0.0.7:5000", true).empty());
  CHECK(t.pings == 1);
  const std::string dead = t.fire(1234ms, "10.0.0.7:5000", true);
  CHECK(t.pings == 1);  // no PING to a peer declared dead
  CHECK(dead == "peer 10.0.0.7:5000 silent for 1234 ms (peer_timeout_ms = 1000)");
}

TEST_CASE("on_timer: while this side does not read the peer, its silence is not the peer's") {
  // A TCP link over its output budget stops reading a peer that reads
  // nothing of ours; the link's drain clock closes that peer.  The timer
  // must not call it silent meanwhile (it may be flooding us), nor queue a
  // PING behind the backed-up output.
  Timer t;
  CHECK(t.fire(900ms, "p", false).empty());
  CHECK(t.fire(5000ms, "p", false).empty());  // 5 x peer_timeout_ms
  CHECK(t.pings == 0);
  CHECK(t.l.last_heard() == t.t0 + 5000ms);
  // Reading again: the peer has its full timeout from the last paused check.
  CHECK(t.fire(5100ms, "p", true).empty());
  CHECK(t.pings == 0);
  CHECK(t.fire(5250ms, "p", true).empty());
  CHECK(t.pings == 1);
  CHECK(t.fire(6000ms, "p", true) == "peer p silent for 1000 ms (peer_timeout_ms = 1000)");
}
