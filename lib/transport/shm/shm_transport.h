// Shared-memory transport: slot-ring sessions between two processes on one
// host, through the segments of shm_segment.h.
//
// Sending (post): each message becomes one 64-byte Descriptor in our own
// segment's ring, its sequence word stored last; a batch then stores
// `head` once (for a peer about to sleep).  A slot message of up to
// kInlineMax bytes goes inside the descriptor: one cache line per hop.  A
// larger one built in place in our segment's data area is sent with no copy
// at all: the sessions' send rings are a second mapping of it
// (core::SlotRing over Link::send_slots(), recognised in register_memory);
// one built elsewhere is copied into the slot once.  LinkStats counts the
// descriptor-inline ones as inline_sends and the in-place ones as
// noninline_sends (verbs' meanings, "read from the send slot").  ShmLink
// gives send_slots() from its creation, before attach(): the sessions map
// their rings in their constructors.
// If the peer announced it is going to sleep, its eventfd is written.
//
// Receiving (poll): the busy poller reads the sequence word of the peer's
// next descriptor (no separate head word on the hot path); each new
// descriptor is copied out of shared memory before a field is looked at,
// checked against this side's private record of the ring (our consumed
// count, the agreed geometry, the slots we armed), and the message is copied
// into the session's own receive slot (its private memory), where the core
// validates the wire header and the FlatBuffers verifier runs as always.
// Why the payload is copied, not read in place: docs/design.md, "Trust".
// A descriptor that makes no sense closes this link only, with the reason.
//
// Peer death: the Unix socket the segments came over stays open for the
// link's life; its hang-up (the peer exited or was killed) closes the link
// after what the peer had published is delivered.
//
// Wiring: Reactor::shm() is a loop's transport; Channel connects and Server
// listens on a Unix domain socket for it (docs/design.md says how).
//
// Hot path: post() and poll() are one virtual call per batch; per message
// no allocation, no lock, no system call (an eventfd write only for a
// sleeping peer, once per batch).
#pragma once

#include <sys/epoll.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "slotrpc/config.h"
#include "transport/shm/shm_segment.h"
#include "transport/transport.h"

namespace slotrpc::transport::shm {

class ShmTransport;

// Counters beyond LinkStats, for tests and the benchmark.
struct ShmLinkStats {
  uint64_t in_place_sends = 0;  // slot messages built in our segment: no copy
  uint64_t copied_sends = 0;    // slot messages copied into our segment by post()
  uint64_t inline_sends = 0;    // slot messages of <= kInlineMax bytes sent in the descriptor
  uint64_t wakeups_sent = 0;    // eventfd writes for a sleeping peer
  uint64_t backlogged = 0;      // messages that waited for descriptor room
};

// A peer that consumes nothing while we hold a backlog is closed after the
// transport's peer timeout, the rule TCP applies to a peer that reads
// nothing (docs/design.md, "Buffer budgets").  The backlog itself is bounded
// by one more ring's worth of messages: the credit protocol keeps a healthy
// peer within the ring (4 x slots + 64 descriptors), so a backlog beyond
// another ring's worth means the peer is not consuming.

class ShmLink final : public Link {
 public:
  ~ShmLink() override;

  // No registration is needed (no NIC); keys are 0.
  Result<MemoryRegion> register_memory(std::span<std::byte> memory, Access access) override;
  void deregister(MemoryRegion& region) override;
  Status attach(const MemoryRegion& receive_ring, const MemoryRegion& send_ring,
                uint32_t slot_count, uint32_t slot_size, void* context) override;
  void post(std::span<const Outgoing> batch) override;
  void close(std::string reason) override;
  std::string describe() const override { return description_; }
  LinkStats stats() const override { return stats_; }
  std::span<std::byte> send_slots() override;

  // For a link made by ShmTransport::accept(): sends our offer, after the
  // HelloReply (the server's order, see accept()).
  Status send_own_offer();

  const ShmLinkStats& shm_stats() const { return shm_stats_; }
  bool down() const { return down_; }
  size_t backlog() const { return backlog_.size(); }

 private:
  friend class ShmTransport;
  ShmLink(ShmTransport& owner, Fd sock, OwnSegment own, PeerSegment peer, std::string description);

  // Takes up to out.size() messages from the peer's ring; returns how many.
  size_t receive(std::span<Completion> out);
  bool peer_has_more();
  bool write_descriptor(const Outgoing& o, const std::byte* control_copy);
  void flush_backlog();
  // The drain rule: fails the link when the peer consumed nothing for the
  // peer timeout while the backlog waits.  Only runs with a backlog.
  void check_drain(bool progressed);
  void publish();
  void fail(std::string reason);
  void on_socket_event(uint32_t events);
  // Sleep announcement (Transport::prepare_sleep) and its withdrawal.
  bool announce_sleep();
  void withdraw_sleep();

  ControlBlock* own_ctl() const { return reinterpret_cast<ControlBlock*>(own_.map.base()); }
  const ControlBlock* peer_ctl() const {
    return reinterpret_cast<const ControlBlock*>(peer_.map.base());
  }

  ShmTransport& owner_;
  Fd sock_;
  OwnSegment own_;
  PeerSegment peer_;
  std::string description_;
  void* context_ = nullptr;
  MemoryRegion ring_{};  // the session's receive ring (private memory)
  // The session's send ring when it maps our data area (register_memory):
  // messages built there are sent in place.  Our own pages, sealed against
  // the peer's writes (shm_segment.cc), so nothing read back is the peer's.
  std::byte* send_alias_ = nullptr;
  bool attached_ = false;
  bool down_ = false;
  bool peer_gone_ = false;  // the socket hung up; fail once the ring is drained
  bool sleep_announced_ = false;
  bool in_epoll_ = false;
  LinkStats stats_;
  ShmLinkStats shm_stats_;

  // Private record of both rings: nothing here is ever read back from
  // shared memory after it was checked.
  uint32_t slot_count_ = 0;
  uint32_t slot_size_ = 0;
  uint32_t desc_mask_ = 0;
  uint64_t published_ = 0;   // our descriptors published (our head)
  uint64_t peer_tail_ = 0;   // last checked value of the peer's consumed count
  uint64_t consumed_ = 0;    // peer descriptors we consumed (our tail)

  struct Pending {
    Outgoing o;
    std::array<std::byte, core::kHeaderSize> control{};
  };
  std::vector<Pending> backlog_;  // waiting for descriptor room, in order
  size_t backlog_limit_ = 0;      // messages; over it the link fails
  // When the peer last consumed something while the backlog waited (set
  // when the backlog starts).  Read and written only with a backlog: the
  // clock is not read on the hot path.
  std::chrono::steady_clock::time_point last_drain_{};
};

class ShmTransport final : public Transport {
 public:
  // Uses config.peer_timeout_ms as the drain timeout (see ShmLink).
  explicit ShmTransport(const Config& config);
  ShmTransport() : ShmTransport(Config{}) {}
  ~ShmTransport() override;
  uint32_t peer_timeout_ms() const { return peer_timeout_ms_; }

  // Connection setup in two halves, so that both ends can run in one thread
  // over a socketpair: offer() creates our segment and sends it; complete()
  // receives the peer's and makes the link.  `sock` is a connected Unix
  // domain stream socket after the session handshake (which agreed on the
  // geometry); it stays open for the link's life as the death signal.
  struct Offered {
    Fd sock;
    Geometry geometry;
    OwnSegment own;
  };
  Result<Offered> offer(int sock, Geometry g);
  Result<std::unique_ptr<ShmLink>> complete(Offered offered, std::chrono::milliseconds timeout,
                                            std::string description);
  // Both halves, for a peer in another thread or process.
  Result<std::unique_ptr<ShmLink>> adopt(int sock, Geometry g, std::chrono::milliseconds timeout,
                                         std::string description);

  // The server's order: the client sends its offer right behind its Hello,
  // and the server answers with its HelloReply first, its own offer after
  // (ShmLink::send_own_offer()).  So this takes the peer's offer first
  // (waiting at most `timeout`; the acceptor waits until the socket is
  // readable, so on a loop this is 0 and never blocks), then creates our
  // segment and the link.
  Result<std::unique_ptr<ShmLink>> accept(int sock, Geometry g, std::chrono::milliseconds timeout,
                                          std::string description);

  std::string_view name() const override { return "shm"; }
  size_t poll(std::span<Completion> out) override;
  int wait_fd() const override { return epoll_fd_.get(); }
  bool prepare_sleep() override;

  // Busy polling checks the sockets and eventfds (epoll_wait, a system call)
  // on one poll in this many; sleeping always checks them first.
  static constexpr uint32_t kEpollEvery = 1024;

 private:
  friend class ShmLink;
  void push(const Completion& c) { ready_.push_back(c); }
  void forget(ShmLink* link);
  void handle_events();
  Result<std::unique_ptr<ShmLink>> make_link(Fd sock, OwnSegment own, PeerSegment peer,
                                             std::string description);

  Fd epoll_fd_;
  uint32_t peer_timeout_ms_;
  std::vector<ShmLink*> links_;
  std::vector<Completion> ready_;  // link-down completions, in order
  size_t next_link_ = 0;           // round robin start, so no link starves
  uint32_t tick_ = 0;
  static constexpr int kMaxEvents = 64;
  epoll_event events_[kMaxEvents];
};

}  // namespace slotrpc::transport::shm
