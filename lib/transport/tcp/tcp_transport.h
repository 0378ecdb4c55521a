// TCP transport: slot-ring frames over a stream socket (Boost.Asio socket,
// non-blocking, TCP_NODELAY), for hosts without an RDMA device.
//
// Frame on the wire (little-endian):
//   u32 word   bit 31 = lane (0 slot, 1 control), bits 0..30 = body length
//   u32 imm    transport::make_imm(slot, generation)
//   body       `length` bytes: header + payload (slot lane, written straight
//              into the receive slot) or one 32-byte header (control lane)
//
// Copies, for docs/design.md: sending is writev() straight from the send
// slot (the kernel copies into the socket buffer).  Receiving, recv() fills a
// per-link staging buffer and the body is copied into the slot; a body
// larger than kDirectReadThreshold that has not arrived yet is read by recv()
// straight into the slot instead.
//
// Busy-poll vs blocking is the reactor's business: poll() never blocks, and
// wait_fd() is this transport's epoll fd, which the reactor sleeps on.
//
// Buffer budgets (docs/design.md, "Buffer budgets"): what a peer can make
// this side hold is bounded.
//   * Output the peer has not read: at most output_budget(S, B) bytes per
//     link before the link stops reading from that peer (EPOLLIN dropped,
//     so the peer's own socket fills: TCP backpressure); reading resumes
//     once the queue is back under half the budget.  A peer that has read
//     nothing for peer_timeout_ms while output is queued is closed.
//   * Completions read but not yet polled: reading stops for this poll once
//     kReadyLimit are queued, so the queue holds at most kReadyLimit plus
//     one staging buffer's worth of frames.
//
// The links (one per connection; their bulk transfers, pushes, lanes and
// TLS) are in tcp_link.h.
#pragma once

#include <sys/epoll.h>
#include <sys/uio.h>

#include <boost/asio/io_context.hpp>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "slotrpc/config.h"
#include "transport/tcp/bulk_lanes.h"
#include "transport/tcp/tcp_link.h"
#include "transport/tls/tls_stream.h"
#include "transport/transport.h"

namespace slotrpc::transport {

class TcpTransport final : public Transport {
 public:
  // Uses config.peer_timeout_ms for the drain timeout (a link whose peer
  // reads nothing for that long while output is queued is closed) and
  // config.tcp_bulk_slice (clamped to 4 KiB .. kBulkChunkBytes).
  // kLanes: the transport of a BulkLanes (its links are lanes: bulk frames
  // only, no lanes of their own, no low-water mark, kLaneSlice slices).
  enum class Role : uint8_t { kLoop, kLanes };
  explicit TcpTransport(const Config& config = Config{}, Role role = Role::kLoop);
  ~TcpTransport() override;

  // Takes ownership of a connected socket (handshake already done on it).
  // Sets O_NONBLOCK and TCP_NODELAY and watches it with epoll.  `tls`: the
  // connection's TLS stream (its handshake done), which the link then
  // reads and writes through.
  Result<std::unique_ptr<TcpLink>> adopt(int fd, std::string description,
                                         std::shared_ptr<tls::Stream> tls = nullptr);

  std::string_view name() const override { return "tcp"; }
  size_t poll(std::span<Completion> out) override;
  int wait_fd() const override { return epoll_fd_; }
  bool prepare_sleep() override {
    return ready_head_ == ready_.size() && !lanes_pending() && push_watch_.empty() &&
           (tls_watch_.empty() || !tls_readable());
  }

  static constexpr size_t kStagingBytes = 256 * 1024;
  static constexpr uint32_t kDirectReadThreshold = 16 * 1024;
  static constexpr uint32_t kControlLaneBit = 0x8000'0000u;

  // Bulk frames (docs/protocol.md, "TCP bulk frames"): prefix word
  // kBulkMarker | type, imm 0, a 32-byte bulk header, data (READ_DATA,
  // WRITE_DATA).  Control frames never have bit 30 set (their length is
  // 32), slot frames never bit 31.
  static constexpr uint32_t kBulkMarker = 0xC000'0000u;
  static constexpr uint32_t kBulkReadRequest = 1;
  static constexpr uint32_t kBulkReadData = 2;
  static constexpr uint32_t kBulkWriteData = 3;
  // The largest data frame a link accepts from its peer (protocol limit,
  // and the largest Config::tcp_bulk_slice).
  static constexpr uint32_t kBulkChunkBytes = 1024 * 1024;
  // Config::tcp_bulk_slice (SLOTRPC_TCP_BULK_SLICE), the tuning knob of TCP
  // bulk (docs/tuning.md, "TCP bulk slices"): bytes per data frame this
  // side sends while calls share the connection (a connection carrying
  // bulk data alone grows its frames: TcpLink::next_slice).  The loop hands
  // the kernel at most two frames of bulk data per flush, and while bulk
  // data is queued the socket's TCP_NOTSENT_LOWAT is two frames: the
  // kernel takes no more once that much of it is unsent, so a frame posted
  // later queues behind at most that much in the socket (and goes ahead of
  // the bulk frames still in the link's own queue).  The socket's own
  // value comes back once the link has no bulk output left, so slot
  // traffic never runs under it.  The receiver takes at most a slice per
  // recv() too, unless it is its loop's one session and no call went by
  // (then as much of the frame as the kernel has).
  uint32_t bulk_slice() const { return bulk_slice_; }
  // The TCP_NOTSENT_LOWAT of a link whose bulk data shares the connection
  // with calls (two slices; a link whose slice has grown uses two of its
  // own).
  int bulk_notsent_lowat() const { return static_cast<int>(2 * bulk_slice_); }
  // Times this loop's lane thread went to sleep (0 before its first lane;
  // for tests of Config::tcp_lane_spin_us).
  uint64_t lane_sleeps() const;
  // The lane thread's kernel thread id (0 before its first lane; for tests
  // of where it runs).
  pid_t lane_thread_id() const;
  // Bytes the links of this transport have received or sent: a sign of
  // work for the lane thread (BulkLanes::run) and the event loop
  // (Reactor::run_turn), since a transfer's data moves without a
  // completion until its end.  (Bytes, not socket events: an event that
  // moves nothing is no work.)
  uint64_t bytes_moved() const override { return bytes_moved_; }
  // Read requests a link has outstanding at its peer, and serves for it.
  static constexpr size_t kMaxBulkReads = 16;

  // Wire bytes of one control frame (8-byte prefix + 32-byte header).
  static constexpr uint64_t kControlFrameBytes = 8 + transport::kHeaderSize;
  // Control frames a well-behaved session may have queued besides its
  // slot frames: cancels and stream grants are at most two per slot (one
  // more can only be queued after the peer read the request that follows
  // the first), PINGs one per keepalive_ms, PONGs one per PING received
  // and coalesced by the session, so a fixed spare covers them.
  static constexpr uint64_t kSpareControlFrames = 64;
  // The most unsent output a link holds before it stops reading: every slot
  // full (one frame per slot: the credit protocol allows no more) plus the
  // control frames above.  Output under this is never what a peer can
  // multiply; output over it is only ever what a peer caused by not reading.
  static constexpr uint64_t output_budget(uint32_t slot_count, uint32_t slot_size) {
    return uint64_t{slot_count} * (8 + uint64_t{slot_size}) +
           (4 * uint64_t{slot_count} + kSpareControlFrames) * kControlFrameBytes;
  }
  // Completions queued for poll() before reading pauses until they are taken.
  static constexpr size_t kReadyLimit = 1024;
  uint32_t peer_timeout_ms() const { return peer_timeout_ms_; }

  // ---- Bulk lanes (bulk_lanes.h) ----
  // Exposures of at least this many bytes go on a session's lane, if it
  // has one (Config::tcp_bulk_lane; 0: lanes off).
  uint64_t lane_min_bytes() const { return lane_min_; }
  // Slot frames every link of this transport sent or received: the loop's
  // small calls, which a link's growing bulk slices must not hold up
  // (TcpLink::next_slice).
  uint64_t slot_frames() const { return slot_frames_; }
  // Slice of lane transfers: the largest frame, since nothing small shares
  // a lane's socket or thread.  Measured against 256 KiB (docs/benchmarks.md,
  // "TCP bulk lanes: 1 MiB slices"): one-way 64 MiB-1 GiB about 5 GB/s
  // instead of 3.2-6.5, a 1 MiB echo 1.47-1.65x the socket ping-pong
  // instead of 1.70-1.94x, small calls beside a 1 GiB echo within 2x of
  // idle in the median run (their worst run was no better).
  static constexpr uint32_t kLaneSlice = 1024 * 1024;
  // Rkeys of lane exposures have this bit; the session link's own stay below.
  static constexpr uint32_t kLaneKeyBit = 0x8000'0000u;
  // FENCE: a bulk frame with no data on a session's connection; addr is
  // the sender's lane byte count the frames after it wait for.
  static constexpr uint32_t kBulkFence = 4;
  // PUSH_DATA (docs/protocol.md, "TCP bulk frames"): read data its owner
  // sends unasked, right behind the request that offers the range, so the
  // reader saves the READ_REQ's trip (TcpLink::set_push_limit).  A push
  // carries at most kMaxPushBytes in all.
  static constexpr uint32_t kBulkPushData = 5;
  static constexpr uint64_t kMaxPushBytes = 16 * 1024 * 1024;
  // A link that accepts pushes reads at most this much into staging with
  // the first recv of a burst (kStagingBytes otherwise): the bytes of a
  // push that arrive with its request in that recv are copied once more,
  // the rest is received in place.
  static constexpr size_t kPushReadAhead = 64 * 1024;
  // Server loop: the connection `fd` presented `token` (TcpLink::offer_lane)
  // in its lane Hello; it becomes that link's lane.  Takes the fd.
  Status accept_lane(uint64_t token, int fd);
  // The same for a token as the handshake carried it (its size checked).
  Status accept_attachment(std::span<const std::byte> token, int fd) override;
  // The lane transport's completions for `link`, removed from its queue.
  std::vector<Completion> take_completions_of(TcpLink* link);
  // For tests: the lane thread's lock (null before the first lane), to
  // hold every lane of this loop still.
  std::mutex* lanes_mutex();

 private:
  friend class TcpLink;
  void push_completion(const Completion& c) {
    ready_.push_back(c);
    ++completions_queued_;
  }
  size_t backlog() const { return ready_.size() - ready_head_; }
  void forget(TcpLink* link);  // purge queued completions of a dying link
  void stall(TcpLink* link);
  void unstall(TcpLink* link);
  // Closes every stalled link whose peer has read nothing for the timeout.
  void check_stalled();
  void handle_event(const epoll_event& e);
  // Links with a parked push or a claimed one to resume (TcpLink::parked_):
  // poll() settles them first, see check_pushes().
  void watch_push(TcpLink* link);
  void check_pushes();
  // TLS links whose Stream holds input epoll cannot see (tcp_tls_io.cc):
  // poll() reads them until it is gone; the loop does not sleep while one
  // of them may read.
  void watch_tls(TcpLink* link);
  void check_tls();
  bool tls_readable() const;
  Result<BulkLanes*> lanes();  // started on the first lane
  bool lanes_pending() const;
  void drain_lane_events();

  uint32_t peer_timeout_ms_;
  uint32_t bulk_slice_;
  Role role_;
  uint64_t lane_min_;
  Config config_;  // what the lane transport is made from
  std::unique_ptr<BulkLanes> lanes_;
  // Lane events being applied by drain_lane_events (a failing link takes
  // its own from here, so none is applied after its kLinkDown).
  std::vector<BulkLanes::Event> lane_batch_;
  size_t lane_batch_pos_ = 0;
  std::unordered_map<uint64_t, TcpLink*> lane_offers_;  // token -> link (server)

  boost::asio::io_context io_;  // owns the sockets; never run (we poll with epoll)
  int epoll_fd_ = -1;
  int epoll_errno_ = 0;  // why epoll_create1 failed, reported by adopt()
  size_t live_links_ = 0;  // links must not outlive the transport (they use io_)
  uint64_t slot_frames_ = 0;  // slot_frames()
  uint64_t polls_ = 0;        // poll() calls: a push parks for at least one turn
  uint64_t bytes_moved_ = 0;  // bytes_moved()
  uint64_t completions_queued_ = 0;  // ever pushed to ready_ ...
  uint64_t completions_taken_ = 0;   // ... and handed out by poll()
  std::vector<TcpLink*> push_watch_;
  std::vector<TcpLink*> tls_watch_;
  std::vector<iovec> iov_;  // writev scratch shared by all links (one thread)
  std::vector<Completion> ready_;
  size_t ready_head_ = 0;
  // Links with output queued, checked by poll() for the drain timeout.
  std::vector<TcpLink*> stalled_;
  // Events from the last epoll_wait not handled yet (the ready queue was
  // full): handled first by the next poll(), in order, so no link starves.
  static constexpr int kMaxEvents = 64;
  epoll_event events_[kMaxEvents];
  int event_head_ = 0;
  int event_count_ = 0;
};

}  // namespace slotrpc::transport
