// The 32-byte message header: encoding, decoding, validation and the
// immediate-data helpers (lib/core/wire_format.h, docs/protocol.md).
#include "core/wire_format.h"

#include <doctest/doctest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

using slotrpc::core::decode_header;
using slotrpc::core::encode_header;
using slotrpc::core::Header;
using slotrpc::core::HeaderError;
using slotrpc::core::imm_generation;
using slotrpc::core::imm_slot;
using slotrpc::core::kHeaderSize;
using slotrpc::core::Kind;
using slotrpc::core::kKindMask;
using slotrpc::core::kWireMagic;
using slotrpc::core::kWireVersion;
using slotrpc::core::make_imm;
using slotrpc::core::validate_header;

namespace {

using Bytes = std::array<std::byte, kHeaderSize>;

Bytes encode(const Header& h) {
  Bytes out;
  out.fill(std::byte{0xcc});  // every byte must be overwritten
  encode_header(h, out.data());
  return out;
}

uint64_t read_le(const Bytes& b, size_t offset, size_t width) {
  uint64_t v = 0;
  for (size_t i = 0; i < width; ++i) v |= uint64_t{std::to_integer<uint8_t>(b[offset + i])} << (8 * i);
  return v;
}

// A header that passes validate_header for a ring of 8 slots of 4096 bytes
// when 32 + 100 bytes were received into slot 3.
constexpr uint32_t kSlotCount = 8;
constexpr uint32_t kSlotSize = 4096;
constexpr uint16_t kPlaced = 3;
constexpr uint32_t kPayload = 100;

Header good_header() {
  Header h;
  h.flags = static_cast<uint8_t>(Kind::kRequest);
  h.method_id = 0x12345678;
  h.request_id = 42;
  h.payload_len = kPayload;
  h.slot = kPlaced;
  h.generation = 7;
  return h;
}

HeaderError check(const Header& h, size_t received = kHeaderSize + kPayload) {
  return validate_header(h, received, kSlotCount, kSlotSize, kPlaced);
}

}  // namespace

TEST_CASE("wire_format: constants") {
  CHECK(kHeaderSize == 32);
  CHECK(kWireMagic == 0x5253);
  CHECK(kWireVersion == 1);
  CHECK(kKindMask == 0x0f);
  CHECK(slotrpc::core::kFlagServerStream == 0x10);
  Header h;
  CHECK(h.magic == kWireMagic);
  CHECK(h.version == kWireVersion);
}

TEST_CASE("wire_format: encode/decode round trip of every field") {
  Header h;
  h.magic = 0xa1b2;
  h.version = 0xc3;
  h.flags = 0xd4;
  h.method_id = 0xdeadbeef;
  h.request_id = 0x0123456789abcdefull;
  h.payload_len = 0xfedcba98;
  h.slot = 0x4321;
  h.status = 0x8765;
  h.generation = 0x13579bdf;
  h.timeout_us = 0x2468ace0;

  const Bytes b = encode(h);
  const Header d = decode_header(b.data());
  CHECK(d.magic == h.magic);
  CHECK(d.version == h.version);
  CHECK(d.flags == h.flags);
  CHECK(d.method_id == h.method_id);
  CHECK(d.request_id == h.request_id);
  CHECK(d.payload_len == h.payload_len);
  CHECK(d.slot == h.slot);
  CHECK(d.status == h.status);
  CHECK(d.generation == h.generation);
  CHECK(d.timeout_us == h.timeout_us);

  SUBCASE("extreme values") {
    Header m;
    m.magic = 0xffff;
    m.version = 0xff;
    m.flags = 0xff;
    m.method_id = UINT32_MAX;
    m.request_id = UINT64_MAX;
    m.payload_len = UINT32_MAX;
    m.slot = UINT16_MAX;
    m.status = UINT16_MAX;
    m.generation = UINT32_MAX;
    m.timeout_us = UINT32_MAX;
    const Header r = decode_header(encode(m).data());
    CHECK(r.magic == 0xffff);
    CHECK(r.version == 0xff);
    CHECK(r.flags == 0xff);
    CHECK(r.method_id == UINT32_MAX);
    CHECK(r.request_id == UINT64_MAX);
    CHECK(r.payload_len == UINT32_MAX);
    CHECK(r.slot == UINT16_MAX);
    CHECK(r.status == UINT16_MAX);
    CHECK(r.generation == UINT32_MAX);
    CHECK(r.timeout_us == UINT32_MAX);
  }
  SUBCASE("zero values") {
    Header z;
    z.magic = 0;
    z.version = 0;
    const Bytes zb = encode(z);
    for (std::byte x : zb) CHECK(x == std::byte{0});
    const Header r = decode_header(zb.data());
    CHECK(r.magic == 0);
    CHECK(r.request_id == 0);
    CHECK(r.timeout_us == 0);
  }
}

TEST_CASE("wire_format: exact little-endian byte layout") {
  Header h;
  h.flags = static_cast<uint8_t>(Kind::kError);
  h.method_id = 0x07060504;
  h.request_id = 0x0f0e0d0c0b0a0908ull;
  h.payload_len = 0x13121110;
  h.slot = 0x1514;
  h.status = 0x1716;
  h.generation = 0x1b1a1918;
  h.timeout_us = 0x1f1e1d1c;
  const Bytes b = encode(h);

  // Magic 0x5253 is stored as 'S' 'R'.
  CHECK(b[0] == std::byte{0x53});
  CHECK(b[1] == std::byte{0x52});
  CHECK(read_le(b, 0, 2) == 0x5253);
  CHECK(b[2] == std::byte{kWireVersion});
  CHECK(b[3] == std::byte{0x03});
  CHECK(read_le(b, 4, 4) == 0x07060504);
  CHECK(read_le(b, 8, 8) == 0x0f0e0d0c0b0a0908ull);
  CHECK(read_le(b, 16, 4) == 0x13121110);
  CHECK(read_le(b, 20, 2) == 0x1514);
  CHECK(read_le(b, 22, 2) == 0x1716);
  CHECK(read_le(b, 24, 4) == 0x1b1a1918);
  CHECK(read_le(b, 28, 4) == 0x1f1e1d1c);
  // With these values, byte i past the first four holds exactly i.
  for (size_t i = 4; i < kHeaderSize; ++i) {
    CAPTURE(i);
    CHECK(std::to_integer<size_t>(b[i]) == i);
  }
}

TEST_CASE("wire_format: decode reads a hand-written little-endian header") {
  Bytes b;
  for (size_t i = 0; i < kHeaderSize; ++i) b[i] = static_cast<std::byte>(0x80 + i);
  const Header h = decode_header(b.data());
  CHECK(h.magic == 0x8180);
  CHECK(h.version == 0x82);
  CHECK(h.flags == 0x83);
  CHECK(h.method_id == 0x87868584u);
  CHECK(h.request_id == 0x8f8e8d8c8b8a8988ull);
  CHECK(h.payload_len == 0x93929190u);
  CHECK(h.slot == 0x9594);
  CHECK(h.status == 0x9796);
  CHECK(h.generation == 0x9b9a9998u);
  CHECK(h.timeout_us == 0x9f9e9d9cu);
}

TEST_CASE("wire_format: kind() masks the flags") {
  Header h;
  for (Kind k : {Kind::kRequest, Kind::kReply, Kind::kError, Kind::kCancel, Kind::kPing,
                 Kind::kPong, Kind::kStreamMessage, Kind::kStreamGrant}) {
    h.flags = static_cast<uint8_t>(k);
    CHECK(h.kind() == k);
    CHECK_FALSE(h.server_stream());
    h.flags = static_cast<uint8_t>(k) | 0xf0;
    CHECK(h.kind() == k);
    CHECK(h.server_stream());
  }
}

TEST_CASE("wire_format: validate_header accepts a good header") {
  const Header h = good_header();
  CHECK(check(h) == HeaderError::kOk);

  SUBCASE("a server-streaming request") {
    Header g = good_header();
    g.flags = static_cast<uint8_t>(Kind::kRequest) | slotrpc::core::kFlagServerStream;
    CHECK(check(g) == HeaderError::kOk);
  }
  SUBCASE("client-streaming and bidi requests") {
    Header g = good_header();
    g.flags = static_cast<uint8_t>(Kind::kRequest) | slotrpc::core::kFlagClientStream;
    CHECK(check(g) == HeaderError::kOk);
    CHECK(g.client_stream());
    CHECK_FALSE(g.server_stream());
    g.flags |= slotrpc::core::kFlagServerStream;
    CHECK(check(g) == HeaderError::kOk);
    CHECK(g.client_stream());
    CHECK(g.server_stream());
  }
  SUBCASE("every kind") {
    for (uint8_t k : {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}) {
      Header g = good_header();
      g.flags = k;
      CAPTURE(int{k});
      CHECK(check(g) == HeaderError::kOk);
    }
  }
  SUBCASE("empty payload") {
    Header g = good_header();
    g.payload_len = 0;
    CHECK(validate_header(g, kHeaderSize, kSlotCount, kSlotSize, kPlaced) == HeaderError::kOk);
  }
  SUBCASE("message exactly fills the slot") {
    Header g = good_header();
    g.payload_len = kSlotSize - kHeaderSize;
    CHECK(validate_header(g, kSlotSize, kSlotCount, kSlotSize, kPlaced) == HeaderError::kOk);
  }
  SUBCASE("last slot of the ring") {
    Header g = good_header();
    g.slot = kSlotCount - 1;
    CHECK(validate_header(g, kHeaderSize + kPayload, kSlotCount, kSlotSize, kSlotCount - 1) ==
          HeaderError::kOk);
  }
  SUBCASE("status and timeout are not checked here") {
    Header g = good_header();
    g.status = 0xffff;
    g.timeout_us = UINT32_MAX;
    g.request_id = UINT64_MAX;
    CHECK(check(g) == HeaderError::kOk);
  }
}

// validate_header reads the flags byte from a table built at compile time;
// every one of the 256 bytes against the rule as protocol.md states it.
TEST_CASE("wire_format: validate_header takes exactly the flags each kind may carry, all 256 bytes") {
  Header h = good_header();
  int accepted = 0;
  for (unsigned f = 0; f < 256; ++f) {
    const unsigned kind = f & 0x0f;
    const unsigned bits = f & 0xf0;
    bool expected = kind >= 1 && kind <= 12;
    if (kind == 2) expected = (bits & ~0xc0u) == 0;        // reply: bulk, metadata
    else if (kind == 3) expected = (bits & ~0x80u) == 0;   // error: metadata
    else if (kind != 1) expected = expected && bits == 0;  // request: any; the rest: none
    h.flags = static_cast<uint8_t>(f);
    CAPTURE(f);
    CHECK((check(h) == HeaderError::kOk) == expected);
    accepted += check(h) == HeaderError::kOk ? 1 : 0;
  }
  CHECK(accepted == 16 + 4 + 2 + 9);
}

TEST_CASE("wire_format: validate_header rejects each bad input") {
  SUBCASE("too short") {
    const Header h = good_header();
    CHECK(validate_header(h, 0, kSlotCount, kSlotSize, kPlaced) == HeaderError::kTooShort);
    CHECK(validate_header(h, kHeaderSize - 1, kSlotCount, kSlotSize, kPlaced) ==
          HeaderError::kTooShort);
  }
  SUBCASE("too short wins over everything else") {
    Header h = good_header();
    h.magic = 0;
    h.version = 9;
    h.flags = 0;
    CHECK(validate_header(h, 10, kSlotCount, kSlotSize, kPlaced) == HeaderError::kTooShort);
  }
  SUBCASE("bad magic") {
    Header h = good_header();
    h.magic = 0x5352;  // byte-swapped
    CHECK(check(h) == HeaderError::kBadMagic);
    h.magic = 0;
    CHECK(check(h) == HeaderError::kBadMagic);
  }
  SUBCASE("bad version") {
    Header h = good_header();
    h.version = 0;
    CHECK(check(h) == HeaderError::kBadVersion);
    h.version = kWireVersion + 1;
    CHECK(check(h) == HeaderError::kBadVersion);
  }
  SUBCASE("zero flags") {
    Header h = good_header();
    h.flags = 0;
    CHECK(check(h) == HeaderError::kBadKind);
  }
  SUBCASE("unknown kinds") {
    Header h = good_header();
    for (uint8_t k = 13; k <= kKindMask; ++k) {
      h.flags = k;
      CAPTURE(int{k});
      CHECK(check(h) == HeaderError::kBadKind);
    }
  }
  SUBCASE("the stream flag on anything but a request") {
    Header h = good_header();
    h.flags = static_cast<uint8_t>(Kind::kReply) | slotrpc::core::kFlagServerStream;
    CHECK(check(h) == HeaderError::kBadKind);
    h.flags = static_cast<uint8_t>(Kind::kStreamGrant) | slotrpc::core::kFlagServerStream;
    CHECK(check(h) == HeaderError::kBadKind);
    h.flags = static_cast<uint8_t>(Kind::kClientMessage) | slotrpc::core::kFlagClientStream;
    CHECK(check(h) == HeaderError::kBadKind);
    h.flags = static_cast<uint8_t>(Kind::kStreamAck) | slotrpc::core::kFlagClientStream;
    CHECK(check(h) == HeaderError::kBadKind);
  }
  SUBCASE("unknown bits") {
    Header h = good_header();
    h.flags = 0x40;
    CHECK(check(h) == HeaderError::kBadKind);
    h.flags = 0x80;
    CHECK(check(h) == HeaderError::kBadKind);
    // A valid kind plus a flag it does not take is refused: the metadata
    // flag (0x80) belongs to requests, replies and errors only.
    h.flags = static_cast<uint8_t>(Kind::kPing) | 0x80;
    CHECK(check(h) == HeaderError::kBadKind);
    h.flags = static_cast<uint8_t>(Kind::kStreamMessage) | 0x80;
    CHECK(check(h) == HeaderError::kBadKind);
    h.flags = static_cast<uint8_t>(Kind::kError) | 0x40;
    CHECK(check(h) == HeaderError::kBadKind);
  }
  SUBCASE("the bulk flag on requests and replies only") {
    Header h = good_header();
    h.flags = static_cast<uint8_t>(Kind::kRequest) | slotrpc::core::kFlagBulk;
    CHECK(check(h) == HeaderError::kOk);
    h.flags = static_cast<uint8_t>(Kind::kReply) | slotrpc::core::kFlagBulk;
    CHECK(check(h) == HeaderError::kOk);
    for (Kind k : {Kind::kError, Kind::kStreamMessage, Kind::kClientMessage, Kind::kCancel}) {
      h.flags = static_cast<uint8_t>(k) | slotrpc::core::kFlagBulk;
      CHECK(check(h) == HeaderError::kBadKind);
    }
    // Not with the stream flags on a reply.
    h.flags = static_cast<uint8_t>(Kind::kReply) | slotrpc::core::kFlagBulk |
              slotrpc::core::kFlagServerStream;
    CHECK(check(h) == HeaderError::kBadKind);
  }
  SUBCASE("payload_len != received - 32") {
    Header h = good_header();
    CHECK(check(h, kHeaderSize + kPayload - 1) == HeaderError::kBadLength);
    CHECK(check(h, kHeaderSize + kPayload + 1) == HeaderError::kBadLength);
    CHECK(check(h, kHeaderSize) == HeaderError::kBadLength);
    h.payload_len = UINT32_MAX;  // must not wrap around
    CHECK(check(h, kHeaderSize + kPayload) == HeaderError::kBadLength);
    CHECK(check(h, size_t{UINT32_MAX} + kHeaderSize - 1) == HeaderError::kBadLength);
  }
  SUBCASE("message larger than the slot") {
    Header h = good_header();
    h.payload_len = kSlotSize - kHeaderSize + 1;
    CHECK(validate_header(h, kSlotSize + 1, kSlotCount, kSlotSize, kPlaced) ==
          HeaderError::kBadLength);
    h.payload_len = 2 * kSlotSize;
    CHECK(validate_header(h, 2 * kSlotSize + kHeaderSize, kSlotCount, kSlotSize, kPlaced) ==
          HeaderError::kBadLength);
  }
  SUBCASE("slot >= slot_count") {
    Header h = good_header();
    h.slot = kSlotCount;
    CHECK(validate_header(h, kHeaderSize + kPayload, kSlotCount, kSlotSize, kSlotCount) ==
          HeaderError::kBadSlot);
    h.slot = UINT16_MAX;
    CHECK(validate_header(h, kHeaderSize + kPayload, kSlotCount, kSlotSize, UINT16_MAX) ==
          HeaderError::kBadSlot);
  }
  SUBCASE("slot != placed slot") {
    Header h = good_header();
    h.slot = kPlaced + 1;
    CHECK(check(h) == HeaderError::kSlotMismatch);
    h.slot = 0;
    CHECK(check(h) == HeaderError::kSlotMismatch);
  }
}

TEST_CASE("wire_format: every HeaderError has a distinct description") {
  const HeaderError all[] = {HeaderError::kOk,        HeaderError::kTooShort,
                             HeaderError::kBadMagic,  HeaderError::kBadVersion,
                             HeaderError::kBadKind,   HeaderError::kBadLength,
                             HeaderError::kBadSlot,   HeaderError::kSlotMismatch};
  CHECK(to_string(HeaderError::kOk) == "ok");
  for (size_t i = 0; i < std::size(all); ++i) {
    const std::string_view a = to_string(all[i]);
    CHECK_FALSE(a.empty());
    CHECK(a != "?");
    for (size_t j = i + 1; j < std::size(all); ++j) CHECK(a != to_string(all[j]));
  }
}

TEST_CASE("wire_format: immediate data packs slot and generation") {
  CHECK(make_imm(0, 0) == 0u);
  CHECK(make_imm(5, 0) == 5u);
  CHECK(make_imm(0, 1) == 0x10000u);
  CHECK(make_imm(0x1234, 0x5678) == 0x56781234u);
  CHECK(make_imm(0xffff, 0xffff) == 0xffffffffu);

  CHECK(imm_slot(0x56781234u) == 0x1234);
  CHECK(imm_generation(0x56781234u) == 0x5678);

  // Only the low 16 bits of the generation travel.
  const uint32_t imm = make_imm(7, 0xabcd1234u);
  CHECK(imm_slot(imm) == 7);
  CHECK(imm_generation(imm) == 0x1234);

  for (uint32_t slot : {0u, 1u, 63u, 4095u, 65535u}) {
    for (uint32_t gen : {0u, 1u, 2u, 0xfffeu, 0xffffu, 0x10000u, 0x12345678u}) {
      const uint32_t v = make_imm(static_cast<uint16_t>(slot), gen);
      CHECK(imm_slot(v) == slot);
      CHECK(imm_generation(v) == static_cast<uint16_t>(gen));
    }
  }
  static_assert(imm_slot(make_imm(9, 3)) == 9);
  static_assert(imm_generation(make_imm(9, 3)) == 3);
}
