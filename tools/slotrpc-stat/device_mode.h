// slotrpc-stat --device NAME: an RDMA device's hardware counters, read from
// sysfs (lib/transport/verbs/hw_counters.h), once or every --watch seconds.
#pragma once

#include <iosfwd>
#include <string>

namespace slotrpc::stat {

// Exit codes of slotrpc-stat.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  // the counters could not be read
inline constexpr int kExitUsage = 2;    // bad options, unknown device or address

struct DeviceOptions {
  std::string device;
  std::string sysfs_root = "/sys/class/infiniband";
  double watch_seconds = 0;  // 0: print once
  unsigned count = 0;        // with watch: refreshes before exiting (0 = until interrupted)
};

// Prints every counter of every port (name, value, kind), then the known
// names the device lacks, to `out`; problems to `err`.  With watch, re-reads
// every watch_seconds and prints values with their deltas and rates.
int run_device_mode(const DeviceOptions& opts, std::ostream& out, std::ostream& err);

}  // namespace slotrpc::stat
