// The TCP transport: TcpTransport, the loop's epoll set and completion
// queue, adopting sockets as links, stalls, and the loop's bulk lanes.  The
// links' framing is in tcp_link.cc; tcp_transport.h says what each part
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

// ----------------------------------------------------------- TcpTransport

TcpTransport::TcpTransport(const Config& config, Role role)
    : peer_timeout_ms_(config.peer_timeout_ms),
      bulk_slice_(role == Role::kLanes
                      ? kLaneSlice
                      : std::clamp<uint32_t>(config.tcp_bulk_slice, 4096, kBulkChunkBytes)),
      role_(role),
      lane_min_(role == Role::kLanes ? 0 : config.tcp_bulk_lane),
      config_(config) {
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) epoll_errno_ = errno;
  ready_.reserve(kReadyReserve);
  iov_.resize(kMaxIov);
}

TcpTransport::~TcpTransport() {
  // Sockets are bound to io_, which dies with us.
  assert(live_links_ == 0 && "destroy every TcpLink before its TcpTransport");
  lanes_.reset();  // joins the lane thread; uses epoll_fd_
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
}

Result<std::unique_ptr<TcpLink>> TcpTransport::adopt(int fd, std::string description,
                                                     std::shared_ptr<tls::Stream> tls) {
  // Ownership is taken even on failure, so the caller never has to work
  // out whether the fd still needs closing.
  auto refuse = [fd](StatusCode code, std::string why) -> Result<std::unique_ptr<TcpLink>> {
    if (fd >= 0) ::close(fd);
    return Status(code, std::move(why));
  };
  if (fd < 0) return refuse(StatusCode::kInvalidArgument, "adopt: invalid fd");
  if (epoll_fd_ < 0) return refuse(StatusCode::kInternal, errno_text("epoll_create1", epoll_errno_));

  sockaddr_storage addr{};
  socklen_t addr_len = sizeof addr;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &addr_len) != 0)
    return refuse(StatusCode::kUnavailable, errno_text("getsockname", errno));
  if (addr.ss_family != AF_INET && addr.ss_family != AF_INET6)
    return refuse(StatusCode::kInvalidArgument, "adopt: not a TCP/IP socket");
  sockaddr_storage peer{};
  socklen_t peer_len = sizeof peer;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0)
    return refuse(StatusCode::kUnavailable, errno_text("getpeername", errno));

  tcp::socket sock(io_);
  boost::system::error_code ec;
  sock.assign(addr.ss_family == AF_INET ? tcp::v4() : tcp::v6(), fd, ec);
  if (ec) return refuse(StatusCode::kInternal, "assign: " + ec.message());
  // From here the socket owns fd; an early return closes it.
  sock.non_blocking(true, ec);
  if (ec) return Status(StatusCode::kInternal, "non_blocking: " + ec.message());
  sock.set_option(tcp::no_delay(true), ec);
  if (ec) return Status(StatusCode::kInternal, "TCP_NODELAY: " + ec.message());

  std::unique_ptr<TcpLink> link(new TcpLink(*this, std::move(sock), std::move(description)));
  epoll_event ev{};
  ev.events = EPOLLIN;  // EPOLLOUT is added only while writes are pending
  ev.data.ptr = link.get();
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0)
    return Status(StatusCode::kInternal, errno_text("epoll_ctl", errno));
  link->in_epoll_ = true;
  if (tls != nullptr) {
    tls->set_fd(fd);
    link->use_tls(std::move(tls));
    // What OpenSSL read ahead during the handshake, epoll will not report.
    if (link->tls_->pending_in()) watch_tls(link.get());
  }
  return link;
}

size_t TcpTransport::poll(std::span<Completion> out) {
  auto drain = [this](std::span<Completion> dst) {
    const size_t n = std::min(dst.size(), ready_.size() - ready_head_);
    std::copy_n(ready_.begin() + static_cast<ptrdiff_t>(ready_head_), n, dst.begin());
    ready_head_ += n;
    completions_taken_ += n;
    if (ready_head_ == ready_.size()) {
      ready_.clear();  // keeps capacity: the queue does not creep forward
      ready_head_ = 0;
    }
    return n;
  };

  // Before anything is handed out, so that a link closed here reports its
  // own reason ahead of the session's keepalive verdict in the same turn.
  if (!stalled_.empty()) check_stalled();
  ++polls_;
  if (!push_watch_.empty()) check_pushes();
  if (!tls_watch_.empty()) check_tls();
  // What the lane thread finished (one atomic load when there is nothing).
  if (lanes_pending()) drain_lane_events();
  size_t got = drain(out);
  // Already-queued work comes first; reading more before the consumer has
  // taken it would only grow the queue.
  // No link, nothing to wait for: a loop that only serves shm sessions
  // must not pay an epoll_wait system call per turn for an empty set (it
  // was most of such a loop's time, docs/benchmarks.md).
  if (got == out.size() || epoll_fd_ < 0 || live_links_ == 0) return got;

  if (event_head_ == event_count_) {
    const int n = ::epoll_wait(epoll_fd_, events_, TcpTransport::kMaxEvents, 0);
    event_head_ = 0;
    event_count_ = std::max(n, 0);
  }
  while (event_head_ < event_count_ && backlog() < kReadyLimit) handle_event(events_[event_head_++]);
  got += drain(out.subspan(got));
  return got;
}

void TcpTransport::handle_event(const epoll_event& e) {
  if (lanes_ != nullptr && e.data.ptr == lanes_.get()) {  // the lane thread's wake
    drain_lane_events();
    return;
  }
  auto* link = static_cast<TcpLink*>(e.data.ptr);
  if (link == nullptr) return;  // its link was destroyed after epoll_wait
  {
    const uint32_t ev = e.events;
    const bool broken = (ev & (EPOLLERR | EPOLLHUP)) != 0;
    if (!link->down_ && (ev & (EPOLLIN | EPOLLERR | EPOLLHUP))) {
      link->on_readable(broken);
      if (link->tls_ != nullptr && !link->down_ && !link->tls_watched_ && link->tls_->pending_in())
        watch_tls(link);
    }
    if (!link->down_ && (ev & EPOLLOUT)) link->on_writable();
    if (!link->down_ && broken) {
      // Reading found neither EOF nor an error (it can happen with HUP and
      // nothing buffered): the link is dead all the same.
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(link->socket_.native_handle(), SOL_SOCKET, SO_ERROR, &err, &len);
      link->fail(err != 0 ? errno_text("socket error", err) : std::string("connection hung up"));
    }
  }
}

void TcpTransport::stall(TcpLink* link) {
  if (link->stalled_pos_ != TcpLink::kNotStalled) return;
  link->stalled_pos_ = stalled_.size();
  stalled_.push_back(link);
}

void TcpTransport::unstall(TcpLink* link) {
  const size_t pos = link->stalled_pos_;
  if (pos == TcpLink::kNotStalled) return;
  stalled_[pos] = stalled_.back();
  stalled_[pos]->stalled_pos_ = pos;
  stalled_.pop_back();
  link->stalled_pos_ = TcpLink::kNotStalled;
}

void TcpTransport::check_stalled() {
  const auto now = Clock::now();
  const auto limit = std::chrono::milliseconds(peer_timeout_ms_);
  // Backwards: fail() unstalls, moving the last entry (already seen) here.
  for (size_t i = stalled_.size(); i-- > 0;) {
    TcpLink* link = stalled_[i];
    const auto idle = now - link->last_drain_;
    if (idle < limit) continue;
    std::string reason = fmt::format(
        "peer has read nothing for {} ms with {} bytes queued (peer_timeout_ms = {})",
        std::chrono::duration_cast<std::chrono::milliseconds>(idle).count(), link->queued_bytes_,
        peer_timeout_ms_);
    base::log().warn("slotrpc: closing {}: {}", link->description_, reason);
    link->fail(std::move(reason));
  }
}

void TcpTransport::forget(TcpLink* link) {
  // Saved events must not hand the destroyed link to the next poll().
  for (int i = event_head_; i < event_count_; ++i)
    if (events_[i].data.ptr == link) events_[i].data.ptr = nullptr;
  auto first = ready_.begin() + static_cast<ptrdiff_t>(ready_head_);
  const auto kept = std::remove_if(first, ready_.end(),
                                   [link](const Completion& c) { return c.link == link; });
  completions_taken_ += static_cast<uint64_t>(ready_.end() - kept);  // never handed out: as good as taken
  ready_.erase(kept, ready_.end());
  if (link->push_watched_) std::erase(push_watch_, link);
  if (link->tls_watched_) std::erase(tls_watch_, link);
  if (ready_head_ == ready_.size()) {
    ready_.clear();
    ready_head_ = 0;
  }
}

Result<BulkLanes*> TcpTransport::lanes() {
  if (lanes_ == nullptr) {
    if (epoll_fd_ < 0) return Status(StatusCode::kInternal, errno_text("epoll_create1", epoll_errno_));
    auto started = BulkLanes::start(config_, epoll_fd_);
    if (!started.ok()) return started.status();
    lanes_ = std::move(started.value());
  }
  return lanes_.get();
}

bool TcpTransport::lanes_pending() const { return lanes_ != nullptr && lanes_->pending(); }

void TcpTransport::drain_lane_events() {
  lane_batch_.clear();
  lane_batch_pos_ = 0;
  lanes_->take(lane_batch_);
  // By index: a link failing below takes its remaining events out of the
  // batch (TcpLink::drop_lane), so none is applied after its kLinkDown.
  for (; lane_batch_pos_ < lane_batch_.size(); ++lane_batch_pos_) {
    BulkLanes::Event& e = lane_batch_[lane_batch_pos_];
    TcpLink* link = e.link;
    if (link == nullptr || link->down_) continue;
    switch (e.kind) {
      case BulkLanes::Event::Kind::kWriteDone:
        // The bytes are in the lane's kernel buffers, not yet at the peer:
        // what this link sends after the kBulkDone (the reply) must wait
        // there until the peer's lane has them all.
        if (e.status == 0)
          link->enqueue_bulk(kBulkFence, 0, 0, 0, e.lane_offset, 0, nullptr, 0);
        link->bulk_done(e.token, static_cast<StatusCode>(e.status));
        link->flush_pending();
        break;
      case BulkLanes::Event::Kind::kDone:
        link->bulk_done(e.token, static_cast<StatusCode>(e.status));
        break;
      case BulkLanes::Event::Kind::kDown:
        link->fail(e.reason);
        break;
      case BulkLanes::Event::Kind::kFence:
        link->resume_after_fence();
        break;
    }
  }
  lane_batch_.clear();
  lane_batch_pos_ = 0;
}

Status TcpTransport::accept_lane(uint64_t token, int fd) {
  auto it = lane_offers_.find(token);
  if (token == 0 || it == lane_offers_.end()) {
    ::close(fd);
    return Status(StatusCode::kInvalidArgument,
                  "no session of this loop offered that bulk lane token (its session may have "
                  "ended, or it has its lane, or the server has lanes off)");
  }
  TcpLink* link = it->second;
  lane_offers_.erase(it);
  link->lane_token_ = 0;
  return link->attach_lane(fd);
}

Status TcpTransport::accept_attachment(std::span<const std::byte> token, int fd) {
  // A server with lanes off offered no token, so accept_lane refuses
  // every one (its sessions' Config decides, not the loop's).
  if (token.size() != TcpLink::kLaneTokenSize) {
    ::close(fd);
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("a bulk lane hello carries an {}-byte token, not {} bytes",
                              TcpLink::kLaneTokenSize, token.size()));
  }
  return accept_lane(TcpLink::decode_lane_token(token.data()), fd);
}

std::vector<Completion> TcpTransport::take_completions_of(TcpLink* link) {
  std::vector<Completion> out;
  auto first = ready_.begin() + static_cast<ptrdiff_t>(ready_head_);
  for (auto it = first; it != ready_.end(); ++it)
    if (it->link == link) out.push_back(*it);
  forget(link);
  return out;
}

std::mutex* TcpTransport::lanes_mutex() { return lanes_ ? &lanes_->mu() : nullptr; }

}  // namespace slotrpc::transport
