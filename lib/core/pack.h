// Packing small messages that are ready together (docs/protocol.md,
// "PACK"; docs/design.md, "Packing").
//
// Each slot message costs one work request (verbs: one WRITE_WITH_IMM, its
// packets, acknowledgements and one receive completion) or one frame (TCP).
// When a session has several small requests or replies ready in the same
// reactor turn, the sender copies them back to back into the send slot of
// the first and posts them as one PACK message into that slot of the peer's
// ring, under that one slot's credit.  Nothing waits to be packed: only
// what one turn already produced is grouped, so a lone call goes out as
// before.
//
// The receiver checks the whole pack (every inner header and length, the
// slots distinct and each ready for its message) before it touches
// anything, then copies each message into the slot it names, as if it had
// arrived alone, and dispatches them in order.  After that nothing differs
// from an unpacked arrival: every message keeps its own slot, credit,
// request id, deadline and status, and a handler still reads its request
// in place in its own slot.  The price is one small copy per packed
// message on each side (at most Config::pack_small bytes each), paid to
// save a work request, a completion and, on verbs, packets.
//
// Neither side allocates: the sender packs inside the Outbox, the receiver
// parses into arrays sized at session setup.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "core/wire_format.h"
#include "transport/transport.h"

namespace slotrpc::core {

// Inner messages start at multiples of 8 from the slot's start, so a
// FlatBuffer copied into a pack keeps the alignment it had in its slot.
inline constexpr uint32_t kPackAlign = 8;
constexpr uint32_t pack_padded(uint32_t n) { return (n + kPackAlign - 1) & ~(kPackAlign - 1); }

// Who sent the pack: a client packs requests, a server replies and errors.
enum class PackSender : uint8_t { kClient, kServer };

// One message inside a received pack: its header and where it starts in
// the carrier slot.
struct PackedEntry {
  uint32_t offset = 0;
  Header header;
};

// Sized once per session (no allocation per pack).
class PackParser {
 public:
  explicit PackParser(uint32_t slot_count) : entries_(slot_count), seen_(slot_count, 0) {}

  // Checks the PACK `pack` (already through validate_header, so its
  // payload fits the bytes received) at the start of `slot_bytes`: a
  // count of 2 .. slot_count messages, each a well-formed header of a kind
  // `sender` may pack, with a payload inside the pack, at 8-byte aligned
  // offsets, the last ending where the pack ends; slots below `slot_count`
  // and distinct; the first for the pack's own slot and generation.
  // Returns "" and fills entries() on success, else what is wrong.
  std::string_view parse(const std::byte* slot_bytes, const Header& pack, uint32_t slot_count,
                         uint32_t slot_size, PackSender sender);
  std::span<const PackedEntry> entries() const { return {entries_.data(), count_}; }

 private:
  std::vector<PackedEntry> entries_;
  std::vector<uint8_t> seen_;
  size_t count_ = 0;
};

// Copies each parsed message to the start of the slot it names in the
// receive ring (`ring`, slot i at ring + i * slot_size); the first moves to
// the start of the carrier slot.  Afterwards every message sits where an
// unpacked one would.
void scatter_pack(std::byte* ring, uint32_t slot_size, std::span<const PackedEntry> entries);

// A session's receiving end, shared by both kinds of session: parse(),
// then the session checks each of entries() against its own slot state,
// then deliver() (ClientSession::on_pack, ServerSession::on_pack).
class PackReceiver {
 public:
  explicit PackReceiver(uint32_t slot_count) : parser_(slot_count) { delivering_.reserve(slot_count); }

  std::string_view parse(const std::byte* slot_bytes, const Header& pack, uint32_t slot_count,
                         uint32_t slot_size, PackSender sender) {
    return parser_.parse(slot_bytes, pack, slot_count, slot_size, sender);
  }
  std::span<const PackedEntry> entries() const { return parser_.entries(); }

  // The whole receive of the PACK `c` (header `h`) that arrived in its slot
  // of `ring`: the immediate and the header agree on the generation, the
  // pack parses, and `accept(entry)` (the session's own rule: is that slot
  // waiting for this message?) returns an empty string for every entry;
  // only then deliver() below.  Returns the reason of the first refusal,
  // for the session's protocol error, with nothing copied or delivered.
  template <class Accept, class Alive, class DeliverOne>
  std::string receive(std::byte* ring, uint32_t slot_count, uint32_t slot_size, transport::Link& link,
                      const transport::Completion& c, const Header& h, PackSender sender, Accept accept,
                      Alive alive, DeliverOne deliver_one) {
    if (imm_generation(c.imm) != static_cast<uint16_t>(h.generation))
      return fmt::format("PACK in slot {}: immediate and header disagree on the generation", c.slot);
    const std::string_view bad = parse(ring + size_t{c.slot} * slot_size, h, slot_count, slot_size, sender);
    if (!bad.empty()) return fmt::format("malformed PACK in slot {}: {}", c.slot, bad);
    for (const PackedEntry& e : entries()) {
      std::string refused = accept(e);
      if (!refused.empty()) return refused;
    }
    deliver(ring, slot_size, link, c, alive, deliver_one);
    return {};
  }

  // Copies each message of the pack `c` delivered into its own slot of
  // `ring`, claims those slots on `link` as the peer's writes (the pack's
  // own was claimed by its arrival), then hands each to `deliver_one` as
  // a kMessage completion of its own, in order, while `alive()`.
  template <class Alive, class DeliverOne>
  void deliver(std::byte* ring, uint32_t slot_size, transport::Link& link,
               const transport::Completion& c, Alive alive, DeliverOne deliver_one) {
    ++received_;
    // A copy: delivering may run handlers, which must not find the
    // parser's entries changed under this loop.  Capacity reserved.
    delivering_.assign(parser_.entries().begin(), parser_.entries().end());
    scatter_pack(ring, slot_size, delivering_);
    for (const PackedEntry& e : delivering_)
      if (e.header.slot != c.slot) link.claim_armed(e.header.slot);
    for (const PackedEntry& e : delivering_) {
      if (!alive()) return;
      transport::Completion inner = c;
      inner.slot = e.header.slot;
      inner.length = kHeaderSize + e.header.payload_len;
      inner.imm = make_imm(e.header.slot, e.header.generation);
      deliver_one(inner);
    }
  }
  uint64_t received() const { return received_; }

 private:
  PackParser parser_;
  std::vector<PackedEntry> delivering_;
  uint64_t received_ = 0;
};

// Sender side, used by the Outbox: writes a PACK of `messages` (each a
// complete message of at most max_message bytes, in order) into the send
// slot `carrier` of `ring`, the slot the first message was built in.  The
// pack goes where that slot has room: before the first message, or after
// it.  Returns where the pack starts and its length, or {nullptr, 0} when
// it does not fit (then the messages go out one by one).
struct PackOut {
  const std::byte* data = nullptr;
  uint32_t length = 0;
};
struct PackPiece {
  const std::byte* data;
  uint32_t length;
};
PackOut write_pack(std::byte* ring, uint32_t slot_size, uint16_t carrier,
                   std::span<const PackPiece> messages);

// Largest pack the sender builds in a slot of `slot_size` whose own message
// is at most `max_message` bytes: one of the two free ends of the slot is
// always at least that large.
constexpr uint32_t pack_capacity(uint32_t slot_size, uint32_t max_message) {
  if (slot_size < max_message + 2 * kPackAlign) return 0;
  return ((slot_size - max_message - kPackAlign) / 2) & ~(kPackAlign - 1);
}

}  // namespace slotrpc::core
