// The TCP transport's framing, link side: TcpLink's slot and control frames
// (post, flush, receive, parse, failure).  TcpTransport (the loop's epoll
// set and completion queue) is in tcp_transport.cc; TcpLink's bulk
// transfers in tcp_bulk.cc, its pushes in tcp_pushes.cc and its side of the
// bulk lanes in tcp_link_lanes.cc; tcp_transport.h says what each part
// holds.
#include "transport/tcp/tcp_transport.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <utility>

#include "base/logging.h"
#include "transport/tcp/tcp_frame.h"
#include "transport/tcp/tcp_limits.h"

namespace slotrpc::transport {

using namespace tcp_frame;
using namespace tcp_limits;

// ---------------------------------------------------------------- TcpLink

TcpLink::TcpLink(TcpTransport& owner, tcp::socket socket, std::string description)
    : owner_(owner),
      socket_(std::move(socket)),
      description_(std::move(description)),
      // Until attach() gives the geometry, only control frames are possible.
      budget_bytes_(TcpTransport::output_budget(0, 0)) {
  pending_.reserve(kPendingReserve);
  read_budget_ = kReadBudget;
  staging_ = std::make_unique_for_overwrite<std::byte[]>(TcpTransport::kStagingBytes);
  // A session's link exposes with keys below kLaneKeyBit; a lane gets the
  // rest (attach_lane).
  exposures_.set_keys(0, TcpTransport::kLaneKeyBit - 1);
  ++owner_.live_links_;
}

TcpLink::~TcpLink() {
  drop_lane(false);
  owner_.unstall(this);
  if (in_epoll_) {
    ::epoll_ctl(owner_.epoll_fd_, EPOLL_CTL_DEL, socket_.native_handle(), nullptr);
    in_epoll_ = false;
  }
  boost::system::error_code ec;
  if (socket_.is_open()) socket_.close(ec);
  // The consumer drops its pointer to us now; a completion still queued
  // would hand it a dangling one.
  owner_.forget(this);
  --owner_.live_links_;
}

Result<MemoryRegion> TcpLink::register_memory(std::span<std::byte> memory, Access) {
  // Sockets read and write any memory; there is nothing to pin.
  MemoryRegion r;
  r.base = memory.data();
  r.length = memory.size();
  return r;
}

void TcpLink::deregister(MemoryRegion& region) { region = MemoryRegion{}; }

Status TcpLink::attach(const MemoryRegion& receive_ring, const MemoryRegion& send_ring,
                       uint32_t slot_count, uint32_t slot_size, void* context) {
  if (attached_) return Status(StatusCode::kInvalidArgument, "tcp link already attached");
  // The slot index travels in the low 16 bits of the immediate.
  if (slot_count == 0 || slot_count > 0x10000u)
    return Status(StatusCode::kInvalidArgument,
                  "slot count " + std::to_string(slot_count) + " outside 1..65536");
  if (slot_size == 0) return Status(StatusCode::kInvalidArgument, "slot size is 0");
  const uint64_t need = uint64_t{slot_count} * slot_size;
  if (receive_ring.base == nullptr || need > receive_ring.length)
    return Status(StatusCode::kInvalidArgument,
                  "receive ring of " + std::to_string(receive_ring.length) + " bytes cannot hold " +
                      std::to_string(slot_count) + " slots of " + std::to_string(slot_size));
  ring_ = receive_ring;
  send_ring_ = send_ring;
  slot_count_ = slot_count;
  slot_size_ = slot_size;
  context_ = context;
  size_arming(slot_count);
  sending_.assign(slot_count, 0);
  budget_bytes_ = TcpTransport::output_budget(slot_count, slot_size);
  attached_ = true;
  return Status::ok_status();
}

void TcpLink::post(std::span<const Outgoing> batch) {
  if (down_) return;
  bool slot_frame = false;
  for (const Outgoing& o : batch) {
    // A bad Outgoing is a bug in the caller; refusing it here keeps a
    // malformed frame off the wire, where it would kill the peer's link.
    if (o.length == 0 || o.length >= TcpTransport::kControlLaneBit || o.data == nullptr) {
      fail("post: invalid message of " + std::to_string(o.length) + " bytes");
      return;
    }
    const bool control = o.delivery == Delivery::kControl;
    if (control && o.length != transport::kHeaderSize) {
      fail("post: control message of " + std::to_string(o.length) + " bytes, expected " +
           std::to_string(transport::kHeaderSize));
      return;
    }
    PendingWrite& w = pending_.emplace_back();
    store_u32_le(w.head.data(), o.length | (control ? TcpTransport::kControlLaneBit : 0u));
    store_u32_le(w.head.data() + 4, o.imm);
    if (control) {
      // The caller may reuse its 32 bytes as soon as post() returns.
      std::memcpy(w.head.data() + kPrefixSize, o.data, transport::kHeaderSize);
      w.head_len = kPrefixSize + transport::kHeaderSize;
      w.body = nullptr;
      w.body_len = 0;
    } else {
      // Slot bodies stay in the send ring until the peer answers, so the
      // kernel can copy them straight from there.
      w.head_len = kPrefixSize;
      w.body = o.data;
      w.body_len = o.length;
      // Until its last byte is in the kernel, the peer cannot have this
      // message, so it may not write the slot it came from (see the
      // receive side).
      if (send_ring_.base != nullptr && o.data >= send_ring_.base &&
          o.data < send_ring_.base + size_t{slot_count_} * slot_size_) {
        w.send_slot = static_cast<int32_t>(static_cast<size_t>(o.data - send_ring_.base) / slot_size_);
        ++sending_[static_cast<size_t>(w.send_slot)];
      }
    }
    w.sent = 0;
    queued_bytes_ += w.head_len + w.body_len;
    ++(control ? stats_.control_sends : stats_.slot_sends);
    if (!control) ++owner_.slot_frames_;  // adaptive slices: calls share the loop
    slot_frame |= !control;
    stats_.messages += o.messages;
    if (o.messages > 1) ++stats_.packs;
  }
  // Pushes follow the request that offers their ranges: it is in this
  // batch (a call exposes its segments and queues its request in one go).
  if (slot_frame && !push_ready_.empty()) start_pushes();
  flush_pending();
}

void TcpLink::flush_pending() {
  std::vector<iovec>& iov = owner_.iov_;
  bool progress = false;
  uint64_t bulk_sent = 0;  // bulk body bytes handed to the kernel in this call
  // At most two frames of the slice at the start (next_slice) per call.
  const uint64_t per_flush = 2 * uint64_t{frame_slice()};
  while (!down_ && output_waiting()) {
    // A large transfer refills the bulk queue chunk by chunk as fast as a
    // loopback socket takes it: without a bound this loop would send the
    // whole gigabyte in one call, and the event loop (other calls, timers,
    // the caller's next request) would wait for it.  EPOLLOUT stays armed,
    // so the next poll goes on.  Small frames are never held back.
    const bool bulk_room = bulk_sent < per_flush;
    const bool bulk_started =
        bulk_pending_head_ < bulk_pending_.size() && bulk_pending_[bulk_pending_head_].sent != 0;
    if (!bulk_room && !bulk_started && pending_head_ == pending_.size()) break;
    // One gathered write, in wire order: a bulk frame already started (the
    // stream must finish it), every small frame, then bulk frames up to the
    // per-flush bound.  The walk after sendmsg takes them in that order.
    size_t n_iov = 0;
    size_t want = 0;
    uint64_t bulk_planned = 0;
    auto add = [&](PendingWrite& w) {
      if (w.sent < w.head_len) {
        iov[n_iov++] = {w.head.data() + w.sent, size_t{w.head_len} - w.sent};
        want += w.head_len - w.sent;
        if (w.body_len != 0) {
          iov[n_iov++] = {const_cast<std::byte*>(w.body), w.body_len};
          want += w.body_len;
        }
      } else {
        const uint32_t off = w.sent - w.head_len;
        iov[n_iov++] = {const_cast<std::byte*>(w.body + off), size_t{w.body_len} - off};
        want += w.body_len - off;
      }
      if (w.bulk_body) bulk_planned += w.body_len;
    };
    size_t bulk_i = bulk_pending_head_;
    if (bulk_started) add(bulk_pending_[bulk_i++]);
    size_t small_i = pending_head_;
    for (; small_i < pending_.size() && n_iov + 2 <= kMaxIov; ++small_i) add(pending_[small_i]);
    const size_t n_small = small_i - pending_head_;
    for (; bulk_i < bulk_pending_.size() && n_iov + 2 <= kMaxIov &&
           bulk_sent + bulk_planned < per_flush;
         ++bulk_i)
      add(bulk_pending_[bulk_i]);
    msghdr msg{};
    msg.msg_iov = iov.data();
    msg.msg_iovlen = n_iov;
    // sendmsg rather than writev: MSG_NOSIGNAL turns a dead peer into EPIPE
    // instead of a process-killing SIGPIPE.
    const ssize_t n = send_fn_(*this, msg);
    ++stats_.doorbells;
    if (n < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) break;
      fail(errno_text("send", err));
      return;
    }
    size_t left = static_cast<size_t>(n);
    owner_.bytes_moved_ += left;
    queued_bytes_ -= left;
    lane_out_ += left;  // read only for lanes (their fences)
    progress |= n > 0;
    // Walks the frames in the order they went into the iovecs.  The
    // *_chunk_sent() calls queue the next chunk (bulk_pending_ may grow and
    // move), so they run after the walk.
    bool write_chunk_done = false;
    bool serve_chunk_done = false;
    auto consume = [&](std::vector<PendingWrite>& q, size_t& head) {
      PendingWrite& w = q[head];
      const uint32_t rest = w.head_len + w.body_len - w.sent;
      const uint32_t take = left >= rest ? rest : static_cast<uint32_t>(left);
      if (w.bulk_body) {
        // Body bytes of this write: the part of [sent, sent + take) past the head.
        const uint32_t from = std::max(w.sent, w.head_len);
        const uint32_t to = w.sent + take;
        if (to > from) {
          bulk_queued_ -= to - from;
          bulk_sent += to - from;
        }
      }
      left -= take;
      if (take == rest) {
        if (w.send_slot >= 0) --sending_[static_cast<size_t>(w.send_slot)];
        write_chunk_done |= w.on_sent == OnSent::kWriteChunk;
        serve_chunk_done |= w.on_sent == OnSent::kServeChunk;
        ++head;
      } else {
        w.sent += take;
      }
    };
    if (bulk_started && left > 0) consume(bulk_pending_, bulk_pending_head_);
    for (size_t i = 0; i < n_small && left > 0; ++i) consume(pending_, pending_head_);
    while (left > 0) consume(bulk_pending_, bulk_pending_head_);
    if (write_chunk_done) write_chunk_sent();
    if (serve_chunk_done) serve_chunk_sent();
    // A short write means the socket buffer is full: another call would
    // only return EAGAIN, so wait for EPOLLOUT instead.
    if (static_cast<size_t>(n) < want) break;
  }
  if (down_) return;
  compact(pending_, pending_head_);
  compact(bulk_pending_, bulk_pending_head_);
  if (bulk_lowat_) bulk_output_changed();
  after_output_change(progress);
}

void TcpLink::compact(std::vector<PendingWrite>& q, size_t& head) {
  if (head == q.size()) {
    q.clear();  // keeps capacity: no allocation on the next post()
    head = 0;
  } else if (head >= kPendingReserve && head * 2 >= q.size()) {
    // Under sustained back-pressure the sent prefix would otherwise grow
    // the vector forever.
    q.erase(q.begin(), q.begin() + static_cast<ptrdiff_t>(head));
    head = 0;
  }
}

void TcpLink::after_output_change(bool progress) {
  if (queued_bytes_ == 0) {
    owner_.unstall(this);
  } else if (progress || stalled_pos_ == kNotStalled) {
    // Only here, with output backed up, is the clock read: never on the
    // path where a write takes everything.
    last_drain_ = Clock::now();
    owner_.stall(this);
  }
  // Hysteresis: stop reading above the budget, resume only at half of it,
  // so a peer draining slowly does not toggle EPOLLIN on every write.
  // Bulk bodies are left out: this side's own writes, or one chunk per read
  // the peer asked for (bounded by kMaxBulkReads), never what a peer can
  // multiply by not reading.
  const uint64_t budgeted = queued_bytes_ - bulk_queued_;
  if (reading_ && budgeted > budget_bytes_) {
    reading_ = false;
    base::log().debug("tcp link {}: {} bytes queued for a peer that is not reading (budget {}): "
                  "reading from it paused", description_, queued_bytes_, budget_bytes_);
  } else if (!reading_ && budgeted <= budget_bytes_ / 2) {
    reading_ = true;
  }
  update_epoll_interest();
}

void TcpLink::on_writable() { flush_pending(); }

void TcpLink::update_epoll_interest() {
  const bool want = output_waiting();
  // Waiting at a FENCE: nothing more is read until the lane catches up.
  const bool read = reading_ && !fenced_;
  if (down_ || !in_epoll_ || (want == want_write_ && read == epoll_reading_)) return;
  // EPOLLOUT only while something waits: a writable socket is the common
  // case and level-triggered EPOLLOUT would wake every poll for nothing.
  // EPOLLIN not while the output budget is exceeded (backpressure); errors
  // and hang-ups are reported regardless.
  epoll_event ev{};
  ev.events = (read ? EPOLLIN : 0u) | (want ? EPOLLOUT : 0u);
  ev.data.ptr = this;
  if (::epoll_ctl(owner_.epoll_fd_, EPOLL_CTL_MOD, socket_.native_handle(), &ev) != 0) {
    fail(errno_text("epoll_ctl", errno));
    return;
  }
  want_write_ = want;
  epoll_reading_ = read;
}

void TcpLink::on_readable(bool drain_all) {
  // An event taken before the budget was exceeded: what is in the socket
  // stays there.  (A broken socket is drained regardless.)
  if (!reading_ && !drain_all) return;
  // Waiting at a FENCE (even on a broken socket: what is buffered may only
  // be delivered after the lane's data), or for a parked push's reader.
  if (fenced_ || parked_) return;
  for (int reads = 0; !down_ && (drain_all || reads < read_budget_); ++reads) {
    // Completions not yet taken by poll() are memory a peer can grow too:
    // leave the rest in the socket (level-triggered epoll comes back).
    if (!drain_all && owner_.backlog() >= TcpTransport::kReadyLimit) return;
    // Slot bodies and bulk data (unless it is being discarded after a
    // revoke: body_dest_ null) go straight to their memory.
    const bool direct = in_body_ && staging_end_ == 0 && body_dest_ != nullptr &&
                        (rx_ == Rx::kBulkData ||
                         (rx_ == Rx::kSlot &&
                          body_len_ - body_got_ >= TcpTransport::kDirectReadThreshold));
    std::byte* dst;
    size_t room;
    bool read_on = false;  // a short read is no reason to go round the loop
    if (direct) {
      // Large body not here yet: let the kernel copy it into the slot once
      // instead of twice via staging.
      dst = body_dest_ + body_got_;
      room = body_len_ - body_got_;
      // Bulk data: up to the rest of the frame, which its sender sized
      // (one slice while calls share the connection, up to 1 MiB while
      // bulk data has it alone; next_slice): capping each recv at our own
      // slice cost a large frame a dozen calls and loop turns
      // (docs/benchmarks.md, "TCP bulk slices that grow").  Unless the
      // loop has other sessions, or calls went by since the frame began:
      // then one slice per call, as they wait for each copy.
      //
      // Alone, a short read does not end the event either: loopback
      // delivers a sender's sendmsg 64 KiB at a time while it copies, so
      // the next recv right away usually finds more, and going round the
      // loop for it (a turn and an epoll_wait per 64 KiB) left the 1 MiB
      // echo at 1.2 to 1.3 times the socket ping-pong, which reads on the
      // same way (1.0 to 1.14 reading on; docs/benchmarks.md, "TCP: a short
      // read reads on").  kReadBudget still bounds the event.
      if (rx_ == Rx::kBulkData) {
        ++bulk_recvs_;
        if (owner_.live_links_ > 1 || owner_.slot_frames_ != slot_frames_at_data_)
          room = std::min<size_t>(room, owner_.bulk_slice());
        else
          read_on = true;
      }
    } else {
      dst = staging_.get() + staging_end_;
      room = TcpTransport::kStagingBytes - staging_end_;
      // A push follows its request in the same burst: what the burst's
      // first recv takes past the push's header lands here and costs a
      // copy (accept_pushes), so that recv takes little.  Later recvs of a
      // burst (a backlog of small frames) take the whole buffer.
      if (accepts_pushes_ && reads == 0) room = std::min(room, TcpTransport::kPushReadAhead);
      // While bulk data may arrive, never read past the current frame: a
      // read-ahead would pull the start of a bulk chunk into staging and
      // cost it a copy.  (Two recv calls per frame then, only while this
      // link has reads outstanding or ranges exposed.)
      if (reads_requested_ != 0 || !exposures_.empty()) {
        const size_t frame_left = in_body_ ? body_len_ - body_got_
                                           : kPrefixSize + transport::kHeaderSize - staging_end_;
        room = std::min(room, frame_left);
      }
    }
    const ssize_t n = recv_fn_(*this, dst, room);
    if (n == 0) {
      fail("peer closed the connection");
      return;
    }
    if (n < 0) {
      const int err = errno;
      if (err == EINTR) {
        --reads;
        continue;
      }
      if (err == EAGAIN || err == EWOULDBLOCK) return;
      fail(errno_text("recv", err));
      return;
    }
    owner_.bytes_moved_ += static_cast<uint64_t>(n);
    if (direct) {
      body_got_ += static_cast<uint32_t>(n);
      if (body_got_ == body_len_ && !finish_frame()) return;
    } else {
      staging_end_ += static_cast<size_t>(n);
      if (!parse_staging()) return;
    }
    if (lane_mode_) lane_received(static_cast<uint64_t>(n));
    if (fenced_ || parked_) return;
    // Fewer bytes than asked: the socket is drained; skip the EAGAIN call
    // (unless more of a bulk frame is on its way to a quiet link: above;
    // a short read never completes the frame).
    // (TLS: a read returns a record at most; the stream knows whether the
    // socket came back short.)
    if (!drain_all && !read_on && (tls_ == nullptr ? static_cast<size_t>(n) < room : tls_->drained())) return;
  }
}

bool TcpLink::parse_staging() {
  std::byte* const base = staging_.get();
  while (staging_begin_ < staging_end_ && !fenced_ && !parked_) {
    const size_t avail = staging_end_ - staging_begin_;
    if (!in_body_) {
      if (avail < kPrefixSize) break;
      const uint32_t word = load_u32_le(base + staging_begin_);
      const uint32_t imm = load_u32_le(base + staging_begin_ + 4);
      staging_begin_ += kPrefixSize;
      if (!begin_frame(word, imm)) return false;
    } else {
      const size_t take = std::min<size_t>(avail, body_len_ - body_got_);
      // body_dest_ null: write data for a range revoked meanwhile, dropped.
      if (body_dest_ != nullptr) std::memcpy(body_dest_ + body_got_, base + staging_begin_, take);
      staging_begin_ += take;
      body_got_ += static_cast<uint32_t>(take);
      if (body_got_ == body_len_ && !finish_frame()) return false;
    }
  }
  // Whatever is left is under 8 bytes of a prefix (or, at a FENCE, the
  // frames after it): move it to the front so the next recv gets the
  // whole buffer and direct reads see it empty.
  const size_t left = staging_end_ - staging_begin_;
  if (left != 0 && staging_begin_ != 0) std::memmove(base, base + staging_begin_, left);
  staging_begin_ = 0;
  staging_end_ = left;
  return true;
}

bool TcpLink::begin_frame(uint32_t word, uint32_t imm) {
  const bool control = (word & TcpTransport::kControlLaneBit) != 0;
  const uint32_t len = word & ~TcpTransport::kControlLaneBit;
  if (!attached_) {
    fail("frame arrived before the link was attached");
    return false;
  }
  if ((word & TcpTransport::kBulkMarker) == TcpTransport::kBulkMarker) {
    const uint32_t type = word & ~TcpTransport::kBulkMarker;
    if (type < TcpTransport::kBulkReadRequest || type > TcpTransport::kBulkPushData || imm != 0) {
      fail("bulk frame of unknown type " + std::to_string(type) + " (imm " + std::to_string(imm) +
           ")");
      return false;
    }
    rx_ = Rx::kBulkHead;
    bulk_type_ = type;
    body_dest_ = bulk_head_.data();
    in_body_ = true;
    body_control_ = false;
    body_len_ = transport::kHeaderSize;
    body_got_ = 0;
    body_imm_ = 0;
    return true;
  }
  if (lane_mode_) {
    fail("peer sent a slot or control frame on a bulk lane");
    return false;
  }
  if (len == 0) {
    fail("peer sent a frame with an empty body");
    return false;
  }
  if (control) {
    if (len != transport::kHeaderSize) {
      fail("control frame of " + std::to_string(len) + " bytes, expected " +
           std::to_string(transport::kHeaderSize));
      return false;
    }
    body_dest_ = control_body_.data();
  } else {
    // Every check runs before a byte is written: a peer must not be able to
    // write outside the ring or over a slot a handler is still reading.
    const uint16_t slot = transport::imm_slot(imm);
    if (slot >= slot_count_) {
      fail("slot " + std::to_string(slot) + " outside ring of " + std::to_string(slot_count_));
      return false;
    }
    if (len > slot_size_) {
      fail("frame of " + std::to_string(len) + " bytes exceeds slot size " +
           std::to_string(slot_size_));
      return false;
    }
    if (!take_armed(slot)) {
      fail("peer wrote slot " + std::to_string(slot) + " which was not armed");
      return false;
    }
    if (sending_[slot] != 0) {
      // Our message from this slot (a reply, say) is still queued: the peer
      // cannot have read it, so it cannot be done with the slot.  Taking
      // its write would let the next message built there overwrite the
      // queued one before it leaves.
      fail("peer wrote slot " + std::to_string(slot) + " before our message from it was sent");
      return false;
    }
    body_dest_ = ring_.base + size_t{slot} * slot_size_;
  }
  in_body_ = true;
  body_control_ = control;
  rx_ = control ? Rx::kControl : Rx::kSlot;
  if (!control) ++owner_.slot_frames_;  // adaptive slices: calls share the loop
  body_len_ = len;
  body_got_ = 0;
  body_imm_ = imm;
  return true;
}

bool TcpLink::finish_frame() {
  if (rx_ == Rx::kBulkHead || rx_ == Rx::kBulkData) {
    const Rx was = rx_;
    in_body_ = false;
    body_len_ = 0;
    body_got_ = 0;
    body_dest_ = nullptr;
    rx_ = Rx::kSlot;
    if (was == Rx::kBulkHead) return on_bulk_header();
    if (bulk_type_ == TcpTransport::kBulkReadData || bulk_type_ == TcpTransport::kBulkPushData) {
      // The chunk is in place; the read is done once every byte is (a
      // dropped push's chunk has tag 0, which no read has).
      auto it = find_read(bulk_read_tag_);
      if (it != reads_.end() && it->got == it->length) end_read(it, StatusCode::kOk);
      // A push's frame may go on past the read that took this part.
      if (bulk_type_ == TcpTransport::kBulkPushData && !down_) end_push_part();
    }
    return !down_;
  }
  Completion c;
  c.kind = body_control_ ? Completion::Kind::kControl : Completion::Kind::kMessage;
  c.slot = body_control_ ? 0 : transport::imm_slot(body_imm_);
  c.length = body_len_;
  c.imm = body_imm_;
  c.context = context_;
  c.link = this;
  if (body_control_) c.control = control_body_;
  owner_.push_completion(c);
  in_body_ = false;
  body_len_ = 0;
  body_got_ = 0;
  body_dest_ = nullptr;
  return true;
}

void TcpLink::close(std::string reason) { fail(std::move(reason)); }

void TcpLink::fail(std::string reason) {
  if (down_) return;
  down_ = true;
  down_reason_ = std::move(reason);
  base::log().debug("tcp link {} down: {}", description_, down_reason_);
  if (in_epoll_) {
    ::epoll_ctl(owner_.epoll_fd_, EPOLL_CTL_DEL, socket_.native_handle(), nullptr);
    in_epoll_ = false;
  }
  boost::system::error_code ec;
  socket_.shutdown(tcp::socket::shutdown_both, ec);
  socket_.close(ec);
  // Nothing can be delivered any more; the credit protocol's memory is the
  // core's to reclaim once it sees kLinkDown.
  std::vector<uint64_t> failed_writes;
  for (const WriteJob& j : writes_) failed_writes.push_back(j.token);
  writes_.clear();
  write_in_flight_ = false;
  pending_.clear();
  pending_head_ = 0;
  bulk_pending_.clear();
  bulk_pending_head_ = 0;
  queued_bytes_ = 0;
  owner_.unstall(this);
  want_write_ = false;
  in_body_ = false;
  staging_begin_ = staging_end_ = 0;
  // Every bulk operation ends before kLinkDown: reads and writes failed (the
  // link's down_reason() says why), revokes waiting for a chunk done (the
  // socket is closed, nothing reaches the memory any more).
  for (const ReadOp& r : reads_) bulk_done(r.token, StatusCode::kUnavailable);
  reads_.clear();
  reads_requested_ = 0;
  for (const uint64_t token : failed_writes) bulk_done(token, StatusCode::kUnavailable);
  for (const ServeJob& j : serves_)
    if (j.revoked) bulk_done(j.revoke_token, StatusCode::kOk);
  serves_.clear();
  serve_in_flight_ = false;
  push_ready_.clear();
  pushes_in_.clear();  // a claimed push's read failed with reads_ above
  parked_ = false;
  push_resume_ = false;
  bulk_queued_ = 0;
  fenced_ = false;
  drop_lane(true);  // the lane's operations end here too, before kLinkDown
  Completion c;
  c.kind = Completion::Kind::kLinkDown;
  c.context = context_;
  c.link = this;
  owner_.push_completion(c);
}

LinkStats TcpLink::stats() const {
  LinkStats s = stats_;
  if (lane_ != nullptr) {
    std::lock_guard<std::mutex> lock(owner_.lanes_->mu());
    s.attached = true;
    s.attached_bytes_sent = lane_->lane_out_;
    s.attached_bytes_received = lane_->lane_in_.load(std::memory_order_relaxed);
    // The lane's transfers are this session's (drop_lane keeps them once
    // the lane is gone).
    s.bulk_requests += lane_->stats_.bulk_requests;
  }
  return s;
}

}  // namespace slotrpc::transport
