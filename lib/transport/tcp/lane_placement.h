// Where a TCP bulk lane thread runs (docs/tuning.md, "Thread placement").
//
// Two rules, one per function:
//
// * lane_placement(): a fixed mask from the settings.  SLOTRPC_TCP_LANE_CPUS
//   wins; else, with SLOTRPC_LOOP_CPUS set, the process's other CPUs, so
//   bulk copies never share a core with an event loop; else none.
//
// * LaneSpare: with no fixed mask, the lane thread leaves the first CPU of
//   the process alone while small calls go by beside a transfer
//   (Config::tcp_lane_spare_rate), and takes it back once they stop.  Off
//   unless the rate is set: it was measured on one 2-vCPU host only.
//
// Why LaneSpare.  A lane thread's recv or sendmsg copies up to a megabyte,
// and a kernel without full preemption (preempt=none, or voluntary) lets
// nobody else run on that CPU until the system call returns: 0.3 to 0.6 ms
// on the 2-vCPU host where the rule was measured.  Whether a small call
// waits for that depends on where the kernel put five busy threads (two
// event loops, two lane threads, a caller) on the cores, which changes
// from run to run: on 2 vCPUs beside a 1 GiB transfer, the 64 B calls' p99
// stayed within 2x of idle in 2 rounds of 6 one hour, 12 of 14 another.
// Lowering the lane thread's priority (SCHED_BATCH, nice, SCHED_IDLE,
// shorter slices) or the copies' size did not help (docs/benchmarks.md):
// the copy is not preemptible, so only where it runs matters.  One CPU
// without bulk copies is where the loops and callers settle (the kernel's
// balancer sees it least loaded), and the p99 held in every round.
//
// Why only while small calls go by: with the lanes' CPU count cut, a
// transfer alone moves less (both ends' lane threads then share what is
// left; on 2 vCPUs that is one core).  Why the first CPU and not the
// loop's: every process on the host then spares the same one, so two
// processes on one host (client and server on loopback) do not each push
// their lanes onto the other's loop.  Config::loop_cpus or tcp_lane_cpus
// set: a fixed mask already keeps lanes off the loops; LaneSpare stays off.
#pragma once

#include <sched.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace slotrpc::transport {

// The fixed mask (see above): the lane list if set; else, with loop_cpus
// set, the CPUs of `process` outside it (none left: nullopt, the thread
// stays where it was started); else nullopt (wherever the kernel puts it).
// `error`: why a list did not parse.
std::optional<cpu_set_t> lane_placement(std::string_view lane_cpus, std::string_view loop_cpus,
                                        const cpu_set_t& process, std::string* error);

// The spare rule, as a state machine the lane thread feeds (no clock or
// system call of its own, so that tests drive it with made-up times).
// Only the lane thread uses it.
class LaneSpare {
 public:
  using Clock = std::chrono::steady_clock;
  // Each check covers at least this long: a rate over fewer frames would
  // flip on a lone call.
  static constexpr Clock::duration kWindow = std::chrono::milliseconds(5);
  // Quiet windows in a row before the lane takes its CPU back: a caller
  // that pauses between calls for a few milliseconds keeps its CPU.
  static constexpr int kQuietWindows = 2;

  enum class Change : uint8_t { kNone, kSpare, kRestore };

  // `process`: the CPUs this process may use.  `rate`: slot frames per
  // second, sent or received by the lane thread's event loop, at which it
  // spares one (Config::tcp_lane_spare_rate); 0, or a process of fewer than
  // two CPUs: off, observe() always says kNone.
  LaneSpare(const cpu_set_t& process, uint32_t rate, Clock::time_point now);

  bool enabled() const { return enabled_; }
  bool sparing() const { return sparing_; }
  // The mask while sparing (the process's CPUs but its first) and after.
  const cpu_set_t& spare_mask() const { return spare_; }
  const cpu_set_t& full_mask() const { return full_; }

  // `frames`: the loop's running count of slot frames (any value to begin
  // with; only differences count).  Says what to do with the thread's mask
  // when a window ends with a verdict that changes the state, else kNone.
  Change observe(Clock::time_point now, uint64_t frames);

 private:
  bool enabled_ = false;
  bool sparing_ = false;
  double rate_ = 0;  // frames per second
  cpu_set_t full_{};
  cpu_set_t spare_{};
  Clock::time_point window_start_{};
  uint64_t frames_at_start_ = 0;
  bool counting_ = false;  // frames_at_start_ holds a count
  int quiet_ = 0;
};

}  // namespace slotrpc::transport
