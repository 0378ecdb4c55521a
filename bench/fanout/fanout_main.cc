// slotrpc-fanout: the microservice fan-out benchmark.
//
// The read path of a social network's home page: a load generator calls
// Frontend.Home(user); the frontend calls Timeline.Get, Posts.Get and
// Media.Get in parallel (three backend processes) and combines their replies.
// Five processes per system, same topology, same schema, same messages:
//
//   slotrpc-fanout --systems tcp,shm,grpc --rates 1000,2000,5000 --seconds 2 --json F
//
// --replicas 3 runs each backend service as three processes behind
// round_robin (slotrpc: a list:// target; gRPC: an ipv4: target with its
// round_robin policy), eleven processes per system.
//
// Systems: tcp and shm (slotrpc over that transport, SLOTRPC_TRANSPORT set
// for every process), grpc (gRPC 1.51 + FlatBuffers from the same schema).
//
// Open loop: at offered rate R, request i is due at start + i/R and is sent
// then, whether or not earlier ones were answered; its latency counts from
// its due time, so queueing anywhere (the frontend, a backend, or the load
// generator falling behind its schedule) shows as latency instead of
// silently lowering the load (no coordinated omission).  Each rate runs
// --seconds; the run stops after the first saturated step: fewer than 99 % of
// the requests answered in time, or the achieved rate under 90 % of the
// offered one.  With --confirm N a saturated step runs up to N times more
// before it counts: a host shared with other work has bursts that saturate
// one step of a system that otherwise holds the rate (every attempt is
// printed and kept).  Every request has a deadline (--deadline-ms).
#include <CLI/CLI.hpp>
#include <sys/prctl.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "bench_common.h"
#include "fanout.h"
#include "slotrpc/histogram.h"

namespace bench::fanout {
namespace {

struct Row {
  std::string system;
  int attempt = 1;  // of this rate, with --confirm
  double offered = 0, achieved = 0;
  uint64_t sent = 0, ok = 0, failed = 0, unanswered = 0;
  double p50 = 0, p90 = 0, p99 = 0, p999 = 0, mean = 0, max = 0;  // microseconds
  double max_issue_lag = 0;                                        // microseconds
  bool saturated = false;
  std::string error;
};

// One open-loop step at `rate` requests/s for `seconds`.
Row run_step(LoadTarget& target, const std::string& system, double rate, double seconds,
             std::chrono::milliseconds deadline) {
  const uint64_t n = std::max<uint64_t>(1, static_cast<uint64_t>(rate * seconds));
  const auto start = Clock::now() + std::chrono::milliseconds(5);
  auto state = std::make_shared<StepState>(n, start);
  Clock::duration max_lag{0};
  for (uint64_t i = 0; i < n; ++i) {
    const auto due = start + std::chrono::nanoseconds(static_cast<uint64_t>(static_cast<double>(i) * 1e9 / rate));
    // Sleep until the due time (timer slack 1 us, set in main).  No spinning:
    // on a small machine a spinning loader takes a core from the five
    // processes it measures.  A late wake-up counts as latency, since
    // latency runs from the due time, and shows in max_issue_lag.
    std::this_thread::sleep_until(due);
    max_lag = std::max(max_lag, Clock::now() - due);
    target.issue(i, due, deadline, state);
  }
  // Every call ends by its deadline; the margin covers a loaded machine.
  const auto give_up = Clock::now() + deadline + std::chrono::seconds(5);
  while (state->done() < n && Clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // a step is seconds long; 1 ms is noise
  }
  Row r;
  r.system = system;
  r.offered = rate;
  r.sent = n;
  r.failed = state->failed();
  r.unanswered = n - std::min(n, state->done());
  slotrpc::Histogram h;
  for (uint64_t i = 0; i < n; ++i) {
    if (const uint64_t ns = state->latency_ns(i); ns != 0) h.record(ns);
  }
  r.ok = h.count();
  const double secs = std::chrono::duration<double>(state->elapsed()).count();
  r.achieved = secs > 0 ? static_cast<double>(r.ok) / secs : 0;
  r.p50 = h.quantile(0.5) / 1e3;
  r.p90 = h.quantile(0.9) / 1e3;
  r.p99 = h.quantile(0.99) / 1e3;
  r.p999 = h.quantile(0.999) / 1e3;
  r.mean = h.mean() / 1e3;
  r.max = h.max() / 1e3;
  r.max_issue_lag = std::chrono::duration<double, std::micro>(max_lag).count();
  r.saturated = r.ok < n * 99 / 100 || r.achieved < 0.9 * rate;
  r.error = state->first_error();
  return r;
}

void print_row(const Row& r) {
  std::printf("%-12s %9.0f %10.0f %9.1f %9.1f %9.1f %9.1f %7lu %7lu %s\n", r.system.c_str(), r.offered, r.achieved,
              r.p50, r.p90, r.p99, r.p999, static_cast<unsigned long>(r.failed),
              static_cast<unsigned long>(r.unanswered),
              r.saturated ? "saturated" : r.attempt > 1 ? "held on a later attempt" : "");
  if (!r.error.empty()) std::printf("  first error: %s\n", r.error.c_str());
  std::fflush(stdout);
}

bool write_json(const std::string& path, const std::vector<Row>& rows, double seconds, uint64_t deadline_ms) {
  std::ostringstream o;
  o << "{\n  \"tool\": \"slotrpc-fanout\",\n  \"format\": 1,\n  \"machine\": " << machine_json() << ",\n";
  o << "  \"run\": {\"seconds_per_step\": " << json_number(seconds) << ", \"deadline_ms\": " << deadline_ms
    << ", \"poll_mode\": " << json_string(std::getenv("SLOTRPC_POLL_MODE") ? std::getenv("SLOTRPC_POLL_MODE") : "")
    << "},\n  \"results\": [";
  bool first = true;
  for (const Row& r : rows) {
    o << (first ? "\n" : ",\n") << "    {\"system\": " << json_string(r.system)
      << ", \"offered_per_s\": " << json_number(r.offered) << ", \"achieved_per_s\": " << json_number(r.achieved)
      << ", \"sent\": " << r.sent << ", \"ok\": " << r.ok << ", \"failed\": " << r.failed
      << ", \"unanswered\": " << r.unanswered << ", \"p50_us\": " << json_number(r.p50)
      << ", \"p90_us\": " << json_number(r.p90) << ", \"p99_us\": " << json_number(r.p99)
      << ", \"p999_us\": " << json_number(r.p999) << ", \"mean_us\": " << json_number(r.mean)
      << ", \"max_us\": " << json_number(r.max) << ", \"max_issue_lag_us\": " << json_number(r.max_issue_lag)
      << ", \"saturated\": " << (r.saturated ? "true" : "false") << ", \"attempt\": " << r.attempt;
    if (!r.error.empty()) o << ", \"error\": " << json_string(r.error);
    o << "}";
    first = false;
  }
  return finish_results_file(o.str(), path);
}

// Starts `replicas` processes per backend and the frontend of `system`
// (each this binary in a serve role); empty on success, else why not.
// With several replicas each backend is a list of addresses, which the
// frontend balances round_robin (slotrpc list://, gRPC ipv4: targets).
std::string start_topology(const std::string& system, int replicas, std::vector<bench::ChildProcess>& procs,
                           uint16_t& frontend_port) {
  const char* roles[3] = {"timeline", "posts", "media"};
  procs = std::vector<bench::ChildProcess>(3 * replicas + 1);
  std::string backends;
  for (int k = 0; k < 3; ++k) {
    backends += k ? ";" : "";
    for (int r = 0; r < replicas; ++r) {
      bench::ChildProcess& p = procs[k * replicas + r];
      if (auto err = p.start({"--serve", roles[k], "--system", system}); !err.empty()) {
        return std::string(roles[k]) + ": " + err;
      }
      backends += (r ? "," : "") + std::string("127.0.0.1:") + std::to_string(p.port());
    }
  }
  bench::ChildProcess& front = procs.back();
  if (auto err = front.start({"--serve", "frontend", "--system", system, "--backends", backends}); !err.empty()) {
    return "frontend: " + err;
  }
  frontend_port = front.port();
  return {};
}

}  // namespace
}  // namespace bench::fanout

int main(int argc, char** argv) {
  using namespace bench::fanout;
  std::vector<std::string> systems = {"tcp", "shm", "grpc"};
  std::vector<double> rates = {1000, 2000, 5000, 10000, 20000, 40000, 80000};
  double seconds = 2, warmup = 0.5;
  uint64_t deadline_ms = 1000;
  bool all_rates = false;
  int replicas = 1;
  int confirm = 0;
  std::string json, serve, system, port_file;
  std::vector<std::string> backends;
  CLI::App app("slotrpc-fanout: a frontend fanning out to three backend services, slotrpc beside gRPC, open loop",
               "slotrpc-fanout");
  app.add_option("--systems", systems, "tcp, shm (slotrpc over that transport), grpc")
      ->delimiter(',')
      ->check(CLI::IsMember({"tcp", "shm", "grpc"}));
  app.add_option("--rates", rates, "offered loads, requests/s, rising; stops after the first saturated one")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  app.add_option("--seconds", seconds, "seconds per rate")->check(CLI::Range(0.01, 3600.0));
  app.add_option("--warmup", warmup, "seconds at the first rate before counting (0: none)")->check(CLI::Range(0.0, 600.0));
  app.add_option("--deadline-ms", deadline_ms, "each request's deadline")->check(CLI::Range(1, 600000));
  app.add_flag("--all-rates", all_rates,
               "run every rate even after a saturated step (for checks of the output, not of speed)");
  app.add_option("--confirm", confirm,
                 "run a saturated step up to this many times more before stopping (0: stop at once)")
      ->check(CLI::Range(0, 10));
  app.add_option("--replicas", replicas,
                 "processes per backend service; more than 1: the frontend balances them round_robin")
      ->check(CLI::Range(1, 16));
  app.add_option("--json", json, "write the results here");
  app.add_option("--serve", serve, "(internal) serve this role: timeline, posts, media, frontend")->group("");
  app.add_option("--system", system, "(internal) the serving system")->group("");
  app.add_option("--backends", backends, "(internal) the frontend's backends, ';' between services, ',' between replicas")
      ->delimiter(';')
      ->group("");
  app.add_option("--port-file", port_file, "(internal) where --serve writes its port")->group("");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  if (!serve.empty()) {
    bench::block_termination_signals();  // before any thread starts
    if (serve == "frontend" && backends.size() != 3) {
      std::fprintf(stderr, "slotrpc-fanout: the frontend needs three --backends\n");
      return 2;
    }
    return system == "grpc" ? serve_grpc(serve, backends, port_file) : serve_slotrpc(serve, backends, port_file);
  }

  ::prctl(PR_SET_TIMERSLACK, 1000UL);  // ns: the loader's sleeps end on time (default slack: 50 us)
  std::printf("machine: %s\n", bench::machine_line().c_str());
  std::printf("%-12s %9s %10s %9s %9s %9s %9s %7s %7s\n", "system", "offered/s", "achieved/s", "p50 us", "p90 us",
              "p99 us", "p99.9 us", "failed", "lost");
  std::vector<Row> rows;
  int rc = 0;
  for (const std::string& sys : systems) {
    std::string name = sys == "grpc" ? "grpc" : "slotrpc-" + sys;
    if (replicas > 1) name += "-x" + std::to_string(replicas);
    if (sys == "grpc" && !grpc_available()) {
      std::printf("%-12s skipped: this build has no gRPC (Debian: libgrpc++-dev libprotobuf-dev)\n", name.c_str());
      continue;
    }
    // slotrpc: every process of this topology, this one included, on `sys`.
    if (sys != "grpc") ::setenv("SLOTRPC_TRANSPORT", sys.c_str(), 1);
    std::vector<bench::ChildProcess> procs;
    uint16_t port = 0;
    std::string error;
    std::unique_ptr<LoadTarget> target;
    if (error = start_topology(sys, replicas, procs, port); error.empty()) {
      const std::string address = "127.0.0.1:" + std::to_string(port);
      target = sys == "grpc" ? grpc_target(address, error) : slotrpc_target(address, sys, error);
    }
    if (target == nullptr) {
      std::fprintf(stderr, "slotrpc-fanout: %s: %s\n", name.c_str(), error.c_str());
      rc = 1;
      continue;
    }
    const auto deadline = std::chrono::milliseconds(deadline_ms);
    if (warmup > 0) run_step(*target, name, rates.front(), warmup, deadline);
    for (double rate : rates) {
      rows.push_back(run_step(*target, name, rate, seconds, deadline));
      print_row(rows.back());
      for (int again = 1; again <= confirm && rows.back().saturated; ++again) {
        rows.push_back(run_step(*target, name, rate, seconds, deadline));
        rows.back().attempt = again + 1;
        print_row(rows.back());
      }
      if (rows.back().saturated && !all_rates) break;
    }
    target.reset();  // before the servers go: its calls are all over by now
  }
  if (!json.empty() && !write_json(json, rows, seconds, deadline_ms)) {
    std::fprintf(stderr, "slotrpc-fanout: cannot write %s\n", json.c_str());
    rc = 1;
  }
  return rc;
}
