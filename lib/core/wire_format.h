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

// Writes `h` into `out[0..32)`.
void encode_header(const Header& h, std::byte* out);
// Reads 32 bytes.  Performs no validation: see validate_header.
Header decode_header(const std::byte* in);

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

// Checks what can be checked without session state: magic, version, a
// known kind with only defined flags, payload_len against the received byte count and the slot size,
// slot index against the ring and against the slot the transport placed the
// bytes in.  Session-state checks (is that slot expecting this message?) are
// done by the sessions.
HeaderError validate_header(const Header& h, size_t received_bytes, uint32_t slot_count,
                            uint32_t slot_size, uint16_t placed_slot);

// The immediate's encoding (transport/frame.h).
using transport::imm_generation;
using transport::imm_slot;
using transport::make_imm;

}  // namespace slotrpc::core
