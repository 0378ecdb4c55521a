// The per-loop monitor: RDMA hardware counters and receive pools.
//
// Every event loop that uses verbs owns a Monitor (rpc::loop_verbs() creates
// it with the loop's verbs transport unless SLOTRPC_MONITOR_INTERVAL_MS is
// 0).  A timer on the loop fires every interval; each tick
//   1. asks the device port's PortSampler for a fresh reading (see below),
//   2. reads the loop's receive pools: the SRQ and every session's own
//      receive queue (capacity, posted, low-water mark),
//   3. computes this loop's deltas and rates against its previous tick, and
//   4. calls the sample hook (Server/Channel::on_monitor_sample), if set.
// fill() appends the last tick's result to a MetricsSnapshot (Server and
// Channel metrics()).
//
// Several loops share one device port (a Server's reactor_threads, Channels
// in the same process).  Reading the port's sysfs files once per loop and
// warning once per loop about the same NAK would multiply both by the
// number of loops, so the port's files belong to one process-wide
// PortSampler per (sysfs root, device, port), shared (shared_ptr, found in a
// registry under a mutex, created by the first loop and gone with the
// last).  Whichever loop's tick comes first after 0.9 x interval reads the
// port and logs the warnings; the others' ticks within that window reuse the
// reading.  No loop owns it, so a Channel or a Server loop that goes away
// takes nothing with it, and no thread is added.  The mutex is taken once
// per tick per loop, never on the data path.
//
// Each loop computes its deltas from the shared readings against its own
// previous tick, so every snapshot says "growth since this loop last
// looked" and a reading seen by two ticks is not counted twice in either.
// fill() skips a device port already present in the snapshot, so a
// Server's metrics() (one fill per loop) lists each counter once.
//
// The hot path pays only for the receive pools: ReceiveQueue decrements a
// counter per consumed receive and compares it with the low-water mark once
// per reposted batch (receive_queue.h); the monitor reads both from its
// timer on the same thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/verbs/hw_counters.h"
#include "base/timer_heap.h"
#include "slotrpc/config.h"
#include "slotrpc/metrics.h"

namespace slotrpc::transport::verbs {
class VerbsTransport;
}

namespace slotrpc::monitor {

using Clock = std::chrono::steady_clock;

// One device port's hardware counters, shared by every loop of the process
// that uses the port (see the top of this file).  Thread-safe.
class PortSampler {
 public:
  // The sampler of (sysfs_root, device, port): the existing one, or a new
  // one that opens the port's counter files (a failure is logged once, and
  // the sampler then reports nothing).
  static std::shared_ptr<PortSampler> acquire(const std::string& device, uint32_t port,
                                              const std::string& sysfs_root = kSysfsRoot);
  ~PortSampler();

  // Reads the port if the last reading is at least 0.9 x `interval` old;
  // then logs one warning per RNR, retry or sequence counter that rose
  // (advice from `config`).  True if it read.
  bool maybe_sample(Clock::time_point now, std::chrono::milliseconds interval, const Config& config);

  // The counters as of the last reading, and when it was taken (the
  // PortCounters' deltas are the growth between the last two readings).
  struct Reading {
    std::vector<HwCounter> counters;
    std::vector<std::string> absent;
    Clock::time_point when{};
    uint64_t sequence = 0;  // readings taken so far (0: none, the port could not be opened)
  };
  Reading reading() const;

  const std::string& device() const { return device_; }
  uint32_t port() const { return port_; }
  // Warnings logged so far (for tests).
  uint64_t warnings() const;

 private:
  PortSampler(std::string key, std::string device, uint32_t port)
      : key_(std::move(key)), device_(std::move(device)), port_(port) {}

  void warn(const HwCounter& c, Clock::duration since, const Config& config);

  std::string key_;
  std::string device_;
  uint32_t port_;
  mutable std::mutex mu_;
  std::unique_ptr<PortCounters> counters_;  // null when the port could not be opened
  Clock::time_point last_{};
  uint64_t sequence_ = 0;
  uint64_t warnings_ = 0;
};

// The advice of a warning for a counter of `kind` (empty for kCongestion and
// kOther, which are not warned about): what it means and which settings to
// change, with their current values.
std::string advice(HwCounter::Kind kind, const Config& config);

// Where the application's sample callback lives: set from any thread at any
// time (Server/Channel::on_monitor_sample), called by every loop after its
// tick.  One per Server / Channel, shared with its loops.
//
// The loops hold the hook itself (rpc::add_monitor_hook: a weak
// reference, locked for the length of a tick), so the hook can outlive its
// Server or Channel by a tick that is running on a loop thread while the
// owner is destroyed on another.  The callback, though, typically points at
// the application's state that dies with the owner; so the owner's
// destructor close()s the hook, which waits for a call in progress.
class SampleHook {
 public:
  using Fn = std::function<void(const MetricsSnapshot&)>;
  void set(Fn fn);  // ignored after close()
  bool empty() const;
  // Calls the callback (outside the mutex: it may take long or call set()).
  void call(const MetricsSnapshot& snapshot) const;
  // Any thread.  Drops the callback for good and waits until no call of it
  // is running on another thread: after close() returns the callback never
  // runs again.  A call on the calling thread (a callback that destroys its
  // Server or Channel) is not waited for; it finishes after close() returns.
  void close();

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable idle_;
  std::shared_ptr<const Fn> fn_;
  mutable int running_ = 0;  // calls in progress, all threads
  bool closed_ = false;
};

class Monitor {
 public:
  // Loop thread.  Samples `verbs`'s device port and receive queues every
  // config.monitor_interval_ms (must be > 0) on the loop's `timers`; the
  // first tick is one interval from now.  `loop_name` labels the receive
  // pools.
  Monitor(base::TimerHeap& timers, std::string loop_name, const Config& config,
          transport::verbs::VerbsTransport& verbs, std::shared_ptr<SampleHook> hook,
          std::string sysfs_root = kSysfsRoot);
  // The same on an event loop (anything with timers(), name(), config():
  // core::Loop), which this layer does not name.
  template <class Loop>
  Monitor(Loop& loop, transport::verbs::VerbsTransport& verbs, std::shared_ptr<SampleHook> hook,
          std::string sysfs_root = kSysfsRoot)
      : Monitor(loop.timers(), loop.name(), loop.config(), verbs, std::move(hook), std::move(sysfs_root)) {}
  ~Monitor();  // cancels the timer (loop thread, or after the loop stopped)
  Monitor(const Monitor&) = delete;
  Monitor& operator=(const Monitor&) = delete;

  // Loop thread.  Appends the last tick's hardware counters (unless the
  // snapshot already holds this device port's), absent counter names and
  // receive pools to `out`.
  void fill(MetricsSnapshot& out) const;

  // Loop thread.  One tick now (the timer's body; tests call it directly).
  void tick(Clock::time_point now = Clock::now());
  uint64_t ticks() const { return ticks_; }
  PortSampler& sampler() const { return *sampler_; }

 private:
  static void on_timer(void* self, uint64_t);
  void arm();

  base::TimerHeap& timers_;
  const std::string loop_name_;
  const Config config_;
  transport::verbs::VerbsTransport& verbs_;
  std::shared_ptr<SampleHook> hook_;
  std::shared_ptr<PortSampler> sampler_;
  std::chrono::milliseconds interval_;
  base::TimerHeap::TimerId timer_ = 0;
  uint64_t ticks_ = 0;

  // This loop's view of the port: values at its previous tick, to compute
  // its own deltas from the shared readings.
  std::vector<HwCounter> hw_;
  std::vector<std::string> absent_;
  Clock::time_point hw_when_{};
  uint64_t hw_sequence_ = 0;
  std::vector<ReceivePool> pools_;
};

}  // namespace slotrpc::monitor
