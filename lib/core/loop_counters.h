// The framework's counters of one event loop.
//
// Each Reactor owns one LoopCounters and only its thread writes it: the
// sessions of that loop bump plain integers and record into histograms, with
// no atomics, no locks, no allocation and no virtual call per message (the
// one exception, said where it is: a client's first call of a method id on a
// loop inserts that method's entry).  Server::metrics() / Channel::metrics()
// ask every loop for a copy on the loop's own thread (a posted task) and add
// the copies up (lib/metrics/collect.h), so nothing is ever read while it is
// written.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>

#include "slotrpc/histogram.h"
#include "slotrpc/metrics.h"
#include "slotrpc/status.h"
#include "transport/transport.h"

namespace slotrpc::core {

inline size_t code_index(StatusCode code) {
  const auto raw = static_cast<size_t>(code);
  return raw < CallCounters::kCodes ? raw : CallCounters::kCodes - 1;
}

struct MethodCounters {
  uint64_t started = 0;
  std::array<uint64_t, CallCounters::kCodes> finished{};
  uint64_t bytes_in = 0;  // as MethodMetrics
  uint64_t bytes_out = 0;
  uint64_t bulk_bytes_in = 0;
  uint64_t bulk_bytes_out = 0;
  Histogram latency_us;
  // Client: the method's full name when a generated client called it
  // (CallOptions::method_name, a static string), so metrics name methods
  // that no server in this process has.
  const char* name = nullptr;

  void finish(StatusCode code, uint64_t us) {
    ++finished[code_index(code)];
    latency_us.record(us);
  }
};

struct SideCounters {
  CallCounters calls;  // `queued` is filled at read time from the sessions
  // By method id.  Server: every registered method is inserted when the
  // loop starts serving, so lookups never allocate; client: see above.
  std::unordered_map<uint32_t, MethodCounters> methods;
};

// Transport counters of links that are gone (their LinkStats are added when
// the session drops its link), so closed sessions still count.
struct TransportTotals {
  transport::LinkStats retired;
  Histogram completions_per_poll;
};

struct LoopCounters {
  SideCounters server;
  SideCounters client;
  TransportTotals tcp;
  TransportTotals verbs;
  TransportTotals shm;  // shared memory (lib/transport/shm): its own label

  enum class Kind { kTcp, kVerbs, kShm };
  // A link's transport by its description ("verbs ...", "shm ...",
  // anything else is TCP).  Cold path only.
  static Kind kind_of(const transport::Link& link) {
    const std::string d = link.describe();
    if (d.rfind("verbs", 0) == 0) return Kind::kVerbs;
    if (d.rfind("shm", 0) == 0) return Kind::kShm;
    return Kind::kTcp;
  }
  // A transport by its name() ("verbs", "shm", anything else is TCP).
  static Kind kind_of_name(std::string_view name) {
    if (name == "verbs") return Kind::kVerbs;
    if (name == "shm") return Kind::kShm;
    return Kind::kTcp;
  }
  TransportTotals& totals(Kind k) { return k == Kind::kVerbs ? verbs : k == Kind::kShm ? shm : tcp; }

  // Cold path: a session is dropping its link.
  void retire_link(const transport::Link& link) { add(totals(kind_of(link)).retired, link.stats()); }
  static void add(transport::LinkStats& into, const transport::LinkStats& s) {
    into.slot_sends += s.slot_sends;
    into.control_sends += s.control_sends;
    into.inline_sends += s.inline_sends;
    into.noninline_sends += s.noninline_sends;
    into.doorbells += s.doorbells;
    into.messages += s.messages;
    into.packs += s.packs;
    into.packets += s.packets;
    into.bulk_requests += s.bulk_requests;
    into.bulk_pushes += s.bulk_pushes;
    into.bulk_pushes_dropped += s.bulk_pushes_dropped;
    into.signaled += s.signaled;
    into.backlogged += s.backlogged;
    into.attached_bytes_sent += s.attached_bytes_sent;
    into.attached_bytes_received += s.attached_bytes_received;
  }
};

}  // namespace slotrpc::core
