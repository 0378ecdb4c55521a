// Integration: a peer cannot grow a server's memory ("Every
// per-session buffer has a bound").
//
// The abuse: one raw TCP session does the real handshake, then writes PING
// control frames as fast as it can with a 4 KiB receive buffer and never
// reads.  Before output budgets, the server queued one PONG per PING in the
// link's pending output and its RSS grew by ~80 MB/s until the OOM killer.
//
// The server runs as an echo_server child process, so its RSS can be read
// from /proc/PID/status while a well-behaved Channel in this process keeps
// calling it.  Every wait is bounded; the child is killed and reaped even
// when a check fails.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <signal.h>
#include <slotrpc/slotrpc.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/handshake.h"
#include "core/wire_format.h"
#include "payloads.h"
#include "process_util.h"

namespace {

using namespace slotrpc::test_payloads;  // ping, pong_error, echo_request, pattern

using namespace std::chrono_literals;
using slotrpc::Channel;
using slotrpc::Config;
using slotrpc::Future;
using slotrpc::Reply;
using slotrpc::RequestWriter;
using Clock = std::chrono::steady_clock;
namespace core = slotrpc::core;

// The echo example's method (examples/echo/echo_service.h).
constexpr uint32_t kExampleEcho = slotrpc::method_id("slotrpc.examples.Echo.Echo");

using test_process::read_file;
using test_process::rss_kib;

// An echo_server child with a short peer timeout and info logging (the
// drain-timeout line is checked in its stderr).
struct ServerProcess {
  test_process::TempDir dir{"slotrpc-buffers"};
  std::unique_ptr<test_process::Child> child;
  pid_t pid = -1;
  uint16_t port = 0;

  explicit ServerProcess(const std::vector<std::string>& env_extra) {
    // Both streams into one file: the log goes wherever spdlog sends it.
    test_process::SpawnOptions o = test_process::SpawnOptions::to_file(log_path());
    o.env = env_extra;
    o.drop_env_prefix = "SLOTRPC_";  // ours win
    auto up = test_process::start_echo_server(dir.path, o);
    child = std::move(up.child);
    REQUIRE_MESSAGE(up.port != 0, up.error);
    pid = child->pid;
    port = up.port;
  }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  std::filesystem::path log_path() const { return dir.path / "log"; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
  void kill_and_reap() {
    child->kill_and_reap();
    pid = -1;
  }
};

// A raw client: the real handshake, then nothing but PING frames.
struct Flooder {
  int fd = -1;
  uint64_t pings_sent = 0;

  ~Flooder() {
    if (fd >= 0) ::close(fd);
  }

  // Connects with a 4 KiB receive buffer and does the handshake (blocking).
  bool connect(uint16_t port) {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    const int small = 4096;  // before connect, so the window stays small
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(port);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return false;
    std::byte hello[core::kHelloSize];
    core::Hello h;
    h.slot_count = 16;
    h.slot_size = 4096;
    core::encode_hello(h, hello);
    if (::send(fd, hello, sizeof hello, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof hello)) return false;
    std::byte reply[core::kHelloSize];
    size_t got = 0;
    while (got < sizeof reply) {
      const ssize_t n = ::recv(fd, reply + got, sizeof reply - got, 0);
      if (n <= 0) return false;
      got += static_cast<size_t>(n);
    }
    auto r = core::decode_hello_reply(reply);
    if (!r.ok() || r->status != 0) return false;
    // The reply's message and extension (a bulk lane token, when the
    // server offers lanes): the frames come after them.
    std::vector<std::byte> rest(r->message_len + r->extension_len);
    for (size_t have = 0; have < rest.size();) {
      const ssize_t n = ::recv(fd, rest.data() + have, rest.size() - have, 0);
      if (n <= 0) return false;
      have += static_cast<size_t>(n);
    }
    const int flags = ::fcntl(fd, F_GETFL);
    ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    return true;
  }

  // One batch of 256 PINGs, blocking until written (false: closed).
  bool flood_once() {
    const int flags = ::fcntl(fd, F_GETFL);
    ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    const std::vector<std::byte>& b = batch_frames();
    size_t off = 0;
    while (off < b.size()) {
      const ssize_t n = ::send(fd, b.data() + off, b.size() - off, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    ::fcntl(fd, F_SETFL, flags);
    pings_sent += 256;
    return true;
  }

  // 256 PING frames: 8-byte prefix (control lane, 32 bytes) + header.
  static const std::vector<std::byte>& batch_frames() {
    static const std::vector<std::byte> b = [] {
      std::vector<std::byte> b;
      core::Header h;
      h.flags = static_cast<uint8_t>(core::Kind::kPing);
      std::byte head[core::kHeaderSize];
      core::encode_header(h, head);
      const uint32_t word = 0x8000'0000u | static_cast<uint32_t>(core::kHeaderSize);
      for (int i = 0; i < 256; ++i) {
        for (int k = 0; k < 4; ++k) b.push_back(static_cast<std::byte>((word >> (8 * k)) & 0xff));
        for (int k = 0; k < 4; ++k) b.push_back(std::byte{0});  // imm: slot 0, generation 0
        b.insert(b.end(), head, head + core::kHeaderSize);
      }
      return b;
    }();
    return b;
  }

  // Writes PINGs until the socket is full (false: the server closed it).
  bool flood() {
    const std::vector<std::byte>& batch = batch_frames();
    for (;;) {
      const ssize_t n = ::send(fd, batch.data(), batch.size(), MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        return errno == EAGAIN || errno == EWOULDBLOCK;
      }
      pings_sent += static_cast<size_t>(n) / 40;
      // A partial frame at the end would desynchronize the stream: finish it.
      size_t rest = (40 - static_cast<size_t>(n) % 40) % 40;
      const std::byte* p = batch.data() + n;
      while (rest > 0) {
        const ssize_t m = ::send(fd, p, rest, MSG_NOSIGNAL);
        if (m < 0 && (errno == EAGAIN || errno == EINTR)) {
          std::this_thread::sleep_for(100us);
          continue;
        }
        if (m <= 0) return false;
        p += m;
        rest -= static_cast<size_t>(m);
      }
      if (static_cast<size_t>(n) < batch.size()) return true;
    }
  }

  // True once the server has closed the connection (RST or FIN): probed
  // with a zero-length peek that does not consume the PONGs never read.
  bool closed_by_server() {
    char c;
    const ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    return err != 0;
  }
};

bool echo_ok(const Reply<EchoReplyView>& r, uint64_t seq, size_t n) { return echo_error(r, seq, n).empty(); }

// `count` echo calls, `window` at a time; returns how many came back right.
uint64_t run_calls(Channel& ch, uint64_t first_seq, uint64_t count, size_t window) {
  uint64_t good = 0;
  std::vector<std::pair<uint64_t, Future<Reply<EchoReplyView>>>> inflight;
  uint64_t next = first_seq;
  const uint64_t end = first_seq + count;
  while (next < end || !inflight.empty()) {
    while (next < end && inflight.size() < window) {
      inflight.emplace_back(next, ch.call_typed<EchoReplyView>(kExampleEcho, echo_request(next, 64)));
      ++next;
    }
    auto& [seq, f] = inflight.front();
    if (!f.wait_for(30s)) return good;  // hung: the caller's CHECK reports it
    if (echo_ok(f.get(), seq, 64)) ++good;
    inflight.erase(inflight.begin());
  }
  return good;
}

}  // namespace

TEST_CASE("PING flood: a peer that never reads cannot grow the server; other sessions are served") {
  // A short peer timeout, so the drain timeout is seen within the flood;
  // the keepalive is the default 1000 ms cut to stay below it.
  ServerProcess server({"SLOTRPC_PEER_TIMEOUT_MS=1000", "SLOTRPC_KEEPALIVE_MS=250",
                        "SLOTRPC_LOG_LEVEL=info"});
  auto connected = Channel::connect(server.address());
  REQUIRE_MESSAGE(connected.ok(), connected.status().to_string());
  auto ch = std::move(connected).value();

  // Warm-up: the well-behaved session's rings, the fiber stacks, the
  // allocator's arenas and one flooding session have all been touched.
  REQUIRE(run_calls(*ch, 1, 2000, 16) == 2000);
  {
    Flooder warm;
    REQUIRE(warm.connect(server.port));
    const auto until = Clock::now() + 300ms;
    while (Clock::now() < until && warm.flood()) std::this_thread::sleep_for(1ms);
  }
  REQUIRE(run_calls(*ch, 3000, 1000, 16) == 1000);
  const long baseline = rss_kib(server.pid);
  REQUIRE(baseline > 0);

  // The flood: 10 s of PINGs from sessions that never read.  A session
  // closed by the server is replaced by a new one at once.
  constexpr auto kFlood = 10s;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> pings{0};
  std::atomic<int> flood_sessions{0};
  std::atomic<int> closed_by_server{0};
  std::atomic<bool> connect_failed{false};
  std::thread flood([&] {
    while (!stop) {
      Flooder f;
      if (!f.connect(server.port)) {
        connect_failed = true;
        return;
      }
      ++flood_sessions;
      bool closed = false;
      while (!stop && !closed) {
        closed = !f.flood() || f.closed_by_server();
        if (!closed) std::this_thread::sleep_for(200us);  // socket full: let the server run
      }
      pings += f.pings_sent;
      if (closed) ++closed_by_server;
    }
  });

  const auto flood_start = Clock::now();
  std::atomic<uint64_t> calls_good{0};
  std::atomic<bool> calls_done{false};
  std::thread caller([&] {
    calls_good = run_calls(*ch, 100'000, 20'000, 16);
    calls_done = true;
  });

  // The flood lasts kFlood, and on until the server has closed one flooding
  // session (bounded): before the drain clock starts, the server's kernel
  // send buffer (autotuned, up to tcp_wmem's max) must fill with PONGs at
  // one per loop turn, which takes longer on a slow (sanitized) build.
  long peak = baseline;
  while (Clock::now() - flood_start < kFlood ||
         (closed_by_server.load() == 0 && Clock::now() - flood_start < 60s)) {
    peak = std::max(peak, rss_kib(server.pid));
    std::this_thread::sleep_for(20ms);
  }
  stop = true;
  flood.join();
  // The calls had the whole flood; they must not need much more.
  const auto calls_until = Clock::now() + 60s;
  while (!calls_done && Clock::now() < calls_until) std::this_thread::sleep_for(10ms);
  const bool finished = calls_done.load();
  if (!finished) server.kill_and_reap();  // unblocks the caller's waits
  caller.join();

  const std::string log = read_file(server.log_path());
  MESSAGE("server RSS baseline " << baseline << " KiB, peak during the flood " << peak << " KiB (+"
                                 << (peak - baseline) << " KiB); " << pings.load() << " PINGs over "
                                 << flood_sessions.load() << " sessions, " << closed_by_server.load()
                                 << " closed by the server");
  CHECK_FALSE(connect_failed.load());
  CHECK(finished);
  CHECK(calls_good.load() == 20'000);
  CHECK_MESSAGE(peak - baseline <= 8 * 1024, "server RSS grew by " << (peak - baseline) << " KiB");
  // Every flooding session that ended before `stop` was closed by the
  // server's drain timeout, which names its reason in the log.
  CHECK(closed_by_server.load() >= 1);
  CHECK_MESSAGE(log.find("has read nothing for") != std::string::npos, log.substr(0, 2000));
  CHECK(log.find("peer_timeout_ms = 1000") != std::string::npos);
}

TEST_CASE("PONGs coalesce: a burst of PINGs is answered by far fewer PONGs") {
  ServerProcess server({"SLOTRPC_LOG_LEVEL=warn"});
  Flooder f;
  REQUIRE(f.connect(server.port));
  // 1,024 PINGs in four writes: the server reads them in a few turns.
  constexpr uint64_t kPings = 1024;
  while (f.pings_sent < kPings) {
    // flood() writes 256 per call while the socket has room.
    const uint64_t before = f.pings_sent;
    REQUIRE(f.flood_once());
    REQUIRE(f.pings_sent > before);
  }
  // Read frames until a PONG has come and then 300 ms pass without one.
  uint64_t pongs = 0;
  std::vector<std::byte> buf;
  auto last = Clock::now();
  const auto deadline = Clock::now() + 10s;
  while (Clock::now() < deadline && (pongs == 0 || Clock::now() - last < 300ms)) {
    std::byte chunk[4096];
    const ssize_t n = ::recv(f.fd, chunk, sizeof chunk, MSG_DONTWAIT);
    if (n == 0) FAIL("the server closed the session");
    if (n < 0) {
      REQUIRE((errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR));
      std::this_thread::sleep_for(1ms);
      continue;
    }
    buf.insert(buf.end(), chunk, chunk + n);
    size_t off = 0;
    while (buf.size() - off >= 40) {
      uint32_t word = 0;
      for (int k = 0; k < 4; ++k) word |= uint32_t(std::to_integer<uint8_t>(buf[off + k])) << (8 * k);
      REQUIRE_MESSAGE(word == (0x8000'0000u | 32u), "the server sent something other than a control frame");
      const core::Header h = core::decode_header(buf.data() + off + 8);
      if (h.kind() == core::Kind::kPong) {
        ++pongs;
        last = Clock::now();
      }
      off += 40;
    }
    buf.erase(buf.begin(), buf.begin() + static_cast<ptrdiff_t>(off));
  }
  MESSAGE(kPings << " PINGs answered by " << pongs << " PONGs");
  CHECK(pongs >= 1);
  // One PONG per reactor turn at most: a turn delivers up to poll_batch
  // (32) completions, so 1,024 PINGs need at most ~32 turns.  Without
  // coalescing there is one PONG per PING.
  CHECK(pongs * 8 <= kPings);
}
