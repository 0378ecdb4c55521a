// RDMA verbs transport: RC queue pairs, one per session; one completion
// queue (with a completion channel) per reactor.
//
// Data path (docs/protocol.md, "Verbs data path"):
//   slot lane     RDMA WRITE_WITH_IMM from the send slot straight into the
//                 peer's receive slot (remote_addr = ring base + slot *
//                 slot_size), immediate = htobe32(core imm).  Zero copies.
//   control lane  SEND of the 32-byte header into a pre-posted receive
//                 buffer; handed to the core inside the Completion.
//   receives      3 * slot_count + 16 per session, posted before the peer
//                 learns the queue pair and reposted (one chain per queue)
//                 after every poll, before the core sees the completions.
//                 With the credit protocol no message ever finds the
//                 receive queue empty (no RNR).
//   sends         every post() is one linked chain of work requests, one
//                 ibv_post_send (one doorbell).  Only every k-th request is
//                 signaled; the send queue is accounted so it never
//                 overflows: what does not fit waits in the link and goes
//                 out when completions free room.
//   inline        a message of header + payload <= the queue pair's real
//                 max_inline_data (probed at creation: Config::inline_bytes,
//                 halved until the device accepts it) is posted inline.
//
// Receive queues and ring protection (Config::srq, docs/design.md):
//   shared   (SLOTRPC_SRQ=auto on a device with SRQs and type-2 memory
//            windows, or on) one protection domain and one shared receive
//            queue per event loop.  Receive requests come from the SRQ
//            while its budget lasts (a session reserves its worst case;
//            beyond that a session gets a receive queue of its own).  A
//            receive ring is registered for local access and memory-window
//            binding only; the peer gets the rkey of a type-2 memory window
//            bound to the session's own queue pair.  A queue pair of
//            session A that uses session B's rkey is refused by the
//            responder (remote access error): nothing is written and the
//            offending link fails.
//   per session  (SLOTRPC_SRQ=off, or auto without the device support) each
//            link has its own protection domain and receive queue, and its
//            ring is registered with REMOTE_WRITE in that PD: the same
//            isolation, from the PD boundary instead of the window.
//
// Liveness: the TCP connection the handshake ran on stays open; its EOF
// fails the link at once (a dead process closes it), besides the core's
// keepalives and the queue pair's own retry errors.
//
// Threads: everything runs on the owning reactor's thread.  Hot path
// (post, poll): no allocation, no locks; the only virtual calls are the
// core's Link::post and Transport::poll, once per batch.
#pragma once

// A TCP-only build (-Dverbs=disabled, or auto without libibverbs) declares
// the names the library uses without <infiniband/verbs.h>: verbs_disabled.h.
#include "slotrpc_verbs_config.h"  // SLOTRPC_WITH_VERBS 0 or 1 (lib/meson.build)
#if !SLOTRPC_WITH_VERBS
#include "transport/verbs/verbs_disabled.h"
#else

#include <infiniband/verbs.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "slotrpc/config.h"
#include "transport/transport.h"
#include "transport/verbs/bulk.h"
#include "transport/verbs/device.h"
#include "transport/verbs/qp_info.h"
#include "transport/verbs/receive_queue.h"
#include "transport/verbs/registered_buffer.h"

namespace slotrpc::transport::verbs {

// The handshake extension both ends send: QpInfo (qp_info.h).

class VerbsTransport;

class VerbsLink final : public Link {
 public:
  ~VerbsLink() override;  // destroys the QP, the link's windows and MRs (and its own PD)

  Result<MemoryRegion> register_memory(std::span<std::byte> memory, Access access) override;
  void deregister(MemoryRegion& region) override;
  // Both rings must have been registered through this link.
  Status attach(const MemoryRegion& receive_ring, const MemoryRegion& send_ring,
                uint32_t slot_count, uint32_t slot_size, void* context) override;
  void post(std::span<const Outgoing> batch) override;
  void close(std::string reason) override;
  std::string describe() const override { return description_; }
  LinkStats stats() const override;

  // Bulk transfers (bulk.h, bulk.cc): type-2 windows per exposure, chunked
  // RDMA READ / WRITE.  Loop thread, except register_bulk/deregister_bulk.
  bool supports_bulk() const override;
  const void* bulk_domain() const override { return pd_; }
  Result<BulkRegistration> register_bulk(const BulkSource& source) override;
  void deregister_bulk(BulkRegistration& registration) override;
  Result<RemoteSegment> expose(const BulkRegistration& registration, size_t offset, size_t length,
                               BulkAccess access) override;
  bool revoke(const RemoteSegment& segment, uint64_t token) override;
  Status read(const BulkRegistration& local, size_t local_offset, const RemoteSegment& remote,
              uint64_t remote_offset, size_t length, uint64_t token) override;
  Status write(const BulkRegistration& local, size_t local_offset, const RemoteSegment& remote,
               uint64_t remote_offset, size_t length, uint64_t token) override;
  // The negotiated max_rd_atomic (after connect) and the chunk size.
  uint32_t max_reads_in_flight() const { return max_rd_atomic_; }
  uint64_t chunk_bytes() const;
  // Windows the link has allocated so far (its pool), for tests.
  size_t bulk_windows() const { return bulk_ ? bulk_->windows.size() : 0; }
  // Whether each exposed range gets an MR of its own under its window
  // (devices that bound a window only by its MR: exposure_mrs.h).
  bool uses_exposure_mrs() const;

  // After attach(): what the peer needs to reach this link.
  QpInfo local_info() const;
  // Moves the queue pair to RTR and RTS towards `peer` (path MTU = the
  // smaller of both ports).  On success the link owns `control_fd` (the
  // handshake's TCP connection, or -1 for none): EOF on it fails the link.
  // On failure the caller keeps the fd.  Messages posted before this wait
  // in the link and go out now.
  Status connect(const QpInfo& peer, int control_fd, const std::string& peer_name);

  bool connected() const { return connected_; }
  bool down() const { return down_; }
  uint32_t qp_num() const { return qp_ != nullptr ? qp_->qp_num : 0; }
  uint32_t max_inline() const { return max_inline_; }
  uint32_t send_queue_depth() const { return sq_depth_; }
  // Receive requests this link may use: its own queue's depth, or what it
  // reserved in the shared one.
  uint32_t receive_queue_depth() const { return rq_depth_; }
  bool shared_receive_queue() const { return rq_ != nullptr && rq_->shared(); }
  // The receive ring is reached through a type-2 memory window bound to
  // this link's queue pair (shared protection domain).
  bool memory_window() const { return ring_window_.mw != nullptr; }
  // The queue pair itself, for tests that read its attributes back
  // (ibv_query_qp); nullptr before setup.
  ibv_qp* queue_pair() const { return qp_; }

  // Test hook, not used by the library: an RDMA WRITE_WITH_IMM of `length`
  // bytes at `local` (inside the attached send ring) to an arbitrary remote
  // address and rkey.  Lets tests show that another session's rkey is
  // refused.  Errors arrive as a kLinkDown completion.
  Status post_raw_write(const std::byte* local, uint32_t length, uint64_t remote_addr,
                        uint32_t rkey, uint32_t imm);

 private:
  friend class VerbsTransport;
  VerbsLink(VerbsTransport& owner, std::string description);

  struct Pending {
    Outgoing out;
    std::array<std::byte, transport::kHeaderSize> control;  // control lane: the copied header
    // A bulk item keeps its place among the messages: a window's bind or
    // invalidation (`bulk` = window), or a write whose chunks are not all
    // posted yet (`bulk` = op; it stays at the head until they are).
    enum class Kind : uint8_t { kMessage, kBind, kInvalidate } kind = Kind::kMessage;
    uint32_t bulk = 0;
  };

  struct Window {  // a type-2 memory window over a kRemoteWrite region
    ibv_mr* mr = nullptr;
    ibv_mw* mw = nullptr;
    uint32_t rkey = 0;  // the key the next bind gives it
  };

  Status setup(uint32_t slot_count);  // PD, QP (INIT), receive buffers
  Status bind_ring_window();           // connect(): bind, wait for the completion
  bool prepare(size_t i, const Outgoing& o);  // fills wr_[i]; false: the link failed
  bool ring_doorbell(size_t n);               // posts wr_[0..n) as one chain
  void flush_backlog();
  // Queues flush_backlog() for the transport's next poll() or
  // prepare_sleep(), or for this link's next post(), whichever comes first:
  // bulk work requests queued in one turn (a bind and the request carrying
  // its key, the invalidations of every call a batch of replies ended, the
  // READs of every handler that ran) leave in one chain, one doorbell.
  void defer_flush();
  void repost();
  bool on_receive(const ibv_wc& wc, const std::byte* buffer, Completion* out);
  void on_send_done(uint32_t retired);
  void on_control_fd(uint32_t events);
  void fail_from_wc(const ibv_wc& wc);
  // bulk.cc
  BulkState& bulk_state();
  void queue_bulk(Pending::Kind kind, uint32_t index);
  void prepare_window_wr(size_t i, const Pending& p);  // a bind or an invalidation
  // Fills wr_[j..room) with chunks of `op`; how many.
  size_t prepare_chunks(size_t j, size_t room, uint32_t op);
  Status start_transfer(bool write, const BulkRegistration& local, size_t local_offset,
                        const RemoteSegment& remote, uint64_t remote_offset, size_t length,
                        uint64_t token);
  void push_bulk_done(uint64_t token, uint16_t status);
  uint8_t responder_resources() const;  // RDMA READs this side answers at once
  void on_bulk_done();                  // a successful signaled bulk request
  void fail_bulk_front(uint16_t code);  // the failed request was a bulk one
  void finish_bulk_on_down();           // fail(): every pending op ends
  // Deallocates the bulk windows and gives back their exposure MRs (a
  // failed link, a destroyed one).
  void free_bulk_windows();
  bool bulk_waiting() const {
    return bulk_ != nullptr && (!bulk_->reads.empty() || !bulk_->writes.empty());
  }
  void fail(std::string reason);
  bool owns_region(const MemoryRegion& r) const;

  VerbsTransport& owner_;
  std::string description_;
  uint16_t index_ = 0;  // entry in owner_.table_, encoded in every wr_id
  uint16_t gen_ = 0;

  ibv_pd* pd_ = nullptr;
  bool owns_pd_ = false;  // per-session mode; else the transport's
  ibv_qp* qp_ = nullptr;
  uint32_t psn_ = 0;
  uint32_t sq_depth_ = 0;
  uint32_t rq_depth_ = 0;
  uint32_t max_inline_ = 0;
  uint32_t path_mtu_ = 1024;  // bytes, set by connect(); for LinkStats::packets
  uint32_t signal_every_ = 1;
  uint32_t created_slots_ = 0;
  int cq_budget_ = 0;  // CQ entries reserved for this link

  // Receive requests: the transport's SRQ (srq_budget_ of them reserved)
  // or a queue of the link's own.
  ReceiveQueue* rq_ = nullptr;
  std::unique_ptr<ReceiveQueue> own_rq_;
  uint32_t srq_budget_ = 0;
  // Control headers when the device cannot inline 32 bytes: buffer
  // seq % sq_depth_, free again once that request has completed.
  RegisteredBuffer ctrl_bufs_;

  std::vector<ibv_send_wr> wr_;   // sq_depth_ entries, reused for every chain
  std::vector<ibv_sge> sge_;
  bool flush_queued_ = false;

  std::vector<Pending> backlog_;  // waits for send-queue room (or for connect)
  size_t backlog_head_ = 0;
  size_t backlog_bulk_ = 0;  // bulk items among them (not in backlog_limit_)
  // Most messages that may wait in the backlog (setup(): 5 x slots + 64, what
  // a peer that follows the credit rules can ever leave unacknowledged).
  // More means the peer takes none of our sends (it stopped reposting
  // receives, so the NIC retries on RNR forever): the link fails instead of
  // growing without bound (docs/design.md, "Buffer budgets").
  size_t backlog_limit_ = 0;
  uint32_t sq_outstanding_ = 0;   // posted, not yet known complete
  uint32_t unsignaled_ = 0;       // posted since the last signaled request
  uint64_t send_seq_ = 0;

  void* context_ = nullptr;
  bool attached_ = false;
  uint32_t slot_count_ = 0;
  uint32_t slot_size_ = 0;
  MemoryRegion ring_{};
  const std::byte* send_base_ = nullptr;
  size_t send_len_ = 0;
  uint32_t send_lkey_ = 0;

  uint64_t peer_ring_ = 0;
  uint32_t peer_rkey_ = 0;
  int fd_ = -1;
  bool in_epoll_ = false;
  bool connected_ = false;
  bool down_ = false;

  std::vector<ibv_mr*> mrs_;  // registered through register_memory
  std::vector<Window> windows_;
  Window ring_window_{};       // the receive ring's, of windows_ (shared PD mode)
  bool bound_ = false;         // the bind completed
  uint8_t max_rd_atomic_ = 1;  // connect(): RDMA READs this side may have in flight
  std::unique_ptr<BulkState> bulk_;  // the first bulk call creates it
  LinkStats stats_;
};

class VerbsTransport final : public Transport {
 public:
  // Opens the device `config` selects (Device::open) and creates the
  // completion channel, the completion queue and the epoll set behind
  // wait_fd().
  static Result<std::unique_ptr<VerbsTransport>> create(const Config& config);
  ~VerbsTransport() override;  // every link must be gone

  // A link with an RC queue pair in INIT and its receive requests posted
  // (shared or its own, see the top of this file); `slot_count` sizes its
  // queues.  Loop thread.
  Result<std::unique_ptr<VerbsLink>> create_link(std::string description, uint32_t slot_count);

  std::string_view name() const override { return "verbs"; }
  size_t poll(std::span<Completion> out) override;
  // Readable when the CQ has an event (after prepare_sleep armed it), an
  // async device event is pending, or a control connection closed.
  int wait_fd() const override { return epoll_fd_; }
  bool prepare_sleep() override;

  const Device& device() const { return *device_; }
  int cq_capacity() const { return cq_capacity_; }
  // Shared mode: one PD and SRQ for every link, rings behind windows.
  bool shared_mode() const { return pd_ != nullptr; }
  uint32_t srq_depth() const { return srq_ ? srq_->depth() : 0; }
  uint32_t srq_committed() const { return srq_committed_; }

  // For the monitor (lib/transport/verbs/monitor.h), once an interval, loop thread: this
  // loop's receive queues, the SRQ ("srq") and every live link's own
  // queue (named by the link's description).
  struct ReceiveQueueInfo {
    std::string queue;
    uint32_t capacity = 0;
    uint32_t posted = 0;
    uint32_t low_water = 0;
  };
  void receive_queues(std::vector<ReceiveQueueInfo>& out) const;

  // Completion-queue polls that found work and the completions they took:
  // completions / polls is how much one poll batches under load.  Two
  // counter increments per non-empty poll, no more.
  struct PollStats {
    uint64_t polls = 0;
    uint64_t completions = 0;
  };
  PollStats poll_stats() const { return poll_stats_; }

  // How often poll() looks at the fds (control connections, async events,
  // CQ events) while busy: every this many polls, and after every sleep.
  static constexpr uint32_t kFdCheckInterval = 1024;

 private:
  friend class VerbsLink;
  VerbsTransport() = default;

  struct Entry {
    VerbsLink* link = nullptr;
    uint16_t gen = 0;
  };

  VerbsLink* lookup(uint64_t wr_id) const;
  VerbsLink* lookup_qp(uint32_t qp_num) const;
  // Polls one batch into ready_; how many completions it took.
  int poll_into_ready();
  // Until the CQ is empty (a destroyed queue pair's completions leave
  // before its number can be reused).
  void drain_cq();
  // Runs flush_backlog() of every link in flush_list_ (defer_flush).
  void flush_deferred();
  size_t process(const ibv_wc* wc, int n, Completion* out);
  void check_fds();
  void on_async_event(const ibv_async_event& e);
  void fail_all(const std::string& reason);
  void forget(VerbsLink* link);
  void push_completion(const Completion& c) { ready_.push_back(c); }
  size_t drain_ready(std::span<Completion> out);

  Config config_;
  std::unique_ptr<Device> device_;
  ibv_pd* pd_ = nullptr;                // shared mode
  std::unique_ptr<ReceiveQueue> srq_;   // shared mode
  uint32_t srq_committed_ = 0;          // receive requests reserved by links
  bool srq_full_logged_ = false;
  // SRQ completions name their queue pair only by number.  A lookup per
  // control message / slot write; no allocation after insert.
  std::unordered_map<uint32_t, uint16_t> by_qpn_;
  ibv_comp_channel* channel_ = nullptr;
  ibv_cq* cq_ = nullptr;
  int cq_capacity_ = 0;
  int cq_committed_ = 0;  // sum of the links' budgets
  int epoll_fd_ = -1;
  bool armed_ = false;
  bool check_fds_ = true;
  uint32_t countdown_ = kFdCheckInterval;

  std::vector<ibv_wc> wc_;
  std::vector<Completion> scratch_;  // prepare_sleep's re-poll
  std::vector<Entry> table_;
  std::vector<uint16_t> free_entries_;
  std::vector<VerbsLink*> repost_list_;
  std::vector<VerbsLink*> flush_list_;
  std::vector<Completion> ready_;
  size_t ready_head_ = 0;
  size_t live_links_ = 0;
  PollStats poll_stats_;
};

}  // namespace slotrpc::transport::verbs

#endif  // SLOTRPC_WITH_VERBS
