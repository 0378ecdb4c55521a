// The messages one session produces during a reactor turn, posted to its
// link as one batch at the end of the turn (one writev / one doorbell).
//
// Capacity is fixed at session setup: at most one slot message per slot is
// outstanding, plus control messages (cancels, grants, keepalives), so the
// hot path never allocates.  Control headers live here until posted because
// transports copy them only inside post().
//
// PONGs coalesce: any number of PINGs received between two posts owe the
// peer one PONG, added by post_to().  A PING costs the receiver a flag, not
// a queued frame, so a peer that floods PINGs cannot multiply this side's
// output (docs/protocol.md, "Liveness").
//
// Packing (lib/core/pack.h): with enable_packing(), consecutive small slot
// messages the session marked packable go out as one PACK.  Only what this
// turn produced is grouped; nothing is held back for it.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <vector>

#include "core/pack.h"
#include "core/wire_format.h"
#include "transport/transport.h"

namespace slotrpc::core {

// Control header with the fields every control message sets.
inline Header control_header(Kind kind, uint16_t slot, uint32_t generation, uint64_t request_id,
                             uint32_t aux = 0, uint16_t status = 0) {
  Header h;
  h.status = status;
  h.flags = static_cast<uint8_t>(kind);
  h.slot = slot;
  h.generation = generation;
  h.request_id = request_id;
  h.method_id = aux;
  return h;
}

class Outbox {
 public:
  explicit Outbox(uint32_t slot_count)
      : control_(size_t{slot_count} + 8) {
    messages_.reserve(2 * size_t{slot_count} + 8);
    packable_.reserve(2 * size_t{slot_count} + 8);
    pieces_.reserve(slot_count);
  }

  // Packs from now on: `send_ring` is the session's send ring (slot i at
  // send_ring + i * slot_size, where the messages are built), and messages
  // of at most `max_message` bytes may be packed.  Called once, before the
  // first post, and only when the peer announced the PACK feature.
  void enable_packing(std::byte* send_ring, uint32_t slot_size, uint32_t max_message) {
    max_message = std::min(max_message, slot_size / 4);
    const uint32_t capacity = pack_capacity(slot_size, max_message);
    if (max_message < kHeaderSize || capacity < kHeaderSize + 2 * pack_padded(max_message)) {
      // Slots too small to hold two packable messages and the pack.
      return;
    }
    send_ring_ = send_ring;
    slot_size_ = slot_size;
    pack_max_message_ = max_message;
    pack_capacity_ = capacity;
  }
  bool packing() const { return send_ring_ != nullptr; }

  // Early flush (Config::tcp_flush_every): the session posts as soon as
  // this many messages wait, instead of only at the end of the loop turn,
  // so that the peer starts on them while this side produces the rest of
  // the turn's messages (a turn that answers 32 replies with 32 new
  // requests otherwise leaves the peer idle until the last one is built).
  // 0: end of turn only.  Hot path: one comparison per slot message.
  void set_flush_every(uint32_t n) { flush_every_ = n; }
  bool flush_due() const { return flush_every_ != 0 && messages_.size() >= flush_every_; }

  // `msg` (header + payload) stays in its send slot until the peer answers.
  // `packable`: a request, reply or error the peer may receive inside a
  // PACK (pack.h); whether it is small enough is decided here.
  void add_slot_message(const std::byte* msg, uint32_t length, uint16_t slot, uint32_t generation,
                        bool packable = false) {
    messages_.push_back(
        transport::Outgoing{msg, length, make_imm(slot, generation), transport::Delivery::kSlot});
    packable_.push_back(packable && length <= pack_max_message_);
  }

  // False when every control buffer is in use: post first.
  bool has_control_room() const { return control_used_ < control_.size(); }

  void add_control(const Header& h) {
    std::byte* bytes = control_[control_used_++].data();
    encode_header(h, bytes);
    messages_.push_back(transport::Outgoing{bytes, static_cast<uint32_t>(kHeaderSize),
                                            make_imm(h.slot, h.generation),
                                            transport::Delivery::kControl});
    packable_.push_back(false);
  }

  // Answers a PING: one PONG goes out with the next post, echoing the
  // request_id of the latest PING it answers.
  void owe_pong(uint64_t request_id) {
    pong_owed_ = true;
    pong_request_id_ = request_id;
  }
  bool pong_owed() const { return pong_owed_; }

  // Posts everything as one batch and empties the box; returns how many
  // messages (a PACK counts what it carries).
  size_t post_to(transport::Link& link) {
    if (pong_owed_) {
      pong_owed_ = false;
      const Header h = control_header(Kind::kPong, 0, 0, pong_request_id_);
      encode_header(h, pong_.data());
      messages_.push_back(transport::Outgoing{pong_.data(), static_cast<uint32_t>(kHeaderSize),
                                              make_imm(0, 0), transport::Delivery::kControl});
      packable_.push_back(false);
    }
    const size_t n = messages_.size();
    if (packing() && n > 1) pack_runs();
    if (!messages_.empty()) link.post(messages_);
    clear();
    return n;
  }

  void clear() {
    messages_.clear();
    packable_.clear();
    control_used_ = 0;
    pong_owed_ = false;
  }

  // Whether a slot message built in [slot, slot + size) waits here (not
  // yet posted).  Cold: the sessions ask on a STREAM_GRANT / STREAM_ACK.
  bool holds(const std::byte* slot, size_t size) const {
    for (const transport::Outgoing& o : messages_)
      if (o.delivery == transport::Delivery::kSlot && o.data >= slot && o.data < slot + size) return true;
    return false;
  }

  // Over the session's life: PACKs posted and the messages inside them.
  uint64_t packs_sent() const { return packs_sent_; }
  uint64_t packed_messages() const { return packed_messages_; }

 private:
  // Replaces each run of two or more consecutive packable messages with
  // PACKs of at most pack_capacity_ bytes, in place.  A PACK takes the
  // place of its first message, so no message moves past one that is not
  // in its pack (a CANCEL or a grant keeps its order with the requests).
  void pack_runs() {
    const size_t n = messages_.size();
    size_t w = 0;
    for (size_t r = 0; r < n;) {
      size_t e = r;
      uint32_t bytes = kHeaderSize;
      while (e < n && packable_[e] && bytes + pack_padded(messages_[e].length) <= pack_capacity_) {
        bytes += pack_padded(messages_[e].length);
        ++e;
      }
      if (e - r >= 2) {
        pieces_.clear();
        for (size_t i = r; i < e; ++i) pieces_.push_back(PackPiece{messages_[i].data, messages_[i].length});
        const PackOut out = write_pack(send_ring_, slot_size_, imm_slot(messages_[r].imm), pieces_);
        if (out.data != nullptr) {
          const auto count = static_cast<uint16_t>(e - r);
          messages_[w++] = transport::Outgoing{out.data, out.length, messages_[r].imm,
                                               transport::Delivery::kSlot, count};
          ++packs_sent_;
          packed_messages_ += count;
          r = e;
          continue;
        }
      }
      if (e == r) e = r + 1;  // not packable: goes alone
      for (; r < e; ++r) messages_[w++] = messages_[r];
    }
    messages_.resize(w);
  }

  std::vector<transport::Outgoing> messages_;
  size_t flush_every_ = 0;
  std::vector<uint8_t> packable_;  // parallel to messages_
  std::vector<PackPiece> pieces_;
  std::byte* send_ring_ = nullptr;  // packing off while null
  uint32_t slot_size_ = 0;
  uint32_t pack_max_message_ = 0;
  uint32_t pack_capacity_ = 0;
  uint64_t packs_sent_ = 0;
  uint64_t packed_messages_ = 0;
  std::vector<std::array<std::byte, kHeaderSize>> control_;
  size_t control_used_ = 0;
  std::array<std::byte, kHeaderSize> pong_{};
  bool pong_owed_ = false;
  uint64_t pong_request_id_ = 0;
};


}  // namespace slotrpc::core
