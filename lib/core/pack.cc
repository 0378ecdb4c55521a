#include "core/pack.h"

#include <cstring>

namespace slotrpc::core {
namespace {

bool packable_kind(const Header& h, PackSender sender) {
  switch (h.kind()) {
    case Kind::kRequest:
      return sender == PackSender::kClient;
    case Kind::kReply:
    case Kind::kError:
      return sender == PackSender::kServer;
    default:
      return false;
  }
}

}  // namespace

std::string_view PackParser::parse(const std::byte* slot_bytes, const Header& pack,
                                   uint32_t slot_count, uint32_t slot_size, PackSender sender) {
  count_ = 0;
  const uint32_t n = pack.method_id;
  if (n < 2) return "a pack holds at least two messages";
  if (n > slot_count || n > entries_.size()) return "a pack holds more messages than the ring has slots";
  const uint64_t end = uint64_t{kHeaderSize} + pack.payload_len;
  uint64_t offset = kHeaderSize;
  std::string_view error;
  for (uint32_t i = 0; i < n; ++i) {
    if (offset + kHeaderSize > end) {
      error = "an inner header runs past the end of the pack";
      break;
    }
    const Header h = decode_header(slot_bytes + offset);
    const uint64_t length = uint64_t{kHeaderSize} + h.payload_len;
    if (offset + length > end) {
      error = "an inner payload runs past the end of the pack";
      break;
    }
    if (validate_header(h, length, slot_count, slot_size, h.slot) != HeaderError::kOk) {
      error = "an inner header is malformed";
      break;
    }
    if (!packable_kind(h, sender)) {
      error = "an inner message is of a kind that may not be packed in this direction";
      break;
    }
    if (seen_[h.slot] != 0) {
      error = "two inner messages name the same slot";
      break;
    }
    if (i == 0 && (h.slot != pack.slot || h.generation != pack.generation)) {
      error = "the first inner message is not for the pack's own slot and generation";
      break;
    }
    seen_[h.slot] = 1;
    entries_[count_++] = PackedEntry{static_cast<uint32_t>(offset), h};
    // The next message starts at the next multiple of 8 (so every offset
    // is aligned by construction); the last ends exactly where the pack
    // does.
    offset = i + 1 == n ? offset + length : pack_padded(static_cast<uint32_t>(offset + length));
  }
  for (size_t i = 0; i < count_; ++i) seen_[entries_[i].header.slot] = 0;
  if (error.empty() && offset != end) error = "the pack has bytes after its last message";
  if (!error.empty()) count_ = 0;
  return error;
}

void scatter_pack(std::byte* ring, uint32_t slot_size, std::span<const PackedEntry> entries) {
  if (entries.empty()) return;
  std::byte* carrier = ring + size_t{entries[0].header.slot} * slot_size;
  // The others first: they are read from the carrier, which the first
  // then overwrites from its start.
  for (size_t i = 1; i < entries.size(); ++i) {
    const PackedEntry& e = entries[i];
    std::memcpy(ring + size_t{e.header.slot} * slot_size, carrier + e.offset,
                kHeaderSize + e.header.payload_len);
  }
  std::memmove(carrier, carrier + entries[0].offset, kHeaderSize + entries[0].header.payload_len);
}

PackOut write_pack(std::byte* ring, uint32_t slot_size, uint16_t carrier,
                   std::span<const PackPiece> messages) {
  if (messages.size() < 2) return {};
  uint64_t length = kHeaderSize;
  for (size_t i = 0; i < messages.size(); ++i) {
    length = i + 1 == messages.size() ? length + messages[i].length
                                      : pack_padded(static_cast<uint32_t>(length + messages[i].length));
  }
  std::byte* slot = ring + size_t{carrier} * slot_size;
  // The first message lies somewhere in its own slot (a FlatBuffer ends at
  // the slot's end, an error text starts at its start): build the pack in
  // front of it, or behind it.
  const auto first_at = static_cast<uint64_t>(messages[0].data - slot);
  const uint64_t first_end = pack_padded(static_cast<uint32_t>(first_at + messages[0].length));
  std::byte* out;
  if (length <= first_at) {
    out = slot;
  } else if (first_end + length <= slot_size) {
    out = slot + first_end;
  } else {
    return {};
  }
  const Header first = decode_header(messages[0].data);
  Header h;
  h.flags = static_cast<uint8_t>(Kind::kPack);
  h.method_id = static_cast<uint32_t>(messages.size());
  h.payload_len = static_cast<uint32_t>(length - kHeaderSize);
  h.slot = carrier;
  h.generation = first.generation;
  encode_header(h, out);
  uint64_t offset = kHeaderSize;
  for (size_t i = 0; i < messages.size(); ++i) {
    std::memcpy(out + offset, messages[i].data, messages[i].length);
    const uint64_t next = offset + messages[i].length;
    if (i + 1 == messages.size()) break;
    const uint32_t padded = pack_padded(static_cast<uint32_t>(next));
    std::memset(out + next, 0, padded - next);
    offset = padded;
  }
  return PackOut{out, static_cast<uint32_t>(length)};
}

}  // namespace slotrpc::core
