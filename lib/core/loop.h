// What a session sees of the event loop it runs on: a queue of tasks from
// other threads (post, ring), timers, fibers, and the turn's bookkeeping
// (flush requests, "heard its peer", when the batch arrived).
//
// The loop itself (the thread, polling the transports, sleeping) is
// reactor::Reactor, which derives from this class.  The core includes only
// this header, so it depends on no reactor and no concrete transport
// (docs/design.md, "Layers").
//
// No virtual function: every call a session makes per message (flush
// requests, heard(), spawn) is an inline, direct call on the loop's own
// state, as it was when these members sat in the reactor.
#pragma once

#include <atomic>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "base/fiber_pool.h"
#include "base/mpsc_queue.h"
#include "base/timer_heap.h"
#include "core/loop_counters.h"
#include "core/session_base.h"
#include "slotrpc/config.h"

namespace slotrpc::core {

class Loop {
 public:
  using Task = std::function<void()>;

  Loop(const Config& config, std::string name);
  ~Loop();
  Loop(const Loop&) = delete;
  Loop& operator=(const Loop&) = delete;

  const std::string& name() const { return name_; }
  const Config& config() const { return config_; }
  bool on_this_thread() const { return std::this_thread::get_id() == thread_id_.load(); }
  // The loop running on the calling thread, or nullptr.
  static Loop* current();

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
  // owner keeps a flag).  Doorbells still queued when the loop ends run
  // when it is destroyed, on the destroying thread.
  void ring(Doorbell* d);

  // Loop thread.  Runs `task` on a fiber (it may suspend).
  void spawn(Task task) { fibers_.start(std::move(task)); }
  void spawn(base::FiberPool::Entry fn, void* ctx, uint64_t arg) { fibers_.start(fn, ctx, arg); }
  // Loop thread.  Schedules a suspended fiber to continue in this turn.
  void make_ready(base::Fiber* f) { ready_fibers_.push_back(f); }

  base::TimerHeap& timers() { return timers_; }

  // Loop thread.  The session's flush() runs at the end of this turn.
  void request_flush(SessionBase* s) {
    if (!s->flush_queued) {
      s->flush_queued = true;
      flush_list_.push_back(s);
    }
  }
  // Loop thread, inside a completion callback: `s` heard its peer.  Its
  // last_heard is stamped once this turn's completions have all been handed
  // out, with the turn's one clock read (core/liveness.h).  Hot path: a
  // flag test and at most one push per session per turn.
  void heard(SessionBase* s) {
    if (!s->heard_queued) {
      s->heard_queued = true;
      heard_list_.push_back(s);
    }
  }
  // Loop thread, inside a completion callback: when the batch being handed
  // out was polled (one clock read per batch): when a request arrived, for
  // its deadline and the server's latency histogram.  Outside a batch (tasks,
  // timers, resumed fibers, flushes) the zero time_point.
  Clock::time_point received_at() const { return received_at_; }
  // A latency stamp: inside a completion callback the batch's clock read,
  // elsewhere a fresh one.  A clock read costs more than the rest of a
  // stamp (about 21 ns through the vDSO on the development VM, seven a
  // call before: docs/benchmarks.md, "Cost of a call (core)"), and a call
  // started or ended by a callback is stamped when its batch arrived.
  Clock::time_point stamp() const {
    return received_at_ != Clock::time_point{} ? received_at_ : Clock::now();
  }
  // Loop thread.  Drops a session from the flush and heard lists (it is
  // going away).
  void forget(SessionBase* s);

  // Loop thread.  The framework's counters of this loop (lib/metrics/
  // reads them).
  LoopCounters& counters() { return counters_; }

 protected:
  // The loop's thread, as it starts and ends (the reactor's run()).
  void enter_thread();
  void leave_thread();
  // Wakes the loop if it announced that it sleeps (sleeping_).
  void wake();
  // Runs every rung doorbell; false if none was.
  bool run_doorbells();
  // The exception barrier of an event loop (docs/design.md, "Limits and
  // abuse"): an exception that a task or callback let through is logged
  // and dropped, and the loop and its other sessions carry on.  Code that
  // can fail for a reason a peer causes (session setup: memory, locked
  // memory, descriptors) catches its own exceptions and refuses the
  // session; this is the last line, so that nothing reaches std::terminate.
  template <class Fn>
  void run_guarded(const char* what, Fn&& fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      log_dropped(what, e.what());
    } catch (...) {
      log_dropped(what, nullptr);
    }
  }
  void log_dropped(const char* what, const char* message);

  Config config_;
  std::string name_;
  std::atomic<std::thread::id> thread_id_{};
  std::atomic<bool> sleeping_{false};
  int event_fd_ = -1;  // written by wake() while the loop sleeps

  base::MpscQueue<Task> inbox_;
  std::atomic<Doorbell*> doorbells_{nullptr};  // intrusive stack, see ring()
  base::TimerHeap timers_;
  base::FiberPool fibers_;
  std::vector<base::Fiber*> ready_fibers_;
  std::vector<SessionBase*> flush_list_;
  std::vector<SessionBase*> flushing_;  // the flush list being run
  std::vector<SessionBase*> heard_list_;
  Clock::time_point received_at_{};
  LoopCounters counters_;
};

}  // namespace slotrpc::core
