// The library's side of Future<T>::get(): a handler's fiber waits without
// blocking its event loop; a thread runs its loop's turns itself where the
// loop lets it (reactor/caller_turns.cc says why), else spins briefly;
// then sleeps on the result's word (slotrpc/detail/shared_state.h).
//
// Why a thread spins, and for how long.  A thread that sleeps at once pays,
// per call, a futex wake on the loop that completes it and a scheduler hop
// (on a VM, often an idle vCPU's wake-up) before it runs again: on shm, at
// one call outstanding, several times the latency of a callback chain
// (docs/benchmarks.md, "Future::get()").  Spinning saves both, but only
// when the reply comes soon: on a host with fewer cores than busy threads
// a long spin steals the CPU the loops need to produce the reply.  So the
// spin is bounded (kMaxSpin) and learned per thread, as the loops' own
// spin is (reactor/spin_budget.h): a wait that had to sleep but ended
// within kGrowWindow (a longer spin would likely have caught it) doubles
// the budget; one that slept longer halves it, down to none.  The learning
// looks at outcomes, not at how long waits took: a wait that slept
// includes its own wake-up, which under load is the very cost the spin
// avoids, and an average of those kept a loaded thread from ever spinning.
// Past kYieldAfter, each check of the clock also yields the CPU, so a spin
// never holds a core the loop it waits for could run on.
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <optional>

#include "base/cpu_relax.h"
#include "reactor/reactor.h"
#include "slotrpc/future.h"

namespace slotrpc::detail {

bool current_fiber(FiberWaiter* out) {
  base::Fiber* f = base::FiberPool::current();
  reactor::Reactor* loop = reactor::Reactor::current();
  if (f == nullptr || loop == nullptr) return false;
  out->loop = loop;
  out->fiber = f;
  return true;
}

void suspend_current_fiber() { base::FiberPool::suspend(); }

void wake_fiber(const FiberWaiter& waiter) {
  auto* loop = static_cast<reactor::Reactor*>(waiter.loop);
  auto* f = static_cast<base::Fiber*>(waiter.fiber);
  if (loop->on_this_thread()) {
    loop->make_ready(f);
  } else {
    loop->post([loop, f] { loop->make_ready(f); });
  }
}

namespace {

using WaitClock = std::chrono::steady_clock;

constexpr int64_t kMaxSpinNs = 20'000;     // never spin longer than this
constexpr int64_t kMinSpinNs = 1'000;      // the smallest spin that is not none
constexpr int64_t kGrowWindowNs = 50'000;  // a sleep that ended sooner grows the spin
// Past this much of a spin, each clock check also yields the CPU, as an
// idle loop does after Config::busy_yield_us (5 µs by default).
constexpr int64_t kYieldAfterNs = 5'000;

// This thread's spin before it sleeps; starts in the middle.
thread_local int64_t t_spin_ns = 8'000;

void learn_slept(int64_t waited_ns) {
  if (waited_ns < kGrowWindowNs) {
    t_spin_ns = std::clamp<int64_t>(2 * t_spin_ns, kMinSpinNs, kMaxSpinNs);
  } else {
    t_spin_ns = t_spin_ns / 2 < kMinSpinNs ? 0 : t_spin_ns / 2;
  }
}

bool is_ready(const std::atomic<uint32_t>* word) {
  return (word->load(std::memory_order_acquire) & kWordReady) != 0;
}

// Sleeps while `word` still reads `seen` (a spurious or early return is
// fine: every caller loops).  `timeout` is relative, or nullptr.
void futex_wait(std::atomic<uint32_t>* word, uint32_t seen, const timespec* timeout) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, seen, timeout, nullptr, 0);
}

// Marks `word` as slept on; false if it became ready instead.
bool announce_sleeper(std::atomic<uint32_t>* word, uint32_t* seen) {
  uint32_t w = word->load(std::memory_order_acquire);
  while ((w & kWordSleeper) == 0) {
    if ((w & kWordReady) != 0) return false;
    if (word->compare_exchange_weak(w, w | kWordSleeper, std::memory_order_acq_rel,
                                    std::memory_order_acquire))
      w |= kWordSleeper;
  }
  if ((w & kWordReady) != 0) return false;
  *seen = w;
  return true;
}

// How long a caller runs its loop's turns before it hands the loop back
// and sleeps on the result's word: learned per thread as the loops' own
// idle spin is (reactor/spin_budget.h), from Config::spin_us (at least
// kMinDriveUs) up to spin_max_us: a wait that gave up and then slept less
// than the budget doubles it, one that slept spin_max_us or more halves
// it.  A fixed spin_us gave up on every reply later than 200 µs on a
// loaded host, and each give-up hands the loop back to its thread, which
// the next call then has to park again (TCP, load 19: get() p50 2x the
// callback form's, against 1x for a ready() poller that never gives up).
constexpr uint32_t kMinDriveUs = 50;
thread_local std::optional<reactor::SpinBudget> t_drive;

reactor::SpinBudget& drive_budget(const reactor::Reactor& r) {
  if (!t_drive) {
    const uint32_t base = std::max(r.config().spin_us, kMinDriveUs);
    t_drive.emplace(base, std::max(base, r.config().spin_max_us));
  }
  return *t_drive;
}

}  // namespace

void poll_progress() {
  reactor::Reactor::DriveLease lease;
  if (reactor::Reactor* r = lease.get()) r->drive_once();
}

void wait_word(std::atomic<uint32_t>* word) {
  const auto start = WaitClock::now();
  int64_t budget = t_spin_ns;
  // Caller turns first (reactor/caller_turns.cc): the reply is delivered
  // by this thread, with no hand-off.  Once they give up (a slow reply), the
  // spin is spent: sleep.
  // The lease ends before any sleep: a loop being destroyed waits for it.
  bool drove = false;
  WaitClock::time_point gave_up{};
  if (reactor::Reactor::DriveLease lease; reactor::Reactor* r = lease.get()) {
    if (r->drive_until_ready(word, start + drive_budget(*r).budget())) return;
    budget = 0;
    drove = true;
    gave_up = WaitClock::now();
  }
  if (budget > 0) {
    const auto until = start + std::chrono::nanoseconds(budget);
    const auto yield_from = start + std::chrono::nanoseconds(kYieldAfterNs);
    // The clock is read every 64 pauses (a read costs about 20 ns, a pause
    // tens): the spin overshoots its budget by well under a microsecond.
    for (uint32_t i = 1;; ++i) {
      if (is_ready(word)) return;  // the spin paid off: keep it
      base::cpu_relax();
      if ((i & 63) == 0) {
        const auto now = WaitClock::now();
        if (now >= until) break;
        if (now >= yield_from) ::sched_yield();
      }
    }
  }
  // Lost wake-ups: the producer sets kReady with an exchange and wakes only
  // if the word it replaced had kSleeper.  Our kSleeper goes in with a CAS,
  // and futex_wait sleeps only while the word still holds what we saw, so
  // either the producer saw kSleeper or we see kReady.
  uint32_t seen = 0;
  bool slept = false;
  while (announce_sleeper(word, &seen)) {
    futex_wait(word, seen, nullptr);
    slept = true;
  }
  if (drove && t_drive) t_drive->slept(WaitClock::now() - gave_up);
  if (slept && !drove) learn_slept((WaitClock::now() - start).count());
}

bool wait_word_for(std::atomic<uint32_t>* word, int64_t timeout_ns) {
  const auto until = WaitClock::now() + std::chrono::nanoseconds(timeout_ns);
  // Caller turns as in wait_word(), never past the deadline.
  if (timeout_ns > 0) {
    reactor::Reactor::DriveLease lease;
    if (reactor::Reactor* r = lease.get();
        r != nullptr && r->drive_until_ready(word, std::min(until, WaitClock::now() + drive_budget(*r).budget())))
      return true;
  }
  uint32_t seen = 0;
  for (;;) {
    if (is_ready(word)) return true;
    // The deadline before kSleeper: a wait that ends without sleeping
    // leaves no sleeper behind for the producer to wake.
    const int64_t left = (until - WaitClock::now()).count();
    if (left <= 0) return false;
    if (!announce_sleeper(word, &seen)) return true;
    timespec ts{static_cast<time_t>(left / 1'000'000'000), static_cast<long>(left % 1'000'000'000)};
    futex_wait(word, seen, &ts);
  }
}

void wake_word(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace slotrpc::detail
