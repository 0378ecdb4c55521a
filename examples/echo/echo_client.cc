// echo_client [--connect HOST:PORT] [--count N] [--size BYTES] [--outstanding K]
// (--help lists them)
//
// Keeps K calls in flight until N have completed, checks every byte of
// every reply, and prints the latency distribution.
//
// A call that fails (e.g. UNAVAILABLE: the server died) stops the run: no
// new call is issued, the calls still out are waited for, and the client
// exits 1 with "echo_client: call failed: <status>".
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "echo_service.h"
#include "slotrpc/histogram.h"

namespace {

using slotrpc::examples::EchoClient;
using slotrpc::examples::EchoReply;
using slotrpc::examples::EchoRequest;

struct Run {
  EchoClient* client = nullptr;
  uint64_t count = 0;
  uint64_t size = 0;
  uint32_t retries = 0;  // CallOptions::max_retries (Echo is idempotent)
  // The first window is issued from main(), the rest from reply callbacks
  // on the channel's event loop: sequence numbers are claimed atomically,
  // and the rest is touched on the event loop only.
  std::atomic<uint64_t> issued{0};
  std::atomic<uint64_t> completed{0};
  std::atomic<uint64_t> out{0};  // issued and not yet completed
  std::atomic<bool> stopping{false};  // a call failed: issue no more
  uint64_t failed = 0;  // event loop only
  std::string first_error;
  std::string first_status;  // the first call that failed with a status
  // Latency in nanoseconds, recorded on the channel's loop (every reply
  // callback runs there): fixed memory however many calls are made.
  slotrpc::Histogram latency_ns;

  std::mutex mu;
  std::condition_variable cv;
  bool done = false;

  slotrpc::CallOptions options() const {
    slotrpc::CallOptions o;
    o.max_retries = retries;  // a call its server died under is sent again (to another, in a fleet)
    return o;
  }

  // False when no call was issued (all were, or the run is stopping).
  bool issue() {
    if (stopping.load()) return false;
    const uint64_t seq = issued.fetch_add(1);
    if (seq >= count) return false;
    out.fetch_add(1);
    const auto started = std::chrono::steady_clock::now();
    const uint64_t size_bytes = size;
    client->Echo(
        [seq, size_bytes](flatbuffers::FlatBufferBuilder& fbb) {
          uint8_t* bytes = nullptr;
          auto payload = fbb.CreateUninitializedVector(size_bytes, &bytes);
          for (size_t i = 0; i < size_bytes; ++i) bytes[i] = echo::pattern(seq, i);
          return slotrpc::examples::CreateEchoRequest(fbb, seq, payload);
        },
        options(), [this, seq, started](slotrpc::Reply<EchoReply>&& reply) { on_reply(seq, started, reply); });
    return true;
  }

  void on_reply(uint64_t seq, std::chrono::steady_clock::time_point started,
                const slotrpc::Reply<EchoReply>& reply) {
    latency_ns.record(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                std::chrono::steady_clock::now() - started).count()));
    std::string error;
    if (!reply.ok()) {
      error = reply.status().to_string();
      if (first_status.empty()) first_status = error;
      stopping.store(true);
    } else if (reply->seq() != seq) {
      error = "reply carries seq " + std::to_string(reply->seq()) + ", expected " + std::to_string(seq);
    } else if (reply->payload() == nullptr || reply->payload()->size() != size) {
      error = "reply payload has the wrong size";
    } else {
      const auto* p = reply->payload();
      for (size_t i = 0; i < size; ++i) {
        if (p->Get(static_cast<flatbuffers::uoffset_t>(i)) != echo::pattern(seq, i)) {
          error = "reply payload differs at byte " + std::to_string(i);
          break;
        }
      }
    }
    if (!error.empty()) {
      if (failed++ == 0) first_error = "call " + std::to_string(seq) + ": " + error;
    }
    completed.fetch_add(1);
    issue();
    // Done when no call is out any more: all completed, or the run stopped
    // at a failure and the last call still out has come back.
    if (out.fetch_sub(1) == 1) {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
      cv.notify_all();
    }
  }
};

double percentile_us(const slotrpc::Histogram& h, double q) { return h.quantile(q) / 1000.0; }

}  // namespace

int main(int argc, char** argv) {
  std::string address = "127.0.0.1:7000";
  uint64_t count = 10000, size = 64, outstanding = 8;
  uint32_t retries = 0;
  CLI::App app("Calls slotrpc.examples.Echo, keeping K calls in flight until N completed; checks "
               "every reply byte and prints the latency distribution.",
               "echo_client");
  app.add_option("--connect", address,
                 "Server address, or a fleet: list://H:P,H:P, dns:///NAME:PORT, etcd://H:P/prefix")
      ->capture_default_str();
  app.add_option("--count", count, "Calls to make")
      ->check(CLI::Range(uint64_t{1}, uint64_t{100'000'000}))->capture_default_str();
  app.add_option("--size", size, "Payload bytes per request (echoed back)")
      ->check(CLI::Range(uint64_t{0}, uint64_t{64} << 20))->capture_default_str();
  app.add_option("--retries", retries, "Times a call is sent again when its server dies (Echo is idempotent)")
      ->check(CLI::Range(uint32_t{0}, uint32_t{100}))->capture_default_str();
  app.add_option("--outstanding", outstanding, "Calls in flight at once")
      ->check(CLI::Range(uint64_t{1}, uint64_t{4096}))->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help exits 0; a bad option 2, the usual usage-error status.
    return app.exit(e) == 0 ? 0 : 2;
  }

  auto channel = slotrpc::Channel::connect(address);
  if (!channel.ok()) {
    std::fprintf(stderr, "echo_client: %s\n", channel.status().to_string().c_str());
    return 1;
  }
  EchoClient client(**channel);
  Run run;
  run.client = &client;
  run.count = count;
  run.size = size;
  run.retries = retries;

  const auto t0 = std::chrono::steady_clock::now();
  // The first window; `out` holds one extra count meanwhile, so callbacks
  // cannot see zero calls out before the window is complete.
  run.out.fetch_add(1);
  for (uint64_t i = 0; i < std::min(outstanding, count); ++i) run.issue();
  if (run.out.fetch_sub(1) == 1) {
    std::lock_guard<std::mutex> lock(run.mu);
    run.done = true;
  }
  {
    std::unique_lock<std::mutex> lock(run.mu);
    run.cv.wait(lock, [&] { return run.done; });
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!run.first_status.empty()) {
    // The run stopped early: the session failed (or a call did).
    std::fprintf(stderr, "echo_client: call failed: %s\n", run.first_status.c_str());
    std::fprintf(stderr, "echo_client: stopped after %llu of %llu calls (%llu ok, %llu failed)\n",
                 static_cast<unsigned long long>(run.completed.load()),
                 static_cast<unsigned long long>(count),
                 static_cast<unsigned long long>(run.completed.load() - run.failed),
                 static_cast<unsigned long long>(run.failed));
    return 1;
  }

  std::printf("echo_client: %llu calls of %llu B, %llu outstanding, over %s to %s\n",
              static_cast<unsigned long long>(count), static_cast<unsigned long long>(size),
              static_cast<unsigned long long>(outstanding),
              std::string(slotrpc::to_string((*channel)->transport())).c_str(),
              (*channel)->peer().c_str());
  // Quantiles from a log-bucketed histogram: at most 6.25% above the exact
  // sample quantile (slotrpc/histogram.h).
  std::printf("echo_client: %llu ok, %llu failed; p50 %.1f us, p99 %.1f us; %.0f calls/s\n",
              static_cast<unsigned long long>(count - run.failed),
              static_cast<unsigned long long>(run.failed), percentile_us(run.latency_ns, 0.50),
              percentile_us(run.latency_ns, 0.99), static_cast<double>(count) / seconds);
  std::printf("echo_client: latency p50 %.1f, p90 %.1f, p99 %.1f, p99.9 %.1f, max %.1f us\n",
              percentile_us(run.latency_ns, 0.50), percentile_us(run.latency_ns, 0.90),
              percentile_us(run.latency_ns, 0.99), percentile_us(run.latency_ns, 0.999),
              run.latency_ns.max() / 1000.0);
  if (run.failed != 0) {
    std::fprintf(stderr, "echo_client: first failure: %s\n", run.first_error.c_str());
    return 1;
  }
  std::printf("echo_client: every reply payload verified\n");
  return 0;
}
