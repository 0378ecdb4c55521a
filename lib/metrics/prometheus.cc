// The Prometheus text exposition format (version 0.0.4) of a snapshot.
//
// Rules followed (and checked by tests/prometheus_test.cc): every name
// starts with slotrpc_; each family has one # HELP and one # TYPE line,
// before its samples, and its samples are contiguous; counters end in
// _total; label values escape \ " and newline; histograms give cumulative
// _bucket lines with a le label, ending with le="+Inf" (= _count), then
// _sum and _count.
//
// Latency histograms are exported in seconds (Prometheus' base unit) on a
// fixed ladder of powers of two of microseconds: le = 2^k us counts the
// values recorded as at most 2^k - 1 whole microseconds, i.e. shorter than
// 2^k us, which is exact for slotrpc::Histogram (2^k - 1 is always a bucket
// edge).  Counts per poll use le = 2^k - 1, exact for the same reason.  The
// ladder always reaches 2^20 (us: about 1 s; per poll: far beyond any
// batch), and further when the largest value needs it, so series stay the
// same from one scrape to the next.
#include <fmt/format.h>

#include <cmath>
#include <string>
#include <string_view>

#include "slotrpc/metrics.h"
#include "slotrpc/status.h"

namespace slotrpc {
namespace {

std::string escape_label(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '"': out += "\\\""; break;
      case '\n': out += "\\n"; break;
      default: out += c;
    }
  }
  return out;
}

struct Label {
  std::string_view name;
  std::string value;
};

std::string labels(std::initializer_list<Label> ls, const Label* extra = nullptr) {
  std::string out;
  auto add = [&](const Label& l) {
    out += out.empty() ? "{" : ",";
    out += l.name;
    out += "=\"";
    out += escape_label(l.value);
    out += '"';
  };
  for (const Label& l : ls) add(l);
  if (extra != nullptr) add(*extra);
  if (!out.empty()) out += '}';
  return out;
}

class Writer {
 public:
  // Starts a family: HELP and TYPE, once.
  void family(std::string_view name, std::string_view type, std::string_view help) {
    out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  }
  void sample(std::string_view name, const std::string& label_text, uint64_t v) {
    out_ += fmt::format("{}{} {}\n", name, label_text, v);
  }
  void sample(std::string_view name, const std::string& label_text, double v) {
    out_ += fmt::format("{}{} {}\n", name, label_text, v);
  }
  // One histogram's series.  `scale` converts a recorded value to the
  // exported unit; `edge_is_power`: the edge 2^k - 1 is exported as 2^k
  // (continuous values truncated to integers), else as is.
  void histogram(std::string_view name, std::initializer_list<Label> ls, const HistogramSnapshot& h,
                 double scale, bool edge_is_power) {
    unsigned top = 20;
    while (top < 64 && h.max > (uint64_t{1} << top) - 1) ++top;
    size_t b = 0;
    uint64_t cumulative = 0;
    for (unsigned k = 0; k <= top; ++k) {
      const uint64_t edge = k == 64 ? UINT64_MAX : (uint64_t{1} << k) - 1;  // inclusive
      while (b < h.buckets.size() && h.buckets[b].first <= edge) cumulative += h.buckets[b++].second;
      const double le = edge_is_power ? std::ldexp(1.0, static_cast<int>(k)) * scale : double(edge) * scale;
      const Label l{"le", fmt::format("{}", le)};
      sample(fmt::format("{}_bucket", name), labels(ls, &l), cumulative);
    }
    const Label inf{"le", "+Inf"};
    sample(fmt::format("{}_bucket", name), labels(ls, &inf), h.count);
    if (scale == 1.0) {
      sample(fmt::format("{}_sum", name), labels(ls), h.sum);
    } else {
      sample(fmt::format("{}_sum", name), labels(ls), double(h.sum) * scale);
    }
    sample(fmt::format("{}_count", name), labels(ls), h.count);
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

std::string_view kind_name(HwCounter::Kind k) {
  switch (k) {
    case HwCounter::Kind::kRnr: return "rnr";
    case HwCounter::Kind::kRetry: return "retry";
    case HwCounter::Kind::kSequence: return "sequence";
    case HwCounter::Kind::kCongestion: return "congestion";
    case HwCounter::Kind::kOther: return "other";
  }
  return "other";
}

const char* side_name(bool server) { return server ? "server" : "client"; }

}  // namespace

std::string to_prometheus(const MetricsSnapshot& m) {
  Writer w;
  w.family("slotrpc_event_loops", "gauge", "Event loops whose counters this snapshot adds up.");
  w.sample("slotrpc_event_loops", "", uint64_t{m.loops});

  const std::pair<bool, const CallCounters*> sides[] = {{true, &m.server}, {false, &m.client}};
  w.family("slotrpc_calls_started_total", "counter",
           "Calls started (server: requests received; client: calls submitted to a session).");
  for (auto [server, c] : sides) w.sample("slotrpc_calls_started_total", labels({{"side", side_name(server)}}), c->started);
  w.family("slotrpc_calls_finished_total", "counter", "Calls finished, by status code.");
  for (auto [server, c] : sides) {
    for (size_t code = 0; code < CallCounters::kCodes; ++code) {
      if (c->finished[code] == 0 && code != 0) continue;
      w.sample("slotrpc_calls_finished_total",
               labels({{"side", side_name(server)},
                       {"code", std::string(status_code_name(static_cast<StatusCode>(code)))}}),
               c->finished[code]);
    }
  }
  w.family("slotrpc_received_bytes_total", "counter",
           "Bytes of slot messages received, 32-byte headers included.");
  for (auto [server, c] : sides) w.sample("slotrpc_received_bytes_total", labels({{"side", side_name(server)}}), c->bytes_in);
  w.family("slotrpc_sent_bytes_total", "counter",
           "Bytes of slot messages sent, 32-byte headers included.");
  for (auto [server, c] : sides) w.sample("slotrpc_sent_bytes_total", labels({{"side", side_name(server)}}), c->bytes_out);
  w.family("slotrpc_bulk_received_bytes_total", "counter",
           "Bytes of bulk segments received (server: read by handlers; client: written by servers "
           "into receive_bulk segments).");
  for (auto [server, c] : sides) {
    w.sample("slotrpc_bulk_received_bytes_total", labels({{"side", side_name(server)}}), c->bulk_bytes_in);
  }
  w.family("slotrpc_bulk_sent_bytes_total", "counter",
           "Bytes of bulk segments sent (server: written by handlers; client: send_bulk segments of "
           "calls sent).");
  for (auto [server, c] : sides) {
    w.sample("slotrpc_bulk_sent_bytes_total", labels({{"side", side_name(server)}}), c->bulk_bytes_out);
  }
  w.family("slotrpc_credit_stalls_total", "counter",
           "Client calls that found no free slot (credit) and waited in the queue.");
  w.sample("slotrpc_credit_stalls_total", "", m.client.credit_stalls);
  w.family("slotrpc_queued_calls", "gauge", "Client calls waiting for a credit now.");
  w.sample("slotrpc_queued_calls", "", m.client.queued);

  w.family("slotrpc_method_calls_started_total", "counter", "Calls started, per method.");
  for (const MethodMetrics& mm : m.methods) {
    w.sample("slotrpc_method_calls_started_total",
             labels({{"side", side_name(mm.server)}, {"method", mm.name}}), mm.started);
  }
  w.family("slotrpc_method_calls_finished_total", "counter",
           "Calls finished, per method and status code.");
  for (const MethodMetrics& mm : m.methods) {
    for (size_t code = 0; code < CallCounters::kCodes; ++code) {
      if (mm.finished[code] == 0 && code != 0) continue;
      w.sample("slotrpc_method_calls_finished_total",
               labels({{"side", side_name(mm.server)},
                       {"method", mm.name},
                       {"code", std::string(status_code_name(static_cast<StatusCode>(code)))}}),
               mm.finished[code]);
    }
  }
  struct MethodBytes {
    const char* name;
    const char* help;
    uint64_t MethodMetrics::*field;
  };
  static const MethodBytes method_bytes[] = {
      {"slotrpc_method_received_bytes_total",
       "Bytes of slot messages received, 32-byte headers included, per method.", &MethodMetrics::bytes_in},
      {"slotrpc_method_sent_bytes_total",
       "Bytes of slot messages sent, 32-byte headers included, per method.", &MethodMetrics::bytes_out},
      {"slotrpc_method_bulk_received_bytes_total", "Bytes of bulk segments received, per method.",
       &MethodMetrics::bulk_bytes_in},
      {"slotrpc_method_bulk_sent_bytes_total", "Bytes of bulk segments sent, per method.",
       &MethodMetrics::bulk_bytes_out},
  };
  for (const MethodBytes& f : method_bytes) {
    w.family(f.name, "counter", f.help);
    for (const MethodMetrics& mm : m.methods) {
      w.sample(f.name, labels({{"side", side_name(mm.server)}, {"method", mm.name}}), mm.*(f.field));
    }
  }
  w.family("slotrpc_method_latency_seconds", "histogram",
           "Call latency per method (server: request arrival to reply queued; client: "
           "submission to completion).");
  for (const MethodMetrics& mm : m.methods) {
    w.histogram("slotrpc_method_latency_seconds",
                {{"side", side_name(mm.server)}, {"method", mm.name}}, mm.latency_us, 1e-6, true);
  }

  struct TransportField {
    const char* name;
    const char* help;
    uint64_t TransportMetrics::*field;
  };
  static const TransportField fields[] = {
      {"slotrpc_transport_slot_sends_total", "Slot messages handed to the network.",
       &TransportMetrics::slot_sends},
      {"slotrpc_transport_control_sends_total", "Control frames (cancels, grants, keepalives) sent.",
       &TransportMetrics::control_sends},
      {"slotrpc_transport_inline_sends_total", "Slot messages sent inline: verbs, posted with IBV_SEND_INLINE; shm, inside the descriptor (<= 40 bytes).",
       &TransportMetrics::inline_sends},
      {"slotrpc_transport_noninline_sends_total",
       "Slot messages read from the registered send slot: verbs, by the NIC; shm, by the peer in place (no copy).",
       &TransportMetrics::noninline_sends},
      {"slotrpc_transport_messages_total",
       "Protocol messages in the slot and control sends (a PACK counts the messages it carries).",
       &TransportMetrics::messages},
      {"slotrpc_transport_packs_total", "Slot sends that were PACKs of several small messages.",
       &TransportMetrics::packs},
      {"slotrpc_transport_packets_total",
       "Verbs: request packets the sends took (ceil(bytes / path MTU) each; acknowledgements not counted).",
       &TransportMetrics::packets},
      {"slotrpc_transport_bulk_requests_total",
       "Bulk transfers started: verbs RDMA READ/WRITE work requests (one per chunk); tcp READ_REQ and "
       "WRITE_DATA frames; shm READ_REQ descriptors and WRITE_DATA chunks.",
       &TransportMetrics::bulk_requests},
      {"slotrpc_transport_bulk_pushes_total",
       "Tcp: send_bulk ranges sent right behind their request, unasked (PUSH_DATA).",
       &TransportMetrics::bulk_pushes},
      {"slotrpc_transport_bulk_pushes_dropped_total",
       "Tcp: pushes received that no read_bulk claimed in time (thrown away and asked for again).",
       &TransportMetrics::bulk_pushes_dropped},
      {"slotrpc_transport_doorbells_total",
       "Verbs: ibv_post_send calls (one per batch); tcp: sendmsg calls.",
       &TransportMetrics::doorbells},
      {"slotrpc_transport_signaled_sends_total", "Verbs sends posted IBV_SEND_SIGNALED.",
       &TransportMetrics::signaled},
      {"slotrpc_transport_backlogged_sends_total", "Verbs sends that waited for send-queue room.",
       &TransportMetrics::backlogged},
      {"slotrpc_transport_bulk_lane_bytes_sent_total",
       "Tcp: bytes sent on bulk lanes (bulk data and its frames).",
       &TransportMetrics::bulk_lane_bytes_sent},
      {"slotrpc_transport_bulk_lane_bytes_received_total",
       "Tcp: bytes received on bulk lanes (bulk data and its frames).",
       &TransportMetrics::bulk_lane_bytes_received},
  };
  w.family("slotrpc_transport_sessions", "gauge", "Open sessions per transport.");
  for (const TransportMetrics& t : m.transports) {
    w.sample("slotrpc_transport_sessions", labels({{"transport", t.transport}}), t.sessions);
  }
  w.family("slotrpc_transport_bulk_lanes", "gauge", "Tcp: open sessions that have their bulk lane.");
  for (const TransportMetrics& t : m.transports) {
    w.sample("slotrpc_transport_bulk_lanes", labels({{"transport", t.transport}}), t.bulk_lanes);
  }
  for (const TransportField& f : fields) {
    w.family(f.name, "counter", f.help);
    for (const TransportMetrics& t : m.transports) {
      w.sample(f.name, labels({{"transport", t.transport}}), t.*(f.field));
    }
  }
  w.family("slotrpc_transport_completions_per_poll", "histogram",
           "Completions returned by each poll of a transport that returned any.");
  for (const TransportMetrics& t : m.transports) {
    w.histogram("slotrpc_transport_completions_per_poll", {{"transport", t.transport}},
                t.completions_per_poll, 1.0, false);
  }

  w.family("slotrpc_hw_counter_total", "counter",
           "RDMA port hardware counters (sysfs hw_counters and counters), as last sampled.");
  for (const HwCounter& c : m.hw_counters) {
    w.sample("slotrpc_hw_counter_total",
             labels({{"device", c.device},
                     {"port", std::to_string(c.port)},
                     {"counter", c.name},
                     {"kind", std::string(kind_name(c.kind))}}),
             c.value);
  }
  w.family("slotrpc_hw_counter_per_second", "gauge",
           "Growth of each hardware counter per second over the last sampling interval.");
  for (const HwCounter& c : m.hw_counters) {
    w.sample("slotrpc_hw_counter_per_second",
             labels({{"device", c.device},
                     {"port", std::to_string(c.port)},
                     {"counter", c.name},
                     {"kind", std::string(kind_name(c.kind))}}),
             c.per_second);
  }
  w.family("slotrpc_hw_counter_absent", "gauge",
           "Known RNR/retry/sequence/congestion counters the device does not expose (1 each).");
  for (const std::string& a : m.hw_counters_absent) {
    w.sample("slotrpc_hw_counter_absent", labels({{"counter", a}}), uint64_t{1});
  }
  struct PoolField {
    const char* name;
    const char* help;
    uint32_t ReceivePool::*field;
  };
  static const PoolField pools[] = {
      {"slotrpc_receive_pool_capacity", "Receive buffers a loop's receive queue holds when full.",
       &ReceivePool::capacity},
      {"slotrpc_receive_pool_posted", "Receive buffers posted (free) at the last sample.",
       &ReceivePool::posted},
      {"slotrpc_receive_pool_low_water", "Fewest receive buffers posted since the loop started.",
       &ReceivePool::low_water},
  };
  for (const PoolField& f : pools) {
    w.family(f.name, "gauge", f.help);
    for (const ReceivePool& p : m.receive_pools) {
      w.sample(f.name, labels({{"loop", p.loop}, {"queue", p.queue}}), uint64_t{p.*(f.field)});
    }
  }
  return w.take();
}

}  // namespace slotrpc
