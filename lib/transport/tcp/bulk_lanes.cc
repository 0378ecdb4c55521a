#include "transport/tcp/bulk_lanes.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <utility>

#include "base/cpu_list.h"
#include "base/logging.h"
#include "transport/tcp/lane_placement.h"
#include "transport/tcp/tcp_transport.h"

namespace slotrpc::transport {

Result<std::unique_ptr<BulkLanes>> BulkLanes::start(const Config& loop_config, int loop_epoll_fd) {
  std::unique_ptr<BulkLanes> l(new BulkLanes());
  auto sys_error = [](const char* what) {
    return Status(StatusCode::kResourceExhausted,
                  std::string("bulk lane: ") + what + ": " + std::strerror(errno));
  };
  l->wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (l->wake_fd_ < 0) return sys_error("eventfd");
  l->stop_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (l->stop_fd_ < 0) return sys_error("eventfd");
  l->wait_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (l->wait_fd_ < 0) return sys_error("epoll_create1");
  l->transport_ = std::make_unique<TcpTransport>(loop_config, TcpTransport::Role::kLanes);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = l->transport_->wait_fd();
  if (::epoll_ctl(l->wait_fd_, EPOLL_CTL_ADD, l->transport_->wait_fd(), &ev) != 0)
    return sys_error("epoll_ctl");
  ev.data.fd = l->stop_fd_;
  if (::epoll_ctl(l->wait_fd_, EPOLL_CTL_ADD, l->stop_fd_, &ev) != 0) return sys_error("epoll_ctl");
  // The loop's side: the TcpTransport recognises this pointer in its events.
  ev.data.ptr = l.get();
  if (::epoll_ctl(loop_epoll_fd, EPOLL_CTL_ADD, l->wake_fd_, &ev) != 0) return sys_error("epoll_ctl");
  l->loop_epoll_fd_ = loop_epoll_fd;
  l->spin_ = std::chrono::microseconds(loop_config.tcp_lane_spin_us);
  l->lane_cpus_ = loop_config.tcp_lane_cpus;
  l->loop_cpus_ = loop_config.loop_cpus;
  try {
    l->thread_ = std::thread([p = l.get()] { p->run(); });
  } catch (const std::system_error& e) {
    errno = e.code().value();
    return sys_error("thread");
  }
  // Named here, not by the thread itself: once start() returns, the thread
  // shows as a lane thread (tools and tests that count them never see it
  // under its creator's name).
  pthread_setname_np(l->thread_.native_handle(), "slotrpc-lanes");
  return l;
}

BulkLanes::~BulkLanes() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)!::write(stop_fd_, &one, sizeof one);
    thread_.join();
  }
  if (loop_epoll_fd_ >= 0) ::epoll_ctl(loop_epoll_fd_, EPOLL_CTL_DEL, wake_fd_, nullptr);
  transport_.reset();
  for (int fd : {wake_fd_, stop_fd_, wait_fd_})
    if (fd >= 0) ::close(fd);
}

void BulkLanes::run() {
  tid_.store(::gettid(), std::memory_order_release);
  place_thread();
  // Scheduled like any thread, not SCHED_BATCH: batch kept small calls'
  // p99 beside a 1 GiB transfer within 2x of idle more often on 2 vCPUs,
  // but on a host whose cores are all busy every wake-up of this thread
  // then waited for a time slice and bulk data moved up to 60 % slower
  // (docs/benchmarks.md).  Keeping bulk copies off the loops' cores is
  // what SLOTRPC_TCP_LANE_CPUS / SLOTRPC_LOOP_CPUS are for (place_thread).
  std::array<Completion, 64> buf;
  std::array<epoll_event, 2> evs;
  // Spinning (Config::tcp_lane_spin_us): after the last sign of work the
  // thread polls on for spin_, yielding the CPU between polls, before it
  // sleeps.  A transfer keeps a lane busy only in bursts (the receiver
  // drains the socket faster than loopback or the NIC fills it; the sender
  // waits for room), and a thread that slept between bursts paid a
  // wake-up for each: 100,000 context switches for ten 1 GiB echoes, and
  // 20 to 40 % of the throughput from 16 MiB up (docs/benchmarks.md, "TCP:
  // lane threads spin").  Yielding, not spinning flat out, so that an
  // event loop woken for a small call on the same core gets it at once.
  //
  // Work is a completion or bytes the poll moved.  Completions
  // alone are not enough: a read's data arrives without one until its last
  // byte, and counting only them sent the receiving lane thread to sleep
  // every 200 us in the middle of a 64 MiB transfer (40 sleeps a call,
  // each paid as a wake-up the sender waited for; docs/benchmarks.md,
  // "data that arrives is work").
  auto last_work = std::chrono::steady_clock::now();
  for (;;) {
    size_t n;
    bool moved;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const uint64_t bytes = transport_->bytes_moved();
      n = transport_->poll(buf);
      moved = transport_->bytes_moved() != bytes;
      for (size_t i = 0; i < n; ++i) forward(to_event(buf[i]));
    }
    if (n != 0 || moved) {  // more may be ready; epoll comes back when not
      if (spin_.count() != 0) last_work = std::chrono::steady_clock::now();
      continue;
    }
    int k = 0;
    if (spin_.count() != 0) {
      k = ::epoll_wait(wait_fd_, evs.data(), static_cast<int>(evs.size()), 0);
      const auto now = std::chrono::steady_clock::now();
      if (k > 0) {
        last_work = now;
      } else if (now - last_work < spin_) {
        ::sched_yield();
        continue;
      }
    }
    if (k <= 0) {
      // Asleep until a lane socket is ready or stop.  The timeout lets the
      // transport's drain clock (peer_timeout_ms) run while a peer stalls.
      sleeps_.fetch_add(1, std::memory_order_relaxed);
      k = ::epoll_wait(wait_fd_, evs.data(), static_cast<int>(evs.size()), 100);
      if (k > 0 && spin_.count() != 0) last_work = std::chrono::steady_clock::now();
    }
    for (int i = 0; i < k; ++i)
      if (evs[i].data.fd == stop_fd_) return;
  }
}

// Config::tcp_lane_cpus, or off Config::loop_cpus (lane_placement()).
// The thread is started by a loop thread and so begins on the loop's
// CPUs; without a placement it stays there.  A refusal (a cpuset keeps the
// process off those CPUs) is logged; the lanes work anyway.
void BulkLanes::place_thread() {
  std::string error;
  const std::optional<cpu_set_t> set = lane_placement(lane_cpus_, loop_cpus_, base::process_cpus(), &error);
  if (!error.empty()) base::log().warn("slotrpc: bulk lanes: {}", error);
  if (set && !base::pin_this_thread(*set))
    base::log().warn("slotrpc: bulk lanes: cannot run on CPUs {}: {}", base::format_cpu_list(*set),
                     std::strerror(errno));
}

BulkLanes::Event BulkLanes::to_event(const Completion& c) {
  auto* lane = static_cast<TcpLink*>(c.link);
  Event e;
  e.link = static_cast<TcpLink*>(c.context);
  switch (c.kind) {
    case Completion::Kind::kBulkDone:
      // imm 1: a lane write (TcpLink::write_chunk_sent), which needs a fence.
      e.kind = c.imm == 1 ? Event::Kind::kWriteDone : Event::Kind::kDone;
      e.token = c.bulk_token;
      e.status = c.bulk_status;
      e.lane_offset = lane->lane_bytes_out();
      break;
    case Completion::Kind::kControl:  // lane mode: a watched fence was reached
      e.kind = Event::Kind::kFence;
      break;
    case Completion::Kind::kLinkDown:
    case Completion::Kind::kMessage:  // a lane refuses slot frames: never
      e.kind = Event::Kind::kDown;
      e.reason = "bulk lane: " + lane->down_reason();
      break;
  }
  return e;
}

void BulkLanes::forward(Event e) {
  bool was_pending;
  {
    std::lock_guard<std::mutex> lock(events_mu_);
    events_.push_back(std::move(e));
    was_pending = pending_.exchange(true, std::memory_order_acq_rel);
  }
  if (!was_pending) {
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof one);
  }
}

void BulkLanes::take(std::vector<Event>& out) {
  uint64_t v;
  (void)!::read(wake_fd_, &v, sizeof v);  // level-triggered: clear it first
  std::lock_guard<std::mutex> lock(events_mu_);
  for (Event& e : events_) out.push_back(std::move(e));
  events_.clear();
  pending_.store(false, std::memory_order_release);
}

void BulkLanes::take_for(TcpLink* link, std::vector<Event>* out) {
  std::lock_guard<std::mutex> lock(events_mu_);
  size_t keep = 0;
  for (size_t i = 0; i < events_.size(); ++i) {
    if (events_[i].link == link) {
      if (out != nullptr) out->push_back(std::move(events_[i]));
    } else {
      if (keep != i) events_[keep] = std::move(events_[i]);
      ++keep;
    }
  }
  events_.resize(keep);
}

void BulkLanes::drain_lane(TcpLink* lane, std::vector<Event>& out) {
  for (const Completion& c : transport_->take_completions_of(lane)) out.push_back(to_event(c));
}

}  // namespace slotrpc::transport
