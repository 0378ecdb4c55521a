// Unit: packing small messages (lib/core/pack.h, the Outbox's pack_runs).
//
// The sender side is driven through a real Outbox posting to a link that
// records what it was given; the receiver side through PackParser and
// scatter_pack on byte images built by hand, so each refusal the protocol
// promises (docs/protocol.md, "PACK") is checked on its own.
#include <doctest/doctest.h>

#include <cstring>
#include <vector>

#include "core/outbox.h"
#include "core/pack.h"
#include "core/wire_format.h"
#include "transport/transport.h"

namespace {

using namespace slotrpc::core;
namespace transport = slotrpc::transport;

constexpr uint32_t kSlots = 8;
constexpr uint32_t kSlotSize = 4096;

// Keeps copies of every batch post() got (the Outgoing pointers stay valid
// in the test's ring).
class RecordingLink final : public transport::Link {
 public:
  slotrpc::Result<transport::MemoryRegion> register_memory(std::span<std::byte> memory,
                                                          transport::Access) override {
    return transport::MemoryRegion{memory.data(), memory.size()};
  }
  void deregister(transport::MemoryRegion&) override {}
  slotrpc::Status attach(const transport::MemoryRegion&, const transport::MemoryRegion&, uint32_t,
                         uint32_t, void*) override {
    return {};
  }
  void post(std::span<const transport::Outgoing> batch) override {
    posts.emplace_back(batch.begin(), batch.end());
  }
  void close(std::string) override {}
  std::string describe() const override { return "recording"; }

  std::vector<std::vector<transport::Outgoing>> posts;
};

struct Ring {
  std::vector<std::byte> bytes = std::vector<std::byte>(size_t{kSlots} * kSlotSize);
  std::byte* slot(uint16_t i) { return bytes.data() + size_t{i} * kSlotSize; }

  // A request built as the client builds one: the FlatBuffer ends at the
  // slot's end, the header just in front of it.
  std::byte* request(uint16_t slot, uint32_t generation, uint32_t payload_len, uint8_t fill) {
    Header h;
    h.flags = static_cast<uint8_t>(Kind::kRequest);
    h.method_id = 0x1234;
    h.request_id = 1000 + slot;
    h.payload_len = payload_len;
    h.slot = slot;
    h.generation = generation;
    h.timeout_us = 500 * slot;
    std::byte* msg = this->slot(slot) + kSlotSize - kHeaderSize - payload_len;
    encode_header(h, msg);
    std::memset(msg + kHeaderSize, fill, payload_len);
    return msg;
  }
  // An error reply as the server writes one: at the start of its slot.
  std::byte* error(uint16_t slot, uint32_t generation, const char* text) {
    Header h;
    h.flags = static_cast<uint8_t>(Kind::kError);
    h.request_id = 2000 + slot;
    h.payload_len = static_cast<uint32_t>(std::strlen(text));
    h.slot = slot;
    h.generation = generation;
    h.status = 3;
    std::byte* msg = this->slot(slot);
    encode_header(h, msg);
    std::memcpy(msg + kHeaderSize, text, h.payload_len);
    return msg;
  }
};

uint32_t length_of(const std::byte* msg) { return kHeaderSize + decode_header(msg).payload_len; }

// The receiver's view: `pack` copied to the start of its slot in a ring
// of the peer, parsed and scattered.  Returns the parse error ("" = ok).
std::string_view receive(const transport::Outgoing& pack, Ring& peer, PackSender sender,
                         std::vector<PackedEntry>* entries = nullptr) {
  const uint16_t carrier = imm_slot(pack.imm);
  std::memcpy(peer.slot(carrier), pack.data, pack.length);
  const Header h = decode_header(peer.slot(carrier));
  REQUIRE(validate_header(h, pack.length, kSlots, kSlotSize, carrier) == HeaderError::kOk);
  REQUIRE(h.kind() == Kind::kPack);
  PackParser parser(kSlots);
  const std::string_view error = parser.parse(peer.slot(carrier), h, kSlots, kSlotSize, sender);
  if (error.empty()) {
    std::vector<PackedEntry> e(parser.entries().begin(), parser.entries().end());
    scatter_pack(peer.bytes.data(), kSlotSize, e);
    if (entries != nullptr) *entries = e;
  }
  return error;
}

}  // namespace

TEST_CASE("outbox: consecutive small messages go out as one PACK, the rest as before") {
  Ring ring;
  RecordingLink link;
  Outbox box(kSlots);
  box.enable_packing(ring.bytes.data(), kSlotSize, 256);
  REQUIRE(box.packing());

  const std::byte* m1 = ring.request(1, 11, 40, 0xa1);
  const std::byte* m2 = ring.request(2, 12, 13, 0xa2);  // not a multiple of 8: padding follows
  const std::byte* m3 = ring.request(3, 13, 64, 0xa3);
  const std::byte* big = ring.request(4, 14, 600, 0xa4);  // over pack_small
  const std::byte* m5 = ring.request(5, 15, 8, 0xa5);
  const std::byte* m6 = ring.request(6, 16, 8, 0xa6);
  const std::byte* lone = ring.request(7, 17, 8, 0xa7);
  box.add_slot_message(m1, length_of(m1), 1, 11, true);
  box.add_slot_message(m2, length_of(m2), 2, 12, true);
  box.add_slot_message(m3, length_of(m3), 3, 13, true);
  box.add_control(control_header(Kind::kCancel, 0, 9, 99));  // breaks the run
  box.add_slot_message(big, length_of(big), 4, 14, true);
  box.add_slot_message(m5, length_of(m5), 5, 15, true);
  box.add_slot_message(m6, length_of(m6), 6, 16, true);
  box.add_slot_message(lone, length_of(lone), 7, 17, false);  // the session said no

  CHECK(box.post_to(link) == 8);  // messages, not sends
  REQUIRE(link.posts.size() == 1);
  const auto& sent = link.posts[0];
  // PACK(1,2,3), CANCEL, big, PACK(5,6), lone: order kept, runs packed.
  REQUIRE(sent.size() == 5);
  CHECK(sent[0].messages == 3);
  CHECK(imm_slot(sent[0].imm) == 1);
  CHECK(imm_generation(sent[0].imm) == 11);
  CHECK(sent[1].delivery == transport::Delivery::kControl);
  CHECK(sent[2].data == big);
  CHECK(sent[2].messages == 1);
  CHECK(sent[3].messages == 2);
  CHECK(imm_slot(sent[3].imm) == 5);
  CHECK(sent[4].data == lone);
  CHECK(box.packs_sent() == 2);
  CHECK(box.packed_messages() == 5);

  // The peer gets every message back, byte for byte, in its own slot.
  Ring peer;
  std::vector<PackedEntry> entries;
  REQUIRE(receive(sent[0], peer, PackSender::kClient, &entries) == "");
  REQUIRE(entries.size() == 3);
  const std::byte* originals[] = {m1, m2, m3};
  for (uint16_t i = 0; i < 3; ++i) {
    CAPTURE(i);
    CHECK(entries[i].header.slot == i + 1);
    CHECK(entries[i].header.request_id == 1001u + i);
    CHECK(entries[i].header.timeout_us == 500u * (i + 1));
    CHECK(std::memcmp(peer.slot(i + 1), originals[i], length_of(originals[i])) == 0);
  }
  REQUIRE(receive(sent[3], peer, PackSender::kClient, &entries) == "");
  CHECK(std::memcmp(peer.slot(5), m5, length_of(m5)) == 0);
  CHECK(std::memcmp(peer.slot(6), m6, length_of(m6)) == 0);
}

TEST_CASE("outbox: without enable_packing, or for a lone message, nothing is packed") {
  Ring ring;
  RecordingLink link;
  SUBCASE("packing off") {
    Outbox box(kSlots);
    const std::byte* a = ring.request(1, 1, 8, 1);
    const std::byte* b = ring.request(2, 1, 8, 2);
    box.add_slot_message(a, length_of(a), 1, 1, true);
    box.add_slot_message(b, length_of(b), 2, 1, true);
    box.post_to(link);
    REQUIRE(link.posts.size() == 1);
    CHECK(link.posts[0].size() == 2);
    CHECK(box.packs_sent() == 0);
  }
  SUBCASE("one message alone keeps today's path") {
    Outbox box(kSlots);
    box.enable_packing(ring.bytes.data(), kSlotSize, 512);
    const std::byte* a = ring.request(1, 1, 8, 1);
    box.add_slot_message(a, length_of(a), 1, 1, true);
    box.post_to(link);
    REQUIRE(link.posts[0].size() == 1);
    CHECK(link.posts[0][0].data == a);
  }
  SUBCASE("slots too small to hold a pack turn packing off") {
    Outbox box(kSlots);
    box.enable_packing(ring.bytes.data(), 256, 512);
    CHECK_FALSE(box.packing());
  }
}

TEST_CASE("write_pack: the pack goes in front of a FlatBuffer, behind an error text") {
  Ring ring;
  SUBCASE("replies built at the slot's end") {
    const std::byte* a = ring.request(2, 5, 100, 1);
    const std::byte* b = ring.request(3, 6, 10, 2);
    const PackPiece pieces[] = {{a, length_of(a)}, {b, length_of(b)}};
    const PackOut out = write_pack(ring.bytes.data(), kSlotSize, 2, pieces);
    REQUIRE(out.data != nullptr);
    CHECK(out.data == ring.slot(2));
    CHECK(out.length == kHeaderSize + pack_padded(length_of(a)) + length_of(b));
  }
  SUBCASE("an error written at the slot's start") {
    const std::byte* a = ring.error(2, 5, "no such method, and a long explanation");
    const std::byte* b = ring.error(3, 6, "x");
    const PackPiece pieces[] = {{a, length_of(a)}, {b, length_of(b)}};
    const PackOut out = write_pack(ring.bytes.data(), kSlotSize, 2, pieces);
    REQUIRE(out.data != nullptr);
    CHECK(out.data == ring.slot(2) + pack_padded(length_of(a)));
    // And the copy of the first message inside the pack is intact.
    Ring peer;
    std::vector<PackedEntry> entries;
    transport::Outgoing o{out.data, out.length, make_imm(2, 5)};
    REQUIRE(receive(o, peer, PackSender::kServer, &entries) == "");
    CHECK(std::memcmp(peer.slot(2), a, length_of(a)) == 0);
    CHECK(std::memcmp(peer.slot(3), b, length_of(b)) == 0);
  }
}

TEST_CASE("PackParser: every malformed pack is refused before anything is copied") {
  // A good pack of two requests (slots 1 and 2) to start from.
  Ring ring;
  const std::byte* a = ring.request(1, 7, 16, 1);
  const std::byte* b = ring.request(2, 8, 24, 2);
  const PackPiece pieces[] = {{a, length_of(a)}, {b, length_of(b)}};
  const PackOut out = write_pack(ring.bytes.data(), kSlotSize, 1, pieces);
  REQUIRE(out.data != nullptr);
  std::vector<std::byte> good(out.data, out.data + out.length);
  const uint32_t second = kHeaderSize + pack_padded(length_of(a));  // offset of message 2

  auto parse = [](std::vector<std::byte> bytes, PackSender sender = PackSender::kClient) {
    const Header h = decode_header(bytes.data());
    bytes.resize(kSlotSize);
    PackParser parser(kSlots);
    const std::string error(parser.parse(bytes.data(), h, kSlots, kSlotSize, sender));
    if (!error.empty()) CHECK(parser.entries().empty());
    return error;
  };
  auto edit_inner = [&](uint32_t offset, auto change) {
    std::vector<std::byte> bytes = good;
    Header h = decode_header(bytes.data() + offset);
    change(h);
    encode_header(h, bytes.data() + offset);
    return bytes;
  };
  auto edit_pack = [&](auto change) { return edit_inner(0, change); };

  CHECK(parse(good) == "");
  CHECK(parse(good, PackSender::kServer).find("kind") != std::string::npos);  // requests from a server
  CHECK(parse(edit_pack([](Header& h) { h.method_id = 1; })).find("at least two") != std::string::npos);
  CHECK(parse(edit_pack([](Header& h) { h.method_id = kSlots + 1; })).find("more messages") !=
        std::string::npos);
  CHECK(parse(edit_pack([](Header& h) { h.method_id = 3; })).find("past the end") != std::string::npos);
  CHECK(parse(edit_inner(second, [](Header& h) { h.payload_len += 1; })).find("past the end") !=
        std::string::npos);
  CHECK(parse(edit_inner(second, [](Header& h) { h.payload_len -= 1; })).find("after its last") !=
        std::string::npos);
  CHECK(parse(edit_inner(second, [](Header& h) { h.magic = 0; })).find("malformed") != std::string::npos);
  CHECK(parse(edit_inner(second, [](Header& h) { h.slot = kSlots; })).find("malformed") !=
        std::string::npos);
  CHECK(parse(edit_inner(second, [](Header& h) { h.slot = 1; })).find("same slot") != std::string::npos);
  CHECK(parse(edit_inner(second, [](Header& h) { h.flags = static_cast<uint8_t>(Kind::kPack); }))
            .find("kind") != std::string::npos);
  CHECK(parse(edit_inner(second, [](Header& h) { h.flags = static_cast<uint8_t>(Kind::kCancel); }))
            .find("kind") != std::string::npos);
  CHECK(parse(edit_inner(kHeaderSize, [](Header& h) { h.slot = 3; })).find("own slot") !=
        std::string::npos);
  CHECK(parse(edit_inner(kHeaderSize, [](Header& h) { h.generation = 99; })).find("own slot") !=
        std::string::npos);
}
