// Timeouts on time: the peer timeout and call deadlines
// fire within 10 % (or one timer tick, whichever is larger) of their
// setting.  Before the fix the liveness check ran every keepalive_ms, so a
// frozen peer was declared dead up to keepalive_ms late (5.5 s for 5 s).
//
// Bounds: the lower one is strict and measured conservatively (from a time
// at or after the peer was last heard, or at or before the deadline was
// set); the upper one is the setting + 10 % + one tick (the reactor sleeps
// in epoll with millisecond timeouts), measured from a time at or before
// the peer was last heard, plus how late the OS woke a plain thread over
// the same time (WakeLateness).  Several trials per case, since one lucky
// trial proves little about a timer's phase.
#include "failure_util.h"

#include <netinet/in.h>
#include <sys/socket.h>

#include <array>

#include "core/handshake.h"
#include "core/outbox.h"
#include "core/wire_format.h"
#include "rpc/connector.h"
#include "test_messages_generated.h"

using namespace failure_test;
using slotrpc::CallOptions;
using slotrpc::Config;
using slotrpc::RawReply;
using slotrpc::Status;
using slotrpc::StatusCode;
namespace core = slotrpc::core;
namespace rpc = slotrpc::rpc;

namespace {

constexpr auto kTick = 1ms;
constexpr uint32_t kKeepaliveMs = 200;
constexpr uint32_t kPeerTimeoutMs = 1000;
constexpr double kUpperMs = kPeerTimeoutMs * 1.1 + 1.0;  // + 10 % + one tick
constexpr int kTrials = 3;

// "peer X silent for N ms (...)" -> N.
long silent_ms(const std::string& message) {
  const size_t at = message.find("silent for ");
  if (at == std::string::npos) return -1;
  return std::stol(message.substr(at + 11));
}

// How late the OS wakes a plain thread while this lives: a thread that
// sleeps until the next 2 ms mark, over and over, keeps the worst lateness.
// The upper bounds below add it: on a loaded machine (the suite shares two
// cores with a VM and compilers) a timer can fire late only because its
// thread was not scheduled, which is not the library's doing and would make
// a "10 %" bound fail one run in a few.  A scheduling bug of the library
// (a check on a keepalive period, a missed re-arm) still shows: it is late
// by far more than a plain thread was over the same time.
class WakeLateness {
 public:
  WakeLateness() : thread_([this] { run(); }) {}
  ~WakeLateness() {
    stop_ = true;
    thread_.join();
  }
  double max_ms() const { return static_cast<double>(max_us_.load()) / 1000.0; }

 private:
  void run() {
    Clock::time_point next = Clock::now();
    while (!stop_) {
      next += 2ms;
      std::this_thread::sleep_until(next);
      const auto now = Clock::now();
      const auto late = std::chrono::duration_cast<std::chrono::microseconds>(now - next).count();
      if (late > max_us_.load()) max_us_ = late;
      if (late > 0) next = now;
    }
  }
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> max_us_{0};
  std::thread thread_;
};

}  // namespace

TEST_CASE("a frozen server (SIGSTOP) is declared dead peer_timeout_ms after it was last heard, within 10 % + a tick") {
  Config cfg;
  cfg.keepalive_ms = kKeepaliveMs;
  cfg.peer_timeout_ms = kPeerTimeoutMs;
  for (int trial = 0; trial < kTrials; ++trial) {
    CAPTURE(trial);
    WakeLateness os;
    EchoServerProcess server;
    auto ch = connect(server.address(), cfg);
    // The session's liveness timer was armed when it was created, just
    // before connect() returned.  The server is last heard answering a call
    // made a little later, at a different offset each trial (a deliberate
    // phase, not a wait for state): a check running on a fixed keepalive_ms
    // period from the session's start (the old rule) would then find the
    // silence long enough 120-180 ms late.
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + 30 * trial));
    {
      auto f = slotrpc::raw::call(*ch, kEcho, echo_request(1, 8));
      REQUIRE(f.wait_for(10000ms));
      REQUIRE(f.get().ok());
    }
    const Clock::time_point stopped = server.freeze();
    // Calls sent to the frozen server end when it is declared dead.
    std::mutex mu;
    std::vector<std::pair<Clock::time_point, Status>> ends;
    for (uint64_t seq = 0; seq < 4; ++seq) {
      slotrpc::raw::call(*ch, kEcho, echo_request(seq, 8), {}, [&](RawReply&& r) {
        std::lock_guard<std::mutex> lock(mu);
        ends.emplace_back(Clock::now(), r.status());
      });
    }
    REQUIRE_MESSAGE(wait_until([&] {
      std::lock_guard<std::mutex> lock(mu);
      return ends.size() == 4;
    }, 10000ms), "the frozen server was never declared dead");
    std::lock_guard<std::mutex> lock(mu);
    const std::string why = ends[0].second.to_string();
    INFO(why);
    for (auto& [at, st] : ends) CHECK(st.to_string() == why);
    REQUIRE(contains(why, "silent for "));
    // The session measures the silence from when it last heard the server.
    const long silent = silent_ms(why);
    // The server was last heard before it was stopped.
    const double since_stopped = ms_between(stopped, ends[0].first);
    MESSAGE("peer timeout " << kPeerTimeoutMs << " ms (keepalive " << kKeepaliveMs
                            << "): declared dead after " << silent << " ms of silence, "
                            << since_stopped << " ms after SIGSTOP was observed");
    const double upper = kUpperMs + os.max_ms();
    MESSAGE("a plain thread woke up to " << os.max_ms() << " ms late meanwhile");
    CHECK(silent >= static_cast<long>(kPeerTimeoutMs));
    CHECK(silent <= static_cast<long>(upper));
    CHECK(since_stopped <= upper);
  }
}

// The silence is counted from after the application handled what it heard:
// the reactor stamps "last heard" once the turn's callbacks have run
// (core/liveness.h).  A reply callback that holds the loop for 150 ms before
// the server freezes must not bring the verdict 150 ms closer: counted from
// when the callback returned, the server is declared dead no earlier than
// peer_timeout_ms.  Stamping at the message's arrival or its batch's poll
// (both tried: the latter failed verbs_failure_test in CI) fails this.
TEST_CASE("a peer's silence is counted from after the callbacks that handled its last message") {
  Config cfg;
  cfg.keepalive_ms = kKeepaliveMs;
  cfg.peer_timeout_ms = kPeerTimeoutMs;
  EchoServerProcess server;
  auto ch = connect(server.address(), cfg);
  std::atomic<int64_t> handled{0};
  slotrpc::raw::call(*ch, kEcho, echo_request(1, 8), {}, [&](RawReply&& r) {
    CHECK(r.ok());
    std::this_thread::sleep_for(150ms);  // holds the loop, as a slow callback does
    handled.store(Clock::now().time_since_epoch().count());
  });
  REQUIRE(wait_until([&] { return handled.load() != 0; }, 10000ms));
  const Clock::time_point returned{Clock::duration(handled.load())};
  server.freeze();
  std::mutex mu;
  std::optional<std::pair<Clock::time_point, Status>> end;
  slotrpc::raw::call(*ch, kEcho, echo_request(2, 8), {}, [&](RawReply&& r) {
    std::lock_guard<std::mutex> lock(mu);
    end.emplace(Clock::now(), r.status());
  });
  REQUIRE_MESSAGE(wait_until([&] {
    std::lock_guard<std::mutex> lock(mu);
    return end.has_value();
  }, 10000ms), "the frozen server was never declared dead");
  std::lock_guard<std::mutex> lock(mu);
  const std::string why = end->second.to_string();
  INFO(why);
  REQUIRE(contains(why, "silent for "));
  const double since_returned = ms_between(returned, end->first);
  MESSAGE("declared dead " << since_returned << " ms after the last reply's callback returned");
  CHECK(since_returned >= kPeerTimeoutMs);
}

namespace {

uint32_t load_u32(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(std::to_integer<uint8_t>(p[i])) << (8 * i);
  return v;
}
void store_u32(std::byte* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}

}  // namespace

TEST_CASE("a silent client is closed by the server peer_timeout_ms after it was last heard, within 10 % + a tick") {
  Config cfg;
  cfg.keepalive_ms = kKeepaliveMs;
  cfg.peer_timeout_ms = kPeerTimeoutMs;
  slotrpc::Server server(cfg);
  slotrpc::ServiceDefinition svc("slotrpc.test.Timeouts");
  svc.add_typed_unary<slotrpc::test::Ping, slotrpc::test::Pong>(
      "Echo", [](const slotrpc::test::Ping& req, slotrpc::ReplyBuilder<slotrpc::test::Pong>& out,
                 slotrpc::ServerCall&) {
        out.Finish(slotrpc::test::CreatePong(out.fbb(), req.seq()));
        return Status();
      });
  REQUIRE(server.add_service(std::move(svc)).ok());
  const Status started = server.start("127.0.0.1:0");
  REQUIRE_MESSAGE(started.ok(), started.to_string());

  for (int trial = 0; trial < kTrials; ++trial) {
    CAPTURE(trial);
    WakeLateness os;
    // A client whose handshake is done by hand, which then says one PING
    // and nothing more (it reads what the server sends, and never answers).
    const auto deadline = Clock::now() + 10s;
    auto fd = rpc::connect_tcp(rpc::Endpoint{"127.0.0.1", server.port()}, deadline);
    REQUIRE_MESSAGE(fd.ok(), fd.status().to_string());
    struct Closer {
      int fd;
      ~Closer() { ::close(fd); }
    } closer{*fd};
    std::array<std::byte, core::kHelloSize> hello_bytes{};
    core::Hello hello;
    hello.transport = core::WireTransport::kTcp;
    hello.slot_count = 4;
    hello.slot_size = 4096;
    core::encode_hello(hello, hello_bytes.data());
    REQUIRE(rpc::write_all(*fd, hello_bytes, deadline).ok());
    REQUIRE(rpc::read_exact(*fd, hello_bytes, deadline).ok());
    auto reply = core::decode_hello_reply(hello_bytes.data());
    REQUIRE(reply.ok());
    REQUIRE(reply->status == 0);
    std::vector<std::byte> rest(reply->message_len + reply->extension_len);
    REQUIRE(rpc::read_exact(*fd, rest, deadline).ok());

    // The session was created (and its liveness timer armed) at the
    // handshake.  Speak a little later, at a different offset each trial,
    // so that a timer running on a fixed period from the session's start
    // (the old rule) would find the silence long enough only up to one
    // keepalive period late.  (A deliberate offset, not a wait for state.)
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + 30 * trial));
    std::array<std::byte, 8 + core::kHeaderSize> ping{};
    store_u32(ping.data(), static_cast<uint32_t>(core::kHeaderSize) | 0x8000'0000u);  // control lane
    core::encode_header(core::control_header(core::Kind::kPing, 0, 0, 7), ping.data() + 8);
    const Clock::time_point said = Clock::now();  // at or before the server heard it
    REQUIRE(rpc::write_all(*fd, ping, deadline).ok());

    // Read (and drop) the server's PONG and PINGs until it closes.
    Clock::time_point closed{};
    int pings = 0;
    for (;;) {
      std::array<std::byte, 8> prefix;
      const Status st = rpc::read_exact(*fd, prefix, Clock::now() + 10s);
      if (!st.ok()) {
        closed = Clock::now();
        REQUIRE_MESSAGE(ms_between(said, closed) < 9000, "the server never closed: " << st.to_string());
        break;
      }
      const uint32_t word = load_u32(prefix.data());
      REQUIRE((word & 0x8000'0000u) != 0);  // only control frames: no calls were made
      std::vector<std::byte> body(word & 0x7fff'ffffu);
      if (!rpc::read_exact(*fd, body, Clock::now() + 10s).ok()) {
        closed = Clock::now();
        break;
      }
      if (core::decode_header(body.data()).kind() == core::Kind::kPing) ++pings;
    }
    const double ms = ms_between(said, closed);
    MESSAGE("server side, peer timeout " << kPeerTimeoutMs << " ms (keepalive " << kKeepaliveMs
                                          << "): closed " << ms << " ms after the client's last word, "
                                          << pings << " PINGs sent meanwhile");
    MESSAGE("a plain thread woke up to " << os.max_ms() << " ms late meanwhile");
    CHECK(ms >= kPeerTimeoutMs);
    CHECK(ms <= kUpperMs + os.max_ms());
    // PINGs every keepalive_ms of silence: at 200, 400, 600, 800 ms.
    CHECK(pings >= 3);
    CHECK(pings <= 5);
  }
}

TEST_CASE("call deadlines fire within 10 % or a tick of their setting, sent or queued") {
  // A frozen server answers nothing (and is not declared dead within this
  // test).  One slot: the second call waits in the queue (and after the
  // first trial the slot stays a zombie: every call queues).  Deadlines of a
  // second and more, so that 10 % is larger than what a loaded 2-core
  // machine adds to a thread's wake-up (tens of ms seen at load 24).
  EchoServerProcess server;
  Config cfg;
  cfg.slot_count = 1;
  cfg.peer_timeout_ms = 60'000;
  auto ch = connect(server.address(), cfg);
  {
    auto f = slotrpc::raw::call(*ch, kEcho, echo_request(1, 8));
    REQUIRE(f.wait_for(10000ms));
    REQUIRE(f.get().ok());
  }
  server.freeze();
  for (int trial = 0; trial < kTrials; ++trial) {
    CAPTURE(trial);
    WakeLateness os;
    const std::vector<std::chrono::milliseconds> timeouts = {1000ms, 1500ms};
    struct Outcome {
      std::atomic<bool> done{false};
      Clock::time_point at;
      StatusCode code = StatusCode::kOk;
    };
    std::vector<Outcome> outcomes(timeouts.size());
    std::vector<Clock::time_point> set(timeouts.size());
    for (size_t i = 0; i < timeouts.size(); ++i) {
      set[i] = Clock::now();  // at or before the deadline is computed
      slotrpc::raw::call(*ch, kEcho, echo_request(i, 8), CallOptions::with_timeout(timeouts[i]), [&, i](RawReply&& r) {
        outcomes[i].at = Clock::now();
        outcomes[i].code = r.status().code();
        outcomes[i].done = true;
      });
    }
    REQUIRE(wait_until([&] {
      for (auto& o : outcomes)
        if (!o.done) return false;
      return true;
    }, 10000ms));
    for (size_t i = 0; i < timeouts.size(); ++i) {
      CAPTURE(i);
      const double ms = ms_between(set[i], outcomes[i].at);
      const double setting = static_cast<double>(timeouts[i].count());
      const double allowance = std::max(setting * 0.1, std::chrono::duration<double, std::milli>(kTick).count());
      MESSAGE("a plain thread woke up to " << os.max_ms() << " ms late meanwhile");
      MESSAGE("deadline " << setting << " ms (" << std::string(trial == 0 && i == 0 ? "sent" : "queued")
                          << "): fired after " << ms << " ms");
      CHECK(outcomes[i].code == StatusCode::kDeadlineExceeded);
      CHECK(ms >= setting);
      CHECK(ms <= setting + allowance + os.max_ms());
    }
  }
  CHECK_FALSE(ch->stats().closed);
}
