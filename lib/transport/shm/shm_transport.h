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
// If the peer announced it is going to sleep, one byte is sent on the
// link's Unix socket to wake it, with MSG_DONTWAIT: a peer can fill its
// socket, never make the send wait (docs/design.md, "Trust and security").
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
// Wiring: rpc::loop_shm() is a loop's transport; Channel connects and Server
// listens on a Unix domain socket for it (docs/design.md says how).
//
// Hot path: post() and poll() are one virtual call per batch; per message
// no allocation, no lock, no system call (a wake-up byte only for a
// sleeping peer, once per batch).
#pragma once

#include <sys/epoll.h>

#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "slotrpc/config.h"
#include "transport/host_bulk.h"
#include "transport/shm/shm_segment.h"
#include "transport/transport.h"

namespace slotrpc::transport::shm {

class ShmTransport;

// Counters beyond LinkStats, for tests and the benchmark.
struct ShmLinkStats {
  uint64_t in_place_sends = 0;  // slot messages built in our segment: no copy
  uint64_t copied_sends = 0;    // slot messages copied into our segment by post()
  uint64_t inline_sends = 0;    // slot messages of <= kInlineMax bytes sent in the descriptor
  uint64_t wakeups_sent = 0;    // wake-up bytes for a sleeping peer (sends tried)
  // ... of which found the peer's socket full: it has unread wake-ups, so
  // it is woken all the same (a peer that never reads; never a wait)
  uint64_t wakeups_already_pending = 0;
  uint64_t backlogged = 0;      // messages that waited for descriptor room
  uint64_t bulk_chunks_sent = 0;      // bulk chunks copied into our staging area
  uint64_t bulk_bytes_sent = 0;       // ... and their bytes
  uint64_t bulk_bytes_received = 0;   // bulk bytes copied out of the peer's staging area
  uint64_t bulk_stalls = 0;           // polls on which bulk data waited for staging or ring room
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

  // Bulk transfers (shm_bulk.cc): through the staging areas of both
  // segments, one copy into the sender's, one out of it by the receiver.
  // The side that exposes a range serves the peer's reads from it and
  // checks the peer's writes against it, so the peer never touches our
  // memory: every access is checked here, on our loop, against an exposure
  // of this link (a bad one fails the link, as verbs' remote access error
  // fails the queue pair).
  bool supports_bulk() const override { return true; }
  const void* bulk_domain() const override;
  Result<BulkRegistration> register_bulk(const BulkSource& source) override;
  void deregister_bulk(BulkRegistration& registration) override;
  Result<RemoteSegment> expose(const BulkRegistration& registration, size_t offset, size_t length,
                               BulkAccess access) override;
  bool revoke(const RemoteSegment& segment, uint64_t token) override;
  Status read(const BulkRegistration& local, size_t local_offset, const RemoteSegment& remote,
              uint64_t remote_offset, size_t length, uint64_t token) override;
  Status write(const BulkRegistration& local, size_t local_offset, const RemoteSegment& remote,
               uint64_t remote_offset, size_t length, uint64_t token) override;

  // Bounds on bulk state, as on TCP: at most kMaxBulkReads of this side's
  // read requests outstanding (more wait here), and a peer with more than
  // that outstanding against us is failed.
  static constexpr size_t kMaxBulkReads = 16;
  // For tests: how long one receive_bulk() may go on copying after its
  // first chunk (kBulkReceiveBudget): zero copies exactly one chunk a
  // poll, a large value up to kBulkReceiveMaxBytes.
  void set_receive_budget(std::chrono::nanoseconds budget) { receive_budget_ = budget; }
  static_assert(kBulkDescCount >= kStagingBytes / kBulkChunkBytes + 2 * kMaxBulkReads,
                "the bulk ring holds every staged chunk, our read requests and their failures");

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
  // What both descriptor rings (slot and bulk) share.  `ring` is "" for
  // the slot ring and "bulk " for the bulk ring: it prefixes the failure
  // reasons.  `count` is the ring's length, a power of two.
  enum class Take : uint8_t { kGot, kEmpty, kFailed };
  // Copies the peer's descriptor number `index` into *d after checking its
  // sequence word: kEmpty when it is not written yet, kFailed when the
  // words make no sense (the link failed).
  Take take_descriptor(const Descriptor* descs, uint64_t count, uint64_t index, Descriptor* d,
                       const char* ring);
  // Before sleeping: whether the peer published past `consumed` (its
  // `head_word`, seq_cst), failing the link if it claims more than the ring
  // shows.  True also when the link just failed (a kLinkDown to deliver).
  bool peer_ring_has_more(const uint64_t& head_word, const Descriptor* descs, uint64_t count,
                          uint64_t consumed, const char* ring);
  // Reads the peer's consumed count of one of our rings into *last, checked
  // against what we published (forward only, not past our head); false
  // when it is nonsense (the link failed).
  bool refresh_peer_count(const uint64_t& word, uint64_t* last, uint64_t published, const char* ring);
  // Writes `d` at `slot`, its sequence word `seq` last (release).
  static void store_descriptor(Descriptor* slot, const Descriptor& d, uint64_t seq);
  // After a seq_cst store of one of our heads: the Dekker pair with the
  // peer's announce_sleep(), and a wake-up byte on the socket if it sleeps.
  void wake_peer_if_sleeping();
  // Publishes a descriptor built by the bulk code; false when the ring is
  // full (or the peer's consumed count is nonsense: then the link failed).
  bool put_descriptor(const Descriptor& d);
  bool ring_has_room();
  // Bulk, shm_bulk.cc.  pump_bulk(): called by every poll while this side
  // has bulk work; publishes what waits (read requests, failed reads) and
  // stages at most kBulkPumpBytes.  on_bulk_descriptor(): one
  // received bulk descriptor; returns false when the link failed, and sets
  // *done when it completed a read (a kBulkDone in *c).
  void pump_bulk();
  bool has_bulk_work() const {
    return !bulk_small_.empty() || !serves_.empty() || !writes_.empty() || !write_confirms_.empty();
  }
  // Takes bulk descriptors from the peer's bulk ring, copying at most about
  // one chunk; returns the completions (reads done) it made.
  // *took: whether it consumed any descriptor (a chunk makes no completion).
  size_t receive_bulk(std::span<Completion> out, bool* took);
  void check_peer_gone();
  void publish_bulk();
  bool on_bulk_descriptor(const Descriptor& d, Completion& c, bool* done, uint64_t* moved);
  void request_reads();
  void reclaim_staging();
  std::byte* stage(uint32_t length);
  void bulk_done(uint64_t token, StatusCode code);
  void fail_bulk();
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
  uint32_t sleep_number_ = 0;  // of our last announcement (our `sleeping` word)
  uint32_t woken_sleep_ = 0;   // the peer's announcement we last sent a wake-up for
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
    std::array<std::byte, transport::kHeaderSize> control{};
  };
  std::vector<Pending> backlog_;  // waiting for descriptor room, in order
  size_t backlog_limit_ = 0;      // messages; over it the link fails
  // When the peer last consumed something while the backlog waited (set
  // when the backlog starts).  Read and written only with a backlog: the
  // clock is not read on the hot path.
  std::chrono::steady_clock::time_point last_drain_{};

  // ---- Bulk (shm_bulk.cc) ----
  // Ranges this side exposed, by key (keys are never reused).
  using Exposure = HostExposure;
  HostExposureTable exposures_;
  // This side's reads: requested (the first reads_requested_) or waiting.
  struct ReadOp {
    uint64_t token = 0;
    uint64_t tag = 0;
    std::byte* dest = nullptr;
    uint64_t length = 0;
    uint64_t got = 0;
    uint32_t rkey = 0;
    uint64_t addr = 0;
  };
  std::deque<ReadOp> reads_;
  size_t reads_requested_ = 0;
  uint64_t next_tag_ = 1;
  // The peer's reads this side serves from its exposures, in order.
  struct ServeJob {
    uint64_t tag = 0;
    uint32_t rkey = 0;
    const std::byte* src = nullptr;
    uint64_t length = 0;
    uint64_t sent = 0;
  };
  std::deque<ServeJob> serves_;
  // This side's writes into the peer's exposures.
  struct WriteJob {
    uint64_t token = 0;
    uint32_t rkey = 0;
    uint64_t addr = 0;
    const std::byte* src = nullptr;
    uint64_t length = 0;
    uint64_t sent = 0;
  };
  std::deque<WriteJob> writes_;
  bool serve_turn_ = true;  // round robin between serving and writing
  // Descriptors without data (read requests, failed reads) waiting for
  // ring room, in order.
  std::deque<Descriptor> bulk_small_;
  // The staging ring: bytes handed out and freed (positions modulo
  // kStagingBytes), and for each chunk the descriptor that names it: the
  // chunk is free again once the peer's consumed count passes it.
  // Our bulk ring (descriptors published, the peer's consumed count as last
  // checked) and the peer's (descriptors we consumed).
  uint64_t bulk_published_ = 0;
  uint64_t peer_bulk_tail_ = 0;
  uint64_t bulk_consumed_ = 0;
  // How long one receive_bulk() goes on copying after its first chunk
  // (kBulkReceiveBudget; set_receive_budget for tests).
  std::chrono::nanoseconds receive_budget_ = kBulkReceiveBudget;
  // Bulk bytes moved since the last sleep announcement, and until when the
  // loop keeps polling for more (kBulkSpin; announce_sleep).
  bool bulk_active_ = false;
  std::chrono::steady_clock::time_point bulk_spin_until_{};
  // Writes whose every chunk is staged, completed once the peer has
  // consumed the last one (its bulk_tail passes `desc`): a reply posted
  // after the completion can then never be seen before the data, though it
  // travels in the other ring.
  struct WriteConfirm {
    uint64_t desc = 0;
    uint64_t token = 0;
  };
  std::deque<WriteConfirm> write_confirms_;
  uint64_t stage_head_ = 0;
  uint64_t stage_tail_ = 0;
  struct StageUse {
    uint64_t desc = 0;  // its descriptor's index in our bulk ring
    uint64_t end = 0;   // stage_head_ after it
  };
  std::deque<StageUse> stage_uses_;
  // When bulk data last moved while it waited for room (the drain rule).
  std::chrono::steady_clock::time_point bulk_progress_{};
  bool bulk_stalled_ = false;
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
  uint64_t bytes_moved() const override { return bulk_bytes_moved_; }

  // Busy polling checks the sockets (epoll_wait, a system call)
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
  // Bulk bytes copied in or out by this transport's links (the reactor
  // counts them as work: a bulk chunk is no completion).
  uint64_t bulk_bytes_moved_ = 0;
  std::vector<ShmLink*> links_;
  std::vector<Completion> ready_;  // link-down completions, in order
  size_t next_link_ = 0;           // round robin start, so no link starves
  uint32_t tick_ = 0;
  static constexpr int kMaxEvents = 64;
  epoll_event events_[kMaxEvents];
};

}  // namespace slotrpc::transport::shm
