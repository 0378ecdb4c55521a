// TcpLink's pushes: a client sends a small send_bulk segment right behind
// its request (PUSH_DATA), and the server's read claims it without a
// READ_REQ (docs/tuning.md, "TCP pushes").  The rest of TcpLink's bulk
// transfers is in tcp_bulk.cc.
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

}  // namespace slotrpc::transport
