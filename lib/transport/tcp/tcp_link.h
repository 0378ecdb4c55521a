// A TCP link: one connection's frames, its output queues and budget,
// its bulk transfers, pushes and lane.  The transport that owns it and
// the wire format: tcp_transport.h.
//
// Bulk transfers (transport.h "Bulk transfers", docs/protocol.md
// "TCP bulk frames"; code in tcp_bulk.cc and tcp_pushes.cc, the framing
// in tcp_link.cc, the lanes in tcp_link_lanes.cc): one-sided reads and writes are emulated on the same
// socket with more frame types (READ_REQ, READ_DATA, WRITE_DATA, FENCE and
// PUSH_DATA).  The exposing side keeps a table of
// exposed ranges (rkey -> range, access) and checks every request against
// it before a byte moves; a request the table refuses fails the link, as a
// remote access error fails a queue pair on verbs.  Bulk bytes are never
// staged: read data and write data go out with sendmsg straight from the
// user's memory and are received with recv straight into the destination
// (a push's bytes that arrive in the same recv as its request excepted:
// at most kPushReadAhead, copied once; set_push_limit says why pushes).
// A transfer is cut into frames of one bulk slice (Config::tcp_bulk_slice,
// 64 KiB by default, growing while no slot frame goes by: next_slice());
// a read the peer asked for
// is served one chunk at a time (the next chunk is queued only once the
// previous one is in the kernel), and so is a write.  Bulk data frames wait
// in a queue of their own behind slot and control frames, and the socket
// holds at most two slices unsent while bulk data flows, so an
// unrelated reply waits for the rest of one chunk and that much, never for
// a gigabyte.  A frame posted after a write's kBulkDone follows all of its
// bytes (one ordered stream; transport.h).
//
// Bounds on bulk state: a link has at most kMaxBulkReads read requests
// outstanding at its peer (more wait locally) and serves at most that many
// for its peer (one more fails the link); bulk bodies do not count against
// the output budget (they are this side's own writes, or one chunk per
// served read), but they do keep the drain clock running, so a peer that
// stops reading them is closed after peer_timeout_ms like any other.
//
// Bulk lanes (bulk_lanes.h): when both ends have them on, a session gets a
// second connection for transfers through exposures of at least
// Config::tcp_bulk_lane bytes, moved by a thread of its own.  The exposing
// side decides: such an exposure is made on the lane, and its rkey (bit 31
// set) tells the peer's link to read or write it through the lane.  A
// FENCE frame on this connection keeps each reply behind its lane data.
//
// TLS (tcp_tls_io.cc): a link adopted with a tls::Stream reads and writes
// through it instead of the socket; the two I/O functions are chosen once,
// when the link is made, and the framing (tcp_transport.h) is the same.  Lanes are
// off on TLS sessions (rpc/ never opens one).
#pragma once

#include <sys/uio.h>

#include <array>
#include <atomic>
#include <chrono>
#include <deque>
#include <boost/asio/ip/tcp.hpp>
#include <memory>
#include <string>
#include <vector>

#include "slotrpc/config.h"
#include "transport/host_bulk.h"
#include "transport/tls/tls_stream.h"
#include "transport/transport.h"

namespace slotrpc::transport {

class TcpTransport;

class TcpLink final : public Link {
 public:
  ~TcpLink() override;  // deregisters from the transport, drops queued completions

  // Sockets read and write any memory: nothing to pin, keys are 0.
  Result<MemoryRegion> register_memory(std::span<std::byte> memory, Access access) override;
  void deregister(MemoryRegion& region) override;
  // sendmsg reads slot bodies from any memory; send_ring tells which slot a
  // body lives in (the peer may not write that slot while it is queued).
  Status attach(const MemoryRegion& receive_ring, const MemoryRegion& send_ring,
                uint32_t slot_count, uint32_t slot_size, void* context) override;
  void post(std::span<const Outgoing> batch) override;
  void close(std::string reason) override;
  std::string describe() const override { return description_; }
  LinkStats stats() const override;  // takes the lanes' lock when there is a lane

  // For tests and monitoring: bytes queued for the peer and not yet
  // written to the socket, and the budget they may reach.
  uint64_t queued_bytes() const { return queued_bytes_; }
  uint64_t output_budget() const { return budget_bytes_; }
  // Whether the link reads from its peer: false while the budget is
  // exceeded.  Paused reading always has output queued, so the drain
  // clock runs.
  bool listening() const override { return reading_; }

  // ---- Bulk transfers (not hot path; see the file comment) ----
  bool supports_bulk() const override { return true; }
  // Sockets reach any host memory: a registration is valid on every TCP
  // link of the process, so all of them share one domain.
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
  // For tests: ranges currently exposed to the peer, reads not finished.
  size_t exposures() const { return exposures_.size(); }
  // For tests: the socket's TCP_NOTSENT_LOWAT now (-1 if it cannot be read).
  int notsent_lowat();
  size_t bulk_reads() const { return reads_.size(); }
  // For tests: reads the peer asked for that this side is serving.
  size_t bulk_serving() const { return serves_.size(); }

  // ---- Pushes (PUSH_DATA; docs/protocol.md "TCP bulk frames", docs/design.md
  // "TCP: pushes") ----
  // Sender: ranges of at most `bytes` exposed for reading (not on a lane)
  // are sent unasked behind the next slot frame this link posts (the
  // request that offers them), so the reader need not send a READ_REQ.
  // 0 (the default): never; set only when the peer announced it accepts
  // pushes (kFeatureTcpPush) and Config::tcp_bulk_push is above 0.
  void set_push_limit(uint64_t bytes);  // clamped to TcpTransport::kMaxPushBytes
  // Receiver: accept PUSH_DATA (this side announced kFeatureTcpPush).  A
  // push's first frame parks reading until a read() of exactly its range
  // claims it (then the data goes straight to the read's destination), or
  // until the turn after every message before it was delivered: then it is
  // dropped, and a later read() of the range sends a READ_REQ as usual.
  void accept_pushes(bool on);
  // For tests: pushes this side started (sender), and pushes received
  // into a read / dropped (receiver).
  struct PushCounts {
    uint64_t sent = 0, claimed = 0, dropped = 0;
  };
  PushCounts push_counts() const {
    return {stats_.bulk_pushes, pushes_claimed_, stats_.bulk_pushes_dropped};
  }
  bool push_parked() const { return parked_; }

  // ---- Bulk lanes (bulk_lanes.h; not hot path) ----
  // The lane is this link's attached connection (transport.h, "Attached
  // connections"): these overrides speak that interface, the methods
  // after them are the lane's own.
  // Reads the session's Config::tcp_bulk_lane (0: no lane for this session).
  void configure(const Config& config) override { lane_threshold_ = config.tcp_bulk_lane; }
  // TLS links have no lane: it would be a second connection outside TLS.
  uint64_t attachment_threshold() const override { return tls_ != nullptr ? 0 : lane_threshold_; }
  // Attaches the lane, or logs that the session goes on without one.
  Status attach_connection(Result<int> connection) override;
  // The lane token (offer_lane), little endian; empty with lanes off.
  std::vector<std::byte> offer_attachment(uint16_t route) override;
  static constexpr size_t kLaneTokenSize = 8;
  static void encode_lane_token(uint64_t token, std::byte* out);
  static uint64_t decode_lane_token(const std::byte* in);

  // Adopts `fd`, a connection whose handshake made it this link's lane
  // (either side), into the loop's lane thread.  Takes the fd even on failure.
  Status attach_lane(int fd);
  bool has_lane() const { return lane_ != nullptr; }
  // Server: the token a client presents on the connection that becomes
  // this link's lane (TcpTransport::accept_lane), issued once (0: none).
  // Its low 16 bits are `route` (the server's loop index); the other 48
  // are random, so a token cannot be guessed.
  uint64_t offer_lane(uint16_t route);
  // For tests: exposures made on the lane.
  size_t lane_exposures();
  // For tests: recv calls made for bulk data (adaptive slices).
  uint64_t bulk_recvs() const { return bulk_recvs_; }
  // Lane mode: bytes handed to the kernel (under the lanes' lock) and
  // bytes received and in place (any thread).
  uint64_t lane_bytes_out() const { return lane_out_; }
  uint64_t lane_bytes_in() const { return lane_in_.load(std::memory_order_acquire); }
  bool fenced() const { return fenced_; }  // for tests: parsing waits for the lane

 private:
  friend class TcpTransport;
  TcpLink(TcpTransport& owner, boost::asio::ip::tcp::socket socket, std::string description);

  // Both are called by TcpTransport::poll when epoll reports the socket.
  // drain_all: keep reading past the fairness budget (the socket reported
  // an error or hang-up, so what is still buffered must be taken now).
  void on_readable(bool drain_all = false);
  void on_writable();
  void flush_pending();
  bool output_waiting() const {
    return pending_head_ < pending_.size() || bulk_pending_head_ < bulk_pending_.size() ||
           (tls_ != nullptr && tls_->pending_out());
  }
  // The link's I/O (tcp_tls_io.cc), chosen once: the socket's sendmsg and
  // recv, or a TLS link's Stream.  Same contract as the system calls
  // (bytes, or -1 with errno); a TLS error fails the link with its reason.
  using SendFn = ssize_t (*)(TcpLink&, const msghdr&);
  using RecvFn = ssize_t (*)(TcpLink&, std::byte*, size_t);
  static ssize_t plain_send(TcpLink& l, const msghdr& msg);
  static ssize_t plain_recv(TcpLink& l, std::byte* dst, size_t len);
  static ssize_t tls_send(TcpLink& l, const msghdr& msg);
  static ssize_t tls_recv(TcpLink& l, std::byte* dst, size_t len);
  void use_tls(std::shared_ptr<tls::Stream> stream);
  void fail(std::string reason);
  void update_epoll_interest();
  // Starts or ends the backpressure and the drain clock after the queue of
  // unsent output changed; `progress`: the peer took bytes just now.
  void after_output_change(bool progress);
  // Receive state machine helpers; return false once the link has failed.
  bool parse_staging();
  bool begin_frame(uint32_t word, uint32_t imm);
  // False once the link has failed (a bulk frame the table refused).
  bool finish_frame();
  // Bulk helpers.
  bool on_bulk_header();
  void enqueue_bulk(uint32_t type, uint32_t rkey, uint32_t status, uint64_t tag, uint64_t addr,
                    uint64_t length, const std::byte* body, uint32_t body_len);
  void request_reads();   // sends READ_REQs up to kMaxBulkReads outstanding
  void serve_next();      // queues the next chunk of a read the peer asked for
  void serve_chunk_sent();
  void write_next();       // queues the next chunk of this side's writes
  void write_chunk_sent();
  // Adaptive slices.  A transfer starts when this side gets a read to
  // serve or a write to send while it has neither; next_slice() sizes each
  // data frame this side sends (see the adaptive-slice state below).
  void transfer_started();
  // A slot frame on the loop since the transfer started: it is shared.
  void note_slot_frames();
  uint32_t next_slice();
  // The size of this side's bulk data frames now: what the flush bound
  // and the socket's low-water mark (two of them each) are counted in.
  uint32_t frame_slice() const;
  // wrote: the end of a write (a lane's session link then fences it).
  void bulk_done(uint64_t token, StatusCode code, bool wrote = false);
  // Lane helpers.  flush_or_kick: a lane's output queued by the loop
  // thread is sent by the lane thread (EPOLLOUT), so no copy runs on the
  // loop; a session link flushes as before.
  void flush_or_kick();
  bool on_fence(uint64_t lane_offset);  // false once the link has failed
  void lane_received(uint64_t n);       // lane mode: after n bytes are in place
  // The arguments of a read or write; *on_lane: the peer exposed the range
  // on the lane, which then does the transfer.
  Status check_transfer(const char* what, const BulkRegistration& local, size_t local_offset,
                        const RemoteSegment& remote, uint64_t remote_offset, size_t length,
                        bool* on_lane) const;
  void resume_after_fence();
  // Drops the lane and any unclaimed offer; `failing`: the session link is
  // failing, so the lane's outstanding operations end (kBulkDone) before
  // its kLinkDown.
  void drop_lane(bool failing);
  // Sets or restores TCP_NOTSENT_LOWAT as bulk output starts or ends.
  void bulk_output_changed();

  // What happens when a PendingWrite has been handed to the kernel.
  enum class OnSent : uint8_t { kNothing, kServeChunk, kWriteChunk };

  struct PendingWrite {
    // The 8-byte prefix, followed (control lane) by the 32-byte body, so a
    // control frame is one contiguous iovec.
    std::array<std::byte, 8 + transport::kHeaderSize> head;
    uint32_t head_len = 0;             // 8 (slot lane) or 40 (control lane)
    const std::byte* body = nullptr;   // slot lane body, not copied
    uint32_t body_len = 0;
    uint32_t sent = 0;  // bytes of head + body already written
    OnSent on_sent = OnSent::kNothing;
    bool bulk_body = false;  // body is bulk data (not counted in the budget)
    int32_t send_slot = -1;  // slot lane: the send slot the body lives in
  };

  // Drops the sent prefix of an output queue.
  static void compact(std::vector<PendingWrite>& q, size_t& head);

  // A range exposed to the peer (expose() .. revoke()).
  using Exposure = HostExposure;  // transport/host_bulk.h
  // A read this side asked for: the peer's READ_DATA lands at dest.
  struct ReadOp {
    uint64_t token = 0;
    uint64_t tag = 0;
    std::byte* dest = nullptr;
    uint64_t length = 0;
    uint64_t got = 0;
    uint32_t rkey = 0;
    uint64_t addr = 0;
    bool requested = false;
  };
  // A write this side started: its chunks go out one at a time, like a
  // served read's, so slot frames posted meanwhile pass between them.
  struct WriteJob {
    uint64_t token = 0;
    uint32_t rkey = 0;
    uint64_t addr = 0;           // the peer's address of the first byte
    const std::byte* src = nullptr;
    uint64_t length = 0;
    uint64_t sent = 0;           // bytes queued so far
  };
  // A read the peer asked for, served from an exposure.
  struct ServeJob {
    uint64_t tag = 0;             // READ_REQ's tag; a push: its total length
    uint32_t rkey = 0;
    const std::byte* src = nullptr;
    uint64_t length = 0;
    uint64_t sent = 0;            // bytes queued so far
    bool revoked = false;         // abort after the chunk in flight
    uint64_t revoke_token = 0;    // kBulkDone for revoke() once that chunk is out
    bool push = false;            // PUSH_DATA, not asked for (not counted in kMaxBulkReads)
  };
  // A push being received (receiver side).  kParked: reading waits at
  // its next byte, `claimed` (the first frame's, or the first after a read
  // of a piece of it ended); kClaimed: its bytes go to the read `read_tag`,
  // which took [claimed - that read's length, claimed); kDropped: the rest
  // is read and thrown away.
  struct PushIn {
    enum class State : uint8_t { kParked, kClaimed, kDropped };
    uint32_t rkey = 0;
    uint64_t total = 0;
    uint64_t got = 0;      // bytes of the frames begun (headers read)
    uint64_t claimed = 0;  // bytes promised to reads, from 0
    State state = State::kParked;
    uint64_t read_tag = 0;
  };
  void start_pushes();              // sender: after a slot frame is queued
  // A served read's or push's next READ_DATA / PUSH_DATA frame: `n` bytes
  // from j.sent, or (n 0) the end of the job with `status`.
  void enqueue_serve(const ServeJob& j, uint32_t status, uint32_t n);
  void end_serve_early(const ServeJob& j);  // its last frame, status UNAVAILABLE
  // The requested read `tag` (reads_.end() if none), and its end.
  std::deque<ReadOp>::iterator find_read(uint64_t tag);
  void end_read(std::deque<ReadOp>::iterator it, StatusCode code);
  bool on_push_header(uint32_t rkey, uint32_t status, uint64_t total, uint64_t addr,
                      uint64_t length);
  // The next bytes of push `p`'s current frame (push_frame_left_ of
  // them): into its read when claimed, up to the read's end; thrown away
  // when dropped.
  void receive_push_part(std::vector<PushIn>::iterator p);
  // A part of a push's frame is in (finish_frame): if the frame goes on
  // past a read that ended, park again for the next piece's read.
  void end_push_part();
  void park(uint32_t rkey);  // reading waits for a read of push `rkey`'s next byte
  // Whether a read from p.claimed would claim the push's next bytes.
  bool waits_for_read(const PushIn& p);
  // Claimed by a read that has ended, the push going on: parks it where
  // the next piece starts (true), for that piece's read.
  bool park_for_next_piece(std::vector<PushIn>::iterator p);
  bool claim_push(std::byte* dest, const RemoteSegment& remote, uint64_t remote_offset,
                  size_t length, uint64_t token);
  void drop_parked();               // the parked push had no reader in time
  void unpark(std::vector<PushIn>::iterator p);  // claimed or dropped: read its frame
  std::vector<PushIn>::iterator find_push(uint32_t rkey);

  TcpTransport& owner_;
  boost::asio::ip::tcp::socket socket_;
  SendFn send_fn_ = &plain_send;
  RecvFn recv_fn_ = &plain_recv;
  // TLS: the Stream, and how reading differs.  A record is at most 16 KiB,
  // so a short read does not mean the socket is drained (Stream::drained
  // does), and an event may read more times; bytes OpenSSL read ahead are
  // invisible to epoll, so the transport comes back for them (tls_watch_).
  std::shared_ptr<tls::Stream> tls_;
  int read_budget_ = 0;  // reads per event: tcp_limits::kReadBudget, more on TLS
  bool tls_watched_ = false;
  std::string description_;
  void* context_ = nullptr;
  MemoryRegion ring_{};
  MemoryRegion send_ring_{};
  uint32_t slot_count_ = 0;
  uint32_t slot_size_ = 0;
  bool attached_ = false;
  bool down_ = false;
  bool want_write_ = false;  // EPOLLOUT currently requested
  bool reading_ = true;         // reads from the peer (false: backpressure)
  bool epoll_reading_ = true;   // EPOLLIN currently requested
  bool in_epoll_ = false;
  LinkStats stats_;

  // Output budget (set by attach from the ring geometry) and the queue it
  // bounds: head + body bytes of pending_ not yet written.
  uint64_t budget_bytes_;
  uint64_t queued_bytes_ = 0;
  // While output is queued: when the peer last took any of it.  The link is
  // then on the transport's stalled_ list at index stalled_pos_.
  std::chrono::steady_clock::time_point last_drain_{};
  size_t stalled_pos_ = kNotStalled;
  static constexpr size_t kNotStalled = ~size_t{0};

  // Outgoing frames not yet fully written, in two queues: slot, control
  // and READ_REQ frames in pending_, bulk data frames (READ_DATA,
  // WRITE_DATA) in bulk_pending_.  A flush sends a frame already started
  // first (the stream must finish it), then every small frame, then bulk
  // frames, so a small frame waits for the rest of one bulk chunk at most,
  // never for the chunks queued behind it.  *_head_ is the first unsent.
  std::vector<PendingWrite> pending_;
  size_t pending_head_ = 0;
  std::vector<PendingWrite> bulk_pending_;
  size_t bulk_pending_head_ = 0;

  // Receive state machine.
  // Bytes read but not consumed (kStagingBytes).  Not a vector: resizing
  // one zero-fills 256 KiB per link, half the cost of a short-lived
  // session (fuzz_tcp_session's profile); only [begin, end) is ever read.
  std::unique_ptr<std::byte[]> staging_;
  size_t staging_begin_ = 0;
  size_t staging_end_ = 0;
  bool in_body_ = false;
  // What the frame being received is; body_control_ mirrors kControl.
  enum class Rx : uint8_t { kSlot, kControl, kBulkHead, kBulkData };
  Rx rx_ = Rx::kSlot;
  uint32_t bulk_type_ = 0;       // of the bulk frame being received
  uint64_t bulk_read_tag_ = 0;   // kBulkData of a READ_DATA: its read
  uint32_t bulk_write_rkey_ = 0; // kBulkData of a WRITE_DATA: its exposure
  std::array<std::byte, transport::kHeaderSize> bulk_head_{};
  uint32_t body_len_ = 0;
  uint32_t body_got_ = 0;
  uint32_t body_imm_ = 0;
  bool body_control_ = false;
  std::byte* body_dest_ = nullptr;  // slot memory or control_body_
  std::array<std::byte, transport::kHeaderSize> control_body_{};

  // Bulk state (see the file comment for its bounds).
  HostExposureTable exposures_;   // a lane's keys are the upper half (kLaneKeyBit and up)
  std::deque<ReadOp> reads_;      // FIFO; the first `requested` ones are at the peer
  size_t reads_requested_ = 0;
  uint64_t next_read_tag_ = 1;
  std::deque<ServeJob> serves_;   // round robin, one chunk in flight at a time
  bool serve_in_flight_ = false;  // serves_.front() has a chunk in pending_
  std::deque<WriteJob> writes_;   // round robin, one chunk in flight at a time
  bool write_in_flight_ = false;  // writes_.front() has a chunk in pending_
  uint64_t bulk_queued_ = 0;      // bulk body bytes of bulk_pending_ (in queued_bytes_ too)
  bool bulk_lowat_ = false;       // a bulk TCP_NOTSENT_LOWAT is set on the socket
  int lowat_mark_ = 0;            // its value: two frames of the slice at the time
  int saved_lowat_ = -1;          // the socket's TCP_NOTSENT_LOWAT before (-1: not read yet)
  // Adaptive slices (docs/design.md, "Slices that grow").  A slot frame
  // sent or received by any link of this loop (TcpTransport::slot_frames_)
  // during a transfer means calls share the loop or the connection with
  // it: that transfer and the next send frames of tcp_bulk_slice, so a
  // reply, here or on another session of the loop, waits behind little.
  // A link whose last two transfers saw none carries bulk data alone (a
  // tensor echo, a checkpoint): each frame then doubles the slice, up to
  // kBulkChunkBytes, and it stays there for the quiet transfers that
  // follow, so they pay one sendmsg and about one recv per MiB instead of
  // sixteen.  The receiver takes a frame in recv calls as large as the
  // kernel gives when its loop has no other session and no slot frame went
  // by since the frame began; otherwise one slice per call, as before (the
  // loop's other sessions wait for each copy, and the sender cannot see
  // them).
  // Counting is one increment per slot frame; the rest happens once per
  // bulk data frame.
  uint64_t slot_frames_at_start_ = 0;  // owner's slot_frames_ when the transfer started
  uint64_t slot_frames_at_data_ = 0;   // ... when the bulk data frame being received began
  uint64_t bulk_recvs_ = 0;            // recv calls made for bulk data (for tests)
  bool shared_now_ = false;            // a slot frame went by during this transfer
  bool shared_before_ = false;         // ... during the previous one
  uint32_t send_slice_ = 0;            // the current slice (0: none chosen yet)

  // Pushes (set_push_limit / accept_pushes).
  uint64_t push_limit_ = 0;
  std::vector<uint32_t> push_ready_;   // sender: exposed, waiting for the request's post
  bool accepts_pushes_ = false;
  std::vector<PushIn> pushes_in_;      // receiver, at most kMaxBulkReads
  bool parked_ = false;                // a push waits for a read (see accept_pushes)
  uint32_t push_rkey_ = 0;             // the push whose frame is being (or waits to be) read
  uint32_t push_frame_left_ = 0;       // bytes of that frame not yet handed to a part
  uint64_t parked_poll_ = 0;           // the owner's poll in which it parked
  uint64_t parked_mark_ = 0;           // the owner's completions_queued_ then
  bool push_resume_ = false;           // claimed or dropped: staging to parse at the next poll
  bool push_watched_ = false;          // in owner_.push_watch_
  uint64_t pushes_claimed_ = 0;        // for tests (sent and dropped are in stats_)

  // Bulk lane state.  A session link: lane_ (guarded by the lanes' lock),
  // and while a FENCE waits, fenced_ / fence_at_ (parsing stops there and
  // EPOLLIN is off).  A lane (lane_mode_): its session link (context_),
  // its byte counts for fences, and the offset a waiting FENCE watches.
  std::unique_ptr<TcpLink> lane_;
  bool lane_mode_ = false;
  bool fenced_ = false;
  uint64_t fence_at_ = 0;
  uint64_t lane_token_ = 0;           // server: offered, not yet claimed
  uint64_t lane_threshold_ = 0;       // configure(): the session's tcp_bulk_lane
  uint64_t lane_out_ = 0;             // lane mode: bytes handed to the kernel
  std::atomic<uint64_t> lane_in_{0};  // lane mode: bytes received and in place
  std::atomic<uint64_t> fence_watch_{0};  // lane mode: 0, or what a FENCE waits for
};

}  // namespace slotrpc::transport
