// Caller turns: a thread blocked in Future::get() runs the loop's turns
// itself while the loop's thread parks.
//
// Why.  On a host with as many cores as busy threads (2 vCPUs: the client
// loop, the server loop and the waiting caller), a caller that waits for
// the loop to hand it a result is a third runnable thread: whether it
// spins or sleeps on a futex, every call pays a hand-off between threads
// (a post into the loop's inbox, the loop's poll, then a wake-up or a
// spinner that holds the core the loop needed).  A callback chain pays
// none of it.  Here the caller becomes the loop for the time it waits, as
// an eRPC application thread is its own loop: its call goes out from its
// own stack (run_or_drive), it polls the reply itself and runs the reply's
// callback, which makes its own result ready: no thread in between.
//
// Who runs turns is one word, turn_: the loop thread (kTurnLoop), a
// caller (kTurnCaller), or nobody (kTurnFree: the loop thread is parked and
// any caller may take the turn with a CAS).  A caller that wants the turn
// counts itself in callers_; the loop thread looks at callers_ once a turn
// (and before it sleeps in epoll, which a caller then interrupts) and
// parks.  While it holds the turn a caller is the loop's thread for every
// "am I on the loop" test (on_this_thread(), Loop::current()): it sets the
// loop's thread id to its own, and gives the loop thread's back on release.
//
// Fibers never change threads: a handler suspended on one thread cannot
// resume on another (its thread_locals, a lock it holds, the sanitizers'
// stack bookkeeping).  So caller turns are only for loops that run no
// fibers (the default client runtime's, lib/rpc/runtime.cc), a caller's
// turn never resumes one, and a caller stops driving if one gets ready.
//
// The parked loop thread comes back on its own: it rechecks every
// kParkRecheck, and takes the turn back when no caller waits and no caller
// took a turn since its last look, or at once when handed back (a caller
// that gave up on a slow reply, fibers to run, stop()).  So a thread that
// calls get() in a loop keeps the loop thread parked, and a program that
// stops calling has its loop back within two rechecks; meanwhile, what
// other threads post waits for the next turn, a caller's or the loop
// thread's (at most those two rechecks).  Releasing the turn costs no
// system call unless it hands the loop back.
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>

#include "base/cpu_relax.h"
#include "reactor/reactor.h"
#include "slotrpc/detail/shared_state.h"

namespace slotrpc::reactor {

namespace {

// The loop thread's recheck while parked for callers: how late, at most,
// it notices that callers stopped (twice this) when none tells it.  Short
// enough that a transport event no caller polls for waits about as long as
// an adaptive loop's wake-up; long enough that a parked loop thread wakes
// rarely (a wake-up costs a few µs of a core the callers use).
constexpr long kParkRecheckNs = 50'000;
// A caller that waits for the turn, or drives turns that find nothing,
// yields the CPU after this long, as an idle loop does (busy_yield_us).
constexpr auto kYieldAfter = std::chrono::microseconds(5);

}  // namespace

// A loop as a thread that may drive it knows it: the loop clears `loop` as
// it ends, then waits until no lease holds the token (`inside`).
struct DriveToken {
  std::atomic<Reactor*> loop;
  std::atomic<uint32_t> inside{0};
  explicit DriveToken(Reactor* r) : loop(r) {}
};

namespace {

// When this thread's last turn found work (run_or_drive, drive_once): a
// thread polling ready() yields the CPU once its turns have found nothing
// for kYieldAfter, as get() and an idle loop do.  Without it a poller that
// never sleeps kept the core the reply's producer needed (p50 1.6 ms at
// one call outstanding on a loaded 2-vCPU host).
thread_local Clock::time_point t_last_work{};

// The loop this thread last sent a call through (run_or_drive), if it
// lends its turns.  Reassigned only when it changes: no reference count
// traffic per call.
thread_local std::shared_ptr<DriveToken> t_target;

bool word_ready(const std::atomic<uint32_t>* word) {
  return (word->load(std::memory_order_acquire) & detail::kWordReady) != 0;
}

}  // namespace

Reactor::DriveLease::DriveLease() {
  if (!t_target || core::Loop::current() != nullptr) return;
  token_ = t_target.get();
  // Dekker with end_leases(): it clears `loop` then reads `inside`; we
  // count ourselves in then read `loop`.
  token_->inside.fetch_add(1, std::memory_order_seq_cst);
  Reactor* r = token_->loop.load(std::memory_order_seq_cst);
  if (r != nullptr && r->caller_turns_allowed()) loop_ = r;
}

Reactor::DriveLease::~DriveLease() {
  if (token_ != nullptr) token_->inside.fetch_sub(1, std::memory_order_release);
}

void Reactor::make_token() { token_ = std::make_shared<DriveToken>(this); }

void Reactor::close_token() { token_->loop.store(nullptr, std::memory_order_seq_cst); }

void Reactor::end_leases() {
  close_token();
  while (token_->inside.load(std::memory_order_seq_cst) != 0) ::sched_yield();
}

void Reactor::allow_caller_turns(bool allow) {
  caller_turns_.store(allow);
  // A caller driving now stops at its next turn and wakes the loop thread.
}

bool Reactor::try_take_turn() {
  uint32_t expect = kTurnFree;
  if (turn_.load(std::memory_order_relaxed) != kTurnFree ||
      !turn_.compare_exchange_strong(expect, kTurnCaller, std::memory_order_acquire, std::memory_order_relaxed))
    return false;
  caller_runs_.fetch_add(1, std::memory_order_relaxed);
  enter_thread();  // on_this_thread() and Loop::current() now name this thread
  return true;
}

void Reactor::release_turn() {
  // What only the loop thread may do: wake it now rather than at its next
  // recheck.  (Tasks posted meanwhile wait for the next turn, a caller's or
  // the loop thread's after its recheck.)
  const bool leftover = !ready_fibers_.empty() || stop_.load(std::memory_order_relaxed) ||
                        !caller_turns_.load(std::memory_order_relaxed);
  thread_id_.store(home_id_);
  leave_thread();
  turn_.store(kTurnFree, std::memory_order_release);
  if (leftover) hand_back();
}

void Reactor::hand_back() {
  handback_.store(true, std::memory_order_release);
  ::eventfd_write(event_fd_, 1);
}

bool Reactor::caller_turn(bool* worked) {
  *worked = run_turn(/*fibers=*/false);
  ++stats_.caller_turns;
  return ready_fibers_.empty() && caller_turns_.load(std::memory_order_relaxed) &&
         !stop_.load(std::memory_order_relaxed);
}

void Reactor::run_or_drive(Task task) {
  if (on_this_thread()) {
    task();
    return;
  }
  // The loop this thread's next get() drives: this one, or none (a get()
  // must not drive a loop other than its call's when it could help it).
  const bool drivable = caller_turns_.load(std::memory_order_relaxed) && core::Loop::current() == nullptr;
  if (core::Loop::current() == nullptr) {
    if (drivable) {
      if (t_target != token_) t_target = token_;
    } else if (t_target) {
      t_target.reset();
    }
  }
  if (drivable) {
    if (try_take_turn()) {
      // The task and the flush it asks for, nothing else: no completion is
      // handed out, so no callback of another call runs inside the call
      // that issued this one (its caller may hold a lock such a callback
      // takes).  The next turn, a get()'s or the loop thread's, polls.
      run_guarded("a task", task);
      flush_sessions();
      t_last_work = {};  // work just now (drive_once reads the time)
      release_turn();
      return;
    }
  }
  post(std::move(task));
}

void Reactor::drive_once() {
  if (!caller_turns_.load(std::memory_order_relaxed) || core::Loop::current() != nullptr) return;
  if (try_take_turn()) {
    bool worked = false;
    caller_turn(&worked);
    const Clock::time_point now = turn_now_;
    release_turn();
    if (worked || t_last_work == Clock::time_point{}) {
      t_last_work = now;
    } else if (now - t_last_work >= kYieldAfter) {
      ::sched_yield();
    }
    return;
  }
  if (t_last_work == Clock::time_point{}) {
    t_last_work = Clock::now();
  } else if (Clock::now() - t_last_work >= kYieldAfter) {
    ::sched_yield();
  }
  // The loop thread has the turn: ask it to park, as a get() would, so that
  // the next ready() finds the turn free.  Once per park (the flag is read
  // before it is written: a poller spins here).
  if ((callers_.load(std::memory_order_relaxed) & kPollerWants) == 0) {
    callers_.fetch_or(kPollerWants, std::memory_order_seq_cst);
    if (deep_asleep_.load(std::memory_order_seq_cst)) ::eventfd_write(event_fd_, 1);
  }
}

bool Reactor::drive_until_ready(const std::atomic<uint32_t>* word, Clock::time_point give_up) {
  if (!caller_turns_.load(std::memory_order_relaxed) || core::Loop::current() != nullptr) return word_ready(word);
  // Dekker with sleep_until_work(): it sets deep_asleep_ then reads
  // callers_; we count ourselves then read deep_asleep_.  A loop thread
  // asleep in epoll holds the turn, so it must wake to park.
  callers_.fetch_add(1, std::memory_order_seq_cst);
  if (deep_asleep_.load(std::memory_order_seq_cst)) ::eventfd_write(event_fd_, 1);
  bool done = false;
  const Clock::time_point start = Clock::now();
  for (uint32_t spins = 1;; ++spins) {
    if (word_ready(word)) {
      done = true;
      break;
    }
    if (try_take_turn()) {
      bool idle = false;
      Clock::time_point idle_since{};
      for (;;) {
        bool worked = false;
        const bool go_on = caller_turn(&worked);
        if (word_ready(word)) {
          done = true;
          break;
        }
        if (!go_on || turn_now_ >= give_up) break;
        // The turn's own clock read (turn_now_): none of our own.
        if (worked) {
          idle = false;
        } else if (!idle) {
          idle = true;
          idle_since = turn_now_;
        } else if (turn_now_ - idle_since >= kYieldAfter) {
          ::sched_yield();
        }
      }
      release_turn();
      break;
    }
    // The loop thread has not parked yet, or another caller drives (its
    // turns deliver our reply too).
    base::cpu_relax();
    if ((spins & 63) == 0) {
      const Clock::time_point now = Clock::now();
      if (now >= give_up) break;
      if (now - start >= kYieldAfter) ::sched_yield();
    }
  }
  // The last caller to give up hands the loop back at once: its own reply
  // (and everything else) is the loop thread's to deliver now.
  if ((callers_.fetch_sub(1, std::memory_order_seq_cst) & ~kPollerWants) == 1 && !done) hand_back();
  return done;
}

void Reactor::park_for_callers() {
  ++stats_.parks;
  callers_.fetch_and(~kPollerWants, std::memory_order_relaxed);  // a poller's ask is answered
  turn_.store(kTurnFree, std::memory_order_seq_cst);
  for (;;) {
    const uint64_t runs = caller_runs_.load(std::memory_order_relaxed);
    // Not "asleep" for Loop::wake(): tasks posted and doorbells rung now
    // run in the next caller's turn, or ours after the recheck, and the
    // thread that posts (often the caller itself, releasing a reply it
    // read) pays no eventfd write for a loop thread that need not run.
    if (!handback_.load(std::memory_order_acquire) && !stop_.load(std::memory_order_relaxed)) {
      pollfd pfd{event_fd_, POLLIN, 0};
      const timespec recheck{0, kParkRecheckNs};
      if (::ppoll(&pfd, 1, &recheck, nullptr) > 0) {
        eventfd_t ignored;
        ::eventfd_read(event_fd_, &ignored);  // non-blocking (core/loop.cc)
      }
    }
    const bool stopping = stop_.load(std::memory_order_relaxed);
    const bool handback = handback_.exchange(false, std::memory_order_acq_rel);
    const bool callers_done = (callers_.load(std::memory_order_seq_cst) & ~kPollerWants) == 0 &&
                              (handback || caller_runs_.load(std::memory_order_relaxed) == runs);
    if (stopping || callers_done) {
      uint32_t expect = kTurnFree;
      if (turn_.compare_exchange_strong(expect, kTurnLoop, std::memory_order_acquire, std::memory_order_relaxed)) {
        enter_thread();
        return;
      }
    }
  }
}

}  // namespace slotrpc::reactor
