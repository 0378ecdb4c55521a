// Fuzz target: a byte stream from a hostile client, fed over loopback TCP to
// a server-side TcpLink and ServerSession, in process.
//
// The server side is what Server::Impl::adopt builds after a handshake: a
// TcpTransport link on a real Reactor, whose turns this thread runs one by
// one (Reactor::run_one_turn), and a ServerSession over a method table with the generated Echo service and a
// test service with a server stream, error, overflow, exception and
// unverified methods.  No Hello is needed: the link and the session run
// after the handshake.  The client end is a plain socket driven by this
// file.
//
// Input:
//   byte 0         slot_count = 1 + b % 8
//   byte 1         slot_size  = 256 + 64 * (b % 16)
//   byte 2         n = b % 16 cut points, then n bytes: chunk sizes 1 + b
//   the rest       the client's byte stream (tcp framing, docs/protocol.md)
// The stream is written in those chunks, the last chunk taking what is
// left; after each chunk the reactor runs turns (poll, tasks, fibers, flush)
// until one finds nothing to do, so frames and prefixes are split where the
// input says, and handlers, stream grants and replies interleave with the
// arriving bytes.  Then the client resets the connection and the session
// must close.
//
// Oracles (a violation aborts):
//  * ASan/UBSan on the transport and session code;
//  * the loop goes idle after each chunk, and the session closes and is
//    released within 10 s of the reset (no hang, no handler left waiting);
//  * everything the server sends is well-formed (framing, a header that
//    validates against the ring, a known kind for its lane, a known non-zero
//    status on an ERROR) and answers something the client sent: a REPLY or
//    ERROR matches a REQUEST (slot, request id, generation), at most once
//    per request sent; a STREAM_MESSAGE uses a slot granted to that request
//    with that generation, at most once per grant; a PONG answers a PING.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <stdexcept>
#include <thread>
#include <string_view>
#include <tuple>
#include <vector>

#include "core/method_table.h"
#include "core/server_session.h"
#include "core/wire_format.h"
#include "echo_service.h"  // examples/echo: the generated Echo service
#include "reactor/reactor.h"
#include "transport/tcp/tcp_transport.h"
#include "tcp_counters.h"
#include "test_messages_generated.h"
#include "fuzz_check.h"

namespace {

using namespace slotrpc;
using namespace slotrpc::core;
using Clock = std::chrono::steady_clock;

constexpr uint32_t kControlBit = 0x8000'0000u;
constexpr uint32_t kBulkMarker = 0xC000'0000u;  // bulk frames (docs/protocol.md, section 6)
constexpr size_t kPrefix = 8;

uint32_t le32(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{std::to_integer<uint8_t>(p[i])} << (8 * i);
  return v;
}

// The methods the fuzzed session can reach.
struct Services {
  echo::EchoHandler echo;
  ServiceDefinition echo_def = echo.definition();
  ServiceDefinition test_def{"slotrpc.test.Fuzz"};
  MethodTable table;

  Services() {
    // A server stream of min(seq, 6) messages; each waits for a grant.
    test_def.add_server_stream<test::Ping, test::Pong>(
        "Stream", [](const test::Ping& req, ServerWriter<test::Pong>& out, ServerCall&) -> Status {
          const uint64_t n = req.seq() < 6 ? req.seq() : 6;
          for (uint64_t i = 0; i < n; ++i) {
            if (!out.Write([i](flatbuffers::FlatBufferBuilder& fbb) {
                  return test::CreatePong(fbb, i);
                }))
              return out.error();
          }
          return {};
        });
    // Any status code, known or not (unknown ones become INTERNAL).
    test_def.add_unary<test::Ping>(
        "Fail", [](const test::Ping& req, flatbuffers::FlatBufferBuilder&, ServerCall&) -> Status {
          return Status(static_cast<StatusCode>(req.seq() % 20), "failed as asked");
        });
    // A reply of `seq` bytes: larger than the slot is RESOURCE_EXHAUSTED.
    test_def.add_unary<test::Ping>(
        "Big", [](const test::Ping& req, flatbuffers::FlatBufferBuilder& fbb, ServerCall&) -> Status {
          std::vector<uint8_t> bytes(req.seq() % 4096, 0xab);
          fbb.Finish(test::CreatePong(fbb, req.seq(), 0, fbb.CreateVector(bytes)));
          return {};
        });
    test_def.add_unary<test::Ping>(
        "Throw", [](const test::Ping&, flatbuffers::FlatBufferBuilder&, ServerCall&) -> Status {
          throw std::runtime_error("thrown as asked");
        });
    // No verifier: the handler sees the raw bytes; returns OK without a
    // reply when the first byte is odd (INTERNAL).
    test_def.add_method("Raw", [](ServerCall& call) -> Status {
      const auto req = call.request();
      uint8_t sum = 0;
      for (std::byte b : req) sum = static_cast<uint8_t>(sum + std::to_integer<uint8_t>(b));
      if (!req.empty() && (std::to_integer<uint8_t>(req[0]) & 1) != 0) return {};
      call.reply().Finish(test::CreatePong(call.reply(), sum));
      return {};
    });
    FUZZ_CHECK(table.add(echo_def).ok());
    FUZZ_CHECK(table.add(test_def).ok());
  }
};

struct Harness {
  Config config;
  Services services;
  std::unique_ptr<reactor::Reactor> loop;
  transport::TcpTransport* tcp = nullptr;  // the loop's, handed in below
  int listen_fd = -1;
  sockaddr_in addr{};

  Harness() {
    config.keepalive_ms = 600'000;  // no keepalive pings during a run: deterministic
    config.peer_timeout_ms = 3'600'000;
    // Never start()ed: this thread runs its turns (Reactor::run_one_turn),
    // so a run needs no thread hand-off and each turn is a known step.
    loop = std::make_unique<reactor::Reactor>(config, "fuzz-loop");
    // This target links only the layers below rpc/, so it hands the loop
    // its TCP transport itself (rpc/loop_transports.h does elsewhere).
    auto added = loop->add_transport(std::make_unique<transport::TcpTransport>(config));
    FUZZ_CHECK(added.ok());
    tcp = static_cast<transport::TcpTransport*>(added.value());
    listen_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    FUZZ_CHECK(listen_fd >= 0);
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    FUZZ_CHECK(::bind(listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    FUZZ_CHECK(::listen(listen_fd, 64) == 0);
    socklen_t len = sizeof addr;
    FUZZ_CHECK(::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  }
};

// What the client sent, as the server will parse it (a superset: the
// server may close before reading it all), and what it got back.
class Oracle {
 public:
  Oracle(uint32_t slot_count, uint32_t slot_size) : slot_count_(slot_count), slot_size_(slot_size) {}

  // The client's whole stream.  Stops where the tcp framing itself is
  // broken, because the server's link fails there.
  void sent(std::span<const std::byte> s) {
    size_t at = 0;
    while (s.size() - at >= kPrefix) {
      const uint32_t word = le32(&s[at]);
      const uint32_t imm = le32(&s[at + 4]);
      if ((word & kBulkMarker) == kBulkMarker) {
        // A bulk frame (a PUSH_DATA the server may take, or one it closes
        // on): its 32-byte header, then data for the types that carry it.
        const uint32_t type = word & ~kBulkMarker;
        if (s.size() - at < kPrefix + kHeaderSize) return;
        uint64_t data = 0;
        if (type == 2 || type == 3 || type == 5) {
          for (int i = 0; i < 8; ++i)
            data |= uint64_t{static_cast<uint8_t>(s[at + kPrefix + 24 + static_cast<size_t>(i)])} << (8 * i);
        }
        if (data > s.size() - at - kPrefix - kHeaderSize) return;
        at += kPrefix + kHeaderSize + data;
        continue;
      }
      const uint32_t len = word & ~kControlBit;
      const bool control = (word & kControlBit) != 0;
      if (len == 0 || (control && len != kHeaderSize)) return;
      if (!control && (imm_slot(imm) >= slot_count_ || len > slot_size_)) return;
      at += kPrefix;
      if (s.size() - at < len) return;
      if (len >= kHeaderSize) {
        const Header h = decode_header(&s[at]);
        if (control && h.kind() == Kind::kPing) ++pings_;
        if (control && h.kind() == Kind::kStreamGrant)
          ++grants_[{h.slot, h.request_id, h.generation}];
        if (!control && h.kind() == Kind::kRequest)
          ++requests_[{h.slot, h.request_id, h.generation}];
        if (!control && h.kind() == Kind::kClientMessage)
          ++client_messages_[{h.slot, h.request_id, h.generation}];
      }
      at += len;
    }
  }

  // Bytes from the server, in arrival order, any split.
  void received(std::span<const std::byte> bytes) {
    in_.insert(in_.end(), bytes.begin(), bytes.end());
    size_t at = 0;
    while (in_.size() - at >= kPrefix) {
      const uint32_t word = le32(&in_[at]);
      const uint32_t imm = le32(&in_[at + 4]);
      const uint32_t len = word & ~kControlBit;
      const bool control = (word & kControlBit) != 0;
      FUZZ_CHECK(len >= kHeaderSize);
      FUZZ_CHECK(!control || len == kHeaderSize);
      FUZZ_CHECK(control || len <= slot_size_);
      if (in_.size() - at - kPrefix < len) break;
      check_message(control, imm, {&in_[at + kPrefix], len});
      ++messages_[static_cast<uint8_t>(decode_header(&in_[at + kPrefix]).kind())];
      at += kPrefix + len;
    }
    in_.erase(in_.begin(), in_.begin() + static_cast<std::ptrdiff_t>(at));
  }

  // For FUZZ_LOG=1: what came back, by kind.
  void print() const {
    std::fprintf(stderr, "server sent: %u reply, %u error, %u stream message, %u pong\n",
                 messages_[2], messages_[3], messages_[7], messages_[6]);
  }

 private:
  using Key = std::tuple<uint16_t, uint64_t, uint32_t>;  // slot, request id, generation

  void check_message(bool control, uint32_t imm, std::span<const std::byte> body) {
    const Header h = decode_header(body.data());
    const uint16_t placed = control ? h.slot : imm_slot(imm);
    if (const HeaderError e = validate_header(h, body.size(), slot_count_, slot_size_, placed);
        e != HeaderError::kOk) {
      const std::string_view why = to_string(e);
      std::fprintf(stderr, "server sent a malformed header: %.*s\n", static_cast<int>(why.size()),
                   why.data());
      std::abort();
    }
    if (control) {
      FUZZ_CHECK(h.kind() == Kind::kPong || h.kind() == Kind::kPing ||
                 h.kind() == Kind::kStreamAck);
      if (h.kind() == Kind::kPong) FUZZ_CHECK(pongs_++ < pings_);
      // Acknowledges a client stream message sent into that slot, once.
      if (h.kind() == Kind::kStreamAck) {
        const Key key{h.slot, h.request_id, h.generation};
        FUZZ_CHECK(acked_[key]++ < client_messages_[key]);
      }
      return;
    }
    FUZZ_CHECK(imm_generation(imm) == static_cast<uint16_t>(h.generation));
    const Key key{h.slot, h.request_id, h.generation};
    switch (h.kind()) {
      case Kind::kReply:
        FUZZ_CHECK(h.status == 0);
        [[fallthrough]];
      case Kind::kError: {
        if (h.kind() == Kind::kError)
          FUZZ_CHECK(h.status != 0 && is_known_status_code(h.status));
        // Answers a request sent in that slot, and no request twice.
        FUZZ_CHECK(answered_[key]++ < requests_[key]);
        return;
      }
      case Kind::kStreamMessage:
        FUZZ_CHECK(h.status == 0);
        // Into a slot the client lent to this request, once per loan.
        FUZZ_CHECK(streamed_[key]++ < grants_[key]);
        return;
      default:
        std::fprintf(stderr, "server sent kind %u on the slot lane\n", unsigned(h.flags));
        std::abort();
    }
  }

  uint32_t slot_count_, slot_size_;
  std::vector<std::byte> in_;
  uint64_t pings_ = 0, pongs_ = 0;
  unsigned messages_[16] = {};
  std::map<Key, uint64_t> requests_, answered_, grants_, streamed_, client_messages_, acked_;
};

// One input's run, all on this thread.
struct Run {
  Harness& harness;
  ServerSession::Geometry geometry;
  Oracle oracle;
  int client = -1;
  int server_view = -1;  // a duplicate of the server's fd, only for its counters
  uint64_t written = 0, drained = 0;
  bool session_released = false;
  std::unique_ptr<ServerSession> session;

  Run(Harness& h, ServerSession::Geometry g) : harness(h), geometry(g), oracle(g.slot_count, g.slot_size) {}

  void start(int server_fd) {
    // Loopback delivery can lag the send() (softirq work deferred under
    // load); the duplicate lets settle() see what has arrived.
    server_view = ::fcntl(server_fd, F_DUPFD_CLOEXEC, 0);
    FUZZ_CHECK(server_view >= 0);
    reactor::Reactor& loop = *harness.loop;
    auto link = harness.tcp->adopt(server_fd, "fuzz");
    if (!link.ok()) {
      std::fprintf(stderr, "harness: adopt of the accepted socket failed: %s\n",
                   link.status().to_string().c_str());
      std::abort();
    }
    link.value()->accept_pushes(true);  // as a server with SLOTRPC_TCP_BULK_PUSH on
    auto s = ServerSession::create(loop, std::move(link.value()), geometry, harness.services.table,
                                   "fuzz-client", [this](ServerSession* closed) {
                                     FUZZ_CHECK(closed == session.get());
                                     session.reset();
                                     session_released = true;
                                   });
    FUZZ_CHECK(s.ok());
    session = std::move(s.value());
    // Accepts PACKs (kind 12) from the fuzzed client, so their parsing and
    // the session's checks run; sends none (the client did not offer
    // them), so the oracles read every reply as a frame of its own.
    session->configure_packing(512, /*client_accepts=*/false);
  }

  void drain() {
    std::byte buf[4096];
    for (;;) {
      const ssize_t n = ::recv(client, buf, sizeof buf, MSG_DONTWAIT);
      if (n <= 0) return;
      drained += static_cast<size_t>(n);
      oracle.received({buf, static_cast<size_t>(n)});
    }
  }

  // True when every byte the client wrote has reached the server's socket
  // and been read from it, and every byte the server sent has been drained.
  bool quiet() const {
    uint64_t received = 0, sent = 0;
    FUZZ_CHECK(fuzz::tcp_byte_counters(server_view, &received, &sent));
    int unread = 0;
    FUZZ_CHECK(::ioctl(server_view, FIONREAD, &unread) == 0);
    const bool reading = session != nullptr && !session->closed();
    return (!reading || (received == written && unread == 0)) && sent == drained;
  }

  // Turns until the loop is idle and the sockets are quiet: the chunk has
  // been read, its messages handled, stream messages written, everything
  // flushed and received.
  void settle() {
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    for (;;) {
      drain();
      if (harness.loop->run_one_turn()) continue;
      drain();
      if (quiet()) return;
      if (Clock::now() > deadline) {
        std::fprintf(stderr, "the server did not go quiet within 10 s\n");
        std::abort();
      }
    }
  }

  // Returns false once the server has gone away.
  bool write(std::span<const std::byte> chunk) {
    size_t done = 0;
    while (done < chunk.size()) {
      const ssize_t n = ::send(client, chunk.data() + done, chunk.size() - done,
                               MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) {
        done += static_cast<size_t>(n);
        this->written += static_cast<size_t>(n);
      } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
        return false;
      } else {
        settle();  // socket buffers full: let the server read
      }
    }
    return true;
  }

  // A reset, not a FIN: no TIME_WAIT left behind by millions of runs.  The
  // session must then close and be released.
  void finish() {
    linger l{1, 0};
    ::setsockopt(client, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    ::close(client);
    client = -1;
    if (std::getenv("FUZZ_LOG") != nullptr) oracle.print();
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (!session_released) {
      if (Clock::now() > deadline) {
        std::fprintf(stderr, "the session was not released within 10 s of the client's reset\n");
        std::abort();
      }
      harness.loop->run_one_turn();
    }
    ::close(server_view);
  }
};

Harness& harness() {
  static Harness* h = [] {
    if (std::getenv("FUZZ_LOG") == nullptr) spdlog::set_level(spdlog::level::off);
    return new Harness;  // lives as long as the process (its loop thread too)
  }();
  return *h;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Harness& h = harness();
  if (size < 3) return 0;
  const ServerSession::Geometry g{1u + data[0] % 8u, 256u + 64u * (data[1] % 16u)};
  const size_t cuts = data[2] % 16u;
  if (size < 3 + cuts) return 0;
  const auto* stream = reinterpret_cast<const std::byte*>(data + 3 + cuts);
  const size_t stream_len = size - 3 - cuts;

  Run run(h, g);
  std::vector<std::span<const std::byte>> chunks;
  size_t at = 0;
  for (size_t i = 0; i < cuts && at < stream_len; ++i) {
    const size_t n = std::min<size_t>(1u + data[3 + i], stream_len - at);
    chunks.emplace_back(stream + at, n);
    at += n;
  }
  if (at < stream_len) chunks.emplace_back(stream + at, stream_len - at);
  run.oracle.sent({stream, stream_len});

  // The machine's other users share the loopback ports: a connect that
  // fails for want of one is retried (bounded), and only then reported,
  // with its errno, as the harness's failure rather than the input's.
  const auto connect_deadline = Clock::now() + std::chrono::seconds(10);
  for (;;) {
    run.client = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    FUZZ_CHECK(run.client >= 0);
    if (::connect(run.client, reinterpret_cast<const sockaddr*>(&h.addr), sizeof h.addr) == 0) break;
    const int err = errno;
    ::close(run.client);
    if (Clock::now() > connect_deadline) {
      std::fprintf(stderr, "harness: connect to the fuzz listener failed for 10 s: %s\n",
                   std::strerror(err));
      std::abort();
    }
    std::this_thread::yield();
  }
  const int one = 1;  // each chunk leaves at once, not held back by Nagle
  FUZZ_CHECK(::setsockopt(run.client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) == 0);
  // Take the connection whose peer is this run's client: anything else in
  // the backlog (a connect of an earlier attempt that the kernel completed
  // after reporting a failure) is stale and is dropped.
  sockaddr_in mine{};
  socklen_t mine_len = sizeof mine;
  FUZZ_CHECK(::getsockname(run.client, reinterpret_cast<sockaddr*>(&mine), &mine_len) == 0);
  int server_fd = -1;
  for (int tries = 0; server_fd < 0; ++tries) {
    FUZZ_CHECK(tries < 64);
    const int fd = ::accept4(h.listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    FUZZ_CHECK(fd >= 0);
    sockaddr_in peer{};
    socklen_t peer_len = sizeof peer;
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) == 0 &&
        peer.sin_port == mine.sin_port && peer.sin_addr.s_addr == mine.sin_addr.s_addr) {
      server_fd = fd;
    } else {
      ::close(fd);
    }
  }
  run.start(server_fd);
  for (const auto& chunk : chunks) {
    if (run.session_released || !run.write(chunk)) break;
    run.settle();
  }
  run.finish();
  return 0;
}
