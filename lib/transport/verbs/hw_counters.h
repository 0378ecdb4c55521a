// RDMA hardware counters from sysfs.
//
// A port of an RDMA device exposes two directories of counters:
//   /sys/class/infiniband/<dev>/ports/<port>/hw_counters/*   (driver counters:
//       RNR NAKs, retries, sequence errors, congestion)
//   /sys/class/infiniband/<dev>/ports/<port>/counters/*      (IB PMA counters:
//       bytes and packets, link errors)
// Each file holds one decimal number.  PortCounters opens every file once and
// re-reads it with pread() at offset 0 (sysfs regenerates the text on every
// read from offset 0), so a sample costs one syscall per counter and no
// directory walk.  This is never on the data path: the monitor samples from
// a timer, once an interval (lib/transport/verbs/monitor.h).
//
// The names the monitor knows (what they mean and what to do when they rise:
// docs/design.md, "Metrics and the monitor") are classified into
// HwCounter::Kind; everything else is read too, as kOther.  Known names of
// the device's family that the port does not expose are reported as absent,
// so "0" can be told from "not measured".
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "slotrpc/metrics.h"
#include "slotrpc/result.h"

namespace slotrpc::monitor {

inline constexpr const char* kSysfsRoot = "/sys/class/infiniband";

struct KnownCounter {
  const char* name;
  HwCounter::Kind kind;
};

// The device family whose known names apply: "mlx5", "rxe", or "" (unknown
// family: nothing is reported absent).
std::string_view device_family(std::string_view device);
// The known counter names of a family (empty for "").
std::span<const KnownCounter> known_counters(std::string_view family);
// The kind of a counter name (any family); kOther when not a known name.
HwCounter::Kind classify_counter(std::string_view name);
// "rnr", "retry", "sequence", "congestion", "other".
std::string_view kind_name(HwCounter::Kind kind);

// Parses a sysfs counter's text ("123\n"): digits, optionally surrounded by
// whitespace.  False for anything else (empty, negative, "N/A", overflow).
bool parse_counter(std::string_view text, uint64_t& value);

// The counters of one port, files held open.  Not thread-safe: one owner
// samples it (the monitor serialises its loops, see monitor.h).
class PortCounters {
 public:
  using Clock = std::chrono::steady_clock;

  // Opens ports/<port>/hw_counters/* and ports/<port>/counters/* of `device`
  // under `sysfs_root` and takes the first sample (the baseline: deltas 0).
  // Fails when the device or the port does not exist, or the port has
  // neither directory; a single file that cannot be opened or read is not a
  // failure (see errors()).
  static Result<std::unique_ptr<PortCounters>> open(const std::string& device, uint32_t port,
                                                    const std::string& sysfs_root = kSysfsRoot);
  ~PortCounters();
  PortCounters(const PortCounters&) = delete;
  PortCounters& operator=(const PortCounters&) = delete;

  // Re-reads every counter.  value is the new reading; delta the growth since
  // the previous good reading, or the new value itself when it went
  // backwards (a device reset, or a narrow counter that wrapped: it counts
  // from 0 again, so the delta is never a huge unsigned difference);
  // per_second = delta / time since the previous sample.  A counter that
  // cannot be read or parsed this time keeps its last value with delta 0.
  // Returns the errors that are new since the previous sample (a counter
  // that keeps failing is reported once, and again after it recovered).
  std::vector<std::string> sample(Clock::time_point now = Clock::now());

  const std::string& device() const { return device_; }
  uint32_t port() const { return port_; }
  std::string_view family() const { return family_; }
  const std::vector<HwCounter>& counters() const { return counters_; }
  // Known names of the family the port does not expose: "rxe0/1: rcvd_rnr_err".
  const std::vector<std::string>& absent() const { return absent_; }
  // Every problem as of the last sample (files that could not be opened at
  // open(), counters whose last read failed), one clear line each.
  std::vector<std::string> errors() const;

 private:
  PortCounters(std::string device, uint32_t port) : device_(std::move(device)), port_(port) {}

  struct File {
    int fd = -1;
    std::string path;
    std::string error;  // non-empty while the last read failed
    bool has_value = false;  // read successfully at least once
  };

  std::string device_;
  uint32_t port_;
  std::string family_;
  std::vector<HwCounter> counters_;
  std::vector<File> files_;               // parallel to counters_
  std::vector<std::string> open_errors_;  // files skipped at open()
  std::vector<std::string> absent_;
  Clock::time_point last_{};
};

// Every counter of every port of one device, and what is missing.
struct DeviceCounters {
  std::vector<HwCounter> counters;
  std::vector<std::string> absent;
  std::vector<std::string> errors;
};

// The RDMA devices under `sysfs_root`, sorted; empty when there are none (or
// the directory does not exist).
std::vector<std::string> list_devices(const std::string& sysfs_root = kSysfsRoot);
// The port numbers of `device`, sorted.
std::vector<uint32_t> list_ports(const std::string& device, const std::string& sysfs_root = kSysfsRoot);

// One reading of every port of `device` (deltas 0).  An unknown device is an
// error naming it and listing the devices that exist.
Result<DeviceCounters> read_device(const std::string& device,
                                   const std::string& sysfs_root = kSysfsRoot);
// The same, counters only (slotrpc-stat --device).
Result<std::vector<HwCounter>> read_device_counters(const std::string& device,
                                                    const std::string& sysfs_root = kSysfsRoot);

}  // namespace slotrpc::monitor
