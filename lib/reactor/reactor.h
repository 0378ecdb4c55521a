// Reactor: one event loop on one thread.
//
// A turn: run tasks posted from other threads, poll every transport handed
// in (add_transport) for a batch of completions and hand each to its
// session, run due timers, then let every session that queued messages
// flush them as one batch per link (one writev / one doorbell).  Handlers
// run on pooled fibers, so a handler that waits (for a nested RPC, a sleep)
// suspends its fiber, not the loop.
//
// The reactor implements the loop the core sees (core/loop.h: tasks,
// timers, fibers, flush requests) and knows transports only through
// transport::Transport: it names none.  The layer that picks transports
// (lib/rpc/loop_transports.h) creates them and hands them in; the reactor
// polls each through the interface, one virtual call per poll.
//
// Idle policy (Config::poll_mode): busy spins, yields the CPU after
// busy_yield_us idle and sleeps after busy_sleep_us idle (so K busy loops on
// fewer cores still take turns; 0 turns either off); blocking sleeps in
// epoll as soon as a turn finds nothing; adaptive spins for spin_us first
// (growing up to spin_max_us while its sleeps keep ending soon,
// reactor/spin_budget.h), yielding after busy_yield_us like busy mode.
//
// A loop is shared: one Runtime (lib/rpc/runtime_core.h) runs sessions of
// many channels and servers on it, so its config is the runtime's.
// Other threads wake a sleeping reactor through an eventfd, written only
// when the reactor has announced that it sleeps.
//
// Caller turns (lib/reactor/caller_turns.cc): a plain thread that waits
// for a reply (Future::get()) may run the loop's turns itself while the
// loop's thread parks, so that a blocking call costs no hand-off between
// threads.  Who runs turns is one word (turn_): the loop thread, a caller,
// or nobody (the loop thread parked for callers).  Only on loops that
// allow it (allow_caller_turns(): loops that run no handler fibers).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "core/loop.h"
#include "reactor/spin_budget.h"
#include "slotrpc/config.h"
#include "slotrpc/histogram.h"
#include "slotrpc/result.h"
#include "transport/transport.h"

namespace slotrpc::reactor {

using core::Clock;

struct DriveToken;  // caller_turns.cc

class Reactor final : public core::Loop {
 public:
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

  // The reactor whose loop runs on the calling thread, or nullptr.
  static Reactor* current() { return static_cast<Reactor*>(core::Loop::current()); }

  // Before start(), or on the loop thread.  From now on the loop polls `t`
  // every turn, sleeps on its wait_fd() and asks its prepare_sleep(); it
  // owns `t` until it ends.  Completions per non-empty poll are recorded in
  // the loop's counters under the transport's name().  At most one
  // transport per name.
  Result<transport::Transport*> add_transport(std::unique_ptr<transport::Transport> t);
  // The transport added under `name` ("tcp", "verbs", "shm"), or nullptr.
  // Loop thread, or before start().
  transport::Transport* find_transport(std::string_view name) const;

  // What the layer that picks transports keeps with each loop (rpc: the
  // transports it created, their monitor, the monitor's callbacks).  The
  // reactor only owns it: it is destroyed when the loop ends, after the
  // loop stopped and before its transports.
  struct Extension {
    virtual ~Extension() = default;
  };
  // Any thread.  This loop's extension; `make` creates it on the first call.
  Extension& extension(const std::function<std::unique_ptr<Extension>()>& make);

  // Caller turns.  Any thread: lets (or stops letting) other threads run
  // this loop's turns while they wait.  Only for loops that never run a
  // fiber (a handler suspended on one thread must not resume on another);
  // spinning poll modes only.
  void allow_caller_turns(bool allow);
  bool caller_turns_allowed() const { return caller_turns_.load(std::memory_order_relaxed); }
  // Any thread.  Runs `task` on the loop: at once on the loop's thread; on
  // the calling thread, with the flush it asks for, when that thread can
  // take the turn without waiting (the loop thread is parked for callers);
  // else posted.  Never runs other work there (no completion, no callback).
  void run_or_drive(Task task);
  // A plain thread (no loop's): runs this loop's turns until `word` has
  // kWordReady (slotrpc/detail/shared_state.h) or `give_up`; true if ready.
  // Waits for the turn while another thread has it.  False at once when
  // caller turns are not allowed.
  bool drive_until_ready(const std::atomic<uint32_t>* word, Clock::time_point give_up);
  // A plain thread: one turn, if the turn is free now; for Future::ready().
  void drive_once();
  // The loop the calling thread last sent work to through run_or_drive(),
  // held for the lease's scope: the loop its next get() drives, or none
  // (that loop is gone, lends no turns, or this thread runs a loop).  A
  // Reactor's destructor waits for the leases on it to end.
  class DriveLease {
   public:
    DriveLease();
    ~DriveLease();
    DriveLease(const DriveLease&) = delete;
    DriveLease& operator=(const DriveLease&) = delete;
    Reactor* get() const { return loop_; }

   private:
    DriveToken* token_ = nullptr;
    Reactor* loop_ = nullptr;
  };

  // Counters for tests and benchmarks (loop thread or after stop()).
  struct Stats {
    uint64_t turns = 0;
    uint64_t sleeps = 0;
    uint64_t completions = 0;
    uint64_t yields = 0;  // sched_yield() of a spinning loop after busy_yield_us idle
    uint64_t spin_us = 0;  // adaptive mode: the current idle spin (SpinBudget)
    uint64_t caller_turns = 0;  // turns run by callers (caller_turns.cc)
    uint64_t parks = 0;         // times the loop thread parked for callers
  };
  const Stats& stats() const { return stats_; }

 private:
  void loop();
  // The loop thread, as it starts: runs it on Config::loop_cpus.
  void place_thread();
  // True if it did any work.  A caller's turn leaves ready fibers to the
  // loop thread (`fibers` false).
  bool run_turn(bool fibers = true);
  // The end of a turn: every session that queued messages posts them.
  void flush_sessions();

  // Caller turns (caller_turns.cc).  turn_'s values: who runs turns.
  static constexpr uint32_t kTurnIdle = 0;     // not started: nobody may drive
  static constexpr uint32_t kTurnLoop = 1;     // the loop thread
  static constexpr uint32_t kTurnFree = 2;     // the loop thread is parked for callers
  static constexpr uint32_t kTurnCaller = 3;   // a caller
  static constexpr uint32_t kTurnStopped = 4;  // the loop ended
  // Takes the turn for the calling thread if it is free; it is then the
  // loop's thread until release_turn().
  bool try_take_turn();
  void release_turn();
  // Any thread: the parked loop thread takes its turn back now.
  void hand_back();
  // Constructor: the token leases refer to.  Destructor: no new lease
  // reaches this loop (close_token), then none still holds it (end_leases).
  void make_token();
  void close_token();
  void end_leases();
  // A caller's turn: as run_turn(), fibers excepted; false when the caller
  // must stop driving (fibers to run, caller turns withdrawn, stop).
  bool caller_turn(bool* worked);
  // The loop thread: gives its turn to the callers waiting, and parks until
  // they are done (callers_ back to 0 and no caller turn for a while).
  void park_for_callers();
  void sleep_until_work();
  // Asks every transport's prepare_sleep(); false if one has work pending.
  bool transports_ready_to_sleep();

  struct Polled {
    transport::Transport* transport;
    Histogram* per_poll;  // counters_: completions per non-empty poll
  };

  std::thread thread_;
  std::thread::id home_id_{};  // the loop thread's id, given back after a caller's turn
  std::atomic<bool> stop_{false};
  std::atomic<uint32_t> turn_{kTurnIdle};
  // Threads waiting to drive (drive_until_ready), and kPollerWants: a
  // thread polling ready() found the turn taken (drive_once).  Nonzero:
  // the loop thread parks.
  static constexpr uint32_t kPollerWants = 1u << 31;
  std::atomic<uint32_t> callers_{0};
  std::atomic<uint64_t> caller_runs_{0};  // caller turns taken: the parked loop's sign of activity
  std::atomic<bool> caller_turns_{false};
  std::atomic<bool> handback_{false};      // hand_back() since the parked loop thread last looked
  std::atomic<bool> deep_asleep_{false};  // in sleep_until_work()'s epoll_wait
  // What a thread keeps of the loop it may drive (DriveLease): outlives
  // the loop, which clears it and waits for the leases on it as it ends.
  std::shared_ptr<DriveToken> token_;
  int epoll_fd_ = -1;

  std::vector<base::Fiber*> running_fibers_;
  Clock::time_point turn_now_{};  // the turn's clock read, after its completions
  SpinBudget spin_;               // adaptive mode's idle spin
  std::vector<transport::Completion> completions_;
  std::vector<std::unique_ptr<transport::Transport>> transports_;  // add_transport()
  std::vector<Polled> polled_;
  std::mutex extension_mu_;  // extension()'s creation
  std::atomic<Extension*> extension_ptr_{nullptr};
  std::unique_ptr<Extension> extension_;
  Stats stats_;
};

}  // namespace slotrpc::reactor
