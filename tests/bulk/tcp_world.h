// The harness of the TCP bulk tests (bulk_tcp_link_test, bulk_tcp_lane_test):
// two TcpTransports ("processes") in this thread, links between them over
// real loopback connections, and a pump that polls both until a condition
// holds, with a generous deadline.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <doctest/doctest.h>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "core/wire_format.h"
#include "transport/tcp/tcp_frame.h"
#include "transport/tcp/tcp_transport.h"

namespace tcp_world {

using namespace slotrpc;
using namespace slotrpc::transport;
using CKind = Completion::Kind;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr auto kTimeout = 60s;  // "does not hang", sanitized builds included
constexpr uint32_t kSlots = 8;
constexpr uint32_t kSlotSize = 4096;

// small_buffers: fixed 64 KiB socket buffers on both ends (no autotuning),
// so that a peer that reads nothing leaves the sender's socket full and
// it stays full.
inline std::pair<int, int> loopback_pair(bool small_buffers = false) {
  int lst = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(lst >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(lst, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(lst, 4) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(::getsockname(lst, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  int c = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(c >= 0);
  REQUIRE(::connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  int s = ::accept4(lst, nullptr, nullptr, SOCK_CLOEXEC);
  REQUIRE(s >= 0);
  ::close(lst);
  if (small_buffers) {
    const int v = 64 * 1024;
    for (int fd : {c, s}) {
      REQUIRE(::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof v) == 0);
      REQUIRE(::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof v) == 0);
    }
  }
  return {c, s};
}

// One end of a link: its receive ring and every completion it produced.
struct End {
  std::unique_ptr<TcpLink> link;
  std::vector<std::byte> ring;
  std::vector<Completion> got;

  void start(TcpTransport& t, int fd, const char* name) {
    auto r = t.adopt(fd, name);
    REQUIRE_MESSAGE(r.ok(), r.status().to_string());
    link = std::move(r).value();
    ring.assign(size_t{kSlots} * kSlotSize, std::byte{0});
    auto reg = link->register_memory(ring, Access::kRemoteWrite);
    REQUIRE(reg.ok());
    REQUIRE(link->attach(reg.value(), MemoryRegion{}, kSlots, kSlotSize, this).ok());
  }
  const Completion* find(CKind kind, uint64_t token = 0) const {
    for (const Completion& c : got)
      if (c.kind == kind && (kind != CKind::kBulkDone || c.bulk_token == token)) return &c;
    return nullptr;
  }
  bool down() const { return find(CKind::kLinkDown) != nullptr; }
};

// Two transports (two "processes") and any number of links between them.
struct World {
  explicit World(const Config& config = Config{}) : a(config), b(config) {}
  TcpTransport a, b;
  std::vector<std::unique_ptr<End>> as, bs;  // as[i] <-> bs[i]

  std::pair<End*, End*> connect(bool small_buffers = false) {
    auto [c, s] = loopback_pair(small_buffers);
    as.push_back(std::make_unique<End>());
    bs.push_back(std::make_unique<End>());
    as.back()->start(a, c, "a");
    bs.back()->start(b, s, "b");
    return {as.back().get(), bs.back().get()};
  }
  // Gives the pair x (on a) <-> y (on b) a bulk lane: a second loopback
  // connection, as the handshake would (transport/tcp/bulk_lanes.h).
  void lane(End& x, End& y) {
    auto [c, s] = loopback_pair();
    REQUIRE(x.link->attach_lane(c).ok());
    REQUIRE(y.link->attach_lane(s).ok());
  }
  void poll_one(TcpTransport& t) {
    std::array<Completion, 16> buf;
    const size_t n = t.poll(buf);
    for (size_t i = 0; i < n; ++i) static_cast<End*>(buf[i].context)->got.push_back(buf[i]);
  }
  bool pump_until(const std::function<bool()>& done) {
    const auto deadline = Clock::now() + kTimeout;
    while (!done()) {
      if (Clock::now() > deadline) return false;
      poll_one(a);
      poll_one(b);
    }
    return true;
  }
};

// Pseudo-random bytes, four per step of the generator: the tests move up
// to 64 MiB, and a byte per step cost seconds in the debug ASan build.
inline std::vector<std::byte> pattern(size_t n, uint32_t seed) {
  std::vector<std::byte> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i += 4) {
    x = x * 1664525u + 1013904223u;
    std::memcpy(v.data() + i, &x, std::min<size_t>(4, n - i));
  }
  return v;
}

// A raw bulk peer (tests of what counts as work while data arrives): it
// takes a reader's READ_REQ from `fd` and answers it with READ_DATA frames
// of `frame` bytes of `src`, one every `gap` (docs/protocol.md, "TCP bulk
// frames": kBulkMarker | type, imm, then rkey, status, tag, addr, length).
struct PacedReadPeer {
  int fd;
  // The READ_REQ's tag; `turn` runs between attempts (a loop to pump).
  uint64_t take_request(const std::function<void()>& turn = [] {}) const {
    std::array<std::byte, 40> req{};
    size_t got = 0;
    const auto deadline = Clock::now() + kTimeout;
    while (got < req.size()) {
      turn();
      const ssize_t k = ::recv(fd, req.data() + got, req.size() - got, MSG_DONTWAIT);
      if (k > 0) got += static_cast<size_t>(k);
      REQUIRE(Clock::now() < deadline);
    }
    REQUIRE(tcp_frame::load_u32_le(req.data()) == (TcpTransport::kBulkMarker | TcpTransport::kBulkReadRequest));
    return tcp_frame::load_u64_le(req.data() + 16);
  }
  // Blocking sends: the reader's socket buffers take a frame at once.
  // False if the reader went away.
  bool send(uint64_t tag, const std::vector<std::byte>& src, size_t frame, std::chrono::milliseconds gap) const {
    for (size_t at = 0; at < src.size(); at += frame) {
      const size_t n = std::min(frame, src.size() - at);
      std::array<std::byte, 40> h{};
      tcp_frame::store_u32_le(h.data(), TcpTransport::kBulkMarker | TcpTransport::kBulkReadData);
      tcp_frame::store_u64_le(h.data() + 16, tag);
      tcp_frame::store_u64_le(h.data() + 24, at);
      tcp_frame::store_u64_le(h.data() + 32, n);
      iovec iov[2] = {{h.data(), h.size()}, {const_cast<std::byte*>(src.data() + at), n}};
      msghdr m{};
      m.msg_iov = iov;
      m.msg_iovlen = 2;
      if (::sendmsg(fd, &m, MSG_NOSIGNAL) != static_cast<ssize_t>(h.size() + n)) return false;
      if (at + n < src.size()) std::this_thread::sleep_for(gap);
    }
    return true;
  }
};

inline BulkRegistration reg(Link& l, std::vector<std::byte>& mem) {
  auto r = l.register_bulk(BulkSource{mem.data(), mem.size()});
  REQUIRE_MESSAGE(r.ok(), r.status().to_string());
  return r.value();
}

// Every byte, and where the first difference is if any.
inline void check_equal(const std::vector<std::byte>& got, const std::vector<std::byte>& want) {
  REQUIRE(got.size() == want.size());
  // memcmp first: std::mismatch is a byte loop, slow in the debug build.
  if (got.empty() || std::memcmp(got.data(), want.data(), got.size()) == 0) return;
  const auto mm = std::mismatch(got.begin(), got.end(), want.begin());
  CHECK_MESSAGE(mm.first == got.end(),
                "first difference at byte " << (mm.first - got.begin()) << " of " << got.size());
}

inline void ok_done(End& e, uint64_t token) {
  const Completion* c = e.find(CKind::kBulkDone, token);
  REQUIRE(c != nullptr);
  CHECK(c->bulk_status == 0);
}

}  // namespace tcp_world
