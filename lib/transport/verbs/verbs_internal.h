// Internals shared by the verbs transport's source files (not an API):
// the wr_id and epoll tag layouts, sizes, and small helpers.
#pragma once

#include <endian.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <chrono>
#include <thread>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <random>
#include <utility>

#include <fmt/format.h>
#include "base/logging.h"

namespace slotrpc::transport::verbs {


// wr_id layout: generation (16) | table index (16) | receive bit | value (31).
// value: a receive buffer index, or for a signaled send the number of send
// requests it retires (itself and the unsignaled ones before it).
constexpr uint64_t kRecvBit = 1ull << 31;
constexpr uint32_t kValueMask = 0x7fff'ffffu;
// A send value with this bit is the memory-window bind (it retires the rest).
constexpr uint32_t kBindBit = 1u << 30;
// Receives from the shared receive queue: this table index (never a link's).
constexpr uint16_t kSrqIndex = 0xffff;

inline uint64_t make_wr_id(uint16_t gen, uint16_t index, bool recv, uint32_t value) {
  return uint64_t{gen} << 48 | uint64_t{index} << 32 | (recv ? kRecvBit : 0) | (value & kValueMask);
}

// epoll tags: the completion channel, the async fd, or a link's control
// connection (index and generation, so a stale event cannot reach a new link).
constexpr uint64_t kTagChannel = 1;
constexpr uint64_t kTagAsync = 2;
constexpr uint64_t kTagLink = 1ull << 63;

constexpr size_t kMaxLinks = kSrqIndex;  // indices 0 .. 0xfffe
constexpr int kInitialCq = 1024;
constexpr size_t kReadyReserve = 1024;
constexpr size_t kBacklogReserve = 64;
// A bind is local work: it completes in microseconds, or the device is stuck.
constexpr auto kBindTimeout = std::chrono::seconds(5);

inline void put16(std::byte* p, uint16_t v) {
  for (int i = 0; i < 2; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
inline void put32(std::byte* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
inline void put64(std::byte* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
inline uint16_t get16(const std::byte* p) {
  return static_cast<uint16_t>(uint16_t(p[0]) | uint16_t(p[1]) << 8);
}
inline uint32_t get32(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(p[i]) << (8 * i);
  return v;
}
inline uint64_t get64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}

inline std::string errno_text(const char* what, int err) {
  return fmt::format("{}: {}", what, std::strerror(err));
}

inline uint32_t random_psn() {
  thread_local std::mt19937 gen{std::random_device{}()};
  return gen() & 0xffffffu;
}

inline bool set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  return flags >= 0 && ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

}  // namespace slotrpc::transport::verbs
