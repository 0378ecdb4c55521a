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
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <unistd.h>

#include "transport/frame.h"
#include "slotrpc/config.h"
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

// How a message reaches the peer.
enum class Delivery : uint8_t {
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
  uint32_t imm = 0;  // transport::make_imm(slot, generation)
  Delivery delivery = Delivery::kSlot;
  // Messages this one carries: 1, or a PACK's count (lib/core/pack.h).
  // Transports only add it to LinkStats::messages.
  uint16_t messages = 1;
};

struct Completion {
  enum class Kind : uint8_t {
    kMessage,   // `length` bytes now sit at the start of slot `slot`
    kControl,   // `control` holds a 32-byte header
    kLinkDown,  // the link failed or the peer closed; `link->down_reason()`
    kBulkDone,  // a bulk read, write or revoke `bulk_token` finished with `bulk_status`
  };
  Kind kind = Kind::kMessage;
  uint16_t slot = 0;
  uint32_t length = 0;
  uint32_t imm = 0;
  void* context = nullptr;  // what the session gave Link::attach
  class Link* link = nullptr;
  std::array<std::byte, transport::kHeaderSize> control{};
  // kBulkDone: the token the core passed to read(), write() or revoke(),
  // and how it went (a StatusCode; kOk = every byte moved / the range is
  // unreachable).
  uint64_t bulk_token = 0;
  uint16_t bulk_status = 0;
};

// ---- Bulk transfers (docs/design.md, "Bulk payloads") ----------
//
// Payloads larger than a slot stay in user memory: the slot carries only
// descriptors (RemoteSegment), and the bytes move once, peer to peer.  On
// verbs by RDMA READ / RDMA WRITE through a type-2 memory window that
// exposes exactly one call's range to one session's queue pair; on TCP the
// same one-sided operations are emulated on the session's socket, the
// bytes received straight into the destination (no staging copy); on shm
// they pass through the sender's staging area in its own sealed segment
// (lib/transport/shm/shm_bulk.cc).
//
// Roles: the side that owns the data *exposes* a range to its peer for the
// duration of one call and *revokes* it when the call ends; the peer
// *reads* from or *writes* into the exposed range.  In slotrpc the client
// exposes (request data the server reads, reply destinations the server
// writes) and the server reads and writes, so a server never exposes its
// memory to a client.
//
// None of this is on the small-call hot path: slot messages never touch it.

// Where bulk memory comes from: host memory, or device memory exported as
// a dma-buf (CUDA: cuMemGetHandleForAddressRange(..., DMA_BUF_FD); ROCm:
// hsa_amd_portable_export_dmabuf), registered with ibv_reg_dmabuf_mr.
struct BulkSource {
  std::byte* address = nullptr;  // host pointer, or the device address the dma-buf covers
  size_t length = 0;
  int dmabuf_fd = -1;            // >= 0: register through this dma-buf
  uint64_t dmabuf_offset = 0;    // of `address` inside the dma-buf
};

// A BulkSource registered in one link's bulk domain (verbs: its protection
// domain).  Valid for every link of the same domain until deregistered.
struct BulkRegistration {
  std::byte* base = nullptr;
  size_t length = 0;
  uint32_t lkey = 0;
  void* handle = nullptr;  // transport-private (struct ibv_mr* for verbs)
  const void* domain = nullptr;  // Link::bulk_domain() of the registering link
};

enum class BulkAccess : uint8_t {
  kRemoteRead = 1,   // the peer may read the range (request data)
  kRemoteWrite = 2,  // the peer may write the range (reply destination)
};

// What the peer is given for an exposed range, inside a slot message: it
// may address [addr, addr + length) with `rkey`, and nothing else.  On
// verbs addr is the virtual address and rkey the memory window's; on TCP
// both are opaque values the exposing link checks every access against.
struct RemoteSegment {
  uint64_t addr = 0;
  uint64_t length = 0;
  uint32_t rkey = 0;
};


// Per-link counters for tests and monitoring; transports fill what applies
// (TCP leaves the verbs-only ones at 0).
struct LinkStats {
  // slot_sends + control_sends are the link's work requests (verbs) or
  // frames (TCP, shm); `messages` what they carried, so messages per work
  // request = messages / (slot_sends + control_sends).
  uint64_t slot_sends = 0;      // slot-lane messages handed to the network (a PACK counts once)
  uint64_t control_sends = 0;   // control-lane messages
  uint64_t messages = 0;        // protocol messages in them (a PACK counts what it carries)
  uint64_t packs = 0;           // slot sends that were PACKs
  uint64_t packets = 0;         // verbs: request packets those sends took (ceil(length / path MTU)
                                // each; acknowledgements not counted)
  uint64_t bulk_requests = 0;   // bulk transfers this side started, in units of what it posts:
                                // verbs, RDMA READ / WRITE work requests (one per chunk); tcp,
                                // READ_REQ frames and WRITE_DATA frames (one per slice); shm,
                                // READ_REQ descriptors and WRITE_DATA chunks (one per 16 KiB)
  uint64_t bulk_pushes = 0;     // tcp: ranges this side sent unasked behind their request (PUSH_DATA)
  uint64_t bulk_pushes_dropped = 0;  // tcp: pushes received that no read claimed in time (read and
                                     // thrown away; the read then asked with a READ_REQ)
  uint64_t inline_sends = 0;    // verbs: posted with IBV_SEND_INLINE (header + payload <= max inline)
  uint64_t noninline_sends = 0; // verbs: read by the NIC from the registered send slot
  uint64_t doorbells = 0;       // verbs: ibv_post_send calls (one per post() that had room);
                                // tcp: sendmsg calls that wrote frames
  uint64_t signaled = 0;        // verbs: sends posted with IBV_SEND_SIGNALED
  uint64_t backlogged = 0;      // verbs: messages that waited for send-queue room
  uint32_t max_inline = 0;      // verbs: the queue pair's real max_inline_data
  bool shared_receive_queue = false;  // verbs: receives come from the loop's SRQ
  bool memory_window = false;         // verbs: the peer writes through a type-2 window
  // The link's attached connection (Link::attachment_threshold below; tcp:
  // its bulk lane): whether it has one now, and the bytes sent and
  // received on it.
  bool attached = false;
  uint64_t attached_bytes_sent = 0;
  uint64_t attached_bytes_received = 0;
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
  // For a PACK's inner messages (lib/core/pack.h), which the core copies
  // from the pack's slot into their own: armed() says whether the peer may
  // write `slot` now, and claim_armed() disarms it as the arrival of a
  // message of its own would have, so the peer may not write it again
  // until it is armed again.
  bool armed(uint16_t slot) const { return slot < armed_.size() && armed_[slot]; }
  bool claim_armed(uint16_t slot) { return take_armed(slot); }

  // True while a slot message posted from send slot `slot` has not wholly
  // left (TCP: not yet all in the kernel).  The peer cannot have read it,
  // so a peer that hands the slot back meanwhile (a STREAM_GRANT, a
  // STREAM_ACK) breaks the protocol, and the session must not build the
  // next message there.  Transports that do not track it say false.
  bool sending(uint16_t slot) const { return slot < sending_.size() && sending_[slot] != 0; }

  // Memory the peer reads in place (slot i at data() + i * slot_size), or
  // empty.  Only the shared-memory transport has it: a session that builds
  // its send slots there (instead of in its own SlotRing) sends with no
  // copy at all; one that does not is still correct, post() then copies
  // each slot message once.  Valid after attach().  TCP and verbs keep the
  // default: the NIC or the socket reads any registered memory.
  virtual std::span<std::byte> send_slots() { return {}; }

  // False while this side has stopped reading from the peer on purpose: a
  // TCP link whose output for a peer that reads none of it is over its
  // budget (tcp_transport.h).  The session's liveness timer asks (not the
  // hot path): silence it caused itself is not the peer's, and a link that
  // pauses reading must run a clock of its own that closes a peer which
  // stays that way (TCP: the drain clock, peer_timeout_ms).
  virtual bool listening() const { return true; }

  // ---- Bulk transfers (see "Bulk transfers" above).  Not hot path. ----
  //
  // Defaults: a transport without bulk support refuses every call with
  // UNIMPLEMENTED, and the core turns that into a clear call status.
  virtual bool supports_bulk() const { return false; }

  // Links whose bulk registrations are interchangeable return the same
  // non-null value (verbs: the protection domain; TCP: the transport).
  // The core's registration cache is keyed by (domain, address range).
  virtual const void* bulk_domain() const { return nullptr; }

  // Registers memory for bulk transfers (pins it on verbs).  Any thread;
  // may take milliseconds for large ranges, so the core caches it.
  virtual Result<BulkRegistration> register_bulk(const BulkSource& source);
  virtual void deregister_bulk(BulkRegistration& registration);

  // Lets this link's peer (and no one else) access `length` bytes at
  // `offset` of `registration`, with `access`, until revoke().  On verbs a
  // type-2 window is bound to this link's queue pair; the bind is ordered
  // before any message posted afterwards, so the returned segment may go
  // out in the next slot message at once.
  virtual Result<RemoteSegment> expose(const BulkRegistration& registration, size_t offset,
                                       size_t length, BulkAccess access);

  // Ends an exposure: after the range is unreachable, any access by the
  // peer fails (verbs: remote access error, which also fails the peer's
  // queue pair, so the hostile or buggy session is lost and no other).
  // Returns true when the range is already unreachable; false when a
  // kBulkDone completion with `token` follows once it is (verbs: after the
  // window's invalidation completed).  The core finishes the call only
  // then, so memory the user gets back is never still reachable.
  virtual bool revoke(const RemoteSegment& segment, uint64_t token);

  // One-sided transfers against a segment the peer exposed: read copies
  // remote [remote_offset, remote_offset + length) into local memory at
  // `local_offset` of `local`; write copies the other way.  One kBulkDone
  // completion with `token` follows when every byte has moved (write: the
  // source may be reused) or the transfer failed.  Large transfers are
  // chunked and interleaved by the link so that slot messages posted
  // meanwhile are not stuck behind them.  Ordering: a slot or control
  // message posted after write()'s kBulkDone reaches the peer after the
  // written bytes (the core sends a reply only then, so a reply never
  // overtakes its data); one posted earlier may pass between chunks (TCP
  // does so; verbs keeps them behind the write).  Bounds against `remote.length`
  // and `local.length` are the caller's to check first; a transfer the
  // peer refuses fails with a non-OK status (and, on verbs, the link).
  virtual Status read(const BulkRegistration& local, size_t local_offset,
                      const RemoteSegment& remote, uint64_t remote_offset, size_t length,
                      uint64_t token);
  virtual Status write(const BulkRegistration& local, size_t local_offset,
                       const RemoteSegment& remote, uint64_t remote_offset, size_t length,
                       uint64_t token);

  // ---- Attached connections.  Not hot path. ----
  //
  // A transport may move part of a session's traffic over a second
  // connection to the same peer, attached to the session's link (TCP: its
  // bulk lane, tcp/bulk_lanes.h, which keeps large transfers from
  // delaying small calls).  What that connection is for is the transport's
  // business; the layers above only carry it through the handshake
  // (docs/protocol.md, "Attached connections"):
  //   1. the server's link offers an opaque token (offer_attachment), sent
  //      in the session's HelloReply;
  //   2. when a bulk transfer of at least attachment_threshold() bytes is
  //      about to start, the client connects again to the address it
  //      dialled and presents the token in a Hello of its own kind;
  //   3. the server routes that connection by the token's route (its first
  //      two bytes, the server loop's index) to the loop's transport
  //      (Transport::accept_attachment), which hands it to the link that
  //      offered the token, and the client gives its socket to its own
  //      link (attach_connection).
  // A session without its attached connection works as before: attaching
  // is an optimisation, and every failure leaves the session as it was.

  // The session's own settings (a Channel's or Server's Config, which may
  // differ from those of the loop whose transport made the link).  Called
  // once, before attach().
  virtual void configure(const Config&) {}
  // Client: bulk transfers of at least this many bytes run on an attached
  // connection once there is one; 0: this link wants none.
  virtual uint64_t attachment_threshold() const { return 0; }
  // Client: takes `connection`, a socket whose attach handshake the server
  // accepted, or the reason there is none (the link logs what it means to
  // the session).  Takes the fd even on failure.
  virtual Status attach_connection(Result<int> connection) {
    if (connection.ok()) close_fd(connection.value());
    return Status(StatusCode::kUnimplemented, describe() + " takes no attached connection");
  }
  // Server: a token for the peer to present on a connection to be
  // attached to this link (first two bytes: `route`, little endian), or
  // empty when the link wants none.  Issued once.
  virtual std::vector<std::byte> offer_attachment(uint16_t route) {
    (void)route;
    return {};
  }

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

  static void close_fd(int fd) { ::close(fd); }

  std::string down_reason_;
  // Per send slot: slot messages from it not yet wholly sent (sending()).
  std::vector<uint16_t> sending_;

 private:
  std::vector<bool> armed_;
};

inline Result<BulkRegistration> Link::register_bulk(const BulkSource&) {
  return Status(StatusCode::kUnimplemented, "bulk transfers are not supported on " + describe());
}
inline void Link::deregister_bulk(BulkRegistration& registration) { registration = {}; }
inline Result<RemoteSegment> Link::expose(const BulkRegistration&, size_t, size_t, BulkAccess) {
  return Status(StatusCode::kUnimplemented, "bulk transfers are not supported on " + describe());
}
inline bool Link::revoke(const RemoteSegment&, uint64_t) { return true; }
inline Status Link::read(const BulkRegistration&, size_t, const RemoteSegment&, uint64_t, size_t,
                         uint64_t) {
  return Status(StatusCode::kUnimplemented, "bulk transfers are not supported on " + describe());
}
inline Status Link::write(const BulkRegistration&, size_t, const RemoteSegment&, uint64_t,
                          size_t, uint64_t) {
  return Status(StatusCode::kUnimplemented, "bulk transfers are not supported on " + describe());
}

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

  // Bytes a poll moved without producing a completion (a bulk transfer's
  // data arrives without one until its last byte): a loop counts a poll
  // that moved bytes as work, so it does not go idle in the middle of a
  // transfer.  A running total; transports without such data keep 0.
  virtual uint64_t bytes_moved() const { return 0; }

  // Server, loop thread: `fd` presented `token` in an attach Hello
  // (Link::offer_attachment); it becomes the offering link's attached
  // connection.  Takes the fd; the error, for the client, says why not.
  virtual Status accept_attachment(std::span<const std::byte> token, int fd);
};

// The server loop an attach token names (its first two bytes, little
// endian); nullopt for a token too short to name one.
inline std::optional<uint16_t> attachment_route(std::span<const std::byte> token) {
  if (token.size() < 2) return std::nullopt;
  return static_cast<uint16_t>(std::to_integer<uint16_t>(token[0]) |
                               std::to_integer<uint16_t>(token[1]) << 8);
}

inline Status Transport::accept_attachment(std::span<const std::byte>, int fd) {
  ::close(fd);
  return Status(StatusCode::kUnimplemented,
                std::string(name()) + " sessions take no attached connection");
}

}  // namespace slotrpc::transport
