// Fuzz target: PACK messages (lib/core/pack.h; docs/protocol.md, "PACK").
//
// Input: byte 0 chooses the mode and the sender; the rest is used as below.
//
//  * Receive (byte 0 bit 1 clear): bytes 1.. are what the transport placed
//    in a slot of a ring of 16 slots of 4 KiB (cut to the slot), header
//    first.  The header's own slot (mod 16) is the slot it was placed in.
//    When validate_header accepts it and it is a PACK, PackParser::parse
//    runs (sender: byte 0 bit 0), and on success scatter_pack.
//    Oracles: a parse that succeeds returns 2 .. 16 entries, at 8-byte
//    aligned offsets inside the pack, back to back with at most 7 bytes of
//    padding between them, the last ending where the pack does, their
//    slots distinct and the first the pack's own slot and generation, each
//    header valid and of a kind the sender may pack; after scatter_pack,
//    every slot named holds exactly its message.  ASan catches any access
//    outside the ring.
//  * Round trip (bit 1 set): bytes 1.. are cut into up to 16 messages
//    (u8 slot, u8 length each, then that many payload bytes) built as the
//    sender would build them, each in its own send slot; write_pack packs
//    them and PackParser::parse must give back every message unchanged.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/pack.h"
#include "core/wire_format.h"
#include "fuzz_check.h"

namespace {

using namespace slotrpc::core;

constexpr uint32_t kSlots = 16;
constexpr uint32_t kSlotSize = 4096;

void receive(const uint8_t* data, size_t size, PackSender sender) {
  std::vector<std::byte> ring(size_t{kSlots} * kSlotSize);
  uint8_t raw[kHeaderSize] = {};
  std::memcpy(raw, data, size < kHeaderSize ? size : kHeaderSize);
  const Header pack = decode_header(reinterpret_cast<const std::byte*>(raw));
  const uint16_t placed = static_cast<uint16_t>(pack.slot % kSlots);
  const size_t received = size < kSlotSize ? size : kSlotSize;
  std::byte* slot = ring.data() + size_t{placed} * kSlotSize;
  std::memcpy(slot, data, received);
  if (validate_header(pack, received, kSlots, kSlotSize, placed) != HeaderError::kOk) return;
  if (pack.kind() != Kind::kPack) return;

  PackParser parser(kSlots);
  const std::string_view error = parser.parse(slot, pack, kSlots, kSlotSize, sender);
  const auto entries = parser.entries();
  if (!error.empty()) {
    FUZZ_CHECK(entries.empty());
    return;
  }
  FUZZ_CHECK(entries.size() >= 2 && entries.size() <= kSlots);
  FUZZ_CHECK(entries.size() == pack.method_id);
  FUZZ_CHECK(entries[0].header.slot == placed && entries[0].header.generation == pack.generation);
  bool seen[kSlots] = {};
  uint64_t expect = kHeaderSize;
  for (size_t i = 0; i < entries.size(); ++i) {
    const PackedEntry& e = entries[i];
    FUZZ_CHECK(e.offset % kPackAlign == 0);
    FUZZ_CHECK(e.offset >= expect && e.offset < expect + kPackAlign);
    const Header h = decode_header(slot + e.offset);
    FUZZ_CHECK(h.slot == e.header.slot && h.payload_len == e.header.payload_len &&
               h.generation == e.header.generation && h.flags == e.header.flags);
    FUZZ_CHECK(validate_header(h, kHeaderSize + h.payload_len, kSlots, kSlotSize, h.slot) ==
               HeaderError::kOk);
    const bool from_client = sender == PackSender::kClient;
    FUZZ_CHECK(from_client ? h.kind() == Kind::kRequest
                           : (h.kind() == Kind::kReply || h.kind() == Kind::kError));
    FUZZ_CHECK(h.slot < kSlots && !seen[h.slot]);
    seen[h.slot] = true;
    expect = e.offset + kHeaderSize + uint64_t{h.payload_len};
  }
  FUZZ_CHECK(expect == kHeaderSize + uint64_t{pack.payload_len});

  const std::vector<std::byte> before(slot, slot + received);
  std::vector<PackedEntry> copy(entries.begin(), entries.end());
  scatter_pack(ring.data(), kSlotSize, copy);
  for (const PackedEntry& e : copy) {
    FUZZ_CHECK(std::memcmp(ring.data() + size_t{e.header.slot} * kSlotSize, before.data() + e.offset,
                           kHeaderSize + e.header.payload_len) == 0);
  }
}

void round_trip(const uint8_t* data, size_t size, PackSender sender) {
  std::vector<std::byte> ring(size_t{kSlots} * kSlotSize);
  std::vector<PackPiece> pieces;
  std::vector<Header> headers;
  bool used[kSlots] = {};
  size_t i = 0;
  while (i + 2 <= size && pieces.size() < kSlots) {
    const auto slot = static_cast<uint16_t>(data[i] % kSlots);
    const uint32_t len = data[i + 1];
    i += 2;
    if (used[slot]) continue;
    used[slot] = true;
    Header h;
    h.flags = static_cast<uint8_t>(sender == PackSender::kClient ? Kind::kRequest
                                   : (len & 1) != 0              ? Kind::kError
                                                                 : Kind::kReply);
    h.method_id = len * 7;
    h.request_id = i;
    h.payload_len = len;
    h.slot = slot;
    h.generation = static_cast<uint32_t>(i * 31 + len);
    h.status = h.kind() == Kind::kError ? 3 : 0;
    // Built where the sender builds: a FlatBuffer ends at the slot's end,
    // an error text starts at its start.
    std::byte* s = ring.data() + size_t{slot} * kSlotSize;
    std::byte* msg = h.kind() == Kind::kError ? s : s + kSlotSize - kHeaderSize - len;
    encode_header(h, msg);
    for (uint32_t k = 0; k < len; ++k)
      msg[kHeaderSize + k] = static_cast<std::byte>(i + k < size ? data[i + k] : 0);
    i += len;
    pieces.push_back(PackPiece{msg, static_cast<uint32_t>(kHeaderSize + len)});
    headers.push_back(h);
  }
  if (pieces.size() < 2) return;
  const PackOut out = write_pack(ring.data(), kSlotSize, headers[0].slot, pieces);
  uint64_t total = kHeaderSize;
  for (const PackPiece& p : pieces) total = pack_padded(static_cast<uint32_t>(total)) + p.length;
  if (out.data == nullptr) {
    // Only a pack too large for either end of the first message's slot.
    FUZZ_CHECK(total > kSlotSize / 2);
    return;
  }
  FUZZ_CHECK(out.length == total);
  // What the receiver gets: the pack at the start of its slot.
  std::vector<std::byte> peer(size_t{kSlots} * kSlotSize);
  std::byte* carrier = peer.data() + size_t{headers[0].slot} * kSlotSize;
  std::memcpy(carrier, out.data, out.length);
  const Header pack = decode_header(carrier);
  FUZZ_CHECK(validate_header(pack, out.length, kSlots, kSlotSize, headers[0].slot) == HeaderError::kOk);
  FUZZ_CHECK(pack.kind() == Kind::kPack && pack.method_id == pieces.size());
  PackParser parser(kSlots);
  const std::string_view error = parser.parse(carrier, pack, kSlots, kSlotSize, sender);
  if (!error.empty()) {
    std::fprintf(stderr, "a pack write_pack built was refused: %.*s\n", static_cast<int>(error.size()),
                 error.data());
    std::abort();
  }
  std::vector<PackedEntry> entries(parser.entries().begin(), parser.entries().end());
  FUZZ_CHECK(entries.size() == pieces.size());
  scatter_pack(peer.data(), kSlotSize, entries);
  for (size_t k = 0; k < pieces.size(); ++k) {
    FUZZ_CHECK(entries[k].header.slot == headers[k].slot);
    FUZZ_CHECK(std::memcmp(peer.data() + size_t{headers[k].slot} * kSlotSize, pieces[k].data,
                           pieces[k].length) == 0);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const PackSender sender = (data[0] & 1) != 0 ? PackSender::kServer : PackSender::kClient;
  if ((data[0] & 2) != 0) {
    round_trip(data + 1, size - 1, sender);
  } else {
    receive(data + 1, size - 1, sender);
  }
  return 0;
}
