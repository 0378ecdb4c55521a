// What the parts of TcpLink (tcp_link.cc: framing and slot messages;
// tcp_bulk.cc, tcp_pushes.cc, tcp_link_lanes.cc: bulk transfers, pushes and
// lanes) share about the wire:
// the frame prefix and little-endian integers (docs/protocol.md, "TCP
// framing").  A named namespace with inline functions, not a copy in an
// anonymous namespace of each file: the unity build compiles several of
// them as one translation unit.
#pragma once

#include <cstddef>
#include <cstdint>

namespace slotrpc::transport::tcp_frame {

// u32 word (lane bit + body length) and u32 imm before every body.
inline constexpr size_t kPrefixSize = 8;

inline void store_u32_le(std::byte* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}
inline uint32_t load_u32_le(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{std::to_integer<uint8_t>(p[i])} << (8 * i);
  return v;
}
inline void store_u64_le(std::byte* p, uint64_t v) {
  store_u32_le(p, static_cast<uint32_t>(v));
  store_u32_le(p + 4, static_cast<uint32_t>(v >> 32));
}
inline uint64_t load_u64_le(const std::byte* p) {
  return uint64_t{load_u32_le(p)} | uint64_t{load_u32_le(p + 4)} << 32;
}

}  // namespace slotrpc::transport::tcp_frame
