// Shared event loops (include/slotrpc/runtime.h) over verbs: a runtime of 2
// loops carrying 16 channels to 4 servers, all over verbs.
//
//   * every call's reply is checked;
//   * the device holds exactly one completion queue per loop for this
//     process (`rdma resource show cq`, filtered by our pid): the sessions of
//     every server and channel on a loop share its CQ.  A channel with loops
//     of its own (the model before runtimes) would add a CQ per channel;
//   * and 32 queue pairs (16 client + 16 server sessions): the sessions
//     really are verbs sessions;
//   * the loops' monitors call every server's and channel's sample hook
//     (rpc::add_monitor_hook's fan-out) at every tick: each server's
//     from both loops.  (The fan-out once dropped every holder after its
//     first sample: a hook saw one sample at most.)
//   * a server's sample callback never runs after ~Server returned, even
//     when a tick is calling it at that moment.  (It once did, and this test
//     hung under ASan: its callbacks' state was declared after the servers,
//     so it was freed first, a tick then locked a freed mutex whose first
//     bytes ASan's allocator had overwritten, and the loop waited on it
//     forever, holding ~Runtime's join.)
//
// A watchdog turns a hang into a failure that names the phase and prints
// every thread's stack (gdb, when installed).
//
// Needs an RDMA device: run by the `rxe` suite (this host's device, else the
// Soft-RoCE VM; see tests/rxe/README.md).  Inside the VM `rdma` (iproute2,
// from the host root) must work; elsewhere a missing tool fails the test too:
// the CQ count is what it is for.
#include "verbs_test_util.h"

#include <slotrpc/slotrpc.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "test_messages_generated.h"

namespace {

using namespace std::chrono_literals;
using slotrpc::Channel;
using slotrpc::Config;
using slotrpc::Future;
using slotrpc::Reply;
using slotrpc::RequestWriter;
using slotrpc::Runtime;
using slotrpc::Server;
using slotrpc::ServerCall;
using slotrpc::ServiceDefinition;
using slotrpc::Status;
using slotrpc::TransportKind;
using slotrpc::test::Ping;
using slotrpc::test::Pong;

constexpr uint32_t kEcho = slotrpc::method_id("slotrpc.test.VerbsRt.Echo");
constexpr int kServers = 4;
constexpr int kChannels = 16;
constexpr int kCallsPerChannel = 64;
constexpr int kOutstanding = 8;

uint8_t pattern(uint64_t seq, size_t i) { return static_cast<uint8_t>((seq * 131 + i * 7 + 3) & 0xff); }

RequestWriter ping(uint64_t seq, size_t n) {
  return [seq, n](flatbuffers::FlatBufferBuilder& fbb) {
    uint8_t* bytes = nullptr;
    auto p = fbb.CreateUninitializedVector(n, &bytes);
    for (size_t i = 0; i < n; ++i) bytes[i] = pattern(seq, i);
    fbb.Finish(slotrpc::test::CreatePing(fbb, seq, 0, p));
  };
}

// Echo: the payload back, and the server's number in the text.
ServiceDefinition make_service(int server) {
  ServiceDefinition svc("slotrpc.test.VerbsRt");
  svc.add_typed_unary<Ping, Pong>("Echo", [server](const Ping& req, slotrpc::ReplyBuilder<Pong>& out, ServerCall&) {
    auto& fbb = out.fbb();
    const auto* p = req.payload();
    auto text = fbb.CreateString("s" + std::to_string(server));
    auto payload = fbb.CreateVector(p ? p->data() : nullptr, p ? p->size() : 0);
    out.Finish(slotrpc::test::CreatePong(fbb, req.seq(), text, payload));
    return Status();
  });
  return svc;
}

std::string pong_error(const Reply<Pong>& r, uint64_t seq, size_t n, int server) {
  if (!r.ok()) return "status " + r.status().to_string();
  if (r->seq() != seq) return "seq " + std::to_string(r->seq()) + ", expected " + std::to_string(seq);
  const std::string want = "s" + std::to_string(server);
  if (r->text() == nullptr || r->text()->str() != want) return "reply from the wrong server";
  const auto* p = r->payload();
  if (p == nullptr || p->size() != n) return "payload size differs";
  for (size_t i = 0; i < n; ++i)
    if (p->Get(static_cast<flatbuffers::uoffset_t>(i)) != pattern(seq, i)) return "payload differs";
  return "";
}

// This process's objects of one kind on the device, from `rdma resource show
// KIND` (iproute2): the lines whose "pid" is one of our threads (the kernel
// reports the thread that created the object: a loop's, e.g. "pid 210 comm
// slotrpc-loop0").  -1 if the tool failed or printed nothing at all.
long own_rdma_objects(const std::string& kind, const std::string& device, std::string* text_out = nullptr) {
  FILE* p = ::popen(("rdma resource show " + kind + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  std::string text;
  char line[1024];
  while (std::fgets(line, sizeof line, p) != nullptr) text += line;
  const int rc = ::pclose(p);
  if (text_out) *text_out = text;
  if (rc != 0 || text.empty()) return -1;
  long n = 0;
  std::istringstream lines(text);
  std::string l;
  while (std::getline(lines, l)) {
    std::istringstream words(l);
    std::string w, prev;
    bool ours = false, on_device = false;
    while (words >> w) {
      if (prev == "pid" && std::filesystem::exists("/proc/self/task/" + w)) ours = true;
      if ((prev == "dev" && w == device) || (prev == "link" && w.rfind(device + "/", 0) == 0)) on_device = true;
      prev = w;
    }
    if (ours && on_device) ++n;
  }
  return n;
}

struct HookProbe {
  std::mutex mu;
  std::set<std::thread::id> threads;  // the loops that called it
  int calls = 0;
  std::function<void(const slotrpc::MetricsSnapshot&)> fn() {
    return [this](const slotrpc::MetricsSnapshot&) {
      std::lock_guard<std::mutex> lock(mu);
      ++calls;
      threads.insert(std::this_thread::get_id());
    };
  }
  size_t loops() {
    std::lock_guard<std::mutex> lock(mu);
    return threads.size();
  }
  int count() {
    std::lock_guard<std::mutex> lock(mu);
    return calls;
  }
};

// Fails the test, with every thread's stack, when it is not done within
// `limit`: a hang would otherwise hold the rxe suite for its whole timeout
// and say nothing about where.  Declared first, so that it also covers the
// teardown (channels, servers, the runtime's loops).
class Watchdog {
 public:
  explicit Watchdog(std::chrono::seconds limit) : thread_([this, limit] { run(limit); }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void phase(const char* what) { phase_.store(what); }

 private:
  void run(std::chrono::seconds limit) {
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_for(lock, limit, [this] { return done_; })) return;
    std::fprintf(stderr, "verbs_runtime_test: WATCHDOG: still in phase \"%s\" after %lld s; every thread's stack:\n",
                 phase_.load(), static_cast<long long>(limit.count()));
    ::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);  // Yama: let gdb attach to us
    const std::string cmd = "gdb -batch -nx -p " + std::to_string(::getpid()) +
                            " -ex 'set pagination off' -ex 'thread apply all bt' 1>&2";
    if (std::system(cmd.c_str()) != 0) std::fprintf(stderr, "verbs_runtime_test: (gdb failed or is missing: no stacks)\n");
    std::fprintf(stderr, "verbs_runtime_test: WATCHDOG: giving up in phase \"%s\"\n", phase_.load());
    std::fflush(stderr);
    std::abort();
  }
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::atomic<const char*> phase_{"start"};
  std::thread thread_;
};

}  // namespace

TEST_CASE("verbs: 16 channels to 4 servers on a runtime of 2 loops share 2 completion queues") {
  // Under ASan inside the emulated VM a run takes about 40 s.
  Watchdog watchdog(std::chrono::seconds(300));
  auto dev = verbs_test::usable_device();
  REQUIRE(dev.ok());
  // The callbacks' state outlives everything that calls it: the servers and
  // channels, and the runtime whose loops run the ticks.
  std::vector<std::unique_ptr<HookProbe>> server_hooks;
  std::vector<std::unique_ptr<HookProbe>> channel_hooks;
  Config cfg;
  cfg.reactor_threads = 2;
  cfg.transport = TransportKind::kVerbs;
  cfg.slot_count = 16;
  cfg.slot_size = 4096;
  cfg.monitor_interval_ms = 100;
  Runtime rt(cfg);
  REQUIRE(rt.loop_count() == 2);

  watchdog.phase("servers start");
  std::vector<std::unique_ptr<Server>> servers;
  for (int s = 0; s < kServers; ++s) {
    servers.push_back(std::make_unique<Server>(rt, cfg));
    REQUIRE(servers.back()->add_service(make_service(s)).ok());
    server_hooks.push_back(std::make_unique<HookProbe>());
    servers.back()->on_monitor_sample(server_hooks.back()->fn());
    const Status st = servers.back()->start("127.0.0.1:0");
    REQUIRE_MESSAGE(st.ok(), st.to_string());
  }
  watchdog.phase("channels connect");
  std::vector<std::unique_ptr<Channel>> channels;
  for (int c = 0; c < kChannels; ++c) {
    const std::string addr = "127.0.0.1:" + std::to_string(servers[c % kServers]->port());
    auto ch = Channel::connect(addr, rt, cfg);
    REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
    REQUIRE(ch.value()->transport() == TransportKind::kVerbs);
    channel_hooks.push_back(std::make_unique<HookProbe>());
    ch.value()->on_monitor_sample(channel_hooks.back()->fn());
    channels.push_back(std::move(ch).value());
  }

  // Every channel keeps kOutstanding calls going at once, all channels at
  // the same time; payloads 0..2999 bytes (inline and not).
  watchdog.phase("calls");
  int bad = 0;
  std::vector<std::vector<Future<Reply<Pong>>>> inflight(kChannels);
  for (int round = 0; round < kCallsPerChannel / kOutstanding; ++round) {
    for (int c = 0; c < kChannels; ++c) {
      for (int k = 0; k < kOutstanding; ++k) {
        const uint64_t seq = (static_cast<uint64_t>(c) << 32) | static_cast<uint64_t>(round * kOutstanding + k);
        inflight[c].push_back(channels[c]->call_typed<Pong>(kEcho, ping(seq, (seq * 37) % 3000)));
      }
    }
    for (int c = 0; c < kChannels; ++c) {
      for (int k = 0; k < kOutstanding; ++k) {
        auto& f = inflight[c][k];
        const uint64_t seq = (static_cast<uint64_t>(c) << 32) | static_cast<uint64_t>(round * kOutstanding + k);
        REQUIRE_MESSAGE(f.wait_for(20s), "channel " << c << " call " << seq << " did not complete");
        const std::string err = pong_error(f.get(), seq, (seq * 37) % 3000, c % kServers);
        if (!err.empty() && bad++ < 3) FAIL_CHECK("channel " << c << ": " << err);
      }
      inflight[c].clear();
    }
  }
  CHECK(bad == 0);

  watchdog.phase("rdma resource show");
  // The device's objects of this process: one CQ per loop, a QP per session.
  std::string cq_text;
  const long cqs = own_rdma_objects("cq", dev.value(), &cq_text);
  std::string qp_text;
  const long qps = own_rdma_objects("qp", dev.value(), &qp_text);
  REQUIRE_MESSAGE(cqs >= 0, "`rdma resource show cq` did not work: " << cq_text);
  MESSAGE("this process on " << dev.value() << ": " << cqs << " completion queues, " << qps << " queue pairs ("
                             << kChannels << " channels, " << kServers << " servers, " << rt.loop_count()
                             << " loops)");
  CHECK_MESSAGE(cqs == static_cast<long>(rt.loop_count()), "rdma resource show cq:\n" << cq_text);
  CHECK_MESSAGE(qps == 2 * kChannels, "rdma resource show qp:\n" << qp_text);

  // Every server's hook from both loops, every channel's from its loop, and
  // each of them again and again (not once: a holder must stay in its
  // loop's list after its first sample).
  watchdog.phase("monitor samples");
  constexpr int kSamples = 3;
  const bool sampled = verbs_test::wait_until(
      [&] {
        for (auto& h : server_hooks)
          if (h->loops() < rt.loop_count() || h->count() < kSamples) return false;
        for (auto& h : channel_hooks)
          if (h->count() < kSamples) return false;
        return true;
      },
      20000ms);
  std::string counts;
  for (auto& h : server_hooks) counts += std::to_string(h->count()) + " ";
  counts += "| channels: ";
  for (auto& h : channel_hooks) counts += std::to_string(h->count()) + " ";
  CHECK_MESSAGE(sampled, "monitor samples per hook, servers then " << counts);
  for (size_t i = 0; i < server_hooks.size(); ++i) {
    CAPTURE(i);
    CHECK(server_hooks[i]->loops() == rt.loop_count());
  }
  for (size_t i = 0; i < channel_hooks.size(); ++i) {
    CAPTURE(i);
    CHECK(channel_hooks[i]->loops() == 1);
  }

  watchdog.phase("channels close");
  channels.clear();
  watchdog.phase("servers stop");
  for (auto& s : servers) s->stop();

  // A stopped server's callback is still called (its hook stays on the
  // loops while the server exists), until ~Server: which must wait for a
  // call in progress.  Catch a tick in the callback, hold it there, and
  // destroy the server meanwhile.
  watchdog.phase("server destroyed during its callback");
  std::atomic<bool> entered{false}, destroyed{false}, saw_destroyed{false}, left{false};
  servers[0]->on_monitor_sample([&](const slotrpc::MetricsSnapshot&) {
    if (entered.exchange(true)) return;  // the first call only (both loops call it)
    // Long enough for ~Server to return, if it does not wait for us.
    verbs_test::wait_until([&] { return destroyed.load(); }, 1000ms);
    saw_destroyed = destroyed.load();
    left = true;
  });
  REQUIRE(verbs_test::wait_until([&] { return entered.load(); }, 20000ms));
  servers[0].reset();
  destroyed = true;
  REQUIRE(verbs_test::wait_until([&] { return left.load(); }, 20000ms));
  CHECK_MESSAGE(!saw_destroyed, "a server's sample callback ran on after ~Server returned");
  watchdog.phase("teardown");
}

int main(int argc, char** argv) { return verbs_test::main(argc, argv); }
