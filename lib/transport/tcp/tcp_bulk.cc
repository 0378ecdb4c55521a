// TcpLink's bulk transfers (issue 12) and its side of the bulk lanes: the
// exposure table, READ_REQ / READ_DATA / WRITE_DATA / FENCE frames, the
// chunking and slicing that keeps small calls moving beside them, and the
// glue to a session's lane (bulk_lanes.h).  The framing and the session
// half of TcpLink are in tcp_transport.cc; tcp_transport.h says how the
// two halves share the link's state.
#include "transport/tcp/tcp_transport.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/logging.h"
#include "transport/tcp/bulk_lanes.h"
#include "transport/tcp/tcp_frame.h"

namespace slotrpc::transport {

using namespace tcp_frame;

// ------------------------------------------------------------ TcpLink bulk
//
// Bulk header (32 bytes, little-endian), docs/protocol.md "TCP bulk frames":
//   u32 rkey  u32 status  u64 tag  u64 addr  u64 length

namespace {

struct BulkHeader {
  uint32_t rkey = 0;
  uint32_t status = 0;
  uint64_t tag = 0;
  uint64_t addr = 0;
  uint64_t length = 0;
};

// One object for every TCP link of the process: see bulk_domain().
const char tcp_bulk_domain = 0;

}  // namespace

const void* TcpLink::bulk_domain() const { return &tcp_bulk_domain; }

uint64_t TcpTransport::lane_sleeps() const { return lanes_ != nullptr ? lanes_->sleeps() : 0; }
pid_t TcpTransport::lane_thread_id() const { return lanes_ != nullptr ? lanes_->thread_id() : 0; }

Result<BulkRegistration> TcpLink::register_bulk(const BulkSource& source) {
  // Nothing to pin: sendmsg and recv reach any host memory.
  return register_host_memory(source, bulk_domain(),
                              "tcp cannot send from or receive into dma-buf (device) memory: copy it "
                              "to host memory first, or use verbs");
}

void TcpLink::deregister_bulk(BulkRegistration& registration) { registration = {}; }

Result<RemoteSegment> TcpLink::expose(const BulkRegistration& registration, size_t offset,
                                      size_t length, BulkAccess access) {
  if (Status st = check_expose(registration, bulk_domain(), "tcp", offset, length, access); !st.ok())
    return st;
  if (down_) return Status(StatusCode::kUnavailable, "expose: link down: " + down_reason_);
  // A large range goes on the lane: the peer's link sees the lane bit in
  // the key and moves the bytes there.
  if (lane_ != nullptr && owner_.lane_min_ != 0 && length >= owner_.lane_min_) {
    std::lock_guard<std::mutex> lock(owner_.lanes_->mu());
    return lane_->expose(registration, offset, length, access);
  }
  // The session's link hands out keys below kLaneKeyBit, its lane the
  // rest (TcpLink's constructor and attach_lane).
  auto rkey = exposures_.add(registration.base + offset, length, access);
  if (!rkey.ok()) return rkey.status();
  if (access == BulkAccess::kRemoteRead && length <= push_limit_) push_ready_.push_back(rkey.value());
  // addr is opaque on TCP: the peer addresses the range from 0.
  return RemoteSegment{0, length, rkey.value()};
}

bool TcpLink::revoke(const RemoteSegment& segment, uint64_t token) {
  if (!lane_mode_ && (segment.rkey & TcpTransport::kLaneKeyBit) != 0) {
    // The lane is gone only once this link failed: nothing reaches the
    // memory any more.
    if (lane_ == nullptr) return true;
    std::lock_guard<std::mutex> lock(owner_.lanes_->mu());
    return lane_->revoke(segment, token);
  }
  if (!exposures_.erase(segment.rkey)) return true;
  if (down_) return true;
  if (!push_ready_.empty()) std::erase(push_ready_, segment.rkey);
  // Write data being received into the range right now: the rest of the
  // chunk is dropped (the next chunk names a revoked key and fails the link).
  if (in_body_ && rx_ == Rx::kBulkData && bulk_type_ == TcpTransport::kBulkWriteData &&
      bulk_write_rkey_ == segment.rkey)
    body_dest_ = nullptr;
  // Reads served from the range: the ones not started end with an error
  // frame now; the one with a chunk in the kernel's hands (sendmsg may
  // still read that memory) ends once the chunk is out, and so does the
  // revoke.
  bool done = true;
  for (size_t i = 0; i < serves_.size();) {
    ServeJob& j = serves_[i];
    if (j.rkey != segment.rkey) {
      ++i;
      continue;
    }
    if (i == 0 && serve_in_flight_) {
      j.revoked = true;
      j.revoke_token = token;
      done = false;
      ++i;
      continue;
    }
    // A push the peer has not seen a byte of just stops.
    if (!j.push || j.sent != 0) end_serve_early(j);
    serves_.erase(serves_.begin() + static_cast<ptrdiff_t>(i));
  }
  flush_or_kick();
  return done || down_;
}

Status TcpLink::check_transfer(const char* what, const BulkRegistration& local,
                               size_t local_offset, const RemoteSegment& remote,
                               uint64_t remote_offset, size_t length, bool* on_lane) const {
  if (Status st = check_transfer_args(what, "tcp", local, bulk_domain(), local_offset, remote,
                                      remote_offset, length, attached_, down_, down_reason_);
      !st.ok())
    return st;
  *on_lane = !lane_mode_ && (remote.rkey & TcpTransport::kLaneKeyBit) != 0;
  if (*on_lane && lane_ == nullptr)
    return Status(StatusCode::kInvalidArgument,
                  std::string(what) + ": the peer exposed the range on a bulk lane, and this session has none");
  return Status::ok_status();
}

Status TcpLink::read(const BulkRegistration& local, size_t local_offset, const RemoteSegment& remote,
                     uint64_t remote_offset, size_t length, uint64_t token) {
  bool on_lane = false;
  if (Status st = check_transfer("read", local, local_offset, remote, remote_offset, length, &on_lane);
      !st.ok())
    return st;
  if (on_lane) {
    std::lock_guard<std::mutex> lock(owner_.lanes_->mu());
    return lane_->read(local, local_offset, remote, remote_offset, length, token);
  }
  // The range's owner pushed it and its next bytes wait for a read: no
  // READ_REQ.
  if (!pushes_in_.empty() && claim_push(local.base + local_offset, remote, remote_offset, length, token))
    return Status::ok_status();
  ReadOp op;
  op.token = token;
  op.tag = next_read_tag_++;
  op.dest = local.base + local_offset;
  op.length = length;
  op.rkey = remote.rkey;
  op.addr = remote.addr + remote_offset;
  reads_.push_back(op);
  request_reads();
  flush_or_kick();
  return Status::ok_status();
}

Status TcpLink::write(const BulkRegistration& local, size_t local_offset,
                      const RemoteSegment& remote, uint64_t remote_offset, size_t length,
                      uint64_t token) {
  bool on_lane = false;
  if (Status st = check_transfer("write", local, local_offset, remote, remote_offset, length, &on_lane);
      !st.ok())
    return st;
  if (on_lane) {
    std::lock_guard<std::mutex> lock(owner_.lanes_->mu());
    return lane_->write(local, local_offset, remote, remote_offset, length, token);
  }
  // Chunk by chunk (write_next): nothing is copied, each queued chunk
  // points into the caller's memory; the kBulkDone follows the last one.
  WriteJob j;
  j.token = token;
  j.rkey = remote.rkey;
  j.addr = remote.addr + remote_offset;
  j.src = local.base + local_offset;
  j.length = length;
  if (serves_.empty() && writes_.empty()) transfer_started();
  writes_.push_back(j);
  write_next();
  flush_or_kick();
  return Status::ok_status();
}

void TcpLink::enqueue_bulk(uint32_t type, uint32_t rkey, uint32_t status, uint64_t tag,
                           uint64_t addr, uint64_t length, const std::byte* body,
                           uint32_t body_len) {
  // READ_REQs are small frames; data frames (and a failed read's frame,
  // which must follow the chunks of its read) wait behind them.
  // A FENCE is a small frame too: ordered with the slot frames after it.
  const bool small = type == TcpTransport::kBulkReadRequest || type == TcpTransport::kBulkFence;
  if (type == TcpTransport::kBulkReadRequest || type == TcpTransport::kBulkWriteData) ++stats_.bulk_requests;
  PendingWrite& w = (small ? pending_ : bulk_pending_).emplace_back();
  std::byte* h = w.head.data();
  store_u32_le(h, TcpTransport::kBulkMarker | type);
  store_u32_le(h + 4, 0);
  store_u32_le(h + 8, rkey);
  store_u32_le(h + 12, status);
  store_u64_le(h + 16, tag);
  store_u64_le(h + 24, addr);
  store_u64_le(h + 32, length);
  w.head_len = kPrefixSize + core::kHeaderSize;
  w.body = body;
  w.body_len = body_len;
  w.sent = 0;
  w.bulk_body = body_len != 0;
  queued_bytes_ += w.head_len + w.body_len;
  bulk_queued_ += w.body_len;
  if (w.body_len != 0 && !bulk_lowat_) bulk_output_changed();
}

void TcpLink::bulk_output_changed() {
  // A lane carries nothing small: no frame there needs the mark.
  if (lane_mode_) return;
  const bool want = bulk_queued_ != 0 || !serves_.empty() || !writes_.empty();
  // Two frames of the current slice: a grown slice (next_slice) takes the
  // mark with it, or the kernel would take a 1 MiB frame in pieces of 128
  // KiB, a wake-up for EPOLLOUT between each (measured: a third slower).
  const int mark = 2 * static_cast<int>(frame_slice());
  if ((want == bulk_lowat_ && (!want || mark == lowat_mark_)) || down_) return;
  const int fd = socket_.native_handle();
  if (saved_lowat_ < 0) {
    socklen_t len = sizeof saved_lowat_;
    if (::getsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &saved_lowat_, &len) != 0) saved_lowat_ = -1;
  }
  // Without the old value there is nothing to restore: leave it alone.
  if (saved_lowat_ < 0) return;
  const int v = want ? mark : saved_lowat_;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &v, sizeof v) == 0) {
    bulk_lowat_ = want;
    lowat_mark_ = want ? mark : 0;
  }
}

int TcpLink::notsent_lowat() {
  int v = -1;
  socklen_t len = sizeof v;
  if (down_ || ::getsockopt(socket_.native_handle(), IPPROTO_TCP, TCP_NOTSENT_LOWAT, &v, &len) != 0) return -1;
  return v;
}

void TcpLink::request_reads() {
  for (size_t i = reads_requested_; i < reads_.size() && reads_requested_ < TcpTransport::kMaxBulkReads;
       ++i) {
    ReadOp& r = reads_[i];
    enqueue_bulk(TcpTransport::kBulkReadRequest, r.rkey, 0, r.tag, r.addr, r.length, nullptr, 0);
    r.requested = true;
    ++reads_requested_;
  }
}

std::deque<TcpLink::ReadOp>::iterator TcpLink::find_read(uint64_t tag) {
  auto it = reads_.begin();
  while (it != reads_.end() && it->requested && it->tag != tag) ++it;
  return it != reads_.end() && it->requested ? it : reads_.end();
}

void TcpLink::end_read(std::deque<ReadOp>::iterator it, StatusCode code) {
  const uint64_t token = it->token;
  reads_.erase(it);
  --reads_requested_;
  bulk_done(token, code);
  request_reads();
}


void TcpLink::transfer_started() {
  shared_before_ = shared_now_;
  shared_now_ = false;
  slot_frames_at_start_ = owner_.slot_frames();
}

uint32_t TcpLink::frame_slice() const { return std::max(send_slice_, owner_.bulk_slice()); }

void TcpLink::note_slot_frames() {
  if (owner_.slot_frames() != slot_frames_at_start_) shared_now_ = true;
}

uint32_t TcpLink::next_slice() {
  const uint32_t base = owner_.bulk_slice();
  // A lane carries nothing small, and its slice is already the largest.
  if (lane_mode_) return base;
  note_slot_frames();
  if (shared_now_ || shared_before_ || send_slice_ < base) {
    send_slice_ = base;
  } else {
    send_slice_ = std::min(send_slice_ * 2, TcpTransport::kBulkChunkBytes);
  }
  if (bulk_lowat_) bulk_output_changed();  // the mark follows the slice (once per change)
  return send_slice_;
}

void TcpLink::serve_next() {
  if (serve_in_flight_ || serves_.empty() || down_) return;
  ServeJob& j = serves_.front();
  const uint32_t n =
      static_cast<uint32_t>(std::min<uint64_t>(j.length - j.sent, next_slice()));
  enqueue_serve(j, 0, n);
  bulk_pending_.back().on_sent = OnSent::kServeChunk;
  j.sent += n;
  serve_in_flight_ = true;
}

void TcpLink::write_next() {
  if (write_in_flight_ || writes_.empty() || down_) return;
  WriteJob& j = writes_.front();
  const uint32_t n =
      static_cast<uint32_t>(std::min<uint64_t>(j.length - j.sent, next_slice()));
  enqueue_bulk(TcpTransport::kBulkWriteData, j.rkey, 0, 0, j.addr + j.sent, n, j.src + j.sent, n);
  bulk_pending_.back().on_sent = OnSent::kWriteChunk;
  j.sent += n;
  write_in_flight_ = true;
}

void TcpLink::write_chunk_sent() {
  write_in_flight_ = false;
  WriteJob j = writes_.front();
  writes_.pop_front();
  if (j.sent < j.length) {
    writes_.push_back(j);  // round robin between this side's writes
  } else {
    bulk_done(j.token, StatusCode::kOk, /*wrote=*/true);  // every byte is in the kernel's hands
  }
  write_next();
  // The transfer's last frame is in the kernel's hands: a slot frame
  // during it counts too (no next_slice saw it).
  if (writes_.empty() && serves_.empty()) note_slot_frames();
}

void TcpLink::serve_chunk_sent() {
  serve_in_flight_ = false;
  ServeJob j = serves_.front();
  serves_.pop_front();
  if (j.revoked) {
    // The memory is ours again only now that the kernel has the chunk.
    if (j.sent < j.length) end_serve_early(j);
    bulk_done(j.revoke_token, StatusCode::kOk);
  } else if (j.sent < j.length) {
    serves_.push_back(j);  // round robin between the peer's reads
  }
  serve_next();
  // The transfer's last frame is in the kernel's hands: a slot frame
  // during it counts too (no next_slice saw it).
  if (writes_.empty() && serves_.empty()) note_slot_frames();
}

void TcpLink::bulk_done(uint64_t token, StatusCode code, bool wrote) {
  Completion c;
  c.kind = Completion::Kind::kBulkDone;
  c.imm = wrote ? 1 : 0;  // read by BulkLanes (a lane write needs a fence)
  c.context = context_;
  c.link = this;
  c.bulk_token = token;
  c.bulk_status = static_cast<uint16_t>(code);
  owner_.push_completion(c);
}

bool TcpLink::on_bulk_header() {
  BulkHeader h;
  const std::byte* p = bulk_head_.data();
  h.rkey = load_u32_le(p);
  h.status = load_u32_le(p + 4);
  h.tag = load_u64_le(p + 8);
  h.addr = load_u64_le(p + 16);
  h.length = load_u64_le(p + 24);
  // Checks the peer's access against an exposure; every failure fails the
  // link before a byte moves (verbs: a remote access error).
  auto check = [&](BulkAccess want, const char* what) -> const Exposure* {
    std::string why;
    const Exposure* e = exposures_.check_peer_access(h.rkey, want, h.addr, h.length, what, &why);
    if (e == nullptr) fail(std::move(why));
    return e;
  };
  switch (bulk_type_) {
    case TcpTransport::kBulkReadRequest: {
      const Exposure* e = check(BulkAccess::kRemoteRead, "read");
      if (e == nullptr) return false;
      // Pushes are this side's own sends, not the peer's reads.
      const auto asked = std::count_if(serves_.begin(), serves_.end(),
                                       [](const ServeJob& s) { return !s.push; });
      if (static_cast<size_t>(asked) >= TcpTransport::kMaxBulkReads) {
        fail("peer has more than " + std::to_string(TcpTransport::kMaxBulkReads) +
             " bulk reads outstanding");
        return false;
      }
      if (serves_.empty() && writes_.empty()) transfer_started();
      serves_.push_back(ServeJob{h.tag, h.rkey, e->base + h.addr, h.length, 0, false, 0});
      serve_next();
      flush_pending();
      return !down_;
    }
    case TcpTransport::kBulkReadData: {
      auto it = find_read(h.tag);
      if (it == reads_.end()) {
        fail("peer sent read data for unknown read " + std::to_string(h.tag));
        return false;
      }
      if (h.status != 0) {
        // The peer revoked the range while serving it (its call ended).
        if (h.length != 0) {
          fail("peer sent a failed read with data");
          return false;
        }
        end_read(it, peer_failure_status(h.status));
        flush_pending();
        return !down_;
      }
      if (h.addr != it->got || h.length == 0 || h.length > TcpTransport::kBulkChunkBytes ||
          h.length > it->length - it->got) {
        fail("peer sent read data " + std::to_string(h.addr) + "+" + std::to_string(h.length) +
             " out of order or beyond read " + std::to_string(h.tag) + " of " +
             std::to_string(it->length) + " bytes");
        return false;
      }
      rx_ = Rx::kBulkData;
      slot_frames_at_data_ = owner_.slot_frames();
      bulk_read_tag_ = h.tag;
      body_dest_ = it->dest + it->got;
      it->got += h.length;
      break;
    }
    case TcpTransport::kBulkWriteData: {
      if (h.length > TcpTransport::kBulkChunkBytes) {
        fail("peer sent a write chunk of " + std::to_string(h.length) + " bytes");
        return false;
      }
      const Exposure* e = check(BulkAccess::kRemoteWrite, "wrote");
      if (e == nullptr) return false;
      rx_ = Rx::kBulkData;
      slot_frames_at_data_ = owner_.slot_frames();
      bulk_write_rkey_ = h.rkey;
      body_dest_ = e->base + h.addr;
      break;
    }
    case TcpTransport::kBulkPushData:
      return on_push_header(h.rkey, h.status, h.tag, h.addr, h.length);
    case TcpTransport::kBulkFence:
      if (lane_mode_ || lane_ == nullptr) {
        fail("peer sent a FENCE on a link without a bulk lane");
        return false;
      }
      return on_fence(h.addr);
    default:
      fail("bulk frame of unknown type");
      return false;
  }
  in_body_ = true;
  body_control_ = false;
  body_len_ = static_cast<uint32_t>(h.length);
  body_got_ = 0;
  return true;
}

// ------------------------------------------------------------ pushes
//
// docs/design.md, "TCP: pushes".  A read costs the reader a READ_REQ and
// the owner a loop turn before the first byte moves: one trip across the
// connection more than the request alone.  So the owner of a small enough
// range sends it unasked, as PUSH_DATA frames right behind the request
// that offers it, and the reader takes them straight into the memory its
// read_bulk names.  The reader cannot know that memory before its handler
// runs, so the push's first frame *parks*: its header is read, and the
// link reads nothing more until either the handler's read claims the push
// (from its first byte: the whole range, or a first piece of it) or every
// message that came before the push has been handed out and the loop has
// gone round once (then the push is dropped, read and thrown away, and the
// handler's later read sends a READ_REQ as always).  A read of a first
// piece parks the push again where that read ends, even inside a frame,
// so that the handler's read of the next piece (per page, say) claims it
// in turn; the same turn rule drops it if none comes.  Parking never lasts
// more than a turn or two of the loop, and bytes never land anywhere but
// in a read's destination.

void TcpLink::set_push_limit(uint64_t bytes) {
  push_limit_ = std::min<uint64_t>(bytes, TcpTransport::kMaxPushBytes);
  if (lane_mode_) push_limit_ = 0;
}

void TcpLink::accept_pushes(bool on) { accepts_pushes_ = on && !lane_mode_; }

void TcpLink::start_pushes() {
  // The receiver refuses a push beyond kMaxBulkReads under way at once
  // (protocol.md), and push jobs are served round robin, so each one
  // started counts until its last frame is in the kernel.  A range over
  // that bound is not pushed: the reader asks for it with a READ_REQ.
  size_t pushing = static_cast<size_t>(
      std::count_if(serves_.begin(), serves_.end(), [](const ServeJob& s) { return s.push; }));
  for (const uint32_t rkey : push_ready_) {
    const Exposure* e = exposures_.find(rkey);
    if (e == nullptr) continue;  // revoked before its request left
    if (pushing >= TcpTransport::kMaxBulkReads) break;
    ++pushing;
    if (serves_.empty() && writes_.empty()) transfer_started();
    ServeJob j;
    j.tag = e->length;  // a push's frames carry its total
    j.rkey = rkey;
    j.src = e->base;
    j.length = e->length;
    j.push = true;
    serves_.push_back(j);
    ++stats_.bulk_pushes;
  }
  push_ready_.clear();
  serve_next();
}

void TcpLink::enqueue_serve(const ServeJob& j, uint32_t status, uint32_t n) {
  // A push names its range (the reader has no tag of its own for it); a
  // served read names the reader's tag.
  enqueue_bulk(j.push ? TcpTransport::kBulkPushData : TcpTransport::kBulkReadData,
               j.push ? j.rkey : 0, status, j.tag, j.sent, n, n != 0 ? j.src + j.sent : nullptr, n);
}

void TcpLink::end_serve_early(const ServeJob& j) {
  enqueue_serve(j, static_cast<uint32_t>(StatusCode::kUnavailable), 0);
}

std::vector<TcpLink::PushIn>::iterator TcpLink::find_push(uint32_t rkey) {
  return std::find_if(pushes_in_.begin(), pushes_in_.end(),
                      [rkey](const PushIn& p) { return p.rkey == rkey; });
}

bool TcpLink::on_push_header(uint32_t rkey, uint32_t status, uint64_t total, uint64_t addr,
                             uint64_t length) {
  auto refuse = [this, rkey](const std::string& why) {
    fail("peer sent PUSH_DATA of rkey " + std::to_string(rkey) + " " + why);
    return false;
  };
  if (!accepts_pushes_) return refuse("to a side that did not announce pushes");
  auto it = find_push(rkey);
  if (status != 0) {
    // The owner revoked the range while pushing it (its call ended).
    if (length != 0) return refuse("that ends it and carries data");
    if (it == pushes_in_.end()) return refuse("that ends a push never started");
    if (it->state == PushIn::State::kClaimed) {
      auto r = find_read(it->read_tag);
      if (r != reads_.end()) end_read(r, peer_failure_status(status));
    }
    pushes_in_.erase(it);
    flush_pending();
    return !down_;
  }
  if (length == 0 || length > TcpTransport::kBulkChunkBytes)
    return refuse("with a frame of " + std::to_string(length) + " bytes (1.." +
                  std::to_string(TcpTransport::kBulkChunkBytes) + ")");
  if (it == pushes_in_.end()) {
    if (addr != 0 || total == 0 || total > TcpTransport::kMaxPushBytes || length > total)
      return refuse("that starts at " + std::to_string(addr) + " of " + std::to_string(total) +
                    " bytes (a push starts at 0 and carries 1.." +
                    std::to_string(TcpTransport::kMaxPushBytes) + ")");
    if (pushes_in_.size() >= TcpTransport::kMaxBulkReads)
      return refuse("while " + std::to_string(pushes_in_.size()) + " pushes are under way");
    PushIn p;
    p.rkey = rkey;
    p.total = total;
    p.got = length;
    pushes_in_.push_back(p);
    // Park: the frame's data stays where it is until a read claims it.
    push_frame_left_ = static_cast<uint32_t>(length);
    park(rkey);
    return true;
  }
  // (The parked state cannot be here: nothing is read while a push parks.)
  if (addr != it->got || total != it->total || length > it->total - it->got)
    return refuse("at " + std::to_string(addr) + "+" + std::to_string(length) +
                  ", out of order or beyond its " + std::to_string(it->total) + " bytes");
  it->got += length;
  push_frame_left_ = static_cast<uint32_t>(length);
  // The read of the piece before this frame may have ended with the last
  // frame: then the next piece's read claims it from here.
  if (!park_for_next_piece(it)) receive_push_part(it);
  return true;
}

bool TcpLink::park_for_next_piece(std::vector<PushIn>::iterator p) {
  if (p->state != PushIn::State::kClaimed || !waits_for_read(*p)) return false;
  p->state = PushIn::State::kParked;
  park(p->rkey);
  return true;
}

void TcpLink::park(uint32_t rkey) {
  parked_ = true;
  push_rkey_ = rkey;
  parked_poll_ = owner_.polls_;
  parked_mark_ = owner_.completions_queued_;
  owner_.watch_push(this);
}

void TcpLink::receive_push_part(std::vector<PushIn>::iterator p) {
  uint32_t n = push_frame_left_;
  push_rkey_ = p->rkey;
  rx_ = Rx::kBulkData;
  bulk_type_ = TcpTransport::kBulkPushData;
  slot_frames_at_data_ = owner_.slot_frames();
  body_dest_ = nullptr;  // dropped: read and thrown away (tag 0 is no read's)
  bulk_read_tag_ = 0;
  if (p->state == PushIn::State::kClaimed) {
    auto r = find_read(p->read_tag);
    if (r != reads_.end()) {
      n = static_cast<uint32_t>(std::min<uint64_t>(n, r->length - r->got));
      body_dest_ = r->dest + r->got;
      r->got += n;
      bulk_read_tag_ = r->tag;
    }
  }
  push_frame_left_ -= n;
  if (p->got == p->total && push_frame_left_ == 0) pushes_in_.erase(p);
  in_body_ = true;
  body_control_ = false;
  body_len_ = n;
  body_got_ = 0;
}

void TcpLink::end_push_part() {
  if (push_frame_left_ == 0) return;  // the frame is in: the next one has a header
  auto p = find_push(push_rkey_);
  if (p == pushes_in_.end()) return;  // cannot happen: erased only with its frame's last part
  // The claimed read took its piece (finish_frame ended it) and the frame
  // goes on: the next piece waits for its read, exactly where it starts.
  if (!park_for_next_piece(p)) receive_push_part(p);
}

bool TcpLink::claim_push(std::byte* dest, const RemoteSegment& remote, uint64_t remote_offset,
                         size_t length, uint64_t token) {
  auto it = find_push(remote.rkey);
  if (it == pushes_in_.end() || !waits_for_read(*it) || remote_offset != it->claimed ||
      length > it->total - it->claimed)
    return false;
  ReadOp op;
  op.token = token;
  op.tag = next_read_tag_++;
  op.dest = dest;
  op.length = length;
  op.rkey = remote.rkey;
  op.requested = true;  // as good as asked for: the requested prefix of reads_
  reads_.push_front(op);
  ++reads_requested_;
  const bool was_parked = it->state == PushIn::State::kParked;
  it->state = PushIn::State::kClaimed;
  it->read_tag = op.tag;
  it->claimed += length;
  ++pushes_claimed_;
  // Parked: its data is read from here on.  Otherwise the read of the
  // piece before ended with a frame, and the next frame's header, not read
  // yet, finds this read.
  if (was_parked) unpark(it);
  return true;
}

bool TcpLink::waits_for_read(const PushIn& p) {
  // Parked; or claimed by a read that has ended, the push going on (the
  // next frame, its header not read yet, parks unless a read comes first).
  return p.state == PushIn::State::kParked ||
         (p.state == PushIn::State::kClaimed && p.claimed < p.total &&
          find_read(p.read_tag) == reads_.end());
}

void TcpLink::drop_parked() {
  auto it = std::find_if(pushes_in_.begin(), pushes_in_.end(),
                         [](const PushIn& p) { return p.state == PushIn::State::kParked; });
  if (it == pushes_in_.end()) return;  // cannot happen: parked_ is cleared with pushes_in_
  it->state = PushIn::State::kDropped;
  ++stats_.bulk_pushes_dropped;
  unpark(it);
}

void TcpLink::unpark(std::vector<PushIn>::iterator p) {
  parked_ = false;
  receive_push_part(p);  // the parked frame's data, from where it waits
  // We may be on a handler's fiber (a claim): what staging holds is parsed
  // at the start of the next poll, and the socket is read from there on.
  push_resume_ = true;
  owner_.watch_push(this);
}

void TcpTransport::watch_push(TcpLink* link) {
  if (link->push_watched_) return;
  link->push_watched_ = true;
  push_watch_.push_back(link);
}

void TcpTransport::check_pushes() {
  for (size_t i = 0; i < push_watch_.size();) {
    TcpLink* link = push_watch_[i];
    // Every message queued before the push parked has been handed out, in
    // an earlier poll (so its handler ran in that turn): nobody claimed it.
    if (!link->down_ && link->parked_ && link->parked_poll_ != polls_ &&
        completions_taken_ >= link->parked_mark_)
      link->drop_parked();
    if (!link->down_ && !link->parked_ && link->push_resume_) {
      link->push_resume_ = false;
      link->parse_staging();  // may fail the link; the socket is read in this poll
    }
    if (link->down_ || (!link->parked_ && !link->push_resume_)) {
      link->push_watched_ = false;
      push_watch_[i] = push_watch_.back();
      push_watch_.pop_back();
    } else {
      ++i;
    }
  }
}

// ------------------------------------------------------------ bulk lanes
//
// bulk_lanes.h says why; the rules here: a session link owns its lane
// (lane_, touched only under the lanes' lock), the lane's context_ is the
// session link, and the lane thread's completions come back through
// TcpTransport::drain_lane_events on the loop thread.

void TcpLink::flush_or_kick() {
  // A lane's output queued from the loop thread goes out from the lane
  // thread: EPOLLOUT wakes it, and the copy never runs on the loop.
  if (lane_mode_) {
    update_epoll_interest();
  } else {
    flush_pending();
  }
}

void TcpLink::lane_received(uint64_t n) {
  const uint64_t in = lane_in_.fetch_add(n, std::memory_order_acq_rel) + n;
  uint64_t watch = fence_watch_.load(std::memory_order_acquire);
  if (watch == 0 || in < watch || !fence_watch_.compare_exchange_strong(watch, 0)) return;
  // Lane mode has no control frames: kControl here means "the FENCE your
  // session link waits at is passed" (BulkLanes::to_event).
  Completion c;
  c.kind = Completion::Kind::kControl;
  c.context = context_;
  c.link = this;
  owner_.push_completion(c);
}

bool TcpLink::on_fence(uint64_t lane_offset) {
  TcpLink& lane = *lane_;
  if (lane.lane_bytes_in() >= lane_offset) return true;
  lane.fence_watch_.store(lane_offset, std::memory_order_seq_cst);
  // Checked again after the watch is set: the lane thread may have passed
  // the offset in between (then it may also report it; that event finds
  // this link no longer fenced and does nothing).
  if (lane.lane_bytes_in() >= lane_offset) {
    lane.fence_watch_.store(0, std::memory_order_seq_cst);
    return true;
  }
  fenced_ = true;
  fence_at_ = lane_offset;
  update_epoll_interest();
  return !down_;
}

void TcpLink::resume_after_fence() {
  if (!fenced_ || down_ || lane_ == nullptr) return;
  if (lane_->lane_bytes_in() < fence_at_) return;  // an older fence's event
  fenced_ = false;
  fence_at_ = 0;
  if (!parse_staging()) return;
  update_epoll_interest();
}

Status TcpLink::attach_lane(int fd) {
  auto refuse = [fd](StatusCode code, std::string why) {
    ::close(fd);
    return Status(code, std::move(why));
  };
  if (lane_mode_ || owner_.role_ == TcpTransport::Role::kLanes)
    return refuse(StatusCode::kInvalidArgument, "a bulk lane cannot have a lane");
  if (down_) return refuse(StatusCode::kUnavailable, "bulk lane: link down: " + down_reason_);
  if (lane_ != nullptr) return refuse(StatusCode::kInvalidArgument, "the link has a bulk lane already");
  auto lanes = owner_.lanes();
  if (!lanes.ok()) return refuse(lanes.status().code(), lanes.status().message());
  std::lock_guard<std::mutex> lock(lanes.value()->mu());
  auto adopted = lanes.value()->transport().adopt(fd, description_ + " (bulk lane)");
  if (!adopted.ok()) return adopted.status();  // adopt() took the fd
  std::unique_ptr<TcpLink>& lane = adopted.value();
  lane->lane_mode_ = true;
  lane->attached_ = true;  // bulk frames only: begin_frame refuses the rest
  lane->context_ = this;
  lane->exposures_.set_keys(TcpTransport::kLaneKeyBit, UINT32_MAX);
  lane_ = std::move(lane);
  core::log().debug("tcp link {}: bulk lane attached", description_);
  return Status::ok_status();
}

uint64_t TcpLink::offer_lane(uint16_t route) {
  if (lane_token_ != 0 || lane_ != nullptr || down_ || lane_mode_) return 0;
  // Unguessable: whoever presents it gets this session's lane.
  std::random_device rd;
  uint64_t token = 0;
  while (token == 0 || owner_.lane_offers_.count(token) != 0)
    token = (((uint64_t{rd()} << 32) | rd()) << 16) | route;
  lane_token_ = token;
  owner_.lane_offers_.emplace(token, this);
  return token;
}

size_t TcpLink::lane_exposures() {
  if (lane_ == nullptr) return 0;
  std::lock_guard<std::mutex> lock(owner_.lanes_->mu());
  return lane_->exposures();
}

void TcpLink::drop_lane(bool failing) {
  // An offer not yet claimed goes too (a server's lanes may not have started).
  if (lane_token_ != 0) {
    owner_.lane_offers_.erase(lane_token_);
    lane_token_ = 0;
  }
  if (owner_.lanes_ == nullptr) return;
  BulkLanes& lanes = *owner_.lanes_;
  std::vector<BulkLanes::Event> events;
  // Oldest first: the batch the loop is applying, then the lane thread's
  // queue, then what the lane transport still holds.
  for (size_t i = owner_.lane_batch_pos_; i < owner_.lane_batch_.size(); ++i) {
    BulkLanes::Event& e = owner_.lane_batch_[i];
    if (e.link != this) continue;
    if (failing) events.push_back(std::move(e));
    e.link = nullptr;
  }
  if (lane_ != nullptr) {
    std::lock_guard<std::mutex> lock(lanes.mu());
    if (failing) lane_->fail("its session's link failed: " + down_reason_);
    lanes.take_for(this, failing ? &events : nullptr);
    if (failing) lanes.drain_lane(lane_.get(), events);
    lane_.reset();  // closes the socket: nothing reaches user memory after this
  } else {
    lanes.take_for(this, failing ? &events : nullptr);
  }
  for (const BulkLanes::Event& e : events)
    if (e.kind == BulkLanes::Event::Kind::kDone || e.kind == BulkLanes::Event::Kind::kWriteDone)
      bulk_done(e.token, static_cast<StatusCode>(e.status));
}

}  // namespace slotrpc::transport
