// TcpLink's side of the bulk lanes (bulk_lanes.h): attaching a lane,
// offering one, the FENCE that keeps a reply behind data sent on the lane,
// and dropping it.  The rest of TcpLink's bulk transfers is in tcp_bulk.cc.
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
  base::log().debug("tcp link {}: bulk lane attached", description_);
  return Status::ok_status();
}

Status TcpLink::attach_connection(Result<int> connection) {
  Status st = connection.ok() ? attach_lane(connection.value()) : connection.status();
  // A session without its lane still works: bulk data shares its connection.
  if (!st.ok())
    base::log().warn("slotrpc: {}: no bulk lane, bulk data shares the connection: {}",
                     description_, st.message());
  return st;
}

std::vector<std::byte> TcpLink::offer_attachment(uint16_t route) {
  if (lane_threshold_ == 0 || tls_ != nullptr) return {};  // none outside TLS
  const uint64_t token = offer_lane(route);
  if (token == 0) return {};
  std::vector<std::byte> out(kLaneTokenSize);
  encode_lane_token(token, out.data());
  return out;
}

// Little endian, so the route (the low 16 bits) is the token's first two
// bytes, as transport::attachment_route() reads them.
void TcpLink::encode_lane_token(uint64_t token, std::byte* out) {
  for (size_t i = 0; i < kLaneTokenSize; ++i) out[i] = static_cast<std::byte>(token >> (8 * i));
}

uint64_t TcpLink::decode_lane_token(const std::byte* in) {
  uint64_t token = 0;
  for (size_t i = 0; i < kLaneTokenSize; ++i) token |= std::to_integer<uint64_t>(in[i]) << (8 * i);
  return token;
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
    stats_.bulk_requests += lane_->stats_.bulk_requests;  // stats() added them while it lived
    lane_.reset();  // closes the socket: nothing reaches user memory after this
  } else {
    lanes.take_for(this, failing ? &events : nullptr);
  }
  for (const BulkLanes::Event& e : events)
    if (e.kind == BulkLanes::Event::Kind::kDone || e.kind == BulkLanes::Event::Kind::kWriteDone)
      bulk_done(e.token, static_cast<StatusCode>(e.status));
}

}  // namespace slotrpc::transport
