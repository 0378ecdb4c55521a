// The client's side of the TCP bulk lane (transport/tcp/bulk_lanes.h):
// calls with a bulk segment of at least tcp_bulk_lane bytes wait while the
// channel opens the lane, then go.  Loop thread only.
#include "rpc/channel_impl.h"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "base/logging.h"
#include "transport/tcp/tcp_transport.h"

namespace slotrpc {

bool Channel::Impl::hold_for_lane(core::PendingCall* pc) {
  size_t biggest = 0;
  for (const BulkSegment& s : pc->send_bulk) biggest = std::max(biggest, s.length);
  for (const BulkSegment& s : pc->receive_bulk) biggest = std::max(biggest, s.length);
  if (biggest == 0 || biggest < config.tcp_bulk_lane) return false;
  if (lane_opening) {
    waiting_for_lane.push_back(pc);
    arm_lane_wait();
    return true;
  }
  if (lane_token == 0 || !session || session->closed()) return false;
  // The opener of an earlier session has finished (its task ran): joining
  // takes no time.
  if (lane_opener.joinable()) lane_opener.join();
  const uint64_t token = std::exchange(lane_token, 0);
  lane_opening = true;
  waiting_for_lane.push_back(pc);
  arm_lane_wait();
  // Connect and handshake off the loop (bounded by connect_timeout_ms),
  // then one task on the loop attaches the lane and lets the calls go.
  lane_opener = std::thread([self = shared_from_this(), s = session, link = lane_link, token] {
    auto endpoint = rpc::parse_address(self->address);
    const auto deadline = Clock::now() + std::chrono::milliseconds(self->config.connect_timeout_ms);
    Result<int> fd = endpoint.ok() ? rpc::open_lane(*endpoint, token, deadline) : endpoint.status();
    self->loop->post([self, s, link, fd]() mutable {
      Status st = fd.status();
      if (fd.ok()) {
        if (self->closing.load() || s->closed()) {
          ::close(fd.value());
          st = Status(StatusCode::kCancelled, "the session ended first");
        } else {
          st = link->attach_lane(fd.value());  // takes the fd
        }
      }
      if (st.ok()) {
        base::log().debug("slotrpc: channel to {}: bulk lane open", self->peer);
      } else if (!self->closing.load()) {
        // A session without its lane still works: bulk data shares its connection.
        base::log().warn("slotrpc: channel to {}: no bulk lane, bulk data shares the connection: {}",
                         self->peer, st.message());
      }
      self->lane_attempt_over();
    });
  });
  return true;
}

// The lane-wait timer's next check: the earliest deadline of a held call,
// and at most 10 ms away, for the session's end (a session has no hook to
// call us; 10 ms is noise beside the peer timeout that ends it).
void Channel::Impl::arm_lane_wait() {
  cancel_lane_wait();
  if (!lane_opening || waiting_for_lane.empty()) return;
  Clock::time_point next = Clock::now() + std::chrono::milliseconds(10);
  for (const core::PendingCall* pc : waiting_for_lane)
    if (pc->deadline) next = std::min(next, *pc->deadline);
  lane_wait_timer = loop->timers().add(next, &Impl::on_lane_wait, this, 0);
}

void Channel::Impl::cancel_lane_wait() {
  if (lane_wait_timer != 0) loop->timers().cancel(lane_wait_timer);
  lane_wait_timer = 0;
}

void Channel::Impl::on_lane_wait(void* self_ptr, uint64_t) {
  auto* self = static_cast<Impl*>(self_ptr);
  self->lane_wait_timer = 0;
  if (!self->lane_opening) return;
  if (!self->session || self->session->closed()) {
    // The session ended while its lane was being opened: its calls fail
    // now, with its reason.  The opener's result finds the session closed
    // and no calls left.
    self->release_held();
    return;
  }
  const Clock::time_point now = Clock::now();
  auto& held = self->waiting_for_lane;
  for (size_t i = 0; i < held.size();) {
    core::PendingCall* pc = held[i];
    if (pc->deadline && *pc->deadline <= now) {
      held.erase(held.begin() + static_cast<ptrdiff_t>(i));
      core::ClientSession::fail_later(
          *self->loop, pc,
          Status(StatusCode::kDeadlineExceeded,
                 "deadline passed before the call was sent (it waited for the channel's bulk lane)"));
    } else {
      ++i;
    }
  }
  self->arm_lane_wait();
}

void Channel::Impl::lane_attempt_over() {
  cancel_lane_wait();
  lane_opening = false;
  release_held();
}

void Channel::Impl::release_held() {
  auto calls = std::move(waiting_for_lane);
  waiting_for_lane.clear();
  for (core::PendingCall* pc : calls) {
    if (closing.load() || !session) {
      core::ClientSession::fail_later(*loop, pc, Status(StatusCode::kCancelled, "channel closed"));
    } else {
      session->submit(pc);  // a session closed meanwhile fails it with its reason
    }
  }
}

bool Channel::Impl::cancel_held(uint64_t request_id) {
  auto it = std::find_if(waiting_for_lane.begin(), waiting_for_lane.end(),
                         [request_id](core::PendingCall* pc) { return pc->request_id == request_id; });
  if (it == waiting_for_lane.end()) return false;
  core::PendingCall* pc = *it;
  waiting_for_lane.erase(it);
  if (waiting_for_lane.empty()) cancel_lane_wait();
  core::ClientSession::fail_later(*loop, pc, Status(StatusCode::kCancelled, "cancelled by the caller"));
  return true;
}

}  // namespace slotrpc
