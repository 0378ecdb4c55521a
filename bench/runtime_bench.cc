// runtime_bench: what sharing event loops (slotrpc::Runtime) does
// to many channels and to nested calls.  Figures, never a test.
//
//   runtime_bench alltoall [--procs 8] [--outstanding 8] [--size 64] [--seconds 3] [--mode before|after|both]
//   runtime_bench nested [--calls 20000] [--size 64] [--mode before|after|both]
//
// alltoall: forks --procs processes; each runs a server and calls every
// other process's server with --outstanding calls of --size bytes in flight
// per peer, for --seconds.  Prints the total completed calls/s of all
// processes and p50/p99 over every call.
//   before = the model before runtimes: each Channel on loops of its own (a
//            private Runtime per channel), the server on its own loop;
//   after  = one Runtime of 1 loop per process carrying its server and all
//            its channels.
// nested: one process; a client (own runtime) calls a front server whose
// handler calls a backend server and answers with its reply; 1 call
// outstanding.  Front and backend servers share a runtime of 1 loop;
//   before = the handler's channel to the backend on a separate runtime
//            (its calls cross threads twice);
//   after  = that channel on the same runtime (the handler's loop).
//
// Raw byte payloads (no FlatBuffers work), TCP over loopback
// (SLOTRPC_* settings apply, e.g. SLOTRPC_POLL_MODE).
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <slotrpc/slotrpc.h>

namespace {

using Clock = std::chrono::steady_clock;
const uint32_t kEcho = slotrpc::method_id("slotrpc.bench.Rt.Echo");
const uint32_t kRelay = slotrpc::method_id("slotrpc.bench.Front.Relay");
static_assert(std::is_trivially_copyable_v<slotrpc::Histogram>, "sent through a pipe");

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "runtime_bench: %s\n", what.c_str());
  std::_Exit(1);
}

void write_all(int fd, const void* p, size_t n) {
  auto* b = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, b, n);
    if (w <= 0) die(std::string("write: ") + std::strerror(errno));
    b += w;
    n -= static_cast<size_t>(w);
  }
}

void read_all(int fd, void* p, size_t n) {
  auto* b = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::read(fd, b, n);
    if (r <= 0) die(r == 0 ? "a peer process died" : std::string("read: ") + std::strerror(errno));
    b += r;
    n -= static_cast<size_t>(r);
  }
}

slotrpc::ServiceDefinition echo_service() {
  slotrpc::ServiceDefinition svc("slotrpc.bench.Rt");
  svc.add_method("Echo", [](slotrpc::ServerCall& call) {
    const auto req = call.request();
    call.reply().PushFlatBuffer(reinterpret_cast<const uint8_t*>(req.data()), req.size());
    return slotrpc::Status();
  });
  return svc;
}

std::string cpu_line() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model = "unknown CPU";
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  }
  std::ifstream la("/proc/loadavg");
  std::string l1, l5, l15;
  la >> l1 >> l5 >> l15;
  return model + ", " + std::to_string(std::thread::hardware_concurrency()) + " hardware threads, load average " +
         l1 + " " + l5 + " " + l15;
}

// ------------------------------------------------------------- alltoall

struct Load {
  int outstanding;
  size_t size;
  double seconds;
};

// What a child reports.
struct ChildResult {
  uint64_t calls = 0;  // completed within the measured interval
  uint64_t failed = 0;
  slotrpc::Histogram lat;  // ns
};

// One channel's calls: `outstanding` chains, each issuing its next call
// from the previous one's reply callback (on the channel's loop) until the
// deadline.  Everything it touches is used by that loop only.
struct Driver {
  slotrpc::Channel* ch = nullptr;
  std::vector<uint8_t> payload;
  Clock::time_point deadline;
  std::atomic<int> live{0};
  uint64_t calls = 0, failed = 0;
  slotrpc::Histogram lat;

  void issue() {
    const auto start = Clock::now();
    if (start >= deadline) {
      live.fetch_sub(1);
      return;
    }
    slotrpc::raw::call(*ch,
        kEcho, [this](flatbuffers::FlatBufferBuilder& fbb) { fbb.PushFlatBuffer(payload.data(), payload.size()); },
        {},
        [this, start](slotrpc::RawReply&& r) {
          const auto now = Clock::now();
          if (!r.ok() || r.size() != payload.size()) {
            ++failed;
          } else if (now <= deadline) {
            ++calls;
            lat.record(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(now - start).count()));
          }
          r.release();
          issue();
        });
  }
};

int alltoall_child(int index, int procs, bool shared, const Load& load, int to_parent, int from_parent) {
  slotrpc::Config cfg;
  cfg.transport = slotrpc::TransportKind::kTcp;
  cfg.reactor_threads = 1;
  cfg.log_level = "warn";  // not a line per session (SLOTRPC_LOG_LEVEL still wins)
  // after: one runtime for everything; before: the server's own, and one per channel.
  slotrpc::Runtime server_rt(cfg);
  slotrpc::Server server(server_rt, cfg);
  if (auto st = server.add_service(echo_service()); !st.ok()) die(st.to_string());
  if (auto st = server.start("127.0.0.1:0"); !st.ok()) die(st.to_string());
  const uint16_t port = server.port();
  write_all(to_parent, &port, sizeof port);
  std::vector<uint16_t> ports(static_cast<size_t>(procs));
  read_all(from_parent, ports.data(), ports.size() * sizeof(uint16_t));

  std::vector<std::unique_ptr<slotrpc::Channel>> channels;
  for (int p = 0; p < procs; ++p) {
    if (p == index) continue;
    const std::string addr = "127.0.0.1:" + std::to_string(ports[static_cast<size_t>(p)]);
    auto ch = shared ? slotrpc::Channel::connect(addr, server_rt, cfg)
                     : slotrpc::Channel::connect(addr, slotrpc::Runtime(cfg), cfg);
    if (!ch.ok()) die("connect " + addr + ": " + ch.status().to_string());
    channels.push_back(std::move(ch).value());
  }
  std::vector<std::unique_ptr<Driver>> drivers;
  for (auto& ch : channels) {
    auto d = std::make_unique<Driver>();
    d->ch = ch.get();
    d->payload.assign(load.size, 0x5a);
    drivers.push_back(std::move(d));
  }
  char c = 'R';
  write_all(to_parent, &c, 1);
  read_all(from_parent, &c, 1);  // 'G': everyone is connected
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(load.seconds));
  for (auto& d : drivers) {
    d->deadline = deadline;
    d->live.store(load.outstanding);
    for (int k = 0; k < load.outstanding; ++k) d->issue();
  }
  for (auto& d : drivers) {
    while (d->live.load() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ChildResult res;
  for (auto& d : drivers) {
    res.calls += d->calls;
    res.failed += d->failed;
    res.lat.merge(d->lat);
  }
  write_all(to_parent, &res, sizeof res);
  read_all(from_parent, &c, 1);  // 'X': every process is done calling
  channels.clear();
  server.stop();
  return 0;
}

int run_alltoall(int procs, bool shared, const Load& load) {
  struct Kid {
    pid_t pid;
    int to_kid, from_kid;
  };
  std::vector<Kid> kids;
  std::fflush(nullptr);
  for (int i = 0; i < procs; ++i) {
    int down[2], up[2];
    if (::pipe(down) != 0 || ::pipe(up) != 0) die("pipe");
    const pid_t pid = ::fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
      for (auto& k : kids) {
        ::close(k.to_kid);
        ::close(k.from_kid);
      }
      ::close(down[1]);
      ::close(up[0]);
      std::_Exit(alltoall_child(i, procs, shared, load, up[1], down[0]));
    }
    ::close(down[0]);
    ::close(up[1]);
    kids.push_back({pid, down[1], up[0]});
  }
  std::vector<uint16_t> ports;
  for (auto& k : kids) {
    uint16_t p = 0;
    read_all(k.from_kid, &p, sizeof p);
    ports.push_back(p);
  }
  for (auto& k : kids) write_all(k.to_kid, ports.data(), ports.size() * sizeof(uint16_t));
  char c = 0;
  for (auto& k : kids) read_all(k.from_kid, &c, 1);
  for (auto& k : kids) write_all(k.to_kid, "G", 1);
  uint64_t calls = 0, failed = 0;
  slotrpc::Histogram lat;
  for (auto& k : kids) {
    ChildResult r;
    read_all(k.from_kid, &r, sizeof r);
    calls += r.calls;
    failed += r.failed;
    lat.merge(r.lat);
  }
  for (auto& k : kids) write_all(k.to_kid, "X", 1);
  int rc = 0;
  for (auto& k : kids) {
    int status = 0;
    ::waitpid(k.pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
    ::close(k.to_kid);
    ::close(k.from_kid);
  }
  std::printf("alltoall %-6s procs %d x %d peers x %d outstanding, %zu B: %10.0f calls/s  p50 %8.1f us  p99 %8.1f us"
              "  (%llu calls, %llu failed)\n",
              shared ? "after" : "before", procs, procs - 1, load.outstanding, load.size,
              static_cast<double>(calls) / load.seconds, lat.quantile(0.50) / 1000.0, lat.quantile(0.99) / 1000.0,
              static_cast<unsigned long long>(calls), static_cast<unsigned long long>(failed));
  std::fflush(stdout);
  return rc != 0 || failed != 0 ? 1 : 0;
}

// --------------------------------------------------------------- nested

int run_nested(bool same_runtime, uint64_t calls, size_t size) {
  slotrpc::Config cfg;
  cfg.transport = slotrpc::TransportKind::kTcp;
  cfg.reactor_threads = 1;
  cfg.log_level = "warn";  // not a line per session (SLOTRPC_LOG_LEVEL still wins)
  slotrpc::Runtime rt(cfg);          // front and backend servers
  slotrpc::Runtime nested_rt(cfg);   // before: the handler's channel
  slotrpc::Runtime client_rt(cfg);   // the outside client, both ways
  slotrpc::Server backend(rt, cfg);
  if (auto st = backend.add_service(echo_service()); !st.ok()) die(st.to_string());
  if (auto st = backend.start("127.0.0.1:0"); !st.ok()) die(st.to_string());
  const std::string backend_addr = "127.0.0.1:" + std::to_string(backend.port());
  // With 1 loop, a channel made here on `rt` is on the handler's loop.
  auto to_backend = slotrpc::Channel::connect(backend_addr, same_runtime ? rt : nested_rt, cfg);
  if (!to_backend.ok()) die(to_backend.status().to_string());
  slotrpc::Channel* inner = to_backend.value().get();

  slotrpc::Server front(rt, cfg);
  slotrpc::ServiceDefinition svc("slotrpc.bench.Front");
  svc.add_method("Relay", [inner](slotrpc::ServerCall& call) {
    const auto req = call.request();
    auto r = slotrpc::raw::call(*inner, kEcho, [&req](flatbuffers::FlatBufferBuilder& fbb) {
                   fbb.PushFlatBuffer(reinterpret_cast<const uint8_t*>(req.data()), req.size());
                 })
                 .get();  // the handler's fiber waits
    if (!r.ok()) return r.status();
    call.reply().PushFlatBuffer(reinterpret_cast<const uint8_t*>(r.data()), r.size());
    return slotrpc::Status();
  });
  if (auto st = front.add_service(std::move(svc)); !st.ok()) die(st.to_string());
  if (auto st = front.start("127.0.0.1:0"); !st.ok()) die(st.to_string());
  auto client = slotrpc::Channel::connect("127.0.0.1:" + std::to_string(front.port()), client_rt, cfg);
  if (!client.ok()) die(client.status().to_string());

  std::vector<uint8_t> payload(size, 0x5a);
  slotrpc::Histogram lat;
  uint64_t failed = 0;
  const uint64_t warmup = std::min<uint64_t>(1000, calls / 10);
  for (uint64_t i = 0; i < warmup + calls; ++i) {
    const auto t0 = Clock::now();
    auto r = slotrpc::raw::call(*client.value(), kRelay, [&](flatbuffers::FlatBufferBuilder& fbb) {
                   fbb.PushFlatBuffer(payload.data(), payload.size());
                 })
                 .get();
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
    if (!r.ok() || r.size() != size) ++failed;
    if (i >= warmup) lat.record(static_cast<uint64_t>(ns));
  }
  std::printf("nested %-6s (backend channel on %s runtime), %zu B, %llu calls: p50 %8.1f us  p99 %8.1f us  "
              "hand-offs %llu  (%llu failed)\n",
              same_runtime ? "after" : "before", same_runtime ? "the same" : "a separate", size,
              static_cast<unsigned long long>(calls), lat.quantile(0.50) / 1000.0, lat.quantile(0.99) / 1000.0,
              static_cast<unsigned long long>(inner->stats().cross_loop_handoffs),
              static_cast<unsigned long long>(failed));
  std::fflush(stdout);
  return failed == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"runtime_bench: shared event loops (slotrpc::Runtime) vs loops per channel"};
  app.require_subcommand(1);
  std::string mode = "both";
  int procs = 8;
  Load load{8, 64, 3.0};
  auto* a2a = app.add_subcommand("alltoall", "every process calls every other one");
  a2a->add_option("--procs", procs, "processes (each a server and a client of all the others)")
      ->check(CLI::Range(2, 64));
  a2a->add_option("--outstanding", load.outstanding, "calls in flight per peer")->check(CLI::Range(1, 1024));
  a2a->add_option("--size", load.size, "payload bytes")->check(CLI::Range(0, 4000));
  a2a->add_option("--seconds", load.seconds, "measured interval")->check(CLI::Range(0.1, 600.0));
  a2a->add_option("--mode", mode, "before, after or both")->check(CLI::IsMember({"before", "after", "both"}));
  uint64_t calls = 20000;
  size_t nsize = 64;
  auto* nested = app.add_subcommand("nested", "client -> handler -> backend -> back, 1 outstanding");
  nested->add_option("--calls", calls, "measured calls (after 10%, at most 1000, of warm-up)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{100'000'000}));
  nested->add_option("--size", nsize, "payload bytes")->check(CLI::Range(0, 4000));
  nested->add_option("--mode", mode, "before, after or both")->check(CLI::IsMember({"before", "after", "both"}));
  CLI11_PARSE(app, argc, argv);

  std::printf("machine: %s\n", cpu_line().c_str());
  std::fflush(stdout);
  int rc = 0;
  const bool before = mode != "after", after = mode != "before";
  if (a2a->parsed()) {
    if (before) rc |= run_alltoall(procs, false, load);
    if (after) rc |= run_alltoall(procs, true, load);
  } else {
    if (before) rc |= run_nested(false, calls, nsize);
    if (after) rc |= run_nested(true, calls, nsize);
  }
  return rc;
}
