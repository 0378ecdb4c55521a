#include "core/wire_format.h"

#include <cstring>

namespace slotrpc::core {
namespace {

bool is_valid_kind(uint8_t flags) {
  const uint8_t k = flags & kKindMask;
  const uint8_t f = flags & ~kKindMask;
  if (k == 0 || k > kMaxKind) return false;
  if ((f & ~kKnownFlags) != 0) return false;
  // The stream flags belong to requests only; the bulk flag to requests
  // and replies; the metadata flag to requests, replies and errors.
  switch (static_cast<Kind>(k)) {
    case Kind::kRequest: return true;
    case Kind::kReply: return (f & ~(kFlagBulk | kFlagMetadata)) == 0;
    case Kind::kError: return (f & ~kFlagMetadata) == 0;
    default: return f == 0;
  }
}

}  // namespace

void encode_header(const Header& h, std::byte* out) {
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

Header decode_header(const std::byte* in) {
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

std::string_view to_string(HeaderError e) {
  switch (e) {
    case HeaderError::kOk: return "ok";
    case HeaderError::kTooShort: return "message shorter than the 32-byte header";
    case HeaderError::kBadMagic: return "bad magic";
    case HeaderError::kBadVersion: return "unsupported protocol version";
    case HeaderError::kBadKind: return "flags hold an unknown message kind or undefined flag bits";
    case HeaderError::kBadLength: return "payload length disagrees with the bytes received or exceeds the slot";
    case HeaderError::kBadSlot: return "slot index outside the ring";
    case HeaderError::kSlotMismatch: return "header slot differs from the slot written";
  }
  return "?";
}

HeaderError validate_header(const Header& h, size_t received_bytes, uint32_t slot_count,
                            uint32_t slot_size, uint16_t placed_slot) {
  if (received_bytes < kHeaderSize) return HeaderError::kTooShort;
  if (h.magic != kWireMagic) return HeaderError::kBadMagic;
  if (h.version != kWireVersion) return HeaderError::kBadVersion;
  if (!is_valid_kind(h.flags)) return HeaderError::kBadKind;
  if (uint64_t{h.payload_len} + kHeaderSize != received_bytes ||
      uint64_t{h.payload_len} + kHeaderSize > slot_size)
    return HeaderError::kBadLength;
  if (h.slot >= slot_count) return HeaderError::kBadSlot;
  if (h.slot != placed_slot) return HeaderError::kSlotMismatch;
  return HeaderError::kOk;
}

}  // namespace slotrpc::core
