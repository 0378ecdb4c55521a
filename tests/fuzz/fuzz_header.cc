// Fuzz target: the 32-byte message header (core::decode_header,
// core::encode_header, core::validate_header) and the immediate encoding.
//
// Input: bytes 0..32 are a header as received (zero-padded when shorter);
// bytes 32..46, when present, are what the receiver knows besides the
// header: u32 received_bytes, u32 slot_count, u32 slot_size, u16 placed_slot
// (little-endian).  Without them the receiver is a default ring (64 slots of
// 64 KiB) that got exactly 32 + payload_len bytes in the header's own slot,
// so a bare valid header is a valid message.
//
// Oracles (any violation aborts, which libFuzzer reports as a crash):
//  * decoding is total and lossless: encode(decode(b)) == b for every b;
//  * validate_header agrees, error for error, with an independent reading
//    of docs/protocol.md section 4 ("Validation on receipt") written below;
//  * every HeaderError has a real description;
//  * make_imm / imm_slot / imm_generation round-trip.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/wire_format.h"
#include "fuzz_check.h"

namespace {

using namespace slotrpc::core;

uint32_t le32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
uint16_t le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }

// docs/protocol.md, "Validation on receipt", in the order listed there.
HeaderError reference_validate(const uint8_t* b, size_t received, uint32_t slot_count,
                               uint32_t slot_size, uint16_t placed) {
  if (received < 32) return HeaderError::kTooShort;
  if (le16(b) != 0x5253) return HeaderError::kBadMagic;
  if (b[2] != 1) return HeaderError::kBadVersion;
  const unsigned kind = b[3] & 0x0f, flags = b[3] & 0xf0;
  if (kind < 1 || kind > 12) return HeaderError::kBadKind;
  // 0x10 server stream, 0x20 client stream, 0x40 bulk, 0x80 metadata: any
  // of them on a request; 0x40 and 0x80 on a reply; 0x80 on an error
  // (protocol.md, section 4); nothing on another kind.
  const bool request_flags = kind == 1;
  const bool reply_flags = kind == 2 && (flags & ~0xc0u) == 0;
  const bool error_flags = kind == 3 && (flags & ~0x80u) == 0;
  if (flags != 0 && !request_flags && !reply_flags && !error_flags) return HeaderError::kBadKind;
  const uint64_t total = 32 + uint64_t{le32(b + 16)};
  if (total != received || total > slot_size) return HeaderError::kBadLength;
  const uint16_t slot = le16(b + 20);
  if (slot >= slot_count) return HeaderError::kBadSlot;
  if (slot != placed) return HeaderError::kSlotMismatch;
  return HeaderError::kOk;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uint8_t raw[kHeaderSize] = {};
  std::memcpy(raw, data, size < kHeaderSize ? size : kHeaderSize);

  // Decoding is total and lossless.
  const Header h = decode_header(reinterpret_cast<const std::byte*>(raw));
  std::byte again[kHeaderSize];
  encode_header(h, again);
  FUZZ_CHECK(std::memcmp(again, raw, kHeaderSize) == 0);
  const Header h2 = decode_header(again);
  FUZZ_CHECK(h2.magic == h.magic && h2.version == h.version && h2.flags == h.flags &&
             h2.method_id == h.method_id && h2.request_id == h.request_id &&
             h2.payload_len == h.payload_len && h2.slot == h.slot && h2.status == h.status &&
             h2.generation == h.generation && h2.timeout_us == h.timeout_us);

  size_t received = kHeaderSize + size_t{h.payload_len};
  uint32_t slot_count = 64, slot_size = 64 * 1024;
  uint16_t placed = h.slot;
  if (size >= kHeaderSize + 14) {
    const uint8_t* p = data + kHeaderSize;
    received = le32(p);
    slot_count = le32(p + 4);
    slot_size = le32(p + 8);
    placed = le16(p + 12);
  }

  const HeaderError got = validate_header(h, received, slot_count, slot_size, placed);
  const HeaderError want = reference_validate(raw, received, slot_count, slot_size, placed);
  if (got != want) {
    std::fprintf(stderr, "validate_header says '%.*s', protocol.md says '%.*s'\n",
                 static_cast<int>(to_string(got).size()), to_string(got).data(),
                 static_cast<int>(to_string(want).size()), to_string(want).data());
    std::abort();
  }
  const std::string_view why = to_string(got);
  FUZZ_CHECK(!why.empty() && why != "?");
  if (got == HeaderError::kOk) {
    FUZZ_CHECK(static_cast<uint8_t>(h.kind()) >= 1 && static_cast<uint8_t>(h.kind()) <= kMaxKind);
    FUZZ_CHECK(!h.server_stream() || h.kind() == Kind::kRequest);
    FUZZ_CHECK(!h.client_stream() || h.kind() == Kind::kRequest);
    FUZZ_CHECK(kHeaderSize + size_t{h.payload_len} <= slot_size);
  }

  // The immediate: slot in the low half, generation's low 16 bits above.
  const uint32_t imm = le32(raw + 24) ^ le32(raw + 4);
  FUZZ_CHECK(make_imm(imm_slot(imm), imm_generation(imm)) == imm);
  const uint32_t made = make_imm(h.slot, h.generation);
  FUZZ_CHECK(imm_slot(made) == h.slot);
  FUZZ_CHECK(imm_generation(made) == static_cast<uint16_t>(h.generation));
  return 0;
}
