// echo_bench: latency and throughput of slotrpc echo calls, server and
// client in one process over loopback (TCP today; verbs when available).
//
//   echo_bench [--calls N] [--sizes 64,1024,16384] [--outstanding 1,32]
//
// Payloads are raw bytes (no FlatBuffers work on either side), so this
// measures the runtime: slots, credits, the reactor and the transport.
// Set SLOTRPC_POLL_MODE=busy for the lowest latency.  Prints one line per
// (size, outstanding) pair and the machine it ran on; nothing is assumed.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <slotrpc/slotrpc.h>

namespace {

const uint32_t kEcho = slotrpc::method_id("slotrpc.bench.Echo.Echo");

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown CPU";
}

struct Result {
  double p50_us = 0, p99_us = 0, max_us = 0, calls_per_s = 0;
  uint64_t failed = 0;
};

Result run(slotrpc::Channel& ch, uint64_t calls, uint64_t size, uint64_t outstanding) {
  // Nanoseconds; recorded by the reply callbacks, which all run on the
  // channel's loop.  Fixed memory, however many calls.
  slotrpc::Histogram lat;
  std::atomic<uint64_t> issued{0}, done{0}, failed{0};
  std::mutex mu;
  std::condition_variable cv;
  bool finished = false;
  std::vector<uint8_t> payload(size, 0x5a);

  std::function<void()> issue = [&] {
    const uint64_t i = issued.fetch_add(1);
    if (i >= calls) return;
    const auto start = std::chrono::steady_clock::now();
    slotrpc::raw::call(ch,
        kEcho,
        [&payload](flatbuffers::FlatBufferBuilder& fbb) { fbb.PushFlatBuffer(payload.data(), payload.size()); },
        {},
        [&, start](slotrpc::RawReply&& r) {
          lat.record(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                               std::chrono::steady_clock::now() - start).count()));
          if (!r.ok() || r.size() != size) ++failed;
          r.release();
          issue();
          if (done.fetch_add(1) + 1 == calls) {
            std::lock_guard<std::mutex> lock(mu);
            finished = true;
            cv.notify_all();
          }
        });
  };
  const auto t0 = std::chrono::steady_clock::now();
  for (uint64_t k = 0; k < std::min(outstanding, calls); ++k) issue();
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return finished; });
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  Result res;  // quantiles within 6.25% (slotrpc/histogram.h)
  res.p50_us = lat.quantile(0.50) / 1000.0;
  res.p99_us = lat.quantile(0.99) / 1000.0;
  res.max_us = lat.max() / 1000.0;
  res.calls_per_s = static_cast<double>(calls) / secs;
  res.failed = failed.load();
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t calls = 100'000;
  std::vector<uint64_t> sizes = {64, 1024, 16384};
  std::vector<uint64_t> windows = {1, 32};
  CLI::App app("Echo round trips over loopback against an in-process Server: p50/p99/max latency "
               "and calls per second for every size and window.",
               "echo_bench");
  app.add_option("--calls", calls, "Calls per point (size, outstanding)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--sizes", sizes, "Payload sizes in bytes, comma-separated")
      ->delimiter(',')->capture_default_str();
  app.add_option("--outstanding", windows, "Calls in flight, comma-separated (one point each)")
      ->delimiter(',')->check(CLI::PositiveNumber)->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help exits 0; a bad option 2, the usual usage-error status.
    return app.exit(e) == 0 ? 0 : 2;
  }

  slotrpc::Server server;
  slotrpc::ServiceDefinition svc("slotrpc.bench.Echo");
  svc.add_method("Echo", [](slotrpc::ServerCall& call) {
    const auto req = call.request();
    call.reply().PushFlatBuffer(reinterpret_cast<const uint8_t*>(req.data()), req.size());
    return slotrpc::Status();
  });
  if (auto st = server.add_service(std::move(svc)); !st.ok()) return std::fprintf(stderr, "%s\n", st.to_string().c_str()), 1;
  if (auto st = server.start("127.0.0.1:0"); !st.ok()) return std::fprintf(stderr, "%s\n", st.to_string().c_str()), 1;
  auto ch = slotrpc::Channel::connect("127.0.0.1:" + std::to_string(server.port()));
  if (!ch.ok()) return std::fprintf(stderr, "%s\n", ch.status().to_string().c_str()), 1;

  std::printf("machine: %s, %u hardware threads; transport %s; poll mode %s; %llu calls per point\n",
              cpu_model().c_str(), std::thread::hardware_concurrency(),
              std::string(slotrpc::to_string((*ch)->transport())).c_str(),
              std::string(slotrpc::to_string((*ch)->config().poll_mode)).c_str(),
              static_cast<unsigned long long>(calls));
  std::printf("%10s %12s %10s %10s %10s %12s\n", "size_B", "outstanding", "p50_us", "p99_us", "max_us", "calls_per_s");
  int rc = 0;
  for (uint64_t size : sizes) {
    if (size + 32 > (*ch)->slot_size()) {
      std::fprintf(stderr, "size %llu does not fit a %u-byte slot; raise SLOTRPC_SLOT_SIZE\n",
                   static_cast<unsigned long long>(size), (*ch)->slot_size());
      return 2;
    }
    for (uint64_t w : windows) {
      const Result r = run(**ch, calls, size, w);
      std::printf("%10llu %12llu %10.1f %10.1f %10.1f %12.0f\n", static_cast<unsigned long long>(size),
                  static_cast<unsigned long long>(w), r.p50_us, r.p99_us, r.max_us, r.calls_per_s);
      if (r.failed != 0) {
        std::fprintf(stderr, "%llu calls failed\n", static_cast<unsigned long long>(r.failed));
        rc = 1;
      }
    }
  }
  return rc;
}
