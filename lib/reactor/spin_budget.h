// How long an adaptive loop spins idle before it sleeps (Config::spin_us,
// growing up to Config::spin_max_us).
//
// Why it grows: a loop that goes to sleep pays for its wake-up (epoll_wait's
// return, and on verbs the completion channel's event), and when its
// peer's answer keeps coming just after spin_us that wake-up is paid on
// every round trip.  Measured in the Soft-RoCE VM, 32 calls in flight over
// verbs: a round trip of 500-700 µs against a 200 µs spin, and 44,000
// calls/s asleep between batches against 58,000-62,000 with the spin at
// 1 ms (docs/benchmarks.md, "Adaptive spin").  So, as the Linux haltpoll
// governor does for an idle vCPU: a sleep that ends sooner than the current
// budget (more spinning would have caught its work) doubles the budget, up
// to spin_max_us; a sleep of spin_max_us or more (the loop may really be
// idle) halves it, down to spin_us.  Halving, not a reset: under load one
// long gap now and then (a descheduled peer) should cost one step, not the
// whole climb again (in the VM the two measured alike, within its noise);
// a loop gone idle is back at spin_us after a few sleeps (1000 -> 500 ->
// 250 -> 200 with the defaults).  A loop that sleeps long, or never wakes
// for work, spins exactly spin_us, as before.
//
// It grows only on a sleep shorter than the budget, not on any sleep
// shorter than spin_max_us: the latter would make a loop with one request
// a millisecond spin the whole millisecond (a core per loop at 1,000 calls
// a second) where this spins 200 µs of it, as before.
//
// Plain arithmetic on the loop thread, once per sleep: no clock read of its
// own (the loop passes how long it slept).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace slotrpc::reactor {

class SpinBudget {
 public:
  // spin_us = 0 (sleep at once) never grows: that is an explicit choice.
  SpinBudget(uint32_t spin_us, uint32_t spin_max_us)
      : base_(spin_us), max_(spin_us == 0 ? 0 : std::max(spin_us, spin_max_us)), us_(spin_us) {}

  std::chrono::microseconds budget() const { return std::chrono::microseconds(us_); }

  // The loop slept for `slept` (from its last idle turn to its wake-up).
  void slept(std::chrono::nanoseconds slept) {
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(slept).count();
    if (us >= static_cast<int64_t>(max_)) {
      us_ = std::max(base_, us_ / 2);
    } else if (us < static_cast<int64_t>(us_)) {
      us_ = static_cast<uint32_t>(std::min<uint64_t>(max_, uint64_t{us_} * 2));
    }
  }

 private:
  uint32_t base_;
  uint32_t max_;
  uint32_t us_;
};

}  // namespace slotrpc::reactor
