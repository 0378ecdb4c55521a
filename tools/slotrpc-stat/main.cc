// slotrpc-stat: what slotrpc sees.
//
//   slotrpc-stat --device rxe0              every hardware counter of the device
//   slotrpc-stat --device rxe0 --watch 1    ... re-read every second, with deltas
//   slotrpc-stat --address HOST:PORT        a running Server's counters and
//                                           per-method latency (slotrpc.Admin/Metrics)
//   slotrpc-stat --address HOST:PORT --prometheus   the same as Prometheus text
//
// main() only parses options and hands them to one mode (device_mode.h);
// a new mode adds its options and its run function, nothing else.
#include <CLI/CLI.hpp>

#include <iostream>

#include "device_mode.h"
#include "process_mode.h"

int main(int argc, char** argv) {
  using namespace slotrpc::stat;
  CLI::App app{
      "slotrpc-stat: a running slotrpc Server's calls, per-method latency, transports and errors "
      "(--address HOST:PORT), or the RDMA hardware counters of a device (--device NAME)"};
  app.set_version_flag("--version", "slotrpc-stat 0.1.0");

  DeviceOptions device;
  auto* device_opt = app.add_option("--device", device.device, "RDMA device whose counters to print (e.g. rxe0, mlx5_0)");
  app.add_option("--sysfs", device.sysfs_root, "sysfs directory of RDMA devices")
      ->capture_default_str();
  ProcessOptions process;
  auto* address_opt = app.add_option("--address", process.address,
                                     "HOST:PORT of a running slotrpc Server (its RPC port)");
  app.add_flag("--prometheus", process.prometheus,
               "with --address: print the Prometheus exposition text");
  device_opt->excludes(address_opt);
  double watch = 0;
  app.add_option("--watch", watch, "re-read every N seconds and print deltas")
      ->check(CLI::PositiveNumber);
  unsigned count = 0;
  app.add_option("--count", count, "with --watch: stop after N samples (default: until interrupted)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 exits 0 for --help/--version and its own code otherwise; every
    // usage error is 2 here.
    const int rc = app.exit(e);
    return rc == 0 ? 0 : kExitUsage;
  }

  if (*device_opt) {
    device.watch_seconds = watch;
    device.count = count;
    return run_device_mode(device, std::cout, std::cerr);
  }
  if (*address_opt) {
    process.watch_seconds = watch;
    process.count = count;
    return run_process_mode(process, std::cout, std::cerr);
  }
  std::cerr << "slotrpc-stat: no mode given (--device NAME or --address HOST:PORT)\n";
  return kExitUsage;
}
