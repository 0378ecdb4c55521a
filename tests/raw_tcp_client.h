// A TCP peer written by hand for tests that must send what a Channel never
// would: the handshake and the frames of lib/transport/tcp/tcp_transport.h
// (u32 lane|length, u32 immediate, body) built byte by byte.  Shared by
// rpc_faults_test and adversarial_test.
//
// Every read and write is bounded by a deadline; a failure is a doctest
// REQUIRE, so a test never hangs on a peer that stopped talking.
#pragma once

#include <doctest/doctest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/handshake.h"
#include "core/wire_format.h"
#include "rpc/connector.h"

namespace raw_tcp {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

inline constexpr uint32_t kControlLane = 0x8000'0000u;

inline void store_u32(std::byte* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}
inline uint32_t load_u32(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(std::to_integer<uint8_t>(p[i])) << (8 * i);
  return v;
}

struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

// A TCP connection to 127.0.0.1:port, handshake not yet done.
inline int tcp_connect(uint16_t port) {
  auto fd = slotrpc::rpc::connect_tcp(slotrpc::rpc::Endpoint{"127.0.0.1", port}, Clock::now() + 5s);
  REQUIRE_MESSAGE(fd.ok(), fd.status().to_string());
  return *fd;
}

// A TCP connection with the handshake done by hand, as lib/rpc/client_connect.cc
// does it: `slot_count` slots of `slot_size` bytes (64 of 64 KiB by default).
// `features`: the kFeature* bits of the Hello (kFeaturePack: the server may
// send PACKs of replies); none, like a client predating the field.
inline int raw_connect(uint16_t port, uint32_t slot_count = 64, uint32_t slot_size = 65536,
                       uint16_t features = 0) {
  const auto deadline = Clock::now() + 5s;
  const int fd = tcp_connect(port);
  std::array<std::byte, slotrpc::core::kHelloSize> buf{};
  slotrpc::core::Hello hello;
  hello.transport = slotrpc::core::WireTransport::kTcp;
  hello.slot_count = slot_count;
  hello.slot_size = slot_size;
  hello.features = features;
  slotrpc::core::encode_hello(hello, buf.data());
  slotrpc::Status st = slotrpc::rpc::write_all(fd, buf, deadline);
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  st = slotrpc::rpc::read_exact(fd, buf, deadline);
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  auto reply = slotrpc::core::decode_hello_reply(buf.data());
  REQUIRE_MESSAGE(reply.ok(), reply.status().to_string());
  REQUIRE(reply->status == 0);
  REQUIRE(reply->slot_count == slot_count);
  REQUIRE(reply->slot_size == slot_size);
  REQUIRE(reply->message_len == 0);
  // The extension: a bulk lane token when the server offers lanes
  // (core/handshake.h, kFeatureAttach); the frames start after it.
  std::vector<std::byte> extension(reply->extension_len);
  st = slotrpc::rpc::read_exact(fd, extension, deadline);
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  return fd;
}

// One frame: prefix (lane bit | length, immediate) and body.  `length_override`
// puts another length in the prefix than the body has (a lie the receiver
// must catch).
inline std::vector<std::byte> frame(bool control, uint32_t imm, const std::vector<std::byte>& body,
                                    uint32_t length_override = UINT32_MAX) {
  std::vector<std::byte> f(8 + body.size());
  const uint32_t len = length_override != UINT32_MAX ? length_override : static_cast<uint32_t>(body.size());
  store_u32(f.data(), len | (control ? kControlLane : 0u));
  store_u32(f.data() + 4, imm);
  if (!body.empty()) std::memcpy(f.data() + 8, body.data(), body.size());
  return f;
}

inline slotrpc::core::Header request_header(uint32_t method, uint64_t request_id, uint16_t slot,
                                            uint32_t generation, size_t payload_len) {
  slotrpc::core::Header h;
  h.flags = static_cast<uint8_t>(slotrpc::core::Kind::kRequest);
  h.method_id = method;
  h.request_id = request_id;
  h.payload_len = static_cast<uint32_t>(payload_len);
  h.slot = slot;
  h.generation = generation;
  return h;
}

// A control-lane header (CANCEL, PING, ...), no payload.
inline slotrpc::core::Header control_header(slotrpc::core::Kind kind, uint16_t slot, uint32_t generation,
                                            uint64_t request_id) {
  slotrpc::core::Header h;
  h.flags = static_cast<uint8_t>(kind);
  h.slot = slot;
  h.generation = generation;
  h.request_id = request_id;
  return h;
}

inline std::vector<std::byte> body_of(const slotrpc::core::Header& h, const std::vector<std::byte>& payload) {
  std::vector<std::byte> b(slotrpc::core::kHeaderSize + payload.size());
  slotrpc::core::encode_header(h, b.data());
  if (!payload.empty()) std::memcpy(b.data() + slotrpc::core::kHeaderSize, payload.data(), payload.size());
  return b;
}

inline void send_bytes(int fd, const std::vector<std::byte>& bytes) {
  const slotrpc::Status st = slotrpc::rpc::write_all(fd, bytes, Clock::now() + 5s);
  REQUIRE_MESSAGE(st.ok(), st.to_string());
}

// A frame as read back from the server.
struct Frame {
  bool control = false;
  uint32_t imm = 0;
  std::vector<std::byte> body;
};

// Reads the next slot-lane frame, skipping the server's keepalive traffic on
// the control lane; REQUIREs one within `limit`.
inline Frame read_slot_frame(int fd, std::chrono::milliseconds limit = 5000ms, uint32_t max_body = 65536) {
  const auto deadline = Clock::now() + limit;
  for (;;) {
    std::array<std::byte, 8> prefix;
    slotrpc::Status st = slotrpc::rpc::read_exact(fd, prefix, deadline);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    Frame f;
    const uint32_t word = load_u32(prefix.data());
    f.control = (word & kControlLane) != 0;
    f.imm = load_u32(prefix.data() + 4);
    f.body.resize(word & ~kControlLane);
    REQUIRE(f.body.size() >= slotrpc::core::kHeaderSize);
    REQUIRE(f.body.size() <= max_body);
    st = slotrpc::rpc::read_exact(fd, f.body, deadline);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    if (!f.control) return f;
  }
}

// True once the peer has closed the connection (EOF or reset); reads and
// discards anything it still sends.
inline bool closed_by_peer(int fd, std::chrono::milliseconds limit) {
  const auto until = Clock::now() + limit;
  std::array<char, 4096> sink;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(left));
    if (r == 0) return false;
    if (r < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    const ssize_t n = ::recv(fd, sink.data(), sink.size(), MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return errno == ECONNRESET || errno == EPIPE;
    }
  }
}

}  // namespace raw_tcp
