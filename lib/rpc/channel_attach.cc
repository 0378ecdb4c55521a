// The client's side of attached connections (transport.h, "Attached
// connections"): a call with a bulk segment of at least the link's
// attachment_threshold() waits while the channel opens the session's
// attached connection, then goes.  Loop thread only.
#include "rpc/channel_impl.h"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "base/logging.h"

namespace slotrpc {

bool Channel::Impl::hold_for_attachment(core::PendingCall* pc) {
  size_t biggest = 0;
  if (!pc->has_bulk()) return false;
  for (const BulkSegment& s : pc->extras->send_bulk) biggest = std::max(biggest, s.length);
  for (const BulkSegment& s : pc->extras->receive_bulk) biggest = std::max(biggest, s.length);
  if (biggest == 0) return false;
  if (attaching) {
    if (biggest < attach_threshold) return false;
    waiting_for_attachment.push_back(pc);
    arm_attach_wait();
    return true;
  }
  if (attach_token.empty() || !session || session->closed()) return false;
  if (attach_link == nullptr || session->link() != attach_link) return false;
  const uint64_t threshold = attach_link->attachment_threshold();
  if (threshold == 0 || biggest < threshold) return false;
  // The opener of an earlier session has finished (its task ran): joining
  // takes no time.
  if (attach_opener.joinable()) attach_opener.join();
  std::vector<std::byte> token = std::exchange(attach_token, {});
  attaching = true;
  attach_threshold = threshold;
  waiting_for_attachment.push_back(pc);
  arm_attach_wait();
  // Connect and handshake off the loop (bounded by connect_timeout_ms),
  // then one task on the loop hands the result to the link and lets the
  // calls go.
  attach_opener = std::thread([self = shared_from_this(), s = session, link = attach_link,
                               token = std::move(token)] {
    auto endpoint = rpc::parse_address(self->address);
    const auto deadline = Clock::now() + std::chrono::milliseconds(self->config.connect_timeout_ms);
    Result<int> fd = endpoint.ok() ? rpc::open_attachment(*endpoint, token, deadline) : endpoint.status();
    self->loop->post([self, s, link, fd]() mutable {
      // A closed session may have dropped its link.
      if (self->closing.load() || s->closed() || s->link() != link) {
        if (fd.ok()) ::close(fd.value());
        base::log().debug("slotrpc: channel to {}: attached connection dropped, the session ended first",
                          self->peer);
      } else {
        (void)link->attach_connection(fd);  // takes the fd; logs a failure
      }
      self->attach_attempt_over();
    });
  });
  return true;
}

// The attach-wait timer's next check: the earliest deadline of a held
// call, and at most 10 ms away, for the session's end (a session has no
// hook to call us; 10 ms is noise beside the peer timeout that ends it).
void Channel::Impl::arm_attach_wait() {
  cancel_attach_wait();
  if (!attaching || waiting_for_attachment.empty()) return;
  Clock::time_point next = Clock::now() + std::chrono::milliseconds(10);
  for (const core::PendingCall* pc : waiting_for_attachment)
    if (pc->deadline) next = std::min(next, *pc->deadline);
  attach_wait_timer = loop->timers().add(next, &Impl::on_attach_wait, this, 0);
}

void Channel::Impl::cancel_attach_wait() {
  if (attach_wait_timer != 0) loop->timers().cancel(attach_wait_timer);
  attach_wait_timer = 0;
}

void Channel::Impl::on_attach_wait(void* self_ptr, uint64_t) {
  auto* self = static_cast<Impl*>(self_ptr);
  self->attach_wait_timer = 0;
  if (!self->attaching) return;
  if (!self->session || self->session->closed()) {
    // The session ended while its attached connection was being opened:
    // its calls fail now, with its reason.  The opener's result finds the
    // session closed and no calls left.
    self->release_held();
    return;
  }
  const Clock::time_point now = Clock::now();
  auto& held = self->waiting_for_attachment;
  for (size_t i = 0; i < held.size();) {
    core::PendingCall* pc = held[i];
    if (pc->deadline && *pc->deadline <= now) {
      held.erase(held.begin() + static_cast<ptrdiff_t>(i));
      core::ClientSession::fail_later(
          *self->loop, pc,
          Status(StatusCode::kDeadlineExceeded,
                 "deadline passed before the call was sent (it waited for the session's attached "
                 "connection to open)"));
    } else {
      ++i;
    }
  }
  self->arm_attach_wait();
}

void Channel::Impl::attach_attempt_over() {
  cancel_attach_wait();
  attaching = false;
  release_held();
}

void Channel::Impl::release_held() {
  auto calls = std::move(waiting_for_attachment);
  waiting_for_attachment.clear();
  for (core::PendingCall* pc : calls) {
    if (closing.load() || !session) {
      core::ClientSession::fail_later(*loop, pc, Status(StatusCode::kCancelled, "channel closed"));
    } else {
      session->submit(pc);  // a session closed meanwhile fails it with its reason
    }
  }
}

bool Channel::Impl::cancel_held(uint64_t request_id) {
  auto it = std::find_if(waiting_for_attachment.begin(), waiting_for_attachment.end(),
                         [request_id](core::PendingCall* pc) { return pc->request_id == request_id; });
  if (it == waiting_for_attachment.end()) return false;
  core::PendingCall* pc = *it;
  waiting_for_attachment.erase(it);
  if (waiting_for_attachment.empty()) cancel_attach_wait();
  core::ClientSession::fail_later(*loop, pc, Status(StatusCode::kCancelled, "cancelled by the caller"));
  return true;
}

}  // namespace slotrpc
