// A TCP link's I/O: the socket's own system calls, or, on a TLS link, its
// tls::Stream (transport/tls/tls_stream.h).  The link picks the pair once,
// when it is made (use_tls), so the plain path has no TLS test per call;
// and the transport's side of TLS: links whose Stream holds input that
// epoll cannot report.
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

#include "transport/tcp/tcp_limits.h"
#include "transport/tcp/tcp_transport.h"

namespace slotrpc::transport {

ssize_t TcpLink::plain_send(TcpLink& l, const msghdr& msg) {
  return ::sendmsg(l.socket_.native_handle(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
}

ssize_t TcpLink::plain_recv(TcpLink& l, std::byte* dst, size_t len) {
  return ::recv(l.socket_.native_handle(), dst, len, MSG_DONTWAIT);
}

ssize_t TcpLink::tls_send(TcpLink& l, const msghdr& msg) {
  const ssize_t n = l.tls_->write(msg.msg_iov, msg.msg_iovlen);
  if (n < 0 && errno == EPROTO) l.fail(l.tls_->error());
  return n;
}

ssize_t TcpLink::tls_recv(TcpLink& l, std::byte* dst, size_t len) {
  const ssize_t n = l.tls_->read(dst, len);
  if (n < 0 && errno == EPROTO) l.fail(l.tls_->error());
  return n;
}

void TcpLink::use_tls(std::shared_ptr<tls::Stream> stream) {
  tls_ = std::move(stream);
  send_fn_ = &tls_send;
  recv_fn_ = &tls_recv;
  // A record is at most 16 KiB: about what a plain link's reads take per
  // event, in records.
  read_budget_ = tcp_limits::kReadBudget * 16;
}

void TcpTransport::watch_tls(TcpLink* link) {
  if (link->tls_watched_) return;
  link->tls_watched_ = true;
  tls_watch_.push_back(link);
}

void TcpTransport::check_tls() {
  for (size_t i = 0; i < tls_watch_.size();) {
    TcpLink* link = tls_watch_[i];
    // Not while paused by its output budget, a FENCE or a parked push:
    // each resumes through this check once it clears.
    if (!link->down_ && link->reading_ && !link->fenced_ && !link->parked_ && backlog() < kReadyLimit)
      link->on_readable(false);
    if (link->down_ || !link->tls_->pending_in()) {
      link->tls_watched_ = false;
      tls_watch_[i] = tls_watch_.back();
      tls_watch_.pop_back();
    } else {
      ++i;
    }
  }
}

bool TcpTransport::tls_readable() const {
  return std::any_of(tls_watch_.begin(), tls_watch_.end(), [](const TcpLink* l) {
    return !l->down_ && l->reading_ && !l->fenced_ && !l->parked_;
  });
}

}  // namespace slotrpc::transport
