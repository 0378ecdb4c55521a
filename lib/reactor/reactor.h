// Reactor: one event loop on one thread.
//
// A turn: run tasks posted from other threads, poll every transport (TCP,
// and verbs or shm once a session uses it) for a batch of completions and hand each
// to its session, run due timers, then
// let every session that queued messages flush them as one batch per link
// (one writev / one doorbell).  Handlers run on pooled fibers, so a handler
// that waits (for a nested RPC, a sleep) suspends its fiber, not the loop.
//
// Idle policy (Config::poll_mode): busy spins, yields the CPU after
// busy_yield_us idle and sleeps after busy_sleep_us idle (so K busy loops on
// fewer cores still take turns; 0 turns either off); blocking sleeps in
// epoll as soon as a turn finds nothing; adaptive spins for spin_us first
// (growing up to spin_max_us while its sleeps keep ending soon,
// reactor/spin_budget.h), yielding after busy_yield_us like busy mode.
//
// A loop is shared: one Runtime (lib/rpc/runtime_core.h) runs sessions of
// many channels and servers on it, so its config is the runtime's, and its
// monitor calls every hook added with add_monitor_hook().
// Other threads wake a sleeping reactor through an eventfd, written only
// when the reactor has announced that it sleeps.
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/session_base.h"
#include "metrics/loop_counters.h"
#include "reactor/fiber_pool.h"
#include "reactor/mpsc_queue.h"
#include "reactor/spin_budget.h"
#include "reactor/timer_heap.h"
#include "slotrpc/config.h"
#include "transport/tcp/tcp_transport.h"

namespace slotrpc::transport::verbs {
class VerbsTransport;
}
namespace slotrpc::transport::shm {
class ShmTransport;
}
namespace slotrpc::monitor {
class Monitor;
class SampleHook;
}

namespace slotrpc::reactor {

struct HookList;

class Reactor {
 public:
  using Task = std::function<void()>;

  Reactor(const Config& config, std::string name);
  ~Reactor();  // stops and joins the thread
  Reactor(const Reactor&) = delete;
  Reactor& operator=(const Reactor&) = delete;

  // Starts the loop on a new thread.
  void start();
  // Asks the loop to finish; joins.  Tasks already posted still run.
  void stop();
  // Runs one turn on the calling thread; true if it did any work.  For tests
  // that drive a loop by hand, one step at a time (tests/fuzz): only on a
  // Reactor that is never start()ed, and always from the same thread.
  bool run_one_turn();

  const std::string& name() const { return name_; }
  const Config& config() const { return config_; }
  bool on_this_thread() const { return std::this_thread::get_id() == thread_id_.load(); }
  // The reactor whose loop runs on the calling thread, or nullptr.
  static Reactor* current();

  // Any thread.  Runs `task` on the loop thread, in order.
  void post(Task task);
  // Runs `task` on the loop now if called on the loop thread, else posts it.
  void run_or_post(Task task);

  // A wake-up without allocation, for producers on other threads that keep
  // their own lock-free queue and only need the loop to look at it (client
  // streams' ready rings, core/out_stream.h).  post() costs a task and an
  // inbox node per call; ring() costs one CAS on an intrusive stack.
  struct Doorbell {
    Doorbell* next = nullptr;
    void (*run)(Doorbell*) = nullptr;  // on the loop; may free the doorbell
  };
  // Any thread.  `run` runs on the loop early in a turn (after the posted
  // tasks); the loop is woken only if it sleeps.  A doorbell may be rung
  // again once its run has started, never while it is still queued (the
  // owner keeps a flag).  Doorbells still queued when the loop ends run in
  // ~Reactor, on the destroying thread.
  void ring(Doorbell* d);

  // Loop thread.  Runs `task` on a fiber (it may suspend).
  void spawn(Task task) { fibers_.start(std::move(task)); }
  void spawn(FiberPool::Entry fn, void* ctx, uint64_t arg) { fibers_.start(fn, ctx, arg); }
  // Loop thread.  Schedules a suspended fiber to continue in this turn.
  void make_ready(Fiber* f) { ready_fibers_.push_back(f); }

  TimerHeap& timers() { return timers_; }
  transport::TcpTransport& tcp() { return tcp_; }
  // Loop thread.  This loop's verbs transport, created on first use (it
  // opens the RDMA device the config selects); the error says why not.
  Result<transport::verbs::VerbsTransport*> verbs();
  // Loop thread.  This loop's shared-memory transport (same-host peers,
  // lib/transport/shm/), created on first use: its wait_fd joins the loop's
  // epoll set, it is polled every turn and asked before the loop sleeps.
  Result<transport::shm::ShmTransport*> shm();
  // Loop thread.  This loop's monitor (hardware counters, receive pools),
  // or nullptr while the loop uses no verbs or the monitor is off.
  monitor::Monitor* monitor() { return monitor_.get(); }
  // Before start().  The callback holder the monitor calls after each
  // sample (Server/Channel::on_monitor_sample).
  void set_monitor_hook(std::shared_ptr<monitor::SampleHook> hook) { monitor_hook_ = std::move(hook); }
  // Any thread, any time.  Adds a callback holder that the loop's monitor
  // calls after each sample, besides set_monitor_hook()'s, for as long as
  // `hook` lives (the loop keeps a weak reference): every channel and server
  // sharing the loop adds its own.
  void add_monitor_hook(const std::shared_ptr<monitor::SampleHook>& hook);

  // Loop thread.  The session's flush() runs at the end of this turn.
  void request_flush(core::SessionBase* s) {
    if (!s->flush_queued) {
      s->flush_queued = true;
      flush_list_.push_back(s);
    }
  }
  // Loop thread, inside a completion callback: `s` heard its peer.  Its
  // last_heard is stamped once this turn's completions have all been handed
  // out, with the turn's one clock read (core/liveness.h).  Hot path: a
  // flag test and at most one push per session per turn.
  void heard(core::SessionBase* s) {
    if (!s->heard_queued) {
      s->heard_queued = true;
      heard_list_.push_back(s);
    }
  }
  // Loop thread, inside a completion callback: when the batch being handed
  // out was polled (one clock read per batch): when a request arrived, for
  // its deadline and the server's latency histogram.
  Clock::time_point received_at() const { return received_at_; }
  // Loop thread.  Drops a session from the flush and heard lists (it is
  // going away).
  void forget(core::SessionBase* s);

  // Loop thread.  The framework's counters of this loop (lib/metrics/).
  metrics::LoopCounters& counters() { return counters_; }

  // Counters for tests and benchmarks (loop thread or after stop()).
  struct Stats {
    uint64_t turns = 0;
    uint64_t sleeps = 0;
    uint64_t completions = 0;
    uint64_t yields = 0;  // sched_yield() of a spinning loop after busy_yield_us idle
    uint64_t spin_us = 0;  // adaptive mode: the current idle spin (SpinBudget)
  };
  const Stats& stats() const { return stats_; }

 private:
  void loop();
  // The loop thread, as it starts: runs it on Config::loop_cpus.
  void place_thread();
  bool run_turn();  // true if it did any work
  void sleep_until_work();
  void wake();
  bool run_doorbells();

  Config config_;
  std::string name_;
  std::thread thread_;
  std::atomic<std::thread::id> thread_id_{};
  std::atomic<bool> stop_{false};
  std::atomic<bool> sleeping_{false};
  int event_fd_ = -1;
  int epoll_fd_ = -1;

  MpscQueue<Task> inbox_;
  std::atomic<Doorbell*> doorbells_{nullptr};  // intrusive stack, see ring()
  TimerHeap timers_;
  FiberPool fibers_;
  std::vector<Fiber*> ready_fibers_;
  std::vector<Fiber*> running_fibers_;
  std::vector<core::SessionBase*> flush_list_;
  std::vector<core::SessionBase*> flushing_;
  std::vector<core::SessionBase*> heard_list_;
  Clock::time_point received_at_{};
  Clock::time_point turn_now_{};  // the turn's clock read, after its completions
  SpinBudget spin_;               // adaptive mode's idle spin
  std::vector<transport::Completion> completions_;
  transport::TcpTransport tcp_;
  std::unique_ptr<transport::verbs::VerbsTransport> verbs_;  // lazily, see verbs()
  std::unique_ptr<transport::shm::ShmTransport> shm_;        // lazily, see shm()
  std::unique_ptr<monitor::Monitor> monitor_;  // with verbs_ (lib/monitor/)
  std::shared_ptr<monitor::SampleHook> monitor_hook_;
  // add_monitor_hook()'s holders; monitor_hook_ fans out to them.
  std::shared_ptr<HookList> hook_list_;
  Stats stats_;
  metrics::LoopCounters counters_;
};

}  // namespace slotrpc::reactor
