// The shared-memory transport across processes: a peer that scribbles
// random bytes over its segment while messages flow, and a peer killed with
// SIGKILL (while it sends messages, and while it serves a bulk read).  The peers are forked children of this test (no exec): after the
// fork the child uses only its own objects and leaves with _exit.
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <random>

#include "../process_util.h"
#include "shm_test_util.h"

using namespace shm_test;

namespace {

constexpr Geometry kGeo{8, 512};
constexpr uint64_t kValid = 100;

// Child side of connect_raw (the parent offered first on the other end).
bool raw_handshake(int sock, RawPeer& p) {
  p.sock = Fd(sock);
  auto own = create_own_segment(kGeo);
  if (!own.ok()) return false;
  p.own = std::move(own).value();
  if (!send_offer(sock, p.own).ok()) return false;
  auto peer = receive_offer(sock, kGeo, 5s);
  if (!peer.ok()) return false;
  p.peer = std::move(peer).value();
  return true;
}

// Blocks until the child writes a byte to the pipe; false after the deadline.
bool wait_ready(int fd, int ms = 10000) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, ms) != 1) return false;
  char b;
  return ::read(fd, &b, 1) == 1;
}

// A peer in a forked child: `hub` offers on one end of a socketpair, the
// child adopts the other, attaches a ring of its own and runs `body` with
// its transport, its link and the fd on which it writes one byte when it
// is ready (body never returns; a setup failure exits with 2 or 3).  Back
// in the parent: the hub's link is completed and attached, and the child
// has said it is ready.
test_process::Child fork_peer(End& hub, const char* name,
                              const std::function<void(ShmTransport&, ShmLink&, int)>& body) {
  auto [s0, s1] = unix_pair();
  auto offered = hub.transport.offer(s0, kGeo);
  REQUIRE(offered.ok());
  int ready[2];
  REQUIRE(::pipe2(ready, O_CLOEXEC) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(ready[0]);
    ShmTransport t;
    auto link = t.adopt(s1, kGeo, 5s, "child");
    if (!link.ok()) ::_exit(2);
    std::vector<std::byte> ring(size_t{kGeo.slot_count} * kGeo.slot_size);
    if (!link.value()->attach({ring.data(), ring.size()}, {ring.data(), ring.size()},
                              kGeo.slot_count, kGeo.slot_size, nullptr).ok())
      ::_exit(3);
    body(t, *link.value(), ready[1]);
    ::_exit(0);
  }
  test_process::Child child = test_process::Child::adopt(pid);
  ::close(ready[1]);
  ::close(s1);
  auto l = hub.transport.complete(std::move(offered).value(), 5s, name);
  REQUIRE_MESSAGE(l.ok(), l.status().message());
  hub.link = std::move(l).value();
  hub.attach(kGeo);
  REQUIRE(wait_ready(ready[0]));
  ::close(ready[0]);
  return child;
}

// Tells the parent of a forked peer that it is ready (fork_peer).
void say_ready(int fd) {
  const char r = 'r';
  if (::write(fd, &r, 1) != 1) ::_exit(4);
}

uint64_t control_seq(const Completion& c) {
  uint64_t v;
  std::memcpy(&v, c.control.data(), sizeof v);
  return v;
}

// A second, well-behaved link on the hub's transport, fed from this
// process while a test abuses the first one: whatever the bad peer does
// must not reach it.
struct GoodLink {
  End& hub;
  End& good;
  std::unique_ptr<ShmLink> at_hub;
  std::vector<std::byte> ring = std::vector<std::byte>(size_t{kGeo.slot_count} * kGeo.slot_size);
  int context = 0;
  uint64_t sent = 0;

  GoodLink(End& h, End& g) : hub(h), good(g) {
    auto [g0, g1] = unix_pair();
    auto oh = hub.transport.offer(g0, kGeo);
    auto og = good.transport.offer(g1, kGeo);
    REQUIRE((oh.ok() && og.ok()));
    auto lh = hub.transport.complete(std::move(oh).value(), 5s, "hub-good");
    auto lg = good.transport.complete(std::move(og).value(), 5s, "good");
    REQUIRE((lh.ok() && lg.ok()));
    good.link = std::move(lg).value();
    good.attach(kGeo);
    at_hub = std::move(lh).value();
    REQUIRE(at_hub->attach({ring.data(), ring.size()}, {ring.data(), ring.size()}, kGeo.slot_count,
                           kGeo.slot_size, &context).ok());
  }

  // Sends the next numbered control message.
  void feed() {
    // Within the backlog budget (one more ring): wait for the hub when it lags.
    if (good.link->backlog() >= 64)
      REQUIRE(pump_until({&hub, &good}, [&] { return good.link->backlog() < 64; }));
    const auto h = control_bytes(sent++);
    const Outgoing o{h.data(), 32, 0, Delivery::kControl};
    good.link->post({&o, 1});
    good.poll_once();
  }

  // Sends `more` messages, then checks that the hub got every message of
  // this link, in order, and that the link is still up.
  void check_delivers_in_order(int more) {
    for (int i = 0; i < more; ++i) feed();
    REQUIRE(pump_until({&hub, &good}, [&] {
      uint64_t n = 0;
      for (const Completion& c : hub.got) n += c.link == at_hub.get();
      return n == sent;
    }));
    uint64_t expect = 0;
    for (const Completion& c : hub.got) {
      if (c.link != at_hub.get()) continue;
      REQUIRE(c.kind == CKind::kControl);
      REQUIRE(control_seq(c) == expect++);
    }
    CHECK_FALSE(at_hub->down());
  }
};

}  // namespace

TEST_CASE("shm: a peer scribbling over its segment while messages flow closes only its link") {
  End hub, good;
  auto [s0, s1] = unix_pair();
  auto offered = hub.transport.offer(s0, kGeo);
  REQUIRE(offered.ok());
  int ready[2], go[2];
  REQUIRE(::pipe2(ready, O_CLOEXEC) == 0);
  REQUIRE(::pipe2(go, O_CLOEXEC) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(ready[0]);
    ::close(go[1]);
    RawPeer p;
    if (!raw_handshake(s1, p)) ::_exit(2);
    std::mt19937_64 rng(12345);
    // Phase 1: valid control messages the parent can count (fewer than the
    // ring's 128 descriptors: this peer does not wait for room).
    for (uint64_t i = 0; i < kValid; ++i) p.put_control(i);
    const char r = 'r';
    if (::write(ready[1], &r, 1) != 1) ::_exit(3);
    // Until the parent has taken them all: they must not be overrun.
    if (!wait_ready(go[0])) ::_exit(4);
    // Phase 2: keep publishing while writing random bytes anywhere in the
    // segment: control words, descriptors, slot data.
    const size_t total = p.own.layout.total;
    for (uint64_t i = kValid;; ++i) {
      p.put_control(i);
      for (int k = 0; k < 8; ++k) {
        const uint64_t v = rng();
        const size_t off = (rng() % (total / 8)) * 8;
        std::memcpy(p.own.map.base() + off, &v, sizeof v);
      }
    }
  }
  test_process::Child child = test_process::Child::adopt(pid);
  ::close(ready[1]);
  ::close(go[0]);
  ::close(s1);
  auto l = hub.transport.complete(std::move(offered).value(), 5s, "scribbler");
  REQUIRE_MESSAGE(l.ok(), l.status().message());
  hub.link = std::move(l).value();
  hub.attach(kGeo);

  // A good link on the same transport, fed from this process throughout.
  GoodLink good_link(hub, good);
  REQUIRE(wait_ready(ready[0]));
  ::close(ready[0]);
  REQUIRE(pump_until({&hub}, [&] { return hub.got.size() >= kValid; }));
  const char g = 'g';
  REQUIRE(::write(go[1], &g, 1) == 1);
  ::close(go[1]);
  // The hostile link must die on its own nonsense, soon, without a crash or
  // a hang, while the good link keeps delivering in order.
  const auto until = Clock::now() + kTimeout;
  while (!hub.has_link_down() && Clock::now() < until) {
    good_link.feed();
    hub.poll_once();
  }
  REQUIRE(hub.has_link_down());
  CHECK(child.running());  // it died of our verdict, not of its own
  const std::string& why = hub.link->down_reason();
  INFO("reason: " << why);
  CHECK(why.find("peer closed") == std::string::npos);
  bool validation_reason = false;
  for (const char* r : {"hostile", "does not fit", "not armed", "unknown lane",
                        "control descriptor", "outside ring"})
    validation_reason = validation_reason || why.find(r) != std::string::npos;
  CHECK(validation_reason);
  // The scribbler's valid messages arrived intact and in order.
  uint64_t next = 0;
  for (const Completion& c : hub.got) {
    if (c.link != hub.link.get() || c.kind != CKind::kControl) continue;
    if (next < kValid) {
      REQUIRE(control_seq(c) == next);
    }
    ++next;
  }
  CHECK(next >= kValid);
  // After: the good link still works, every message in order.
  good_link.check_delivers_in_order(2000);
  CHECK(child.kill_and_reap());
}

TEST_CASE("shm: kill -9 of the peer process reports the link down at once, after what it sent") {
  // with_stream: the child keeps sending until killed; otherwise it sends a
  // fixed count, says so, and waits to be killed.
  for (const bool with_stream : {false, true}) {
    CAPTURE(with_stream);
    End hub;
    constexpr uint64_t kFixed = 100;
    test_process::Child child = fork_peer(hub, "victim", [&](ShmTransport& t, ShmLink& link, int ready) {
      std::array<Completion, 16> buf;
      uint64_t i = 0;
      for (; i < kFixed; ++i) {
        const auto h = control_bytes(i);
        const Outgoing o{h.data(), 32, 0, Delivery::kControl};
        link.post({&o, 1});
        t.poll(buf);
      }
      say_ready(ready);
      for (;;) {
        if (with_stream && link.backlog() < 64) {
          const auto h = control_bytes(i++);
          const Outgoing o{h.data(), 32, 0, Delivery::kControl};
          link.post({&o, 1});
        }
        t.poll(buf);
      }
    });
    if (with_stream)  // receive while it runs, then kill it mid-stream
      REQUIRE(pump_until({&hub}, [&] { return hub.got.size() > 2 * kFixed; }));
    REQUIRE(child.signal(SIGKILL));
    REQUIRE(child.wait(10000ms));
    REQUIRE(WIFSIGNALED(child.exit_status));
    // As a loop about to sleep would: it sees the hang-up first (before it
    // has read the ring), and must not sleep on the undelivered messages.
    CHECK_FALSE(hub.transport.prepare_sleep());
    REQUIRE(pump_until({&hub}, [&] { return hub.has_link_down(); }));
    CHECK_MESSAGE(hub.link->down_reason().find("peer closed") != std::string::npos,
                  hub.link->down_reason());
    // Everything before the link-down is in order; at least what the child
    // had sent before it said so; nothing after it.
    REQUIRE(hub.got.back().kind == CKind::kLinkDown);
    uint64_t expect = 0;
    for (size_t i = 0; i + 1 < hub.got.size(); ++i) {
      REQUIRE(hub.got[i].kind == CKind::kControl);
      REQUIRE(control_seq(hub.got[i]) == expect++);
    }
    CHECK(expect >= kFixed);
    if (!with_stream) CHECK(expect == kFixed);
  }
}

TEST_CASE("shm: kill -9 of a peer serving a bulk read ends the read UNAVAILABLE, then the link") {
  // The child exposes 64 MiB for reading (key 1, the link's first) and
  // serves; the hub reads it, and the child is killed mid-transfer.
  constexpr size_t kBytes = 64u << 20;
  auto pattern = [](size_t i) { return static_cast<std::byte>((i * 7 + (i >> 16)) & 0xff); };
  End hub;
  test_process::Child child = fork_peer(hub, "server", [&](ShmTransport& t, ShmLink& link, int ready) {
    std::vector<std::byte> src(kBytes);
    for (size_t i = 0; i < kBytes; ++i) src[i] = pattern(i);
    auto r = link.register_bulk(BulkSource{src.data(), src.size()});
    if (!r.ok()) ::_exit(5);
    auto seg = link.expose(r.value(), 0, kBytes, BulkAccess::kRemoteRead);
    if (!seg.ok() || seg.value().rkey != 1) ::_exit(6);
    say_ready(ready);
    std::array<Completion, 16> buf;
    for (;;) t.poll(buf);
  });
  std::vector<std::byte> dst(kBytes, std::byte{0});
  auto reg = hub.link->register_bulk(BulkSource{dst.data(), dst.size()});
  REQUIRE(reg.ok());
  REQUIRE(hub.link->read(reg.value(), 0, RemoteSegment{0, kBytes, 1}, 0, kBytes, 5).ok());
  REQUIRE(pump_until({&hub}, [&] { return hub.link->shm_stats().bulk_bytes_received >= (4u << 20); }));
  REQUIRE(child.signal(SIGKILL));
  REQUIRE(child.wait(10000ms));
  REQUIRE(pump_until({&hub}, [&] { return hub.has_link_down(); }));
  CHECK_MESSAGE(hub.link->down_reason().find("peer closed") != std::string::npos, hub.link->down_reason());
  // The read ended, failed, before the link-down; what arrived is the
  // child's bytes in order, and nothing lies beyond it.
  size_t done_at = SIZE_MAX, down_at = SIZE_MAX;
  for (size_t i = 0; i < hub.got.size(); ++i) {
    if (hub.got[i].kind == CKind::kBulkDone && hub.got[i].bulk_token == 5) done_at = i;
    if (hub.got[i].kind == CKind::kLinkDown) down_at = i;
  }
  REQUIRE(done_at != SIZE_MAX);
  CHECK(done_at < down_at);
  CHECK(hub.got[done_at].bulk_status == static_cast<uint16_t>(StatusCode::kUnavailable));
  const size_t got = hub.link->shm_stats().bulk_bytes_received;
  CHECK(got < kBytes);
  size_t bad = SIZE_MAX;
  for (size_t i = 0; i < kBytes && bad == SIZE_MAX; ++i)
    if (dst[i] != (i < got ? pattern(i) : std::byte{0})) bad = i;
  CHECK_MESSAGE(bad == SIZE_MAX, "byte " << bad << " of " << got << " received");
}

TEST_CASE("shm: a peer that stops consuming while we have a backlog is closed after peer_timeout_ms") {
  // The drain rule of TCP (docs/design.md, "Buffer budgets"), made short
  // through the ordinary Config.
  Config config;
  config.keepalive_ms = 50;
  config.peer_timeout_ms = 1000;
  REQUIRE(config.validate().ok());
  End hub(config), good;
  // A healthy consumer until it is stopped.
  test_process::Child child = fork_peer(hub, "stopped", [](ShmTransport& t, ShmLink&, int ready) {
    say_ready(ready);
    std::array<Completion, 16> buf;
    for (;;) t.poll(buf);
  });

  // Another link on the same transport, fed from this process throughout.
  GoodLink good_link(hub, good);

  // A consumer that drains keeps the link up (1 s: a busy machine may
  // deschedule the child for a while, never for that long): a full ring and a backlog,
  // taken as it goes, for longer than the timeout.
  const uint64_t ring = compute_layout(kGeo).value().desc_count;
  uint64_t sent = 0;
  auto send_hub = [&](uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) {
      const auto h = control_bytes(sent++);
      const Outgoing o{h.data(), 32, 0, Delivery::kControl};
      hub.link->post({&o, 1});
    }
  };
  const auto busy_until = Clock::now() + 2 * std::chrono::milliseconds(config.peer_timeout_ms);
  while (Clock::now() < busy_until) {
    // Never more than half a ring waiting: under the budget however slowly
    // the child is scheduled.
    if (hub.link->backlog() < ring / 2) send_hub(ring / 2);
    hub.poll_once();
  }
  REQUIRE_FALSE(hub.link->down());
  CHECK(hub.link->shm_stats().backlogged > 0);  // it did wait behind a full ring

  // Start from no backlog, so the clock we read below starts no later than
  // the link's.
  REQUIRE(pump_until({&hub}, [&] { return hub.link->backlog() == 0; }));
  // Stopped (waited for in /proc: state 'T'), it consumes nothing more.
  REQUIRE(child.stop());
  REQUIRE(test_process::process_state(child.pid) == 'T');
  // Fill whatever room the ring has left, then one message waits.
  const auto backlog_from = Clock::now();
  for (uint64_t i = 0; i <= 2 * ring && hub.link->backlog() == 0; ++i) send_hub(1);
  REQUIRE(hub.link->backlog() > 0);
  const auto until = backlog_from + kTimeout;
  while (!hub.has_link_down() && Clock::now() < until) {
    good_link.feed();
    hub.poll_once();
  }
  const auto took = Clock::now() - backlog_from;
  REQUIRE(hub.has_link_down());
  const std::string& why = hub.link->down_reason();
  INFO("reason: " << why);
  CHECK(why.find("peer has consumed nothing for") != std::string::npos);
  CHECK(why.find("peer_timeout_ms = 1000") != std::string::npos);
  // Never before the timeout (our clock started before the backlog did).
  CHECK(took >= std::chrono::milliseconds(config.peer_timeout_ms));
  CHECK(child.running());  // closed by our rule, not by its death

  // The other link was never affected and still delivers, in order.
  good_link.check_delivers_in_order(2000);
  CHECK(child.kill_and_reap());
}
