// Gathering a MetricsSnapshot from event loops (cold path).
//
// Each loop is read on its own thread (read_loop, from a posted task, or
// directly when the caller already runs on it): a copy of its counters, the
// live links' LinkStats and the monitor's part.  The caller adds the
// readings up (Collector) and names the methods.  The monitor's part is
// added by the caller (Monitor::fill).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/loop_counters.h"
#include "slotrpc/metrics.h"

namespace slotrpc::core {
class Loop;
}

namespace slotrpc::metrics {

// The counters a loop keeps live (core/loop_counters.h); this layer reads them.
using core::LoopCounters;
using core::MethodCounters;
using core::SideCounters;

struct LoopReading {
  LoopCounters counters;
  transport::LinkStats tcp_live, verbs_live, shm_live;  // open links
  uint64_t tcp_sessions = 0, verbs_sessions = 0, shm_sessions = 0;
  uint64_t tcp_lanes = 0;  // open tcp links with their bulk lane
  // Open verbs links: the largest max_inline, and how many use the loop's
  // SRQ / a memory window.
  uint32_t verbs_max_inline = 0;
  uint64_t verbs_srq = 0, verbs_memory_window = 0;
  uint64_t client_queued = 0;
  MetricsSnapshot monitor;  // the monitor's part (hardware, receive pools)
};

// Loop thread.  `links` are the loop's open links; `client_queued` the calls
// its client sessions hold in their queues.  The monitor's part
// (LoopReading::monitor) is the caller's to fill: the layer that created
// the loop's transports knows its monitor (rpc/loop_transports.h).
LoopReading read_loop(core::Loop& loop, const std::vector<const transport::Link*>& links,
                      uint64_t client_queued);
// Loop thread.  The same with the call and link counters of one owner on
// that loop (a Server's or Channel's sessions on a shared loop count into
// their owner's LoopCounters); the per-poll histograms and the monitor
// stay the loop's.
LoopReading read_loop(core::Loop& loop, const LoopCounters& owner,
                      const std::vector<const transport::Link*>& links, uint64_t client_queued);

// "slotrpc.examples.Echo.Echo" -> "slotrpc.examples.Echo/Echo".
std::string method_display_name(const std::string& full_name);

// Any thread: adds readings up into one snapshot.
class Collector {
 public:
  // Names a method id of one side; empty: unknown (shown as "0x%08x").
  using Namer = std::function<std::string(uint32_t id, bool server)>;

  void add(const LoopReading& r);
  MetricsSnapshot finish(const Namer& name);

 private:
  MetricsSnapshot out_;
  std::map<std::pair<bool, uint32_t>, MethodCounters> methods_;  // (client?, id)
  transport::LinkStats tcp_, verbs_, shm_;
  uint64_t tcp_sessions_ = 0, verbs_sessions_ = 0, shm_sessions_ = 0;
  uint64_t tcp_lanes_ = 0;
  uint32_t verbs_max_inline_ = 0;
  uint64_t verbs_srq_ = 0, verbs_memory_window_ = 0;
  Histogram tcp_polls_, verbs_polls_, shm_polls_;
};

// Process-wide: the names clients learnt for method ids (generated clients
// announce theirs; servers their services').  Cold: a mutex.
void remember_method_name(uint32_t id, const std::string& full_name);
std::string known_method_name(uint32_t id);

}  // namespace slotrpc::metrics
