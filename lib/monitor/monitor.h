// The per-loop monitor: RDMA hardware counters and receive pools.
//
// STUB (interface only, filled in by the monitor work of issue 9): a
// Reactor that uses verbs owns one; Server::metrics() and Channel::metrics()
// ask it, on its loop's thread, to append what it last sampled.
#pragma once

#include "slotrpc/metrics.h"

namespace slotrpc::monitor {

class Monitor {
 public:
  // Loop thread.  Appends the last sample's hardware counters, absent
  // counter names and receive pools to `out`.
  void fill(MetricsSnapshot& out) const { (void)out; }
};

}  // namespace slotrpc::monitor
