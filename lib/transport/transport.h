// The transport interface: everything the protocol core needs from a
// network, and nothing more.
//
//   Transport  one per reactor and kind: polls a batch of completions,
//              exposes one fd to sleep on.
//   Link       one per session: registers the session's memory, posts a
//              batch of messages to the peer.
//
// Registration belongs to the Link, not the Transport, because on verbs
// what the peer may write is bound to the session's own queue pair (a
// type-2 memory window, or a protection domain of its own): a queue pair can
// only reach its own session's ring, never another session's (see
// docs/design.md, "Receive queues and ring protection").
//
// A message is placed by the transport into a *slot* of the receiver's
// registered ring (RDMA WRITE_WITH_IMM into the slot; TCP copies the frame
// body into it) or, for header-only control messages, handed over inside the
// Completion.  The core never learns which transport it runs on.
//
// Hot path: post() and poll() are the only virtual calls, once per batch,
// never per message.  Neither allocates in steady state.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/wire_format.h"
#include "slotrpc/result.h"
#include "slotrpc/status.h"

namespace slotrpc::transport {

// Memory the transport may read (send rings) or write (receive rings).  For
// TCP the keys are 0; for verbs `lkey` is the MR's and `rkey` is what the
// peer gets: the memory window's, or the MR's in a per-session PD.
struct MemoryRegion {
  std::byte* base = nullptr;
  size_t length = 0;
  uint32_t lkey = 0;
  uint32_t rkey = 0;
  void* handle = nullptr;  // transport-private (struct ibv_mr* for verbs)
};

enum class Access : uint8_t {
  kLocalSend,     // read by the local NIC / socket only
  kRemoteWrite,   // written by the session's peer
};

enum class Lane : uint8_t {
  kSlot,     // bytes go into slot imm_slot(imm) of the peer's receive ring
  kControl,  // exactly one 32-byte header, delivered inside the Completion
};

struct Outgoing {
  // kSlot: header + payload, inside a registered send ring, untouched by the
  // caller until the peer has answered on that slot (the credit protocol
  // guarantees this, so transports need not copy).
  // kControl: 32 bytes that post() copies before it returns.
  const std::byte* data = nullptr;
  uint32_t length = 0;
  uint32_t imm = 0;  // core::make_imm(slot, generation)
  Lane lane = Lane::kSlot;
};

struct Completion {
  enum class Kind : uint8_t {
    kMessage,   // `length` bytes now sit at the start of slot `slot`
    kControl,   // `control` holds a 32-byte header
    kLinkDown,  // the link failed or the peer closed; `link->down_reason()`
  };
  Kind kind = Kind::kMessage;
  uint16_t slot = 0;
  uint32_t length = 0;
  uint32_t imm = 0;
  void* context = nullptr;  // what the session gave Link::attach
  class Link* link = nullptr;
  std::array<std::byte, core::kHeaderSize> control{};
};

// Per-link counters for tests and monitoring; transports fill what applies
// (TCP leaves the verbs-only ones at 0).
struct LinkStats {
  uint64_t slot_sends = 0;      // slot-lane messages handed to the network
  uint64_t control_sends = 0;   // control-lane messages
  uint64_t inline_sends = 0;    // verbs: posted with IBV_SEND_INLINE (header + payload <= max inline)
  uint64_t noninline_sends = 0; // verbs: read by the NIC from the registered send slot
  uint64_t doorbells = 0;       // verbs: ibv_post_send calls (one per post() that had room)
  uint64_t signaled = 0;        // verbs: sends posted with IBV_SEND_SIGNALED
  uint64_t backlogged = 0;      // verbs: messages that waited for send-queue room
  uint32_t max_inline = 0;      // verbs: the queue pair's real max_inline_data
  bool shared_receive_queue = false;  // verbs: receives come from the loop's SRQ
  bool memory_window = false;         // verbs: the peer writes through a type-2 window
};

class Link {
 public:
  virtual ~Link() = default;

  // Registration happens at session setup, never per call.  kRemoteWrite
  // memory may be written by this link's peer only; kLocalSend memory is
  // read by the local side only.  Regions must be deregistered (through the
  // same link) before the link is destroyed.
  virtual Result<MemoryRegion> register_memory(std::span<std::byte> memory, Access access) = 0;
  virtual void deregister(MemoryRegion& region) = 0;

  // Binds the link to its session: incoming slot messages land in
  // `receive_ring` (slot i at base + i * slot_size); outgoing slot messages
  // are read from `send_ring`; completions carry `context`.  Called once, on
  // the reactor thread, before any post().
  virtual Status attach(const MemoryRegion& receive_ring, const MemoryRegion& send_ring,
                        uint32_t slot_count, uint32_t slot_size, void* context) = 0;

  // Sends the batch in order: one writev / one doorbell.  Never blocks; a
  // transport that cannot send everything now keeps the rest and finishes
  // on later polls.  A failure shows up as a kLinkDown completion.
  virtual void post(std::span<const Outgoing> batch) = 0;

  // Allows the peer to write slot `slot` once.  TCP enforces it before a
  // byte is written (a frame into a slot not armed closes the link, so a
  // misbehaving peer cannot overwrite a request a handler is reading in
  // place).  On verbs the bytes have landed by the time the completion is
  // seen: there the region is writable by this link's peer only (a window
  // bound to its queue pair, or its own protection domain), and a write
  // into an unarmed slot fails the link
  // before the core sees it.
  void arm(uint16_t slot) {
    if (slot < armed_.size()) armed_[slot] = true;
  }

  // Memory the peer reads in place (slot i at data() + i * slot_size), or
  // empty.  Only the shared-memory transport has it: a session that builds
  // its send slots there (instead of in its own SlotRing) sends with no
  // copy at all; one that does not is still correct, post() then copies
  // each slot message once.  Valid after attach().  TCP and verbs keep the
  // default: the NIC or the socket reads any registered memory.
  virtual std::span<std::byte> send_slots() { return {}; }

  // Shuts the link down; a kLinkDown completion follows.  Idempotent.
  virtual void close(std::string reason) = 0;

  // "tcp 127.0.0.1:40000 -> 127.0.0.1:5000"
  virtual std::string describe() const = 0;
  // Not on the hot path (a snapshot for tests and monitoring).
  virtual LinkStats stats() const { return {}; }
  const std::string& down_reason() const { return down_reason_; }

 protected:
  // True when slot was armed; disarms it.
  bool take_armed(uint16_t slot) {
    if (slot >= armed_.size() || !armed_[slot]) return false;
    armed_[slot] = false;
    return true;
  }
  void size_arming(uint32_t slot_count) { armed_.assign(slot_count, false); }

  std::string down_reason_;

 private:
  std::vector<bool> armed_;
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual std::string_view name() const = 0;  // "tcp", "verbs", "shm"

  // Fills up to out.size() completions, returns how many.  Never blocks.
  virtual size_t poll(std::span<Completion> out) = 0;

  // An fd that becomes readable when poll() may have work.  The reactor
  // sleeps on it (epoll) in blocking mode; prepare_sleep() is called first
  // and returns false if work is already pending (no sleep then).
  virtual int wait_fd() const = 0;
  virtual bool prepare_sleep() { return true; }
};

}  // namespace slotrpc::transport
