// Shared by the verbs tests.
//
// The verbs tests need an RDMA device.  The `rxe` meson suite runs them
// (tests/verbs/run_device_suite.sh -> run_verbs_tests.sh) directly on this
// host's device when it has one, else inside the Soft-RoCE VM
// (tests/rxe/rxe-vm.sh); no machine here has one, so here that is the VM.
// Run by hand on a host without a device they print why and exit 77
// (meson's "skipped"); inside the VM (RXE_VM set) a missing device is a
// failure, never a skip, and run_verbs_tests.sh counts a skip as a failure
// wherever it runs.
#pragma once

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <optional>
#include <string>
#include <thread>

#include "../process_util.h"
#include "slotrpc/config.h"
#include "transport/verbs/device.h"

namespace verbs_test {

inline bool in_rxe_vm() { return std::getenv("RXE_VM") != nullptr; }

// Call counts of the load phases, scaled down by VERBS_LOAD_DIVISOR
// (tests/verbs/meson.build sets 4 in sanitized builds).  In the emulated VM
// a sanitized process makes about 1,300 calls a second, so the load phases
// of four cases took 97 of the sanitized rxe run's 240 s; what ASan and
// UBSan look for shows on the first ring wraps or not at all, while the
// release build keeps the full counts for drift and races.  Never below
// `floor`, so every phase still wraps the rings several times.
inline uint64_t load_calls(uint64_t full, uint64_t floor = 200) {
  const char* env = std::getenv("VERBS_LOAD_DIVISOR");
  const uint64_t divisor = env != nullptr ? std::strtoull(env, nullptr, 10) : 1;
  const uint64_t n = divisor > 1 ? full / divisor : full;
  return n < floor ? (full < floor ? full : floor) : n;
}

// The device the tests use: what SLOTRPC_* selects (rxe0 in the VM).
inline slotrpc::Result<std::string> usable_device() {
  auto cfg = slotrpc::Config{}.with_environment();
  if (!cfg.ok()) return cfg.status();
  auto dev = slotrpc::transport::verbs::Device::open(cfg.value());
  if (!dev.ok()) return dev.status();
  return dev.value()->name();
}

// One of /sys/class/infiniband/<dev>/ports/<port>/hw_counters/<name>.
inline std::optional<uint64_t> hw_counter(const std::string& device, const std::string& name,
                                          unsigned port = 1) {
  std::ifstream in("/sys/class/infiniband/" + device + "/ports/" + std::to_string(port) +
                   "/hw_counters/" + name);
  uint64_t v = 0;
  if (!(in >> v)) return std::nullopt;
  return v;
}

// Object counts of a device from `rdma resource show` (iproute2), e.g.
// {"pd": 3, "cq": 2, "qp": 3, "mr": 5, ...}; empty if the tool is missing.
inline std::map<std::string, long> rdma_resources(const std::string& device) {
  std::map<std::string, long> out;
  FILE* p = ::popen(("rdma resource show " + device + " 2>/dev/null").c_str(), "r");
  if (p == nullptr) return out;
  char line[512];
  std::string text;
  while (std::fgets(line, sizeof line, p) != nullptr) text += line;
  ::pclose(p);
  std::istringstream in(text);
  std::string word, prev;
  while (in >> word) {
    char* end = nullptr;
    const long v = std::strtol(word.c_str(), &end, 10);
    if (!prev.empty() && end != word.c_str() && *end == '\0') out[prev] = v;
    prev = word;
  }
  return out;
}

// Bounded polling (10 s unless told): process_util.h.
using test_process::wait_until;

// main() of a verbs test binary.  `child`, when set, serves argv "--child*"
// invocations (--child, --child-client, ...: processes the test spawns from
// its own binary).
inline int main(int argc, char** argv, const std::function<int(int, char**)>& child = nullptr) {
  if (child && argc >= 2 && std::string(argv[1]).rfind("--child", 0) == 0) return child(argc, argv);
  auto dev = usable_device();
  if (!dev.ok()) {
    if (in_rxe_vm()) {
      std::fprintf(stderr, "FAIL: inside the rxe VM but no usable RDMA device: %s\n",
                   dev.status().to_string().c_str());
      return 1;
    }
    std::printf("SKIP: no usable RDMA device here (%s).\n"
                "meson test --suite rxe runs them on a host's device or inside the Soft-RoCE VM "
                "(see tests/rxe/README.md).\n",
                dev.status().message().c_str());
    return 77;
  }
  std::printf("verbs tests on %s\n", dev.value().c_str());
  doctest::Context ctx;
  ctx.applyCommandLine(argc, argv);
  return ctx.run();
}

}  // namespace verbs_test
