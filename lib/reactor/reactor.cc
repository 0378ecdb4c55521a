#include "reactor/reactor.h"

#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cassert>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "core/cpu_list.h"
#include "core/logging.h"
#include "monitor/monitor.h"
#include "transport/verbs/verbs_transport.h"
#include "transport/shm/shm_transport.h"

namespace slotrpc::reactor {

// add_monitor_hook()'s holders.  Cold: a mutex, taken once per sample.
struct HookList {
  std::mutex mu;
  std::vector<std::weak_ptr<monitor::SampleHook>> hooks;
};

namespace {
thread_local Reactor* tls_reactor = nullptr;

// The exception barrier of an event loop (docs/design.md, "Limits and
// abuse"): an exception that a task or timer callback let through is
// logged and dropped, and the loop and its other sessions carry on.  Code
// that can fail for a reason a peer causes (session setup: memory, locked
// memory, descriptors) catches its own exceptions and refuses the session;
// this is the last line, so that nothing ever reaches std::terminate.
template <class Fn>
void run_guarded(const std::string& loop, const char* what, Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    core::log().error("slotrpc: {}: {} threw, dropped: {}", loop, what, e.what());
  } catch (...) {
    core::log().error("slotrpc: {}: {} threw a non-standard exception, dropped", loop, what);
  }
}
}

Reactor::Reactor(const Config& config, std::string name)
    : config_(config),
      name_(std::move(name)),
      fibers_(size_t{config.fiber_stack_kb} * 1024), spin_(config.spin_us, config.spin_max_us), tcp_(config),
      hook_list_(std::make_shared<HookList>()) {
  stats_.spin_us = config.spin_us;
  // The monitor's one hook calls every holder added later (a shared loop
  // serves many channels and servers); holders that died are dropped.
  monitor_hook_ = std::make_shared<monitor::SampleHook>();
  monitor_hook_->set([list = hook_list_](const MetricsSnapshot& snapshot) {
    std::vector<std::shared_ptr<monitor::SampleHook>> live;
    {
      std::lock_guard<std::mutex> lock(list->mu);
      std::erase_if(list->hooks, [&](const std::weak_ptr<monitor::SampleHook>& w) {
        auto h = w.lock();
        if (!h) return true;
        live.push_back(std::move(h));  // `h` is empty now: decide before
        return false;
      });
    }
    for (const auto& h : live) h->call(snapshot);
  });
  event_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (event_fd_ < 0 || epoll_fd_ < 0) {
    throw std::runtime_error(std::string("slotrpc reactor: ") + std::strerror(errno));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = event_fd_;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, event_fd_, &ev);
  ev.data.fd = tcp_.wait_fd();
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, tcp_.wait_fd(), &ev);
  completions_.resize(config.poll_batch);
}

Reactor::~Reactor() {
  stop();
  // Tasks never run (posted after the loop ended) are destroyed here.
  Task t;
  while (inbox_.pop(t)) {
  }
  run_doorbells();  // their owners only release what they hold
  monitor_.reset();  // it samples verbs_'s receive queues
  verbs_.reset();
  shm_.reset();
  ::close(event_fd_);
  ::close(epoll_fd_);
}

Result<transport::verbs::VerbsTransport*> Reactor::verbs() {
  if (verbs_) return verbs_.get();
  auto created = transport::verbs::VerbsTransport::create(config_);
  if (!created.ok()) return created.status();
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = created.value()->wait_fd();
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, ev.data.fd, &ev) != 0) {
    return Status(StatusCode::kInternal, std::string("slotrpc reactor: epoll_ctl: ") + std::strerror(errno));
  }
  verbs_ = std::move(created.value());
  core::log().debug("slotrpc: {}: verbs transport on {}", name_, verbs_->device().describe());
  // The monitor samples what this loop's verbs sessions use: the device
  // port's counters and the loop's receive queues (lib/monitor/monitor.h).
  if (config_.monitor_interval_ms != 0) {
    monitor_ = std::make_unique<monitor::Monitor>(*this, *verbs_, monitor_hook_);
  }
  return verbs_.get();
}

Result<transport::shm::ShmTransport*> Reactor::shm() {
  if (shm_) return shm_.get();
  auto created = std::make_unique<transport::shm::ShmTransport>(config_);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = created->wait_fd();
  if (ev.data.fd < 0 || ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, ev.data.fd, &ev) != 0) {
    return Status(StatusCode::kInternal, std::string("slotrpc reactor: shm epoll: ") + std::strerror(errno));
  }
  shm_ = std::move(created);
  core::log().debug("slotrpc: {}: shm transport", name_);
  return shm_.get();
}

void Reactor::add_monitor_hook(const std::shared_ptr<monitor::SampleHook>& hook) {
  std::lock_guard<std::mutex> lock(hook_list_->mu);
  hook_list_->hooks.push_back(hook);
}

Reactor* Reactor::current() { return tls_reactor; }

// Config::loop_cpus (core/cpu_list.h says why).  Validated with the
// config (the syntax, and at least one CPU online); if the kernel refuses
// anyway (a cpuset keeps the process off those CPUs), the loop runs where
// it is and says so once.
void Reactor::place_thread() {
  if (config_.loop_cpus.empty()) return;
  auto set = core::parse_cpu_list("SLOTRPC_LOOP_CPUS", config_.loop_cpus);
  if (!set.ok()) {
    core::log().warn("slotrpc: {}: {}", name_, set.status().message());
    return;
  }
  if (!core::pin_this_thread(set.value()))
    core::log().warn("slotrpc: {}: cannot run on CPUs {} (SLOTRPC_LOOP_CPUS): {}", name_, config_.loop_cpus,
                     std::strerror(errno));
}

void Reactor::start() {
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

void Reactor::post(Task task) {
  inbox_.push(std::move(task));
  wake();
}

void Reactor::run_or_post(Task task) {
  if (on_this_thread()) {
    task();
  } else {
    post(std::move(task));
  }
}

void Reactor::ring(Doorbell* d) {
  Doorbell* head = doorbells_.load(std::memory_order_relaxed);
  do {
    d->next = head;
  } while (!doorbells_.compare_exchange_weak(head, d, std::memory_order_release,
                                             std::memory_order_relaxed));
  wake();
}

// All rung doorbells at once (a stack: no order between them; each owner
// orders its own queue).  `next` is read before `run`, which may ring the
// doorbell again or free it.
bool Reactor::run_doorbells() {
  if (doorbells_.load(std::memory_order_relaxed) == nullptr) return false;
  Doorbell* d = doorbells_.exchange(nullptr, std::memory_order_acquire);
  while (d != nullptr) {
    Doorbell* next = d->next;
    run_guarded(name_, "a doorbell", [d] { d->run(d); });
    d = next;
  }
  return true;
}

void Reactor::wake() {
  // Pairs with the fence in sleep_until_work(): either the loop sees the
  // new task before sleeping, or we see that it sleeps and wake it.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (sleeping_.load(std::memory_order_relaxed)) ::eventfd_write(event_fd_, 1);
}

// A session going away: its places in this turn's lists are cleared, so
// that no stamp or flush reaches it after it is destroyed.
void Reactor::forget(core::SessionBase* s) {
  if (s->heard_queued) {
    s->heard_queued = false;
    for (auto& p : heard_list_)
      if (p == s) p = nullptr;
  }
  if (!s->flush_queued) return;
  s->flush_queued = false;
  for (auto& p : flush_list_)
    if (p == s) p = nullptr;
  for (auto& p : flushing_)  // forgotten while another session flushes
    if (p == s) p = nullptr;
}

void Reactor::loop() {
  thread_id_.store(std::this_thread::get_id());
  tls_reactor = this;
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
  tls_reactor = nullptr;
}

bool Reactor::run_turn() {
  bool worked = false;
  ++stats_.turns;

  // Cross-thread tasks; bounded so a flood cannot starve the network.
  Task task;
  for (int i = 0; i < 1024 && inbox_.pop(task); ++i) {
    // Doorbells rung before this task was posted run before it (one load
    // when none is): a thread that drops a stream message and then asks
    // the loop something sees the slot back, as with posted tasks.
    worked |= run_doorbells();
    run_guarded(name_, "a posted task", task);
    task = nullptr;
    worked = true;
  }
  worked |= run_doorbells();

  // One batch of completions per transport (both classes are final: these
  // are direct calls).  A session callback may destroy a link, never a
  // transport, so the batch stays valid while it is handed out.
  auto deliver = [this](size_t n, Histogram& per_poll) {
    if (n == 0) return false;
    per_poll.record(n);
    received_at_ = Clock::now();  // one read per batch (received_at())
    for (size_t i = 0; i < n; ++i) {
      const transport::Completion& c = completions_[i];
      auto* session = static_cast<core::SessionBase*>(c.context);
      if (session != nullptr) session->on_completion(session, c);
    }
    stats_.completions += n;
    return true;
  };
  if (verbs_) worked |= deliver(verbs_->poll(completions_), counters_.verbs.completions_per_poll);
  if (shm_) {
    // Bulk chunks copied in or out are work too (the TCP rule below).
    const uint64_t shm_bytes = shm_->bytes_moved();
    worked |= deliver(shm_->poll(completions_), counters_.shm.completions_per_poll);
    worked |= shm_->bytes_moved() != shm_bytes;
  }
  // Bytes the TCP poll moved are work even without a completion:
  // a bulk transfer's data arrives without one until its last byte, and a
  // loop that counted only completions went idle in the middle of a
  // transfer, yielding every turn after busy_yield_us and sleeping after
  // its spin (docs/benchmarks.md, sixteenth session, "data that arrives is
  // work").  Two loads of a counter: nothing on the hot path.
  const uint64_t tcp_bytes = tcp_.bytes_moved();
  worked |= deliver(tcp_.poll(completions_), counters_.tcp.completions_per_poll);
  worked |= tcp_.bytes_moved() != tcp_bytes;

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
      run_guarded(name_, "a timer callback", [this, now] { timers_.run_expired(now); });
      worked = true;
    }
  }

  // Fibers woken during this turn (their awaited result arrived).
  while (!ready_fibers_.empty()) {
    running_fibers_.swap(ready_fibers_);
    for (Fiber* f : running_fibers_) fibers_.resume(f);
    running_fibers_.clear();
    worked = true;
  }

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
  return worked;
}

void Reactor::sleep_until_work() {
  sleeping_.store(true, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (!inbox_.empty() || doorbells_.load(std::memory_order_relaxed) != nullptr ||
      !ready_fibers_.empty() || !tcp_.prepare_sleep() ||
      (verbs_ && !verbs_->prepare_sleep()) || (shm_ && !shm_->prepare_sleep()) || stop_.load(std::memory_order_relaxed)) {
    sleeping_.store(false, std::memory_order_relaxed);
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
  for (int i = 0; i < n; ++i) {
    if (events[i].data.fd == event_fd_) {
      eventfd_t ignored;
      ::eventfd_read(event_fd_, &ignored);
    }
  }
}

}  // namespace slotrpc::reactor
