// The slotrpc message header: 32 bytes, little-endian, at the start of every
// slot.  docs/protocol.md is the normative description; this file and that
// one change together.
//
// Encoding and decoding never allocate and never throw: they run once per
// message on the reactor's hot path.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

#include "transport/frame.h"

namespace slotrpc::core {

inline constexpr uint16_t kWireMagic = 0x5253;  // bytes 'S' 'R' on the wire
inline constexpr uint8_t kWireVersion = 1;
using transport::kHeaderSize;  // transport/frame.h

// `flags`: the low four bits are the message kind, the high four are flag
// bits (only kFlagServerStream is defined).
enum class Kind : uint8_t {
  kRequest = 1,        // client -> server, into the server's receive slot
  kReply = 2,          // server -> client, OK, into the client's receive slot
  kError = 3,          // server -> client, `status` != OK, payload = UTF-8 message
  kCancel = 4,         // control: client abandons the call in `slot`/`generation`
  kPing = 5,           // control: keepalive probe
  kPong = 6,           // control: keepalive answer
  kStreamMessage = 7,  // server -> client: one message of a server stream, into a lent slot
  kStreamGrant = 8,    // control: client lends slot `slot` to the stream in slot `method_id`
  // Client and bidi streaming (protocol feature kFeatureClientStreams):
  kClientMessage = 9,  // client -> server: one message of a client stream, into slot `slot`
                       // of the stream's window; `method_id` = the call slot
  kHalfClose = 10,     // control: the client will write no more to the call in `slot`
  kStreamAck = 11,     // control, server -> client: the handler is done with the client
                       // message in `slot`; `method_id` = the call slot
  // Packing (protocol feature kFeaturePack, lib/core/pack.h):
  kPack = 12,          // slot: `method_id` complete messages back to back, the first
                       // for slot `slot`; each is dispatched as if it came alone
};
inline constexpr uint8_t kKindMask = 0x0f;
inline constexpr uint8_t kMaxKind = 12;
// On a kRequest: the server writes a stream of messages (server streaming).
inline constexpr uint8_t kFlagServerStream = 0x10;
// On a kRequest: the client writes a stream of messages (client streaming;
// with kFlagServerStream too, bidi).
inline constexpr uint8_t kFlagClientStream = 0x20;
// On a kRequest or an OK kReply (protocol feature kFeatureBulk): the
// payload starts with a bulk descriptor block (lib/core/bulk/descriptors.h,
// docs/protocol.md "Bulk descriptors"), the FlatBuffer follows it.
inline constexpr uint8_t kFlagBulk = 0x40;
// On a kRequest (call metadata), or a kReply or kError (trailers), sent only
// to a peer that announced kFeatureMetadata: the payload starts with a
// metadata block (lib/core/metadata.h), before any bulk block.
inline constexpr uint8_t kFlagMetadata = 0x80;
inline constexpr uint8_t kKnownFlags = kFlagServerStream | kFlagClientStream | kFlagBulk | kFlagMetadata;

struct Header {
  uint16_t magic = kWireMagic;
  uint8_t version = kWireVersion;
  uint8_t flags = 0;         // a Kind, plus flag bits
  uint32_t method_id = 0;    // kRequest: the method; kStreamGrant: the stream's call slot
  uint64_t request_id = 0;   // unique per session and direction, never reused
  uint32_t payload_len = 0;  // bytes after the header
  uint16_t slot = 0;         // slot index in the receiver's ring
  uint16_t status = 0;       // StatusCode of a kError message (kCancel: why), else 0
  uint32_t generation = 0;   // bumped by the client each time it reuses a slot
  uint32_t timeout_us = 0;   // kRequest: time left before the caller's deadline, 0 = none

  Kind kind() const { return static_cast<Kind>(flags & kKindMask); }
  bool server_stream() const { return (flags & kFlagServerStream) != 0; }
  bool client_stream() const { return (flags & kFlagClientStream) != 0; }
  bool bulk() const { return (flags & kFlagBulk) != 0; }
  bool metadata() const { return (flags & kFlagMetadata) != 0; }
};

// Explicit little-endian stores and loads: the wire order does not depend
// on the host (the header, and the bulk descriptor blocks, lib/bulk).  On a
// little-endian host that order is the host's, so each is one unaligned
// load or store: GCC does not merge the byte loop into one (a header's
// decode took 54 instructions, bench/core_bench_profile.py).
template <class T>
void store_le(std::byte* p, T v) {
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(p, &v, sizeof(T));
  } else {
    for (size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
  }
}
template <class T>
T load_le(const std::byte* p) {
  T v = 0;
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(&v, p, sizeof(T));
  } else {
    for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(static_cast<T>(p[i]) << (8 * i));
  }
  return v;
}

// Header fields at their wire offsets: a header is encoded and decoded
// once per message, so these are inline (a call and its spills cost more
// than the loads and stores themselves).
// Writes `h` into `out[0..32)`.
inline void encode_header(const Header& h, std::byte* out) {
  store_le<uint16_t>(out + 0, h.magic);
  store_le<uint8_t>(out + 2, h.version);
  store_le<uint8_t>(out + 3, h.flags);
  store_le<uint32_t>(out + 4, h.method_id);
  store_le<uint64_t>(out + 8, h.request_id);
  store_le<uint32_t>(out + 16, h.payload_len);
  store_le<uint16_t>(out + 20, h.slot);
  store_le<uint16_t>(out + 22, h.status);
  store_le<uint32_t>(out + 24, h.generation);
  store_le<uint32_t>(out + 28, h.timeout_us);
}
// Reads 32 bytes.  Performs no validation: see validate_header.
inline Header decode_header(const std::byte* in) {
  Header h;
  h.magic = load_le<uint16_t>(in + 0);
  h.version = load_le<uint8_t>(in + 2);
  h.flags = load_le<uint8_t>(in + 3);
  h.method_id = load_le<uint32_t>(in + 4);
  h.request_id = load_le<uint64_t>(in + 8);
  h.payload_len = load_le<uint32_t>(in + 16);
  h.slot = load_le<uint16_t>(in + 20);
  h.status = load_le<uint16_t>(in + 22);
  h.generation = load_le<uint32_t>(in + 24);
  h.timeout_us = load_le<uint32_t>(in + 28);
  return h;
}

// Why a received header was refused.  kOk means well-formed.
enum class HeaderError : uint8_t {
  kOk,
  kTooShort,
  kBadMagic,
  kBadVersion,
  kBadKind,
  kBadLength,
  kBadSlot,
  kSlotMismatch,
};
std::string_view to_string(HeaderError e);

// Whether a flags byte is a known kind with only the flag bits that kind
// may carry: the stream flags belong to requests only, the bulk flag to
// requests and replies, the metadata flag to requests, replies and errors.
constexpr bool is_valid_flags(uint8_t flags) {
  const uint8_t k = flags & kKindMask;
  const uint8_t f = flags & ~kKindMask;
  if (k == 0 || k > kMaxKind) return false;
  if ((f & ~kKnownFlags) != 0) return false;
  switch (static_cast<Kind>(k)) {
    case Kind::kRequest: return true;
    case Kind::kReply: return (f & ~(kFlagBulk | kFlagMetadata)) == 0;
    case Kind::kError: return (f & ~kFlagMetadata) == 0;
    default: return f == 0;
  }
}
// The same for all 256 bytes, one bit each: a received header's flags are
// checked with one load and a shift instead of the branches above.
struct ValidFlagsTable {
  uint64_t bits[4] = {};
  constexpr ValidFlagsTable() {
    for (unsigned f = 0; f < 256; ++f)
      if (is_valid_flags(static_cast<uint8_t>(f))) bits[f >> 6] |= uint64_t{1} << (f & 63);
  }
  constexpr bool operator[](uint8_t f) const { return ((bits[f >> 6] >> (f & 63)) & 1) != 0; }
};
inline constexpr ValidFlagsTable kValidFlags{};

// Checks what can be checked without session state: magic, version, a
// known kind with only defined flags, payload_len against the received byte count and the slot size,
// slot index against the ring and against the slot the transport placed the
// bytes in.  Session-state checks (is that slot expecting this message?) are
// done by the sessions.  Inline: it runs on every message, and the common
// outcome is a handful of compares.
inline HeaderError validate_header(const Header& h, size_t received_bytes, uint32_t slot_count,
                                   uint32_t slot_size, uint16_t placed_slot) {
  if (received_bytes < kHeaderSize) [[unlikely]] return HeaderError::kTooShort;
  if (h.magic != kWireMagic) [[unlikely]] return HeaderError::kBadMagic;
  if (h.version != kWireVersion) [[unlikely]] return HeaderError::kBadVersion;
  if (!kValidFlags[h.flags]) [[unlikely]] return HeaderError::kBadKind;
  if (uint64_t{h.payload_len} + kHeaderSize != received_bytes ||
      uint64_t{h.payload_len} + kHeaderSize > slot_size) [[unlikely]]
    return HeaderError::kBadLength;
  if (h.slot >= slot_count) [[unlikely]] return HeaderError::kBadSlot;
  if (h.slot != placed_slot) [[unlikely]] return HeaderError::kSlotMismatch;
  return HeaderError::kOk;
}

// The immediate's encoding (transport/frame.h).
using transport::imm_generation;
using transport::imm_slot;
using transport::make_imm;

}  // namespace slotrpc::core
