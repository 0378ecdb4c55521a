#include "transport/tcp/tcp_transport.h"

#include <netinet/in.h>
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

#include "core/logging.h"

namespace slotrpc::transport {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

#ifdef IOV_MAX
constexpr size_t kMaxIov = IOV_MAX;
#else
constexpr size_t kMaxIov = 1024;
#endif

// Reads per readable event before moving on to the next link, so one busy
// peer cannot starve the others; level-triggered epoll brings us back.
constexpr int kReadBudget = 4;
// Events taken per epoll_wait: TcpTransport::kMaxEvents.
using Clock = std::chrono::steady_clock;
// Initial capacities: reserved once so steady-state post()/poll() never
// allocate (vectors only grow past these under unusual bursts, then stay).
constexpr size_t kPendingReserve = 256;
constexpr size_t kReadyReserve = 1024;

constexpr size_t kPrefixSize = 8;

void store_u32_le(std::byte* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}
uint32_t load_u32_le(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{std::to_integer<uint8_t>(p[i])} << (8 * i);
  return v;
}

std::string errno_text(const char* what, int err) {
  std::string s(what);
  s += ": ";
  s += std::strerror(err);
  return s;
}

}  // namespace

// ---------------------------------------------------------------- TcpLink

TcpLink::TcpLink(TcpTransport& owner, tcp::socket socket, std::string description)
    : owner_(owner),
      socket_(std::move(socket)),
      description_(std::move(description)),
      // Until attach() gives the geometry, only control frames are possible.
      budget_bytes_(TcpTransport::output_budget(0, 0)) {
  pending_.reserve(kPendingReserve);
  staging_ = std::make_unique_for_overwrite<std::byte[]>(TcpTransport::kStagingBytes);
  ++owner_.live_links_;
}

TcpLink::~TcpLink() {
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

Status TcpLink::attach(const MemoryRegion& receive_ring, const MemoryRegion& /*send_ring*/,
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
  slot_count_ = slot_count;
  slot_size_ = slot_size;
  context_ = context;
  size_arming(slot_count);
  budget_bytes_ = TcpTransport::output_budget(slot_count, slot_size);
  attached_ = true;
  return Status::ok_status();
}

void TcpLink::post(std::span<const Outgoing> batch) {
  if (down_) return;
  for (const Outgoing& o : batch) {
    // A bad Outgoing is a bug in the caller; refusing it here keeps a
    // malformed frame off the wire, where it would kill the peer's link.
    if (o.length == 0 || o.length >= TcpTransport::kControlLaneBit || o.data == nullptr) {
      fail("post: invalid message of " + std::to_string(o.length) + " bytes");
      return;
    }
    const bool control = o.lane == Lane::kControl;
    if (control && o.length != core::kHeaderSize) {
      fail("post: control message of " + std::to_string(o.length) + " bytes, expected " +
           std::to_string(core::kHeaderSize));
      return;
    }
    PendingWrite& w = pending_.emplace_back();
    store_u32_le(w.head.data(), o.length | (control ? TcpTransport::kControlLaneBit : 0u));
    store_u32_le(w.head.data() + 4, o.imm);
    if (control) {
      // The caller may reuse its 32 bytes as soon as post() returns.
      std::memcpy(w.head.data() + kPrefixSize, o.data, core::kHeaderSize);
      w.head_len = kPrefixSize + core::kHeaderSize;
      w.body = nullptr;
      w.body_len = 0;
    } else {
      // Slot bodies stay in the send ring until the peer answers, so the
      // kernel can copy them straight from there.
      w.head_len = kPrefixSize;
      w.body = o.data;
      w.body_len = o.length;
    }
    w.sent = 0;
    queued_bytes_ += w.head_len + w.body_len;
    ++(control ? stats_.control_sends : stats_.slot_sends);
  }
  flush_pending();
}

void TcpLink::flush_pending() {
  const int fd = socket_.native_handle();
  std::vector<iovec>& iov = owner_.iov_;
  bool progress = false;
  while (!down_ && pending_head_ < pending_.size()) {
    // One gathered write for as many frames as fit in IOV_MAX iovecs.
    size_t n_iov = 0;
    size_t want = 0;
    for (size_t i = pending_head_; i < pending_.size() && n_iov + 2 <= kMaxIov; ++i) {
      PendingWrite& w = pending_[i];
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
    }
    msghdr msg{};
    msg.msg_iov = iov.data();
    msg.msg_iovlen = n_iov;
    // sendmsg rather than writev: MSG_NOSIGNAL turns a dead peer into EPIPE
    // instead of a process-killing SIGPIPE.
    const ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) break;
      fail(errno_text("send", err));
      return;
    }
    size_t left = static_cast<size_t>(n);
    queued_bytes_ -= left;
    progress |= n > 0;
    while (left > 0) {
      PendingWrite& w = pending_[pending_head_];
      const uint32_t rest = w.head_len + w.body_len - w.sent;
      if (left >= rest) {
        left -= rest;
        ++pending_head_;
      } else {
        w.sent += static_cast<uint32_t>(left);
        left = 0;
      }
    }
    // A short write means the socket buffer is full: another call would
    // only return EAGAIN, so wait for EPOLLOUT instead.
    if (static_cast<size_t>(n) < want) break;
  }
  if (down_) return;
  if (pending_head_ == pending_.size()) {
    pending_.clear();  // keeps capacity: no allocation on the next post()
    pending_head_ = 0;
  } else if (pending_head_ >= kPendingReserve && pending_head_ * 2 >= pending_.size()) {
    // Under sustained back-pressure the sent prefix would otherwise grow
    // the vector forever.
    pending_.erase(pending_.begin(), pending_.begin() + static_cast<ptrdiff_t>(pending_head_));
    pending_head_ = 0;
  }
  after_output_change(progress);
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
  if (reading_ && queued_bytes_ > budget_bytes_) {
    reading_ = false;
    core::log().debug("tcp link {}: {} bytes queued for a peer that is not reading (budget {}): "
                  "reading from it paused", description_, queued_bytes_, budget_bytes_);
  } else if (!reading_ && queued_bytes_ <= budget_bytes_ / 2) {
    reading_ = true;
  }
  update_epoll_interest();
}

void TcpLink::on_writable() { flush_pending(); }

void TcpLink::update_epoll_interest() {
  const bool want = pending_head_ < pending_.size();
  if (down_ || !in_epoll_ || (want == want_write_ && reading_ == epoll_reading_)) return;
  // EPOLLOUT only while something waits: a writable socket is the common
  // case and level-triggered EPOLLOUT would wake every poll for nothing.
  // EPOLLIN not while the output budget is exceeded (backpressure); errors
  // and hang-ups are reported regardless.
  epoll_event ev{};
  ev.events = (reading_ ? EPOLLIN : 0u) | (want ? EPOLLOUT : 0u);
  ev.data.ptr = this;
  if (::epoll_ctl(owner_.epoll_fd_, EPOLL_CTL_MOD, socket_.native_handle(), &ev) != 0) {
    fail(errno_text("epoll_ctl", errno));
    return;
  }
  want_write_ = want;
  epoll_reading_ = reading_;
}

void TcpLink::on_readable(bool drain_all) {
  // An event taken before the budget was exceeded: what is in the socket
  // stays there.  (A broken socket is drained regardless.)
  if (!reading_ && !drain_all) return;
  const int fd = socket_.native_handle();
  for (int reads = 0; !down_ && (drain_all || reads < kReadBudget); ++reads) {
    // Completions not yet taken by poll() are memory a peer can grow too:
    // leave the rest in the socket (level-triggered epoll comes back).
    if (!drain_all && owner_.backlog() >= TcpTransport::kReadyLimit) return;
    const bool direct = in_body_ && !body_control_ && staging_end_ == 0 &&
                        body_len_ - body_got_ >= TcpTransport::kDirectReadThreshold;
    std::byte* dst;
    size_t room;
    if (direct) {
      // Large body not here yet: let the kernel copy it into the slot once
      // instead of twice via staging.
      dst = body_dest_ + body_got_;
      room = body_len_ - body_got_;
    } else {
      dst = staging_.get() + staging_end_;
      room = TcpTransport::kStagingBytes - staging_end_;
    }
    const ssize_t n = ::recv(fd, dst, room, MSG_DONTWAIT);
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
    if (direct) {
      body_got_ += static_cast<uint32_t>(n);
      if (body_got_ == body_len_) finish_frame();
    } else {
      staging_end_ += static_cast<size_t>(n);
      if (!parse_staging()) return;
    }
    // Fewer bytes than asked: the socket is drained; skip the EAGAIN call.
    if (static_cast<size_t>(n) < room && !drain_all) return;
  }
}

bool TcpLink::parse_staging() {
  std::byte* const base = staging_.get();
  while (staging_begin_ < staging_end_) {
    const size_t avail = staging_end_ - staging_begin_;
    if (!in_body_) {
      if (avail < kPrefixSize) break;
      const uint32_t word = load_u32_le(base + staging_begin_);
      const uint32_t imm = load_u32_le(base + staging_begin_ + 4);
      staging_begin_ += kPrefixSize;
      if (!begin_frame(word, imm)) return false;
    } else {
      const size_t take = std::min<size_t>(avail, body_len_ - body_got_);
      std::memcpy(body_dest_ + body_got_, base + staging_begin_, take);
      staging_begin_ += take;
      body_got_ += static_cast<uint32_t>(take);
      if (body_got_ == body_len_) finish_frame();
    }
  }
  // Whatever is left is under 8 bytes of a prefix: move it to the front so
  // the next recv gets the whole buffer and direct reads see it empty.
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
  if (len == 0) {
    fail("peer sent a frame with an empty body");
    return false;
  }
  if (control) {
    if (len != core::kHeaderSize) {
      fail("control frame of " + std::to_string(len) + " bytes, expected " +
           std::to_string(core::kHeaderSize));
      return false;
    }
    body_dest_ = control_body_.data();
  } else {
    // Every check runs before a byte is written: a peer must not be able to
    // write outside the ring or over a slot a handler is still reading.
    const uint16_t slot = core::imm_slot(imm);
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
    body_dest_ = ring_.base + size_t{slot} * slot_size_;
  }
  in_body_ = true;
  body_control_ = control;
  body_len_ = len;
  body_got_ = 0;
  body_imm_ = imm;
  return true;
}

void TcpLink::finish_frame() {
  Completion c;
  c.kind = body_control_ ? Completion::Kind::kControl : Completion::Kind::kMessage;
  c.slot = body_control_ ? 0 : core::imm_slot(body_imm_);
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
}

void TcpLink::close(std::string reason) { fail(std::move(reason)); }

void TcpLink::fail(std::string reason) {
  if (down_) return;
  down_ = true;
  down_reason_ = std::move(reason);
  core::log().debug("tcp link {} down: {}", description_, down_reason_);
  if (in_epoll_) {
    ::epoll_ctl(owner_.epoll_fd_, EPOLL_CTL_DEL, socket_.native_handle(), nullptr);
    in_epoll_ = false;
  }
  boost::system::error_code ec;
  socket_.shutdown(tcp::socket::shutdown_both, ec);
  socket_.close(ec);
  // Nothing can be delivered any more; the credit protocol's memory is the
  // core's to reclaim once it sees kLinkDown.
  pending_.clear();
  pending_head_ = 0;
  queued_bytes_ = 0;
  owner_.unstall(this);
  want_write_ = false;
  in_body_ = false;
  staging_begin_ = staging_end_ = 0;
  Completion c;
  c.kind = Completion::Kind::kLinkDown;
  c.context = context_;
  c.link = this;
  owner_.push_completion(c);
}

// ----------------------------------------------------------- TcpTransport

TcpTransport::TcpTransport(const Config& config) : peer_timeout_ms_(config.peer_timeout_ms) {
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) epoll_errno_ = errno;
  ready_.reserve(kReadyReserve);
  iov_.resize(kMaxIov);
}

TcpTransport::~TcpTransport() {
  // Sockets are bound to io_, which dies with us.
  assert(live_links_ == 0 && "destroy every TcpLink before its TcpTransport");
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
}

Result<std::unique_ptr<TcpLink>> TcpTransport::adopt(int fd, std::string description) {
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
  return link;
}

size_t TcpTransport::poll(std::span<Completion> out) {
  auto drain = [this](std::span<Completion> dst) {
    const size_t n = std::min(dst.size(), ready_.size() - ready_head_);
    std::copy_n(ready_.begin() + static_cast<ptrdiff_t>(ready_head_), n, dst.begin());
    ready_head_ += n;
    if (ready_head_ == ready_.size()) {
      ready_.clear();  // keeps capacity: the queue does not creep forward
      ready_head_ = 0;
    }
    return n;
  };

  // Before anything is handed out, so that a link closed here reports its
  // own reason ahead of the session's keepalive verdict in the same turn.
  if (!stalled_.empty()) check_stalled();
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
  auto* link = static_cast<TcpLink*>(e.data.ptr);
  if (link == nullptr) return;  // its link was destroyed after epoll_wait
  {
    const uint32_t ev = e.events;
    const bool broken = (ev & (EPOLLERR | EPOLLHUP)) != 0;
    if (!link->down_ && (ev & (EPOLLIN | EPOLLERR | EPOLLHUP))) link->on_readable(broken);
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
    core::log().warn("slotrpc: closing {}: {}", link->description_, reason);
    link->fail(std::move(reason));
  }
}

void TcpTransport::forget(TcpLink* link) {
  // Saved events must not hand the destroyed link to the next poll().
  for (int i = event_head_; i < event_count_; ++i)
    if (events_[i].data.ptr == link) events_[i].data.ptr = nullptr;
  auto first = ready_.begin() + static_cast<ptrdiff_t>(ready_head_);
  ready_.erase(std::remove_if(first, ready_.end(),
                              [link](const Completion& c) { return c.link == link; }),
               ready_.end());
  if (ready_head_ == ready_.size()) {
    ready_.clear();
    ready_head_ = 0;
  }
}

}  // namespace slotrpc::transport
