// What a client sees when its server dies.
//
//   * An application-style client keeps 8 or 256 calls in flight by issuing
//     the next call from each callback, against an echo_server process that
//     is killed (SIGKILL), frozen (SIGSTOP) or stopped gracefully (SIGTERM):
//     every call ends exactly once, with UNAVAILABLE (or DEADLINE_EXCEEDED
//     where its deadline came first), no callback runs inside another, and
//     the client stops in bounded time.  Before the fix the failure
//     callbacks recursed through Channel::call until the stack overflowed.
//   * echo_client itself, with its server killed: exits 1 with a message.
//   * Fail-fast: a call on a dead channel (or with its deadline passed)
//     completes with the session's status, after Channel::call returned.
//   * Reconnect backoff: against a dead address, idempotent retries start
//     no more reconnects than the policy allows.
#include "failure_util.h"

#include <netinet/in.h>
#include <sys/socket.h>

using namespace failure_test;
using slotrpc::CallOptions;
using slotrpc::Channel;
using slotrpc::Config;
using slotrpc::RawReply;
using slotrpc::Status;
using slotrpc::StatusCode;

namespace {

enum class Death { kKill, kFreeze, kGracefulStop };

// Failed calls a Reissuer keeps reissuing before it stops: enough that the
// old re-entrant failure chain would have overflowed the stack many times.
constexpr uint64_t kFailuresToReissue = 50'000;

void reissuing_client_survives(Death death, size_t window, std::optional<std::chrono::milliseconds> timeout) {
  CAPTURE(window);
  EchoServerProcess server;
  Config cfg;
  cfg.keepalive_ms = 200;
  cfg.peer_timeout_ms = 1000;
  auto ch = connect(server.address(), cfg);
  Reissuer client(*ch, window, kFailuresToReissue, timeout);
  client.start();
  REQUIRE_MESSAGE(wait_until([&] { return client.ok() >= 2000; }, 30000ms),
                  "calls make no progress: " << client.ok() << " ok");

  Clock::time_point t0 = Clock::now();
  switch (death) {
    case Death::kKill:
      server.kill();
      break;
    case Death::kFreeze:
      t0 = server.freeze();
      break;
    case Death::kGracefulStop:
      server.terminate();
      break;
  }
  // Bounded: the closed connection is seen at once, a frozen server after
  // peer_timeout_ms (1 s); then the reissued calls fail fast.
  const bool stopped = wait_until([&] { return client.finished(); }, 20000ms);
  REQUIRE_MESSAGE(stopped, "the client did not stop: " << client.failures() << " failures");
  const double ms = ms_between(t0, Clock::now());
  CAPTURE(ms);
  client.check_every_call_ended_once();
  const std::string first = client.first_unavailable();
  INFO("first UNAVAILABLE: " << first);
  switch (death) {
    case Death::kKill:
    case Death::kGracefulStop:
      CHECK(contains(first, "lost"));
      CHECK(ms < 10000);
      break;
    case Death::kFreeze:
      CHECK(contains(first, "silent"));
      CHECK(contains(first, "peer_timeout_ms = 1000"));
      CHECK(ms >= 900);  // only the silence can tell
      CHECK(ms < 15000);
      break;
  }
  // Later calls fail fast with the session's status too.
  auto f = slotrpc::raw::call(*ch, kEcho, echo_request(1, 8));
  REQUIRE(f.wait_for(5000ms));
  const RawReply r = f.get();
  CHECK(r.status().code() == StatusCode::kUnavailable);
  CHECK(r.status().to_string() == first);
  CHECK(ch->stats().closed);
}

}  // namespace

TEST_CASE("reissuing client: 8 in flight; server killed (SIGKILL)") {
  reissuing_client_survives(Death::kKill, 8, std::nullopt);
}
TEST_CASE("reissuing client: 256 in flight; server killed (SIGKILL)") {
  reissuing_client_survives(Death::kKill, 256, std::nullopt);
}
TEST_CASE("reissuing client: 8 in flight; server frozen (SIGSTOP)") {
  reissuing_client_survives(Death::kFreeze, 8, std::nullopt);
}
TEST_CASE("reissuing client: 256 in flight with 400 ms deadlines; server frozen (SIGSTOP)") {
  // The deadlines of the calls out at the freeze come before the peer
  // timeout: those end DEADLINE_EXCEEDED, the rest UNAVAILABLE.
  reissuing_client_survives(Death::kFreeze, 256, 400ms);
}
TEST_CASE("reissuing client: 8 in flight; server stopped gracefully (SIGTERM -> Server::stop)") {
  reissuing_client_survives(Death::kGracefulStop, 8, std::nullopt);
}
TEST_CASE("reissuing client: 256 in flight; server stopped gracefully (SIGTERM -> Server::stop)") {
  reissuing_client_survives(Death::kGracefulStop, 256, std::nullopt);
}

namespace {

// The reproduction with the shipped examples.
void echo_client_exits_cleanly(const std::string& outstanding) {
  CAPTURE(outstanding);
  EchoServerProcess server;
  // An idle server spends no CPU (a keepalive a second): CPU it spends from
  // now on is spent serving the client's calls.
  const uint64_t idle_ticks = cpu_ticks(server.pid());
  Child client({binary("ECHO_CLIENT"), "--connect", server.address(), "--count", "20000000",
                "--outstanding", outstanding},
               SpawnOptions::to_files(server.dir.path, "echo_client"));
  // Progress: the server has served calls for 10 ticks of CPU (~100 ms).
  REQUIRE_MESSAGE(wait_until([&] { return !client.running() || cpu_ticks(server.pid()) >= idle_ticks + 10; },
                             60000ms),
                  "echo_client made no progress");
  REQUIRE_MESSAGE(client.running(), "echo_client exited early: " << client.stderr_text());
  server.kill();
  int status = 0;
  REQUIRE_MESSAGE(client.wait(20000ms, &status), "echo_client did not exit after its server died");
  const std::string err = client.stderr_text();
  INFO("echo_client stderr:\n" << err << "stdout:\n" << client.stdout_text());
  REQUIRE_MESSAGE(WIFEXITED(status), "echo_client died of signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0));
  CHECK(WEXITSTATUS(status) == 1);
  // The generated client's status names the method (CallOptions::method_name).
  CHECK(contains(err, "echo_client: call failed: UNAVAILABLE: slotrpc.examples.Echo/Echo: connection to 127.0.0.1:" +
                          std::to_string(server.port) + " lost: "));
}

}  // namespace

TEST_CASE("echo_client --outstanding 8: server killed -> exit 1 with the reason; no crash") {
  echo_client_exits_cleanly("8");
}
TEST_CASE("echo_client --outstanding 256: server killed -> exit 1 with the reason; no crash") {
  echo_client_exits_cleanly("256");
}

TEST_CASE("fail-fast: a call on a dead channel completes with the session's status, not on the caller's stack") {
  EchoServerProcess server;
  auto ch = connect(server.address());
  server.kill();
  REQUIRE(wait_until([&] { return ch->stats().closed; }, 10000ms));

  // Issued on the channel's loop (from a callback), where the old code ran
  // the failure inline: the inner callback must not have run when the inner
  // call returns.
  std::mutex mu;
  Status outer, inner;
  std::atomic<bool> inner_ran{false}, inner_ran_inside_call{true}, done{false};
  slotrpc::raw::call(*ch, kEcho, echo_request(1, 8), {}, [&](RawReply&& a) {
    {
      std::lock_guard<std::mutex> lock(mu);
      outer = a.status();
    }
    slotrpc::raw::call(*ch, kEcho, echo_request(2, 8), {}, [&](RawReply&& b) {
      std::lock_guard<std::mutex> lock(mu);
      inner = b.status();
      inner_ran = true;
      done = true;
    });
    inner_ran_inside_call = inner_ran.load();
  });
  REQUIRE(wait_until([&] { return done.load(); }, 10000ms));
  CHECK_FALSE(inner_ran_inside_call.load());
  std::lock_guard<std::mutex> lock(mu);
  CHECK(outer.code() == StatusCode::kUnavailable);
  CHECK(contains(outer.message(), "lost"));
  CHECK(inner.code() == StatusCode::kUnavailable);
  CHECK(inner.message() == outer.message());  // the session's status
}

TEST_CASE("fail-fast: a deadline already passed completes later, not on the caller's stack") {
  EchoServerProcess server;
  auto ch = connect(server.address());
  std::mutex mu;
  Status outer, inner;
  std::atomic<bool> inner_ran{false}, inner_ran_inside_call{true}, done{false};
  slotrpc::raw::call(*ch, kEcho, echo_request(1, 8), {}, [&](RawReply&& a) {
    {
      std::lock_guard<std::mutex> lock(mu);
      outer = a.status();
    }
    CallOptions past;
    past.deadline = Clock::now() - 1ms;
    slotrpc::raw::call(*ch, kEcho, echo_request(2, 8), past, [&](RawReply&& b) {
      std::lock_guard<std::mutex> lock(mu);
      inner = b.status();
      inner_ran = true;
      done = true;
    });
    inner_ran_inside_call = inner_ran.load();
  });
  REQUIRE(wait_until([&] { return done.load(); }, 10000ms));
  CHECK_FALSE(inner_ran_inside_call.load());
  std::lock_guard<std::mutex> lock(mu);
  CHECK(outer.ok());
  CHECK(inner.code() == StatusCode::kDeadlineExceeded);
  CHECK_FALSE(ch->stats().closed);
}

TEST_CASE("fail-fast: a full call queue refuses later, not on the caller's stack") {
  EchoServerProcess server;
  Config cfg;
  cfg.slot_count = 2;
  cfg.max_queued_calls = 1;
  auto ch = connect(server.address(), cfg);
  server.freeze();  // nothing is answered: the slots and the queue stay full
  std::mutex mu;
  std::vector<Status> refused;
  std::atomic<int> ran_inside_call{0}, completed{0};
  std::atomic<bool> in_call{false};
  // Two calls take the slots, one waits in the queue, the fourth is refused.
  std::atomic<bool> issued{false};
  slotrpc::raw::call(*ch, kEcho, echo_request(0, 8), CallOptions::with_timeout(300ms), [&](RawReply&&) {});
  slotrpc::raw::call(*ch, kEcho, echo_request(1, 8), CallOptions::with_timeout(300ms), [&](RawReply&&) {});
  slotrpc::raw::call(*ch, kEcho, echo_request(2, 8), CallOptions::with_timeout(300ms), [&](RawReply&&) {});
  // The fourth is issued on the loop (a stats() snapshot runs there too, so
  // post it through a call that fails fast: a deadline already passed).
  CallOptions past;
  past.deadline = Clock::now() - 1ms;
  slotrpc::raw::call(*ch, kEcho, echo_request(3, 8), past, [&](RawReply&&) {
    in_call = true;
    slotrpc::raw::call(*ch, kEcho, echo_request(4, 8), {}, [&](RawReply&& r) {
      if (in_call.load()) ++ran_inside_call;
      std::lock_guard<std::mutex> lock(mu);
      refused.push_back(r.status());
      ++completed;
    });
    in_call = false;
    issued = true;
  });
  REQUIRE(wait_until([&] { return completed.load() == 1; }, 10000ms));
  CHECK(issued.load());
  CHECK(ran_inside_call.load() == 0);
  std::lock_guard<std::mutex> lock(mu);
  REQUIRE(refused.size() == 1);
  CHECK(refused[0].code() == StatusCode::kResourceExhausted);
  CHECK(contains(refused[0].message(), "max_queued_calls = 1"));
}

TEST_CASE("reconnect backoff: against a dead address, idempotent retries do not reconnect in a loop") {
  // A server that goes away for good: its port refuses connections.
  std::string address;
  std::unique_ptr<Channel> ch;
  {
    EchoServerProcess server;
    address = server.address();
    ch = connect(address);
    auto f = slotrpc::raw::call(*ch, kEcho, echo_request(1, 8));
    REQUIRE(f.wait_for(10000ms));
    REQUIRE(f.get().ok());
    server.kill();
  }
  REQUIRE(wait_until([&] { return ch->stats().closed; }, 10000ms));

  CallOptions idempotent;
  idempotent.idempotent = true;
  idempotent.max_retries = 3;
  // Issue retried calls back to back for 1.5 s.  The policy: the first
  // reconnect at once, then after a failure k waits in [0.5, 1] x
  // min(10 s, 100 ms x 2^(k-1)): no sooner than 50, 150, 350, 750 and
  // 1550 ms after the first.  So at most 5 attempts in 1.5 s, and at least
  // 3 (the latest they may come is 100, 300 ms after the first; a busy
  // machine may delay them, not advance them).
  const auto t0 = Clock::now();
  uint64_t calls = 0;
  uint64_t backing_off = 0;
  std::string backoff_message;
  while (Clock::now() - t0 < 1500ms) {
    auto f = slotrpc::raw::call(*ch, kEcho, echo_request(2, 8), idempotent);
    REQUIRE(f.wait_for(10000ms));
    const RawReply r = f.get();
    ++calls;
    REQUIRE_MESSAGE(r.status().code() == StatusCode::kUnavailable, r.status().to_string());
    if (contains(r.status().message(), "not reconnecting to " + address + " for another ")) {
      ++backing_off;
      backoff_message = r.status().message();
    } else {
      CHECK_MESSAGE(contains(r.status().message(), "reconnect failed"), r.status().to_string());
    }
    std::this_thread::sleep_for(1ms);
  }
  const auto stats = ch->stats();
  INFO(calls << " calls, " << stats.reconnect_attempts << " reconnect attempts, " << backing_off
             << " refused while backing off; e.g. " << backoff_message);
  CHECK(stats.reconnect_attempts <= 5);
  CHECK(stats.reconnect_attempts >= 3);
  CHECK(stats.reconnects == 0);
  CHECK(calls >= 50);  // most calls were refused fast, not connected for
  CHECK(backing_off >= calls - stats.reconnect_attempts);
  CHECK(contains(backoff_message, " ms (backing off after "));
  CHECK(contains(backoff_message, "failed attempt"));
  CHECK(stats.closed);
}

TEST_CASE("connect to a listener that never answers the handshake: UNAVAILABLE naming connect_timeout_ms and its value") {
  // The kernel completes the TCP connect into the backlog; nothing reads it.
  const int l = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(l >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(l, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(l, 8) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(::getsockname(l, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  Config cfg;
  cfg.transport = slotrpc::TransportKind::kTcp;
  cfg.connect_timeout_ms = 300;
  auto ch = Channel::connect("127.0.0.1:" + std::to_string(ntohs(addr.sin_port)), cfg);
  ::close(l);
  REQUIRE_FALSE(ch.ok());
  CHECK(ch.status().code() == StatusCode::kUnavailable);
  CHECK_MESSAGE(ch.status().message().find("timed out") != std::string::npos, ch.status().to_string());
  CHECK_MESSAGE(ch.status().message().find("connect_timeout_ms = 300 ms") != std::string::npos,
                ch.status().to_string());
}
