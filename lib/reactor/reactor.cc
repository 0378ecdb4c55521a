#include "reactor/reactor.h"

#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cassert>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

#include "base/cpu_list.h"
#include "base/logging.h"

namespace slotrpc::reactor {

Reactor::Reactor(const Config& config, std::string name)
    : core::Loop(config, std::move(name)), spin_(config.spin_us, config.spin_max_us) {
  stats_.spin_us = config.spin_us;
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) {
    throw std::runtime_error(std::string("slotrpc reactor: ") + std::strerror(errno));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = event_fd_;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, event_fd_, &ev);
  completions_.resize(config.poll_batch);
  make_token();
}

Reactor::~Reactor() {
  // Threads that may drive this loop (caller_turns.cc) find it gone from
  // here on; the loop thread takes the turn back from one that drives now,
  // and we wait for the last to let go of the loop.
  close_token();
  stop();
  end_leases();
  // Tasks never run (posted after the loop ended) are destroyed here.
  Task t;
  while (inbox_.pop(t)) {
  }
  run_doorbells();  // their owners only release what they hold
  // What the layers above keep with the loop (a monitor samples the
  // transports), then the transports, newest first.
  extension_.reset();
  while (!transports_.empty()) transports_.pop_back();
  ::close(epoll_fd_);
}

Result<transport::Transport*> Reactor::add_transport(std::unique_ptr<transport::Transport> t) {
  if (find_transport(t->name()) != nullptr)
    return Status(StatusCode::kInternal, fmt::format("slotrpc reactor: a second {} transport", t->name()));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = t->wait_fd();
  if (ev.data.fd < 0 || ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, ev.data.fd, &ev) != 0) {
    return Status(StatusCode::kInternal,
                  fmt::format("slotrpc reactor: {} epoll: {}", t->name(), std::strerror(errno)));
  }
  core::TransportTotals& totals = counters_.totals(core::LoopCounters::kind_of_name(t->name()));
  // Newest first: the transports a loop takes on with its sessions (verbs,
  // shm) are polled before TCP, which every loop has from the start.
  polled_.insert(polled_.begin(), Polled{t.get(), &totals.completions_per_poll});
  transports_.push_back(std::move(t));
  return transports_.back().get();
}

transport::Transport* Reactor::find_transport(std::string_view name) const {
  for (const auto& t : transports_)
    if (t->name() == name) return t.get();
  return nullptr;
}

Reactor::Extension& Reactor::extension(const std::function<std::unique_ptr<Extension>()>& make) {
  if (Extension* e = extension_ptr_.load(std::memory_order_acquire)) return *e;
  std::lock_guard<std::mutex> lock(extension_mu_);
  if (!extension_) {
    extension_ = make();
    extension_ptr_.store(extension_.get(), std::memory_order_release);
  }
  return *extension_;
}

// Config::loop_cpus (base/cpu_list.h says why).  Validated with the
// config (the syntax, and at least one CPU online); if the kernel refuses
// anyway (a cpuset keeps the process off those CPUs), the loop runs where
// it is and says so once.
void Reactor::place_thread() {
  if (config_.loop_cpus.empty()) return;
  auto set = base::parse_cpu_list("SLOTRPC_LOOP_CPUS", config_.loop_cpus);
  if (!set.ok()) {
    base::log().warn("slotrpc: {}: {}", name_, set.status().message());
    return;
  }
  if (!base::pin_this_thread(set.value()))
    base::log().warn("slotrpc: {}: cannot run on CPUs {} (SLOTRPC_LOOP_CPUS): {}", name_, config_.loop_cpus,
                     std::strerror(errno));
}

void Reactor::start() {
  turn_.store(kTurnLoop);
  thread_ = std::thread([this] { loop(); });
}

void Reactor::stop() {
  if (!thread_.joinable()) return;
  stop_.store(true);
  ::eventfd_write(event_fd_, 1);
  thread_.join();
}

bool Reactor::run_one_turn() {
  assert(!thread_.joinable() && "run_one_turn() on a started Reactor");
  return run_turn();
}

void Reactor::loop() {
  enter_thread();
  home_id_ = std::this_thread::get_id();
  pthread_setname_np(pthread_self(), name_.substr(0, 15).c_str());
  place_thread();
  // The idle clock uses each turn's own clock read (turn_now_): one read a
  // turn, busy or idle, which matters where a read is a system call (an
  // emulated HPET, docs/benchmarks.md).  Idleness starts at the first idle
  // turn's read, not at the last working turn's: that one is taken before
  // the turn's fibers and flush (a sendmsg, microseconds on loopback), and
  // counting from there made loops start yielding that much sooner (TCP
  // ping-pong p50 8.7 -> 9.2 µs on the host).
  Clock::time_point idle_since = Clock::now();
  bool idle_started = true;
  while (!stop_.load(std::memory_order_relaxed)) {
    // Callers waiting to run turns themselves (caller_turns.cc): one load
    // a turn, and 0 unless a thread waits in Future::get().
    if (callers_.load(std::memory_order_relaxed) != 0) {
      park_for_callers();
      idle_since = Clock::now();
      continue;
    }
    if (run_turn()) {
      idle_started = false;
      continue;
    }
    if (!idle_started) {
      idle_since = turn_now_;
      idle_started = true;
    }
    // Idle.  Both spinning modes (busy, adaptive) yield the CPU between
    // polls once they have been idle for busy_yield_us: a loop that spins
    // right after it sent a request holds the core its peer may be woken onto.  Loopback TCP
    // wakes the receiver "synchronously" (sk_data_ready), and the scheduler
    // then queues it on the sender's CPU, expecting the sender to sleep; a
    // spinning sender that never yields keeps it waiting until the spin
    // ends.  Measured (docs/benchmarks.md, "Spinning loops yield"): one echo
    // every 2 ms, adaptive on both ends, p50 475 us without the yield.
    if (config_.poll_mode == PollMode::kBlocking) {
      sleep_until_work();
      continue;
    }
    // Spinning: adaptive sleeps after spin_us (0: at once); busy after
    // busy_sleep_us (0: never), so that busy polling survives
    // oversubscription (docs/tuning.md).  Work resets the idle clock.
    const auto idle = turn_now_ - idle_since;
    const bool adaptive = config_.poll_mode == PollMode::kAdaptive;
    const bool sleep_now = adaptive ? idle >= spin_.budget()
                                    : config_.busy_sleep_us != 0 && idle >= std::chrono::microseconds(config_.busy_sleep_us);
    if (sleep_now) {
      const Clock::time_point asleep_at = turn_now_;
      sleep_until_work();
      idle_since = Clock::now();
      if (adaptive) {
        spin_.slept(idle_since - asleep_at);
        stats_.spin_us = static_cast<uint64_t>(spin_.budget().count());
      }
    } else if (config_.busy_yield_us != 0 && idle >= std::chrono::microseconds(config_.busy_yield_us)) {
      ++stats_.yields;
      ::sched_yield();
    }
  }
  // Run what was posted before stop (e.g. session shutdowns), boundedly.
  for (int i = 0; i < 100 && run_turn(); ++i) {
  }
  turn_.store(kTurnStopped);  // no caller takes a turn from here on
  leave_thread();
}

bool Reactor::run_turn(bool fibers) {
  bool worked = false;
  ++stats_.turns;

  // Cross-thread tasks; bounded so a flood cannot starve the network.
  Task task;
  for (int i = 0; i < 1024 && inbox_.pop(task); ++i) {
    // Doorbells rung before this task was posted run before it (one load
    // when none is): a thread that drops a stream message and then asks
    // the loop something sees the slot back, as with posted tasks.
    worked |= run_doorbells();
    run_guarded("a posted task", task);
    task = nullptr;
    worked = true;
  }
  worked |= run_doorbells();

  // One batch of completions per transport, through the interface (one
  // virtual call per poll, none per message).  A session callback may
  // destroy a link, never a transport, so the batch stays valid while it
  // is handed out.
  //
  // Bytes a poll moved are work even without a completion: a bulk
  // transfer's data arrives without one until its last byte, and a loop
  // that counted only completions went idle in the middle of a transfer,
  // yielding every turn after busy_yield_us and sleeping after its spin
  // (docs/benchmarks.md, "data that arrives is work").  Two loads of a
  // counter: nothing on the hot path.
  for (const Polled& p : polled_) {
    const uint64_t moved = p.transport->bytes_moved();
    const size_t n = p.transport->poll(completions_);
    worked |= p.transport->bytes_moved() != moved;
    if (n == 0) continue;
    p.per_poll->record(n);
    received_at_ = Clock::now();  // one read per batch (received_at())
    for (size_t i = 0; i < n; ++i) {
      const transport::Completion& c = completions_[i];
      auto* session = static_cast<core::SessionBase*>(c.context);
      if (session != nullptr) session->on_completion(session, c);
    }
    received_at_ = {};  // outside a batch, Loop::stamp() reads the clock
    stats_.completions += n;
    worked = true;
  }

  // The turn's clock read: it stamps the sessions that heard their peer in
  // the batches above (after every callback of theirs ran, so never earlier
  // than what the application saw), then decides which timers are due, so
  // that a session heard in this turn is never declared dead by it.
  const Clock::time_point now = Clock::now();
  turn_now_ = now;
  if (!heard_list_.empty()) {
    for (core::SessionBase* s : heard_list_) {
      if (s == nullptr) continue;
      s->heard_queued = false;
      s->last_heard = now;
    }
    heard_list_.clear();
  }
  if (timers_.live() != 0) {
    if (timers_.next_deadline() <= now) {
      // A timer leaves the heap before its callback runs, so after a throw
      // the remaining due timers simply run in the next turn.
      run_guarded("a timer callback", [this, now] { timers_.run_expired(now); });
      worked = true;
    }
  }

  // Fibers woken during this turn (their awaited result arrived).
  while (fibers && !ready_fibers_.empty()) {
    running_fibers_.swap(ready_fibers_);
    for (base::Fiber* f : running_fibers_) fibers_.resume(f);
    running_fibers_.clear();
    worked = true;
  }

  flush_sessions();
  return worked;
}

void Reactor::flush_sessions() {
  // One post per link for everything this turn produced.
  while (!flush_list_.empty()) {
    flushing_.swap(flush_list_);
    for (core::SessionBase* s : flushing_) {
      if (s == nullptr) continue;
      s->flush_queued = false;
      s->flush(s);
    }
    flushing_.clear();
  }
}

bool Reactor::transports_ready_to_sleep() {
  for (const Polled& p : polled_)
    if (!p.transport->prepare_sleep()) return false;
  return true;
}

void Reactor::sleep_until_work() {
  sleeping_.store(true, std::memory_order_relaxed);
  // A caller that wants the turn looks at deep_asleep_ after it counted
  // itself in callers_, and we at callers_ after this store.
  deep_asleep_.store(true, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (callers_.load(std::memory_order_relaxed) != 0 || !inbox_.empty() || doorbells_.load(std::memory_order_relaxed) != nullptr ||
      !ready_fibers_.empty() || !transports_ready_to_sleep() || stop_.load(std::memory_order_relaxed)) {
    sleeping_.store(false, std::memory_order_relaxed);
    deep_asleep_.store(false, std::memory_order_relaxed);
    return;
  }
  int timeout_ms = -1;
  const Clock::time_point next = timers_.next_deadline();
  if (next != Clock::time_point::max()) {
    auto left = std::chrono::ceil<std::chrono::milliseconds>(next - Clock::now()).count();
    timeout_ms = left < 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 60'000));
  }
  epoll_event events[4];
  ++stats_.sleeps;
  const int n = ::epoll_wait(epoll_fd_, events, 4, timeout_ms);
  sleeping_.store(false, std::memory_order_relaxed);
  deep_asleep_.store(false, std::memory_order_relaxed);
  for (int i = 0; i < n; ++i) {
    if (events[i].data.fd == event_fd_) {
      eventfd_t ignored;
      ::eventfd_read(event_fd_, &ignored);
    }
  }
}

}  // namespace slotrpc::reactor
