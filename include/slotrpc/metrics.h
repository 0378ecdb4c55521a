// Metrics: what a Server or a Channel counts, as a snapshot.
//
//   slotrpc::MetricsSnapshot m = server.metrics();
//   std::cout << slotrpc::to_prometheus(m);
//
// Three sources, gathered on read (each event loop is asked on its own
// thread, so the hot path counts without atomics or locks):
//   * the framework: calls, statuses, bytes, credit stalls, per method;
//   * the transports: slot sends, inline sends, doorbells, polls;
//   * the monitor (lib/transport/verbs/monitor.h): the RDMA device's hardware counters
//     (RNR NAKs, retries, sequence errors, congestion) and the free
//     receive buffers of each loop, sampled every
//     SLOTRPC_MONITOR_INTERVAL_MS.
// docs/design.md ("Metrics and the monitor") says what each one means and
// what to do when it rises.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "slotrpc/export.h"

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

// Calls of one side (server: requests this process served; client: calls
// its channels made), summed over event loops.  docs/design.md, "Framework
// counters", says what each means and what to do when it rises.
struct CallCounters {
  // Status codes are gRPC's numbers (slotrpc/status.h), 0..16.
  static constexpr size_t kCodes = 17;

  uint64_t started = 0;
  std::array<uint64_t, kCodes> finished{};  // by status code
  // Slot messages, 32-byte header included: server in = requests and
  // client-stream messages, out = replies and server-stream messages;
  // client the other way round.  Control frames (cancels, grants,
  // keepalives, stream acks) are not counted.
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  // Bulk segments (CallOptions::send_bulk / receive_bulk), not in the
  // slot bytes above.  Server: what its handlers read (read_bulk, in) and
  // wrote (write_bulk, out).  Client: out = the send_bulk bytes its calls
  // offered, counted when the call is sent (a handler may read less); in =
  // what servers wrote into its receive_bulk segments (RawReply::bulk_received).
  uint64_t bulk_bytes_in = 0;
  uint64_t bulk_bytes_out = 0;
  // Client: calls that found no free credit and waited in the queue.
  uint64_t credit_stalls = 0;
  // Client: calls waiting for a credit at the moment of the snapshot.
  uint64_t queued = 0;

  uint64_t finished_total() const {
    uint64_t n = 0;
    for (uint64_t f : finished) n += f;
    return n;
  }
};

// One method on one side, from all loops.
struct MethodMetrics {
  std::string name;  // "slotrpc.examples.Echo/Echo"; a client that never
                     // learnt the name (a raw call) shows "0x1234abcd"
  uint32_t id = 0;
  bool server = true;  // false: the calls this process made
  uint64_t started = 0;
  std::array<uint64_t, CallCounters::kCodes> finished{};
  // This method's share of CallCounters' bytes (slot messages with their
  // headers, and bulk; same rules).  A request for a method the server does
  // not have, and a message that arrives after its call ended, count in the
  // side's totals only.
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  uint64_t bulk_bytes_in = 0;
  uint64_t bulk_bytes_out = 0;
  // Server: from the request's arrival to its reply being queued for the
  // wire; client: from the call's submission on its loop (queueing for a
  // credit included) to its completion.  Microseconds.
  HistogramSnapshot latency_us;
};

// One transport kind ("tcp", "verbs", "shm"), summed over the loops and their
// sessions, open and closed (LinkStats in lib/transport/transport.h).
struct TransportMetrics {
  std::string transport;
  uint64_t sessions = 0;        // open now
  uint64_t slot_sends = 0;      // slot messages handed to the network
  uint64_t control_sends = 0;   // control frames
  uint64_t inline_sends = 0;    // verbs: posted IBV_SEND_INLINE; shm: sent inside the descriptor
  uint64_t noninline_sends = 0; // verbs: read by the NIC from the send slot; shm: read in place
  uint64_t messages = 0;        // protocol messages those sends carried (a PACK counts its messages)
  uint64_t packs = 0;           // slot sends that were PACKs (several small messages, one send)
  uint64_t packets = 0;         // verbs: request packets of those sends (ceil(bytes / path MTU) each)
  uint64_t bulk_requests = 0;   // bulk transfers started: verbs READ/WRITE work requests; tcp READ_REQ
                                // and WRITE_DATA frames; shm READ_REQ descriptors and WRITE_DATA chunks
  uint64_t bulk_pushes = 0;     // tcp: send_bulk ranges sent right behind their request, unasked
  uint64_t bulk_pushes_dropped = 0;  // tcp: pushes received that no read_bulk claimed in time
                                     // (thrown away; the read asked for the bytes again)
  uint64_t doorbells = 0;       // verbs: ibv_post_send calls; tcp: sendmsg calls
  uint64_t signaled = 0;        // verbs: sends posted IBV_SEND_SIGNALED
  uint64_t backlogged = 0;      // verbs: sends that waited for send-queue room
  // tcp: open sessions that have their bulk lane (docs/design.md, "TCP: bulk
  // lanes"), and the bytes sent and received on lanes (bulk data and its
  // frames).
  uint64_t bulk_lanes = 0;
  uint64_t bulk_lane_bytes_sent = 0;
  uint64_t bulk_lane_bytes_received = 0;
  // verbs, of the open sessions: the largest max_inline_data of their
  // queue pairs (what SLOTRPC_INLINE_BYTES became on the device); those
  // that receive from their loop's shared receive queue; those whose peer
  // writes through a type-2 memory window (docs/design.md, "Receive queues
  // and ring protection").
  uint32_t max_inline = 0;
  uint64_t srq_sessions = 0;
  uint64_t memory_window_sessions = 0;
  // Completions returned by each poll that returned any (the loop polls
  // without pause when busy, so empty polls are not recorded).
  HistogramSnapshot completions_per_poll;
};

// Everything at one moment.  The framework and transport parts are filled
// by Server::metrics() / Channel::metrics(); the hardware part by the
// monitor (empty when no loop uses verbs or the monitor is off).
struct MetricsSnapshot {
  std::chrono::system_clock::time_point taken{};

  // --- framework: calls, methods, transports ----------------------------
  uint32_t loops = 0;  // event loops asked
  CallCounters server;
  CallCounters client;
  std::vector<MethodMetrics> methods;  // sorted by side, then name
  std::vector<TransportMetrics> transports;
  // The entry of one transport ("tcp", "verbs", "shm"), or nullptr.
  const TransportMetrics* transport(std::string_view kind) const {
    for (const TransportMetrics& t : transports)
      if (t.transport == kind) return &t;
    return nullptr;
  }

  // --- monitor: hardware counters and receive pools ---------------------
  std::vector<HwCounter> hw_counters;
  // Known counter names ("rxe0/1: rcvd_rnr_err") that this device does not
  // expose, so a dashboard can tell "0" from "not measured".
  std::vector<std::string> hw_counters_absent;
  std::vector<ReceivePool> receive_pools;
};

// The snapshot in the Prometheus text exposition format (version 0.0.4):
// what the metrics port (SLOTRPC_METRICS_ADDRESS) serves at /metrics.
SLOTRPC_API std::string to_prometheus(const MetricsSnapshot& snapshot);

}  // namespace slotrpc
