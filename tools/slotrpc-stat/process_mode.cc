#include "process_mode.h"

#include <fmt/format.h>
#include <slotrpc/slotrpc.h>

#include <chrono>
#include <ostream>
#include <thread>

#include "device_mode.h"
#include "rpc/admin/admin.h"

namespace slotrpc::stat {
namespace {

std::string us(uint64_t v) { return fmt::format("{}", v); }

void print_calls(std::ostream& out, const char* side, const CallCounters& c) {
  if (c.started == 0 && c.finished_total() == 0) return;
  out << fmt::format("{} calls: started {}, finished {}", side, c.started, c.finished_total());
  for (size_t code = 0; code < CallCounters::kCodes; ++code) {
    if (c.finished[code] != 0) {
      out << fmt::format(" {}={}", status_code_name(static_cast<StatusCode>(code)), c.finished[code]);
    }
  }
  out << fmt::format("; bytes in {}, out {}", c.bytes_in, c.bytes_out);
  if (c.bulk_bytes_in != 0 || c.bulk_bytes_out != 0) {
    out << fmt::format("; bulk bytes in {}, out {}", c.bulk_bytes_in, c.bulk_bytes_out);
  }
  if (c.credit_stalls != 0 || c.queued != 0) {
    out << fmt::format("; credit stalls {}, queued now {}", c.credit_stalls, c.queued);
  }
  out << "\n";
}

void print_table(std::ostream& out, const MetricsSnapshot& m, const MetricsSnapshot* prev,
                 double interval_s) {
  out << fmt::format("event loops: {}\n", m.loops);
  print_calls(out, "server", m.server);
  print_calls(out, "client", m.client);
  if (prev != nullptr && interval_s > 0) {
    const double rate = double(m.server.finished_total() - prev->server.finished_total()) / interval_s;
    out << fmt::format("server calls/s over the last {:.1f} s: {:.0f}\n", interval_s, rate);
  }
  out << fmt::format("{:<7} {:<40} {:>10} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}\n", "side",
                     "method", "calls", "errors", "p50 us", "p90 us", "p99 us", "p99.9 us", "max us");
  for (const MethodMetrics& mm : m.methods) {
    uint64_t finished = 0;
    for (uint64_t f : mm.finished) finished += f;
    const uint64_t errors = finished - mm.finished[0];
    const HistogramSnapshot& h = mm.latency_us;
    out << fmt::format("{:<7} {:<40} {:>10} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}\n",
                       mm.server ? "server" : "client", mm.name, finished, errors,
                       us(Histogram::quantile(h, 0.5)), us(Histogram::quantile(h, 0.9)),
                       us(Histogram::quantile(h, 0.99)), us(Histogram::quantile(h, 0.999)), us(h.max));
  }
  for (const TransportMetrics& t : m.transports) {
    const uint64_t sends = t.slot_sends + t.control_sends;
    out << fmt::format("transport {}: {} sessions, {} slot sends, {} control sends, {} messages "
                       "({:.2f} per send; {} packs)",
                       t.transport, t.sessions, t.slot_sends, t.control_sends, t.messages,
                       sends == 0 ? 0.0 : double(t.messages) / double(sends), t.packs);
    if (t.transport == "verbs") {
      const uint64_t wrs = t.slot_sends + t.control_sends;
      out << fmt::format(", {} inline / {} non-inline, {} doorbells ({:.1f} work requests each), "
                         "{} signaled, {} backlogged",
                         t.inline_sends, t.noninline_sends, t.doorbells,
                         t.doorbells == 0 ? 0.0 : double(wrs) / double(t.doorbells), t.signaled,
                         t.backlogged);
    }
    const HistogramSnapshot& p = t.completions_per_poll;
    out << fmt::format("; completions per poll p50 {} p99 {} max {} ({} polls)\n",
                       Histogram::quantile(p, 0.5), Histogram::quantile(p, 0.99), p.max, p.count);
  }
  for (const HwCounter& c : m.hw_counters) {
    if (c.kind == HwCounter::Kind::kOther && c.delta == 0) continue;
    out << fmt::format("hw {}/{} {}: {} (+{}, {:.1f}/s)\n", c.device, c.port, c.name, c.value,
                       c.delta, c.per_second);
  }
  for (const ReceivePool& p : m.receive_pools) {
    out << fmt::format("receive pool {} {}: {} of {} posted, low water {}\n", p.loop, p.queue,
                       p.posted, p.capacity, p.low_water);
  }
  for (const std::string& a : m.hw_counters_absent) out << "hw counter not exposed: " << a << "\n";
}

}  // namespace

int run_process_mode(const ProcessOptions& opts, std::ostream& out, std::ostream& err) {
  Config config;
  // The default (auto) transport, not TCP: a server started with
  // SLOTRPC_TRANSPORT=verbs refuses TCP sessions, and an operator must
  // still be able to read it.  Two slots keep what verbs pins small.
  config.slot_count = 2;
  config.log_level = "warn";
  auto channel = Channel::connect(opts.address, config);
  if (!channel.ok()) {
    err << "slotrpc-stat: " << channel.status().to_string() << "\n";
    return channel.status().code() == StatusCode::kInvalidArgument ? kExitUsage : kExitFailure;
  }
  MetricsSnapshot prev;
  bool have_prev = false;
  auto last = std::chrono::steady_clock::now();
  for (unsigned n = 0;; ++n) {
    auto m = admin::fetch_metrics(**channel,
                                  CallOptions::with_timeout(std::chrono::milliseconds(10000)));
    if (!m.ok()) {
      err << "slotrpc-stat: slotrpc.Admin/Metrics on " << opts.address << ": "
          << m.status().to_string() << "\n";
      return kExitFailure;
    }
    const auto now = std::chrono::steady_clock::now();
    if (opts.prometheus) {
      out << to_prometheus(m.value());
    } else {
      if (opts.watch_seconds > 0) out << "--- " << opts.address << "\n";
      print_table(out, m.value(), have_prev ? &prev : nullptr,
                  std::chrono::duration<double>(now - last).count());
    }
    out.flush();
    if (opts.watch_seconds <= 0 || (opts.count != 0 && n + 1 >= opts.count)) return kExitOk;
    prev = std::move(m.value());
    have_prev = true;
    last = now;
    std::this_thread::sleep_for(std::chrono::duration<double>(opts.watch_seconds));
  }
}

}  // namespace slotrpc::stat
