#include "device_mode.h"

#include <fmt/format.h>
#include <fmt/ostream.h>

#include <chrono>
#include <csignal>
#include <memory>
#include <ostream>
#include <thread>
#include <vector>

#include "transport/verbs/hw_counters.h"

namespace slotrpc::stat {

namespace {

using monitor::PortCounters;

volatile std::sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

void print_counters(std::ostream& out, const std::vector<HwCounter>& counters, bool deltas) {
  if (deltas) {
    fmt::print(out, "{:<5} {:<36} {:>20} {:>12} {:>12} {}\n", "port", "counter", "value", "delta", "per_s",
               "kind");
  } else {
    fmt::print(out, "{:<5} {:<36} {:>20} {}\n", "port", "counter", "value", "kind");
  }
  for (const HwCounter& c : counters) {
    if (deltas) {
      fmt::print(out, "{:<5} {:<36} {:>20} {:>12} {:>12.1f} {}\n", c.port, c.name, c.value, c.delta,
                 c.per_second, monitor::kind_name(c.kind));
    } else {
      fmt::print(out, "{:<5} {:<36} {:>20} {}\n", c.port, c.name, c.value, monitor::kind_name(c.kind));
    }
  }
}

void print_absent(std::ostream& out, const std::vector<std::string>& absent) {
  if (absent.empty()) {
    fmt::print(out, "absent known counters: none\n");
    return;
  }
  fmt::print(out, "absent known counters ({}):\n", absent.size());
  for (const auto& a : absent) fmt::print(out, "  {}\n", a);
}

int print_once(const DeviceOptions& opts, std::ostream& out, std::ostream& err) {
  auto d = monitor::read_device(opts.device, opts.sysfs_root);
  if (!d.ok()) {
    fmt::print(err, "slotrpc-stat: {}\n", d.status().message());
    return d.status().code() == StatusCode::kInvalidArgument ? kExitUsage : kExitFailure;
  }
  const std::string_view family = monitor::device_family(opts.device);
  fmt::print(out, "device {}{}\n", opts.device, family.empty() ? "" : fmt::format(" ({})", family));
  print_counters(out, d.value().counters, false);
  print_absent(out, d.value().absent);
  for (const auto& e : d.value().errors) fmt::print(err, "slotrpc-stat: warning: {}\n", e);
  return kExitOk;
}

int watch(const DeviceOptions& opts, std::ostream& out, std::ostream& err) {
  // Validates the device (and its error) the same way as a single read.
  auto d = monitor::read_device(opts.device, opts.sysfs_root);
  if (!d.ok()) {
    fmt::print(err, "slotrpc-stat: {}\n", d.status().message());
    return d.status().code() == StatusCode::kInvalidArgument ? kExitUsage : kExitFailure;
  }
  std::vector<std::unique_ptr<PortCounters>> ports;
  for (uint32_t p : monitor::list_ports(opts.device, opts.sysfs_root)) {
    auto pc = PortCounters::open(opts.device, p, opts.sysfs_root);
    if (!pc.ok()) {
      fmt::print(err, "slotrpc-stat: warning: {}\n", pc.status().message());
      continue;
    }
    for (const auto& e : pc.value()->errors()) fmt::print(err, "slotrpc-stat: warning: {}\n", e);
    ports.push_back(std::move(pc.value()));
  }
  if (ports.empty()) {
    fmt::print(err, "slotrpc-stat: device {}: no port could be read\n", opts.device);
    return kExitFailure;
  }
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  const auto period = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(opts.watch_seconds));
  auto next = std::chrono::steady_clock::now();
  for (unsigned i = 0; !g_stop && (opts.count == 0 || i < opts.count); ++i) {
    if (i > 0) {
      next += period;
      while (!g_stop && std::chrono::steady_clock::now() < next)
        std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
            next - std::chrono::steady_clock::now(), std::chrono::milliseconds(100)));
      if (g_stop) break;
    }
    std::vector<HwCounter> all;
    for (auto& pc : ports) {
      if (i > 0) {
        for (const auto& e : pc->sample()) fmt::print(err, "slotrpc-stat: warning: {}\n", e);
      }
      all.insert(all.end(), pc->counters().begin(), pc->counters().end());
    }
    fmt::print(out, "device {}, sample {} ({})\n", opts.device, i + 1,
               i == 0 ? std::string("baseline")
                      : fmt::format("{} s since the previous", opts.watch_seconds));
    print_counters(out, all, true);
    out.flush();
  }
  std::vector<std::string> absent;
  for (auto& pc : ports) absent.insert(absent.end(), pc->absent().begin(), pc->absent().end());
  print_absent(out, absent);
  return kExitOk;
}

}  // namespace

int run_device_mode(const DeviceOptions& opts, std::ostream& out, std::ostream& err) {
  return opts.watch_seconds > 0 ? watch(opts, out, err) : print_once(opts, out, err);
}

}  // namespace slotrpc::stat
