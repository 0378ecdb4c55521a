// TcpLink's bulk transfers: the exposure table, READ_REQ / READ_DATA /
// WRITE_DATA frames, and the chunking and slicing that keeps small calls
// moving beside them.  Pushes are in tcp_pushes.cc, the link's side of the
// bulk lanes in tcp_link_lanes.cc, the framing in tcp_link.cc;
// tcp_transport.h says how the parts share the link's state.
#include "transport/tcp/tcp_transport.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "base/logging.h"
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
  w.head_len = kPrefixSize + transport::kHeaderSize;
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
        // The peer's code as it came (16 bits at most): the reader names it
        // in its error, and takes one it does not know as UNAVAILABLE.
        end_read(it, static_cast<StatusCode>(std::min<uint32_t>(h.status, UINT16_MAX)));
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

}  // namespace slotrpc::transport
