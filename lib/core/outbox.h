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
#pragma once

#include <array>
#include <cstddef>
#include <vector>

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
  }

  // `msg` (header + payload) stays in its send slot until the peer answers.
  void add_slot_message(const std::byte* msg, uint32_t length, uint16_t slot, uint32_t generation) {
    messages_.push_back(
        transport::Outgoing{msg, length, make_imm(slot, generation), transport::Lane::kSlot});
  }

  // False when every control buffer is in use: post first.
  bool has_control_room() const { return control_used_ < control_.size(); }

  void add_control(const Header& h) {
    std::byte* bytes = control_[control_used_++].data();
    encode_header(h, bytes);
    messages_.push_back(transport::Outgoing{bytes, static_cast<uint32_t>(kHeaderSize),
                                            make_imm(h.slot, h.generation),
                                            transport::Lane::kControl});
  }

  // Answers a PING: one PONG goes out with the next post, echoing the
  // request_id of the latest PING it answers.
  void owe_pong(uint64_t request_id) {
    pong_owed_ = true;
    pong_request_id_ = request_id;
  }
  bool pong_owed() const { return pong_owed_; }

  // Posts everything as one batch and empties the box; returns how many.
  size_t post_to(transport::Link& link) {
    if (pong_owed_) {
      pong_owed_ = false;
      const Header h = control_header(Kind::kPong, 0, 0, pong_request_id_);
      encode_header(h, pong_.data());
      messages_.push_back(transport::Outgoing{pong_.data(), static_cast<uint32_t>(kHeaderSize),
                                              make_imm(0, 0), transport::Lane::kControl});
    }
    const size_t n = messages_.size();
    if (n != 0) link.post(messages_);
    clear();
    return n;
  }

  void clear() {
    messages_.clear();
    control_used_ = 0;
    pong_owed_ = false;
  }

 private:
  std::vector<transport::Outgoing> messages_;
  std::vector<std::array<std::byte, kHeaderSize>> control_;
  size_t control_used_ = 0;
  std::array<std::byte, kHeaderSize> pong_{};
  bool pong_owed_ = false;
  uint64_t pong_request_id_ = 0;
};


}  // namespace slotrpc::core
