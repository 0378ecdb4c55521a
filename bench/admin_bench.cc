// admin_bench: what other clients' calls cost a bystander's echo rate, with
// the load as slotrpc.Admin/Metrics calls and as echo calls.
//
//   admin_bench [--seconds 2] [--sessions 2] [--inflight 64] [--outstanding 32]
//
// A server process (this binary, forked before any thread starts) serves
// echo on one loop.  The bystander: one channel on a runtime of its own,
// `outstanding` 64-byte echo calls in flight, each reply re-issuing.  The
// load: `sessions` channels on another runtime, each keeping `inflight`
// calls in flight, either Admin/Metrics or echo.  Prints the bystander's
// calls/s with no load, with echo load and with Admin load, and the load's
// own calls/s.
#include <CLI/CLI.hpp>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <slotrpc/slotrpc.h>

namespace {

using Clock = std::chrono::steady_clock;
const uint32_t kEcho = slotrpc::method_id("slotrpc.bench.Echo.Echo");
const uint32_t kAdmin = slotrpc::method_id("slotrpc.Admin.Metrics");

// The child: serves until its stdin (the parent's pipe) closes.
[[noreturn]] void serve(int port_fd, int quit_fd) {
  slotrpc::Server server;
  slotrpc::ServiceDefinition svc("slotrpc.bench.Echo");
  svc.add_method("Echo", [](slotrpc::ServerCall& call) {
    const auto req = call.request();
    call.reply().PushFlatBuffer(reinterpret_cast<const uint8_t*>(req.data()), req.size());
    return slotrpc::Status();
  });
  if (!server.add_service(std::move(svc)).ok() || !server.start("127.0.0.1:0").ok()) _exit(1);
  const uint16_t port = server.port();
  if (::write(port_fd, &port, sizeof port) != sizeof port) _exit(1);
  char c;
  while (::read(quit_fd, &c, 1) > 0) {
  }
  server.stop();
  _exit(0);
}

// Keeps `inflight` calls of `method` in flight on `ch` until `stop`;
// counts the replies.
struct Load {
  Load(slotrpc::Channel& c, uint32_t m, std::atomic<bool>& s) : ch(c), method(m), stop(s) {}
  slotrpc::Channel& ch;
  uint32_t method;
  std::atomic<bool>& stop;
  std::atomic<uint64_t> done{0}, failed{0}, live{0};
  std::vector<uint8_t> payload = std::vector<uint8_t>(64, 0x5a);

  void issue() {
    if (stop.load(std::memory_order_relaxed)) return;
    ++live;
    slotrpc::raw::call(ch,
        method,
        [this](flatbuffers::FlatBufferBuilder& fbb) {
          if (method == kAdmin) {
            fbb.Finish(flatbuffers::Offset<void>(fbb.EndTable(fbb.StartTable())));  // an empty table
          } else {
            fbb.PushFlatBuffer(payload.data(), payload.size());
          }
        },
        {},
        [this](slotrpc::RawReply&& r) {
          if (r.ok()) ++done;
          else ++failed;
          r.release();
          --live;
          issue();
        });
  }
};

struct Point {
  double bystander = 0, load = 0;
  uint64_t load_failed = 0;
};

Point measure(const std::string& address, const slotrpc::Runtime& by_rt, const slotrpc::Runtime& load_rt,
              uint32_t load_method, int sessions, int inflight, int outstanding, double seconds) {
  std::atomic<bool> stop{false};
  std::vector<std::unique_ptr<slotrpc::Channel>> load_channels;
  std::vector<std::unique_ptr<Load>> loads;
  for (int s = 0; s < sessions && load_method != 0; ++s) {
    load_channels.push_back(slotrpc::Channel::connect(address, load_rt).value());
    loads.push_back(std::make_unique<Load>(*load_channels.back(), load_method, stop));
  }
  auto by_ch = slotrpc::Channel::connect(address, by_rt).value();
  Load by(*by_ch, kEcho, stop);
  for (auto& l : loads)
    for (int i = 0; i < inflight; ++i) l->issue();
  for (int i = 0; i < outstanding; ++i) by.issue();
  // Warm up, then count over the window.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const uint64_t by0 = by.done.load();
  uint64_t load0 = 0;
  for (auto& l : loads) load0 += l->done.load();
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  Point p;
  p.bystander = static_cast<double>(by.done.load() - by0) / secs;
  uint64_t load1 = 0;
  for (auto& l : loads) {
    load1 += l->done.load();
    p.load_failed += l->failed.load();
  }
  p.load = static_cast<double>(load1 - load0) / secs;
  stop = true;
  // Drain: every callback has run before its Load goes.
  auto drained = [&] {
    if (by.live.load() != 0) return false;
    for (auto& l : loads)
      if (l->live.load() != 0) return false;
    return true;
  };
  while (!drained()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 2;
  int sessions = 2, inflight = 64, outstanding = 32;
  CLI::App app("A bystander's echo rate under Admin/Metrics load and under echo load.", "admin_bench");
  app.add_option("--seconds", seconds, "Measuring window per point")->capture_default_str();
  app.add_option("--sessions", sessions, "Load channels")->capture_default_str();
  app.add_option("--inflight", inflight, "Calls in flight per load channel")->capture_default_str();
  app.add_option("--outstanding", outstanding, "The bystander's echo calls in flight")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  int port_pipe[2], quit_pipe[2];
  if (::pipe(port_pipe) != 0 || ::pipe(quit_pipe) != 0) return 1;
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(port_pipe[0]);
    ::close(quit_pipe[1]);
    serve(port_pipe[1], quit_pipe[0]);
  }
  ::close(port_pipe[1]);
  ::close(quit_pipe[0]);
  uint16_t port = 0;
  if (::read(port_pipe[0], &port, sizeof port) != sizeof port) return std::fprintf(stderr, "server did not start\n"), 1;
  const std::string address = "127.0.0.1:" + std::to_string(port);

  slotrpc::Runtime by_rt, load_rt;
  std::printf("bystander: %d echo calls in flight; load: %d sessions x %d calls in flight; %.1f s per point\n",
              outstanding, sessions, inflight, seconds);
  std::printf("%-8s %16s %14s %12s\n", "load", "bystander_calls_s", "load_calls_s", "load_failed");
  const struct {
    const char* name;
    uint32_t method;
  } points[] = {{"none", 0}, {"echo", kEcho}, {"admin", kAdmin}};
  for (const auto& pt : points) {
    const Point p = measure(address, by_rt, load_rt, pt.method, sessions, inflight, outstanding, seconds);
    std::printf("%-8s %16.0f %14.0f %12llu\n", pt.name, p.bystander, p.load,
                static_cast<unsigned long long>(p.load_failed));
  }
  ::close(quit_pipe[1]);
  int status = 0;
  ::waitpid(child, &status, 0);
  return 0;
}
