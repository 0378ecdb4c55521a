// Metrics: what a Server or a Channel counts, as a snapshot.
//
//   slotrpc::MetricsSnapshot m = server.metrics();
//   std::cout << slotrpc::to_prometheus(m);
//
// Three sources, gathered on read (each event loop is asked on its own
// thread, so the hot path counts without atomics or locks):
//   * the framework: calls, statuses, bytes, credit stalls, per method;
//   * the transports: slot sends, inline sends, doorbells, polls;
//   * the monitor (lib/monitor/): the RDMA device's hardware counters
//     (RNR NAKs, retries, sequence errors, congestion) and the free
//     receive buffers of each loop, sampled every
//     SLOTRPC_MONITOR_INTERVAL_MS.
// docs/design.md ("Metrics and the monitor") says what each one means and
// what to do when it rises.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace slotrpc {

// A distribution (latency in microseconds, or a count per event) in the
// log-bucketed form every slotrpc histogram keeps.
struct HistogramSnapshot {
  uint64_t count = 0;
  uint64_t sum = 0;
  uint64_t min = 0;  // 0 when count == 0
  uint64_t max = 0;
  // Non-empty buckets, ascending: (inclusive upper bound, values in it).
  std::vector<std::pair<uint64_t, uint64_t>> buckets;
};

// One hardware counter of an RDMA device port, as of the last sample.
struct HwCounter {
  enum class Kind : uint8_t {
    kRnr,         // receiver-not-ready NAKs and their retries
    kRetry,       // transport retries and ACK timeouts
    kSequence,    // out-of-sequence packets, duplicate requests
    kCongestion,  // ECN / CNP
    kOther,       // everything else the port exposes
  };
  std::string device;  // "mlx5_0", "rxe0"
  uint32_t port = 0;
  std::string name;    // the sysfs file name: "out_of_buffer", "rcvd_rnr_err"
  Kind kind = Kind::kOther;
  uint64_t value = 0;  // the last value read
  uint64_t delta = 0;  // growth over the last interval (a reset counts from 0)
  double per_second = 0;
};

// The receive buffers one event loop keeps posted for its verbs sessions
// (its shared receive queue, or one session's own queue): a pool that
// shrinks towards 0 is the warning before the NIC sends RNR NAKs.
struct ReceivePool {
  std::string loop;    // the event loop's name
  std::string queue;   // "srq", or the session's link description
  uint32_t capacity = 0;
  uint32_t posted = 0;     // free receives at the last sample
  uint32_t low_water = 0;  // the fewest seen since the loop started
};

// Everything at one moment.  The framework and transport parts are filled
// by Server::metrics() / Channel::metrics(); the hardware part by the
// monitor (empty when no loop uses verbs or the monitor is off).
struct MetricsSnapshot {
  std::chrono::system_clock::time_point taken{};

  // --- monitor: hardware counters and receive pools ---------------------
  std::vector<HwCounter> hw_counters;
  // Known counter names ("rxe0/1: rcvd_rnr_err") that this device does not
  // expose, so a dashboard can tell "0" from "not measured".
  std::vector<std::string> hw_counters_absent;
  std::vector<ReceivePool> receive_pools;
};

}  // namespace slotrpc
