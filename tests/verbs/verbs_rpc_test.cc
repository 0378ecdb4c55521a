// Server and Channel over the verbs transport: transport choice, connection
// setup and teardown, 100,000 echo calls with 32 outstanding (no RNR on the
// device), inline and non-inline sizes up to the slot size, several
// sessions, server streaming, deadlines, keepalives, blocking poll mode,
// peer death, a killed peer leaving the survivor's other sessions serving
// (either side killed), and invalid configuration.
//
// Needs an RDMA device: run by the `rxe` suite (this host's device, else the
// Soft-RoCE VM; see tests/rxe/README.md).  The binary doubles as the peer
// processes those tests kill: a server (`verbs_rpc_test --child PORT_FILE`)
// and a client calling a server until killed
// (`verbs_rpc_test --child-client ADDRESS PROGRESS_FILE`).
#include "verbs_test_util.h"

#include <signal.h>
#include <slotrpc/slotrpc.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../env_var.h"
#include "base/settings.h"
#include "../ping_payloads.h"
#include "test_messages_generated.h"

namespace {

using namespace slotrpc::test_payloads;  // ping, pong_error, echo_request, pattern

using namespace std::chrono_literals;
using slotrpc::CallOptions;
using slotrpc::Channel;
using slotrpc::Config;
using slotrpc::Future;
using slotrpc::RawReply;
using slotrpc::Reply;
using slotrpc::RequestWriter;
using slotrpc::Server;
using slotrpc::ServerCall;
using slotrpc::ServiceDefinition;
using slotrpc::Status;
using slotrpc::StatusCode;
using slotrpc::TransportKind;
using slotrpc::test::Ping;
using slotrpc::test::Pong;
using Clock = std::chrono::steady_clock;

constexpr const char* kService = "slotrpc.test.Verbs";
constexpr uint32_t kEcho = slotrpc::method_id("slotrpc.test.Verbs.Echo");
constexpr uint32_t kSlow = slotrpc::method_id("slotrpc.test.Verbs.Slow");
constexpr uint32_t kCount = slotrpc::method_id("slotrpc.test.Verbs.Count");

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

template <class T>
T get_within(Future<T>& f, std::chrono::milliseconds limit = 10000ms) {
  if (!f.wait_for(limit)) {
    f.cancel();
    FAIL("no result within " << limit.count() << " ms");
  }
  return f.get();
}

ServiceDefinition make_service() {
  ServiceDefinition svc(kService);
  svc.add_typed_unary<Ping, Pong>("Echo", [](const Ping& req, slotrpc::ReplyBuilder<Pong>& out, ServerCall&) {
    auto& fbb = out.fbb();
    const auto* p = req.payload();
    static const uint8_t kNone = 0;
    auto payload = p != nullptr ? fbb.CreateVector(p->data(), p->size()) : fbb.CreateVector(&kNone, 0);
    out.Finish(slotrpc::test::CreatePong(fbb, req.seq(), 0, payload));
    return Status();
  });
  svc.add_typed_unary<Ping, Pong>("Slow", [](const Ping& req, slotrpc::ReplyBuilder<Pong>& out, ServerCall& call) {
    const auto until = Clock::now() + std::chrono::milliseconds(req.sleep_ms());
    while (Clock::now() < until && !call.cancelled()) slotrpc::this_fiber::sleep_for(5ms);
    out.Finish(slotrpc::test::CreatePong(out.fbb(), req.seq()));
    return Status();
  });
  // Count: streams Pong{seq = i, payload = 100 pattern bytes} for i < req.seq.
  svc.add_server_stream<Ping, Pong>("Count", [](const Ping& req, slotrpc::ServerWriter<Pong>& w, ServerCall&) {
    for (uint64_t i = 0; i < req.seq(); ++i) {
      const bool ok = w.Write([i](flatbuffers::FlatBufferBuilder& fbb) {
        uint8_t* bytes = nullptr;
        auto p = fbb.CreateUninitializedVector(100, &bytes);
        for (size_t k = 0; k < 100; ++k) bytes[k] = pattern(i, k);
        return slotrpc::test::CreatePong(fbb, i, 0, p);
      });
      if (!ok) return w.error();
    }
    return Status();
  });
  return svc;
}

Config base_config() {
  Config c;
  c.slot_count = 64;
  c.slot_size = 8192;
  return c;
}

struct TestServer {
  std::unique_ptr<Server> server;
  std::string address;
  explicit TestServer(Config cfg = base_config()) : server(std::make_unique<Server>(cfg)) {
    REQUIRE(server->add_service(make_service()).ok());
    const Status st = server->start("127.0.0.1:0");
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    address = "127.0.0.1:" + std::to_string(server->port());
  }
};

std::unique_ptr<Channel> connect(const std::string& address, Config cfg = base_config()) {
  auto ch = Channel::connect(address, cfg);
  REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
  return std::move(ch).value();
}

void check_echo(Channel& ch, uint64_t seq, size_t n = 64) {
  auto f = ch.call_typed<Pong>(kEcho, ping_bytes(seq, n));
  const std::string err = pong_error(get_within(f), seq, n);
  CHECK_MESSAGE(err.empty(), err);
}

using slotrpc::test::EnvVar;

std::string device_name() {
  auto d = verbs_test::usable_device();
  REQUIRE(d.ok());
  return d.value();
}

// ------------------------------------------------------- child processes

// `verbs_rpc_test --child PORT_FILE`: a server; writes its port, serves
// until SIGTERM.
int run_child_server(int argc, char** argv) {
  if (argc < 3) return 2;
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  Server server(base_config());
  if (!server.add_service(make_service()).ok()) return 1;
  if (auto st = server.start("127.0.0.1:0"); !st.ok()) {
    std::fprintf(stderr, "child: %s\n", st.to_string().c_str());
    return 1;
  }
  const std::string file = argv[2];
  { std::ofstream(file + ".tmp") << server.port() << "\n"; }
  std::rename((file + ".tmp").c_str(), file.c_str());
  int sig = 0;
  sigwait(&signals, &sig);
  server.stop();
  return 0;
}

// `verbs_rpc_test --child-client ADDRESS PROGRESS_FILE`: a client over verbs
// that keeps 32 Echo calls outstanding (payloads 0..2999 bytes, so inline
// and non-inline) until it is killed, checks every reply, and rewrites
// PROGRESS_FILE with its count of checked replies every 20 ms. Exits 3 on
// the first failed call (its server went away, or a wrong reply).
int run_child_client(int argc, char** argv) {
  if (argc < 4) return 2;
  Config c = base_config();
  c.transport = TransportKind::kVerbs;
  auto connected = Channel::connect(argv[2], c);
  if (!connected.ok()) {
    std::fprintf(stderr, "child client: %s\n", connected.status().to_string().c_str());
    return 1;
  }
  std::unique_ptr<Channel> ch = std::move(connected).value();
  constexpr uint64_t kOutstanding = 32;
  std::atomic<uint64_t> next{0}, done{0};
  std::function<void()> issue = [&] {
    const uint64_t seq = next.fetch_add(1);
    const size_t n = static_cast<size_t>((seq * 37) % 3000);
    slotrpc::raw::call(*ch, kEcho, ping_bytes(seq, n), CallOptions{}, [&, seq, n](RawReply&& raw) {
      const std::string err = pong_error(Reply<Pong>(std::move(raw)), seq, n);
      if (!err.empty()) {
        std::fprintf(stderr, "child client: call %llu: %s\n", static_cast<unsigned long long>(seq), err.c_str());
        std::_Exit(3);
      }
      ++done;
      issue();
    });
  };
  for (uint64_t i = 0; i < kOutstanding; ++i) issue();
  const std::string file = argv[3];
  for (;;) {
    { std::ofstream(file + ".tmp") << done.load() << "\n"; }
    std::rename((file + ".tmp").c_str(), file.c_str());
    std::this_thread::sleep_for(20ms);
  }
}

int run_child(int argc, char** argv) {
  const std::string mode = argv[1];
  if (mode == "--child") return run_child_server(argc, argv);
  if (mode == "--child-client") return run_child_client(argc, argv);
  std::fprintf(stderr, "unknown child mode %s\n", mode.c_str());
  return 2;
}

// This binary run with `args` (after argv[0]) in a fresh temp dir, stdout
// and stderr to dir/out and dir/err; killed and reaped on destruction.
struct ChildProcess {
  test_process::TempDir tmp{"verbs_rpc_test"};
  std::string dir = tmp.path.string();
  std::unique_ptr<test_process::Child> child;

  explicit ChildProcess(std::vector<std::string> args) {
    for (auto& a : args) {
      const size_t at = a.find("{dir}");
      if (at != std::string::npos) a.replace(at, 5, dir);
    }
    args.insert(args.begin(), test_process::self_exe());
    test_process::SpawnOptions o;
    o.stdout_path = dir + "/out";
    o.stderr_path = dir + "/err";
    child = std::make_unique<test_process::Child>(std::move(args), o);
  }
  // True while the process runs (false once it has exited, reaped here).
  bool running() { return child->running(); }
  std::string stderr_text() const { return child->stderr_text(); }
  // SIGSTOP, then wait until the process is stopped: until then it may
  // still answer (the signal is delivered asynchronously).
  void stop() {
    const bool stopped = child->stop(5000ms);
    REQUIRE_MESSAGE(child->pid > 0, "child exited instead of stopping: " << stderr_text());
    REQUIRE_MESSAGE(stopped, "child did not stop within 5 s");
  }
  void kill_and_reap() { child->kill_and_reap(); }
  int exit_status() const { return child->exit_status; }
};

// A server process (`--child`).
struct ChildServer : ChildProcess {
  uint16_t port = 0;

  ChildServer() : ChildProcess({"--child", "{dir}/port"}) {
    const auto up = test_process::wait_for_port_file(dir + "/port", *child, 20000ms);
    port = up.port;
    if (port == 0) {
      const std::string err = stderr_text();
      kill_and_reap();
      FAIL("child server did not start: " << err);
    }
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
};

// A client process (`--child-client`) calling `address` until killed.
struct ChildClient : ChildProcess {
  explicit ChildClient(const std::string& address) : ChildProcess({"--child-client", address, "{dir}/progress"}) {}
  // Its count of checked replies (0 before the first report).
  uint64_t progress() const {
    std::ifstream in(dir + "/progress");
    uint64_t n = 0;
    in >> n;
    return n;
  }
};

// Threads calling Echo on one channel until stop(), `window` calls in
// flight per thread, payloads 0..2999 bytes, every reply payload-checked.
// `phase` is the test's clock: 0 before the kill, 1 while killing (the
// signal is on its way), 2 once the killed process is reaped. Each call's
// outcome is judged by the phase it was issued and completed in:
//   survivor (a channel to a process that lives): every call OK;
//   doomed (a channel to the process killed): OK only if issued before the
//   process was reaped; UNAVAILABLE only if completed after the kill began.
// Anything else is an error (the first one is kept).
class EchoLoad {
 public:
  EchoLoad(Channel& ch, const std::atomic<int>& phase, uint64_t tag, bool doomed, int threads = 2,
           int window = 4)
      : ch_(ch), phase_(phase), doomed_(doomed) {
    for (int t = 0; t < threads; ++t) {
      threads_.emplace_back([this, tag, t, window] { run(tag << 48 | uint64_t(t) << 40, window); });
    }
  }
  ~EchoLoad() { stop(); }
  void stop() {
    stopping_ = true;
    for (auto& th : threads_) th.join();
    threads_.clear();
  }
  uint64_t ok() const { return ok_before_ + ok_after_; }
  uint64_t ok_before() const { return ok_before_; }   // issued before the reap
  uint64_t ok_after() const { return ok_after_; }     // issued after the reap
  uint64_t unavailable() const { return unavailable_; }
  uint64_t errors() const { return errors_; }
  std::string first_error() const {
    std::lock_guard<std::mutex> lock(mu_);
    return first_error_;
  }

 private:
  void error(const std::string& what) {
    ++errors_;
    std::lock_guard<std::mutex> lock(mu_);
    if (first_error_.empty()) first_error_ = what;
  }
  void run(uint64_t base, int window) {
    struct InFlight {
      uint64_t seq;
      size_t n;
      int issued_in;
      Future<Reply<Pong>> f;
    };
    uint64_t i = 0;
    while (!stopping_) {
      std::vector<InFlight> batch;
      for (int w = 0; w < window; ++w, ++i) {
        const uint64_t seq = base | i;
        const size_t n = static_cast<size_t>((i * 37) % 3000);
        const int issued_in = phase_.load();
        batch.push_back({seq, n, issued_in, ch_.call_typed<Pong>(kEcho, ping_bytes(seq, n))});
      }
      bool failed = false;
      for (auto& c : batch) {
        const std::string what = "call " + std::to_string(c.seq & 0xffffffffffull) + " (issued in phase " +
                                 std::to_string(c.issued_in) + "): ";
        if (!c.f.wait_for(60s)) {
          c.f.cancel();
          error(what + "no result within 60 s");
          continue;
        }
        const Reply<Pong> r = c.f.get();
        const int completed_in = phase_.load();
        if (r.ok()) {
          const std::string err = pong_error(r, c.seq, c.n);
          if (!err.empty()) {
            error(what + err);
          } else if (doomed_ && c.issued_in == 2) {
            error(what + "succeeded although its server was already dead");
          } else {
            ++(c.issued_in == 2 ? ok_after_ : ok_before_);
          }
        } else if (doomed_ && r.status().code() == StatusCode::kUnavailable && completed_in >= 1) {
          ++unavailable_;
          failed = true;
        } else {
          error(what + r.status().to_string() + " (completed in phase " + std::to_string(completed_in) + ")");
          failed = true;
        }
      }
      if (failed) std::this_thread::sleep_for(1ms);  // a closed channel fails at once: do not spin
    }
  }

  Channel& ch_;
  const std::atomic<int>& phase_;
  const bool doomed_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> ok_before_{0}, ok_after_{0}, unavailable_{0}, errors_{0};
  mutable std::mutex mu_;
  std::string first_error_;
  std::vector<std::thread> threads_;
};

}  // namespace

int main(int argc, char** argv) { return verbs_test::main(argc, argv, run_child); }

// ====================================================== transport choice

// The channel's verbs counters (Channel::metrics(), its "verbs" entry);
// all 0 when the channel has used no verbs session.
static slotrpc::TransportMetrics verbs_metrics(const Channel& ch) {
  const auto m = ch.metrics();
  const slotrpc::TransportMetrics* v = m.transport("verbs");
  return v != nullptr ? *v : slotrpc::TransportMetrics{};
}

TEST_CASE("verbs: auto picks verbs when both ends have a device; tcp when either says tcp") {
  SUBCASE("both auto: verbs") {
    TestServer ts;
    auto ch = connect(ts.address);
    CHECK(ch->transport() == TransportKind::kVerbs);
    check_echo(*ch, 1);
    const auto s = verbs_metrics(*ch);
    CHECK(s.max_inline > 0);
    CHECK(s.doorbells >= 1);
    CHECK(s.inline_sends >= 1);  // a 64-byte echo goes inline
  }
  SUBCASE("client tcp: tcp (the server takes both kinds)") {
    TestServer ts;
    Config c = base_config();
    c.transport = TransportKind::kTcp;
    auto tcp = connect(ts.address, c);
    auto verbs = connect(ts.address);
    CHECK(tcp->transport() == TransportKind::kTcp);
    CHECK(verbs->transport() == TransportKind::kVerbs);
    check_echo(*tcp, 2);
    check_echo(*verbs, 3);
    CHECK(verbs_metrics(*tcp).max_inline == 0);
    CHECK(ts.server->session_count() == 2);
  }
  SUBCASE("server tcp, client auto: the server answers tcp") {
    Config sc = base_config();
    sc.transport = TransportKind::kTcp;
    TestServer ts(sc);
    auto ch = connect(ts.address);
    CHECK(ch->transport() == TransportKind::kTcp);
    check_echo(*ch, 4);
  }
  SUBCASE("server tcp, client verbs: a clear error") {
    Config sc = base_config();
    sc.transport = TransportKind::kTcp;
    TestServer ts(sc);
    Config c = base_config();
    c.transport = TransportKind::kVerbs;
    auto ch = Channel::connect(ts.address, c);
    REQUIRE_FALSE(ch.ok());
    CHECK(ch.status().code() == StatusCode::kUnavailable);
    CHECK_MESSAGE(contains(ch.status().message(), "answered with tcp"), ch.status().message());
    CHECK_MESSAGE(contains(ch.status().message(), "tcp only"), ch.status().message());
    CHECK(verbs_test::wait_until([&] { return ts.server->session_count() == 0; }));
  }
  SUBCASE("server verbs, client tcp: refused") {
    Config sc = base_config();
    sc.transport = TransportKind::kVerbs;
    TestServer ts(sc);
    Config c = base_config();
    c.transport = TransportKind::kTcp;
    auto ch = Channel::connect(ts.address, c);
    REQUIRE_FALSE(ch.ok());
    CHECK_MESSAGE(contains(ch.status().message(), "only the verbs transport"), ch.status().message());
    c.transport = TransportKind::kVerbs;
    auto v = connect(ts.address, c);
    CHECK(v->transport() == TransportKind::kVerbs);
    check_echo(*v, 5);
  }
  SUBCASE("SLOTRPC_TRANSPORT forces it") {
    TestServer ts;
    {
      EnvVar t("SLOTRPC_TRANSPORT", "tcp");
      auto ch = connect(ts.address);
      CHECK(ch->transport() == TransportKind::kTcp);
    }
    {
      EnvVar t("SLOTRPC_TRANSPORT", "verbs");
      auto ch = connect(ts.address);
      CHECK(ch->transport() == TransportKind::kVerbs);
      check_echo(*ch, 6);
    }
  }
}

TEST_CASE("verbs: shared receive queue and memory windows by default; SLOTRPC_SRQ=off still serves") {
  // rxe has SRQs and type-2 memory windows: auto takes them.  Each end
  // decides for itself, so every mix must work.
  using slotrpc::SharedReceiveQueue;
  for (auto server_mode : {SharedReceiveQueue::kAuto, SharedReceiveQueue::kOff}) {
    for (auto client_mode : {SharedReceiveQueue::kAuto, SharedReceiveQueue::kOff, SharedReceiveQueue::kOn}) {
      CAPTURE(server_mode);
      CAPTURE(client_mode);
      Config sc = base_config();
      sc.srq = server_mode;
      TestServer ts(sc);
      Config c = base_config();
      c.srq = client_mode;
      auto a = connect(ts.address, c);
      auto b = connect(ts.address, c);
      REQUIRE(a->transport() == TransportKind::kVerbs);
      const bool shared = client_mode != SharedReceiveQueue::kOff;
      CHECK(verbs_metrics(*a).srq_sessions == (shared ? 1u : 0u));
      CHECK(verbs_metrics(*a).memory_window_sessions == (shared ? 1u : 0u));
      const uint64_t calls = verbs_test::load_calls(200, 50);
      for (uint64_t i = 0; i < calls; ++i) {
        check_echo(*a, i, i * 37 % 3000);
        check_echo(*b, i + 1000, i * 53 % 3000);
      }
      CHECK_FALSE(a->stats().closed);
      CHECK_FALSE(b->stats().closed);
    }
  }
}

// ====================================================== setup and teardown

TEST_CASE("verbs: connection setup and teardown, 40 times, resources come back") {
  TestServer ts;
  const std::string dev = device_name();
  { auto warm = connect(ts.address); }  // the server loop's transport (context, CQ) stays
  REQUIRE(verbs_test::wait_until([&] { return ts.server->session_count() == 0; }));
  const auto before = verbs_test::rdma_resources(dev);
  for (int i = 0; i < 40; ++i) {
    CAPTURE(i);
    auto ch = connect(ts.address);
    REQUIRE(ch->transport() == TransportKind::kVerbs);
    check_echo(*ch, static_cast<uint64_t>(i), static_cast<size_t>(i) * 100);
    if (i % 2 == 0) {
      // Leave a call pending on a slow handler: destruction cancels it.
      auto pending = ch->call_typed<Pong>(kSlow, ping_bytes(1000 + i, 0, 5000));
      ch.reset();
      auto r = get_within(pending, 2000ms);
      CHECK(r.status().code() == StatusCode::kCancelled);
    }
  }
  // The server saw every control connection close.
  CHECK(verbs_test::wait_until([&] { return ts.server->session_count() == 0; }, 10000ms));
  // Every queue pair, protection domain, memory region, CQ and context of
  // those sessions is gone, on both sides.
  const auto after = verbs_test::rdma_resources(dev);
  if (before.empty()) {
    MESSAGE("`rdma resource show` unavailable: object counts not checked");
    CHECK_FALSE(verbs_test::in_rxe_vm());
  } else {
    for (const char* kind : {"pd", "qp", "mr", "cq", "ctx"}) {
      CAPTURE(kind);
      CHECK(after.count(kind) == 1);
      CHECK(after.at(kind) == before.at(kind));
    }
    MESSAGE("rdma resources after 40 sessions: pd " << after.at("pd") << " qp " << after.at("qp") << " mr "
                                                    << after.at("mr") << " cq " << after.at("cq"));
  }
  auto ch = connect(ts.address);
  check_echo(*ch, 99);
}

// ====================================================== data path

TEST_CASE("verbs: echo calls (100,000; fewer under sanitizers) with 32 outstanding, every reply checked, no RNR") {
  TestServer ts;
  auto ch = connect(ts.address);
  REQUIRE(ch->transport() == TransportKind::kVerbs);
  const std::string dev = device_name();
  const auto rcvd0 = verbs_test::hw_counter(dev, "rcvd_rnr_err");
  const auto send0 = verbs_test::hw_counter(dev, "send_rnr_err");

  // VERBS_ECHO_CALLS (tests/verbs/meson.build): 100,000, or fewer in the
  // sanitized build, where a run of 20,000 took about a minute in the VM.
  const char* calls_env = std::getenv("VERBS_ECHO_CALLS");
  const uint64_t kCalls = calls_env != nullptr ? std::strtoull(calls_env, nullptr, 10) : 100000;
  REQUIRE(kCalls >= 1000);
  constexpr uint64_t kOutstanding = 32;
  constexpr size_t kPayload = 64;
  slotrpc::Histogram latency_us;  // recorded on the channel's loop (the callbacks')
  std::atomic<uint64_t> done{0}, failed{0};
  std::mutex mu;
  std::string first_error;
  std::atomic<uint64_t> next{0};
  // Each reply submits the next call from the channel's loop.
  std::function<void()> issue;
  issue = [&] {
    const uint64_t seq = next.fetch_add(1);
    if (seq >= kCalls) return;
    const auto t0 = Clock::now();
    slotrpc::raw::call(*ch, kEcho, ping_bytes(seq, kPayload), CallOptions{}, [&, seq, t0](RawReply&& raw) {
      latency_us.record(static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count()));
      const std::string err = pong_error(Reply<Pong>(std::move(raw)), seq, kPayload);
      if (!err.empty()) {
        ++failed;
        std::lock_guard<std::mutex> lock(mu);
        if (first_error.empty()) first_error = "seq " + std::to_string(seq) + ": " + err;
      }
      ++done;
      issue();
    });
  };
  const auto t0 = Clock::now();
  for (uint64_t i = 0; i < kOutstanding; ++i) issue();
  REQUIRE(verbs_test::wait_until([&] { return done.load() == kCalls; }, 600000ms));
  const double secs = ms_since(t0) / 1000;
  CHECK_MESSAGE(failed.load() == 0, first_error);
  const auto s = ch->stats();
  const auto v = verbs_metrics(*ch);
  MESSAGE(kCalls << " calls of " << kPayload << " B, 32 outstanding, over verbs: p50 " << latency_us.quantile(0.5)
          << " us, p99 " << latency_us.quantile(0.99) << " us, max " << latency_us.max() << " us, " << static_cast<uint64_t>(kCalls / secs)
          << " calls/s; " << v.inline_sends << " inline / " << v.noninline_sends << " non-inline sends, "
          << v.doorbells << " doorbells for " << s.messages_sent << " messages; "
          << s.packs_sent << " PACKs carried " << s.packed_requests << " requests; "
          << s.link_messages << " messages in " << s.work_requests << " work requests, "
          << v.packets << " packets");
  // Every work request was posted inline (a lone 32 + ~100 byte request)
  // or read from its slot (a PACK of several, too large to inline; in the
  // rxe VM all of them: 16 requests a PACK).
  CHECK(v.inline_sends + v.noninline_sends == s.work_requests);
  // Replies arrive together, so the requests they release leave together:
  // with packing on (the default), PACKs carry many of them.
  CHECK(s.packs_sent >= 1);
  CHECK(s.link_messages > s.work_requests);
  // 32 calls outstanding: a loop turn sends what several replies released,
  // in one chain and one doorbell.
  const double doorbells_per_message = double(v.doorbells) / double(s.messages_sent);
  MESSAGE("doorbells per message: " << doorbells_per_message);
  CHECK(doorbells_per_message < 0.5);  // rxe VM: about 0.05
  CHECK_FALSE(s.closed);
  CHECK(s.free_slots == 64);
  // The framework counters add up exactly: every call started and
  // finished OK on both sides, bytes agree, and over verbs every send was
  // either inline or not.
  {
    const slotrpc::MetricsSnapshot c = ch->metrics();
    const slotrpc::MetricsSnapshot sv = ts.server->metrics();
    CHECK(c.client.started == kCalls);
    CHECK(c.client.finished[0] == kCalls);
    CHECK(c.client.finished_total() == kCalls);
    CHECK(sv.server.started == kCalls);
    CHECK(sv.server.finished[0] == kCalls);
    CHECK(c.client.bytes_out == sv.server.bytes_in);
    CHECK(c.client.bytes_in == sv.server.bytes_out);
    auto verbs_of = [](const slotrpc::MetricsSnapshot& m) {
      const slotrpc::TransportMetrics* t = nullptr;
      for (const auto& x : m.transports) if (x.transport == "verbs") t = &x;
      REQUIRE(t != nullptr);
      return t;
    };
    for (const auto* m : {&c, &sv}) {
      const slotrpc::TransportMetrics* t = verbs_of(*m);
      const slotrpc::TransportMetrics* peer = verbs_of(m == &c ? sv : c);
      // One request (one reply) per call; PACKs carry several in one send.
      CHECK(t->messages - t->control_sends == kCalls);
      CHECK(t->slot_sends <= kCalls);
      CHECK(t->inline_sends + t->noninline_sends == t->slot_sends + t->control_sends);
      // Each slot send of the peer arrived through a poll here.
      CHECK(t->completions_per_poll.sum >= peer->slot_sends);
      const slotrpc::MethodMetrics* echo = nullptr;
      for (const auto& x : m->methods) if (x.id == kEcho) echo = &x;
      REQUIRE(echo != nullptr);
      CHECK(echo->name == "slotrpc.test.Verbs/Echo");
      CHECK(echo->latency_us.count == kCalls);
    }
  }
  if (rcvd0 && send0) {
    const auto rcvd1 = verbs_test::hw_counter(dev, "rcvd_rnr_err");
    const auto send1 = verbs_test::hw_counter(dev, "send_rnr_err");
    REQUIRE(rcvd1);
    REQUIRE(send1);
    MESSAGE("RNR counters of " << dev << ": rcvd_rnr_err " << *rcvd0 << " -> " << *rcvd1 << ", send_rnr_err "
                               << *send0 << " -> " << *send1);
    CHECK(*rcvd1 - *rcvd0 == 0);
    CHECK(*send1 - *send0 == 0);
  } else {
    MESSAGE("no hw_counters for " << dev << ": RNR deltas not checked");
    CHECK_FALSE(verbs_test::in_rxe_vm());  // rxe has them
  }
}

TEST_CASE("verbs: inline and non-inline sizes up to the slot size") {
  Config c = base_config();
  c.keepalive_ms = 60000;  // no pings in the counts below
  c.peer_timeout_ms = 120000;
  TestServer ts(c);
  auto ch = connect(ts.address, c);
  const uint32_t mi = verbs_metrics(*ch).max_inline;
  REQUIRE(mi > 0);
  // The request's size on the wire, computed the way the writer builds it.
  auto request_bytes = [](uint64_t seq, size_t n) {
    flatbuffers::FlatBufferBuilder fbb;
    ping_bytes(seq, n)(fbb);
    return 32 + fbb.GetSize();
  };
  std::vector<size_t> payloads = {0, 1, 50, 100};
  for (size_t n = 100; request_bytes(1, n) <= mi + 8; ++n) payloads.push_back(n);  // across max_inline
  for (size_t n : {500, 1000, 4000, 8000}) payloads.push_back(n);
  // The largest payload that fits a slot (8192 - header - FlatBuffer
  // overhead), found by trying: a request that does not fit fails before
  // anything is sent.
  size_t largest = c.slot_size;
  for (;; --largest) {
    auto f = ch->call_typed<Pong>(kEcho, ping_bytes(1, largest));
    const auto r = get_within(f);
    if (r.ok()) break;
    REQUIRE(r.status().code() == StatusCode::kResourceExhausted);
  }
  REQUIRE(largest > 8000);
  payloads.push_back(largest);
  uint64_t want_inline = 0, want_copy = 0;
  for (size_t n : payloads) {
    CAPTURE(n);
    const auto before = verbs_metrics(*ch);
    check_echo(*ch, n, n);
    const auto after = verbs_metrics(*ch);
    const size_t bytes = request_bytes(n, n);
    if (bytes <= mi) {
      ++want_inline;
      CHECK(after.inline_sends == before.inline_sends + 1);
    } else {
      ++want_copy;
      CHECK(after.noninline_sends == before.noninline_sends + 1);
    }
  }
  CHECK(want_inline >= 4);
  CHECK(want_copy >= 4);
  MESSAGE("max_inline " << mi << ": " << want_inline << " requests inline, " << want_copy
                        << " from the send slot; largest payload " << largest << " B in a "
                        << c.slot_size << "-byte slot");
  // One byte more does not fit: RESOURCE_EXHAUSTED, nothing sent.
  const auto before = ch->stats();
  auto f = ch->call_typed<Pong>(kEcho, ping_bytes(1, largest + 1));
  auto r = get_within(f);
  CHECK(r.status().code() == StatusCode::kResourceExhausted);
  CHECK(ch->stats().messages_sent == before.messages_sent);
  check_echo(*ch, 7, 10);
}

TEST_CASE("verbs: several sessions on one server, concurrent callers") {
  Config sc = base_config();
  sc.reactor_threads = 2;
  TestServer ts(sc);
  constexpr int kChannels = 6, kThreads = 3;
  const int kCalls = static_cast<int>(verbs_test::load_calls(1000));
  std::vector<std::unique_ptr<Channel>> channels;
  for (int i = 0; i < kChannels; ++i) {
    channels.push_back(connect(ts.address));
    CHECK(channels.back()->transport() == TransportKind::kVerbs);
  }
  CHECK(ts.server->session_count() == kChannels);
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < kChannels; ++c) {
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, c, t] {
        for (int i = 0; i < kCalls; ++i) {
          const uint64_t seq = uint64_t(c) << 40 | uint64_t(t) << 32 | uint64_t(i);
          const size_t n = static_cast<size_t>((i * 37) % 3000);
          auto f = channels[c]->call_typed<Pong>(kEcho, ping_bytes(seq, n));
          if (!f.wait_for(30s) || !pong_error(f.get(), seq, n).empty()) ++errors;
        }
      });
    }
  }
  for (auto& th : threads) th.join();
  CHECK(errors.load() == 0);
  for (auto& ch : channels) CHECK(ch->stats().free_slots == 64);
  channels.clear();
  CHECK(verbs_test::wait_until([&] { return ts.server->session_count() == 0; }));
}

TEST_CASE("verbs: a server-streaming call") {
  Config c = base_config();
  c.stream_window = 4;
  TestServer ts(c);
  auto ch = connect(ts.address, c);
  REQUIRE(ch->transport() == TransportKind::kVerbs);
  for (uint64_t n : {0ull, 1ull, 500ull}) {
    CAPTURE(n);
    auto reader = ch->server_stream<Ping, Pong>(kCount, [n](flatbuffers::FlatBufferBuilder& fbb) {
      return slotrpc::test::CreatePing(fbb, n);
    });
    uint64_t got = 0;
    while (auto m = reader.Read()) {
      REQUIRE(m->ok());
      CHECK((*m)->seq() == got);
      const std::string err = pong_error(*m, got, 100);
      CHECK_MESSAGE(err.empty(), err);
      ++got;
    }
    CHECK(reader.status().ok());
    CHECK(got == n);
  }
  CHECK(verbs_test::wait_until([&] { return ch->stats().free_slots == 64; }));
  check_echo(*ch, 8);
}

TEST_CASE("verbs: deadlines leave zombies until the late reply; cancel reaches the handler") {
  TestServer ts;
  auto ch = connect(ts.address);
  auto f = ch->call_typed<Pong>(kSlow, ping_bytes(1, 0, 300), CallOptions::with_timeout(50ms));
  auto r = get_within(f);
  CHECK(r.status().code() == StatusCode::kDeadlineExceeded);
  // The handler saw the CANCEL (a control-lane SEND) and replied early.
  CHECK(verbs_test::wait_until([&] {
    const auto s = ch->stats();
    return s.zombies == 0 && s.late_replies_dropped == 1;
  }));
  check_echo(*ch, 2);
}

TEST_CASE("verbs: an idle session stays up on keepalives") {
  Config c = base_config();
  c.keepalive_ms = 100;
  // Not tighter: the same timeout bounds the verbs connect, slow in the
  // ASan build in the TCG VM (see the frozen-peer case).
  c.peer_timeout_ms = 1000;
  TestServer ts(c);
  auto ch = connect(ts.address, c);
  check_echo(*ch, 1);
  std::this_thread::sleep_for(2500ms);  // many keepalive periods, 2.5 peer timeouts, no calls
  CHECK_FALSE(ch->stats().closed);
  check_echo(*ch, 2);
  CHECK(ts.server->session_count() == 1);
}

TEST_CASE("verbs: poll modes (the completion channel wakes sleeping loops)") {
  for (auto mode : {slotrpc::PollMode::kBlocking, slotrpc::PollMode::kBusy, slotrpc::PollMode::kAdaptive}) {
    const std::string mode_name(slotrpc::to_string(mode));
    CAPTURE(mode_name);
    Config c = base_config();
    c.poll_mode = mode;
    c.spin_us = 20;
    TestServer ts(c);
    auto ch = connect(ts.address, c);
    std::vector<Future<Reply<Pong>>> pending;
    // 2,000 calls (500 under the sanitizers): each mode's sleeps and
    // wake-ups show in the first few hundred.
    const uint64_t calls = verbs_test::load_calls(2000);
    for (uint64_t i = 0; i < calls; ++i) {
      pending.push_back(ch->call_typed<Pong>(kEcho, ping_bytes(i, 16)));
      if (pending.size() == 8) {
        for (auto& f : pending) CHECK(get_within(f).ok());
        pending.clear();
      }
      if (i % (calls / 4) == 0) std::this_thread::sleep_for(20ms);  // four idle gaps: the loops sleep
    }
    for (auto& f : pending) CHECK(get_within(f).ok());
  }
}

TEST_CASE("verbs: an idempotent call reconnects over verbs after a server restart") {
  auto first = std::make_unique<TestServer>();
  const std::string address = first->address;
  auto ch = connect(address);
  REQUIRE(ch->transport() == TransportKind::kVerbs);
  check_echo(*ch, 1);
  first->server->stop();
  first.reset();
  REQUIRE(verbs_test::wait_until([&] { return ch->stats().closed; }, 5000ms));

  Config sc = base_config();
  auto second = std::make_unique<Server>(sc);
  REQUIRE(second->add_service(make_service()).ok());
  const Status st = second->start(address);
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  CallOptions retry;
  retry.idempotent = true;
  retry.max_retries = 2;
  auto f = ch->call_typed<Pong>(kEcho, ping_bytes(2, 500), retry);
  auto r = get_within(f);
  const std::string err = pong_error(r, 2, 500);
  CHECK_MESSAGE(err.empty(), err);
  CHECK(ch->transport() == TransportKind::kVerbs);
  CHECK_FALSE(ch->stats().closed);
  check_echo(*ch, 3, 3000);
}

// ====================================================== faults

TEST_CASE("verbs: server stop fails pending calls with UNAVAILABLE") {
  TestServer ts;
  auto ch = connect(ts.address);
  std::vector<Future<Reply<Pong>>> pending;
  for (int i = 0; i < 5; ++i) pending.push_back(ch->call_typed<Pong>(kSlow, ping_bytes(i, 0, 8000)));
  std::this_thread::sleep_for(50ms);
  const auto t0 = Clock::now();
  std::thread stopper([&] { ts.server->stop(); });
  for (auto& f : pending) {
    auto r = get_within(f, 5000ms);
    CHECK(r.status().code() == StatusCode::kUnavailable);
    CHECK_MESSAGE(contains(r.status().message(), "lost"), r.status().to_string());
  }
  CHECK(ms_since(t0) < 3000);
  stopper.join();
  CHECK(ch->stats().closed);
}

TEST_CASE("verbs: peer death -> UNAVAILABLE (process killed; process frozen)") {
  SUBCASE("killed: the closed control connection tells at once") {
    ChildServer child;
    auto ch = connect(child.address());
    REQUIRE(ch->transport() == TransportKind::kVerbs);
    check_echo(*ch, 1);
    std::vector<Future<Reply<Pong>>> pending;
    for (int i = 0; i < 8; ++i) pending.push_back(ch->call_typed<Pong>(kSlow, ping_bytes(10 + i, 0, 10000)));
    std::this_thread::sleep_for(100ms);
    for (auto& f : pending) CHECK_FALSE(f.ready());
    const auto t0 = Clock::now();
    child.kill_and_reap();
    for (auto& f : pending) {
      auto r = get_within(f, 5000ms);
      CHECK(r.status().code() == StatusCode::kUnavailable);
      CHECK_MESSAGE(contains(r.status().message(), "lost"), r.status().to_string());
    }
    const double elapsed = ms_since(t0);
    MESSAGE("killed server detected after " << elapsed << " ms");
    CHECK(elapsed < 2500);  // not the 5 s peer timeout
    CHECK(ch->stats().closed);
    auto late = ch->call_typed<Pong>(kEcho, ping_bytes(99));
    CHECK(get_within(late, 2000ms).status().code() == StatusCode::kUnavailable);
  }
  SUBCASE("frozen (SIGSTOP): the keepalive tells") {
    ChildServer child;
    Config c = base_config();
    // 1.5 s, not less: the same timeout bounds the verbs connect, which
    // took over 600 ms in CI (ASan build in the TCG VM on a loaded host).
    c.keepalive_ms = 200;
    c.peer_timeout_ms = 1500;
    auto ch = connect(child.address(), c);
    check_echo(*ch, 1);
    child.stop();
    const auto t0 = Clock::now();
    auto f = ch->call_typed<Pong>(kEcho, ping_bytes(2));
    auto r = get_within(f, 8000ms);
    CHECK(r.status().code() == StatusCode::kUnavailable);
    CHECK_MESSAGE(contains(r.status().message(), "silent"), r.status().to_string());
    const double elapsed = ms_since(t0);
    CHECK(elapsed >= 750);
    CHECK(elapsed < 6000);
    child.kill_and_reap();
  }
}

TEST_CASE("verbs: killing either peer mid-run leaves the survivor serving its other sessions") {
  // 0: before the kill; 1: SIGKILL on its way; 2: the killed process reaped.
  std::atomic<int> phase{0};
  const uint64_t kAfterKill = verbs_test::load_calls(3000);  // checked calls issued after the reap, per survivor channel

  SUBCASE("server survives: a client process is killed, the server's other sessions go on") {
    TestServer ts;  // one event loop: the dying session shares it with the survivors
    auto a = connect(ts.address);
    auto b = connect(ts.address);
    REQUIRE(a->transport() == TransportKind::kVerbs);
    REQUIRE(b->transport() == TransportKind::kVerbs);
    ChildClient child(ts.address);
    // The child is connected over verbs and its calls are flowing.
    const bool flowing =
        verbs_test::wait_until([&] { return child.progress() >= 200 || !child.running(); }, 30000ms);
    const bool alive = child.running();
    REQUIRE_MESSAGE(flowing, "child client made no progress: " << child.stderr_text());
    REQUIRE_MESSAGE(alive, "child client exited: " << child.stderr_text());
    CHECK(ts.server->session_count() == 3);

    EchoLoad load_a(*a, phase, 1, false);
    EchoLoad load_b(*b, phase, 2, false);
    REQUIRE(verbs_test::wait_until([&] { return load_a.ok() >= 200 && load_b.ok() >= 200; }, 60000ms));
    // Mid-run: the child's count still moves right before the kill.
    const uint64_t p0 = child.progress();
    REQUIRE(verbs_test::wait_until([&] { return child.progress() > p0 || !child.running(); }, 10000ms));
    const bool still_alive = child.running();
    REQUIRE_MESSAGE(still_alive, "child client stopped early: " << child.stderr_text());
    const uint64_t child_calls = child.progress();

    const auto t0 = Clock::now();
    phase = 1;
    child.kill_and_reap();
    phase = 2;
    CHECK(WIFSIGNALED(child.exit_status()));
    CHECK(WTERMSIG(child.exit_status()) == SIGKILL);
    const bool dropped = verbs_test::wait_until([&] { return ts.server->session_count() == 2; }, 10000ms);
    const double drop_ms = ms_since(t0);
    CHECK_MESSAGE(dropped, "sessions still open 10 s after the kill: " << ts.server->session_count());
    const bool enough = verbs_test::wait_until(
        [&] {
          return (load_a.ok_after() >= kAfterKill && load_b.ok_after() >= kAfterKill) ||
                 load_a.errors() + load_b.errors() > 0;
        },
        300000ms);
    load_a.stop();
    load_b.stop();
    MESSAGE("child client killed after " << child_calls << " checked calls; server back to "
            << ts.server->session_count() << " sessions after " << drop_ms << " ms; channel a: "
            << load_a.ok_before() << " calls before / " << load_a.ok_after() << " after, channel b: "
            << load_b.ok_before() << " / " << load_b.ok_after());
    CHECK_MESSAGE(load_a.errors() == 0, load_a.errors() << " errors, first: " << load_a.first_error());
    CHECK_MESSAGE(load_b.errors() == 0, load_b.errors() << " errors, first: " << load_b.first_error());
    CHECK(enough);
    CHECK(load_a.ok_after() >= kAfterKill);
    CHECK(load_b.ok_after() >= kAfterKill);
    for (Channel* ch : {a.get(), b.get()}) {
      const auto s = ch->stats();
      CHECK_FALSE(s.closed);
      CHECK(s.free_slots == 64);
    }
    CHECK(ts.server->session_count() == 2);
    // A brand-new session still gets verbs.
    auto fresh = connect(ts.address);
    CHECK(fresh->transport() == TransportKind::kVerbs);
    for (uint64_t i = 0; i < 20; ++i) check_echo(*fresh, 9000 + i, static_cast<size_t>(i) * 150);
    CHECK(ts.server->session_count() == 3);
    check_echo(*a, 9100, 2000);
    check_echo(*b, 9101, 10);
  }

  SUBCASE("client survives: a server process is killed, the client's other channel goes on") {
    ChildServer child;
    TestServer ts;
    auto doomed = connect(child.address());
    auto other = connect(ts.address);
    REQUIRE(doomed->transport() == TransportKind::kVerbs);
    REQUIRE(other->transport() == TransportKind::kVerbs);
    EchoLoad load_doomed(*doomed, phase, 1, true);
    EchoLoad load_other(*other, phase, 2, false);
    REQUIRE(verbs_test::wait_until([&] { return load_doomed.ok() >= 200 && load_other.ok() >= 200; }, 60000ms));
    // Also calls certainly in flight on the child at the kill: slow ones.
    std::vector<Future<Reply<Pong>>> slow;
    for (int i = 0; i < 4; ++i) slow.push_back(doomed->call_typed<Pong>(kSlow, ping_bytes(100 + i, 0, 30000)));
    std::this_thread::sleep_for(100ms);
    for (auto& f : slow) CHECK_FALSE(f.ready());
    const uint64_t doomed_before = load_doomed.ok();
    REQUIRE(verbs_test::wait_until([&] { return load_doomed.ok() > doomed_before; }, 10000ms));  // mid-run

    const auto t0 = Clock::now();
    phase = 1;
    child.kill_and_reap();
    phase = 2;
    for (auto& f : slow) {
      auto r = get_within(f, 10000ms);
      CHECK(r.status().code() == StatusCode::kUnavailable);
    }
    const bool closed = verbs_test::wait_until([&] { return doomed->stats().closed; }, 10000ms);
    const double closed_ms = ms_since(t0);
    CHECK(closed);
    const bool enough = verbs_test::wait_until(
        [&] {
          return (load_other.ok_after() >= kAfterKill && load_doomed.unavailable() > 0) ||
                 load_other.errors() + load_doomed.errors() > 0;
        },
        300000ms);
    load_doomed.stop();
    load_other.stop();
    MESSAGE("server process killed; its channel seen closed within " << closed_ms << " ms: "
            << load_doomed.ok_before() << " calls OK before, " << load_doomed.unavailable() << " UNAVAILABLE, "
            << load_doomed.ok_after() << " OK after; the other channel: " << load_other.ok_before()
            << " calls before / " << load_other.ok_after() << " after");
    CHECK_MESSAGE(load_doomed.errors() == 0,
                  load_doomed.errors() << " errors, first: " << load_doomed.first_error());
    CHECK_MESSAGE(load_other.errors() == 0,
                  load_other.errors() << " errors, first: " << load_other.first_error());
    CHECK(enough);
    CHECK(load_doomed.unavailable() > 0);
    CHECK(load_doomed.ok_after() == 0);
    CHECK(load_other.ok_after() >= kAfterKill);
    auto late = doomed->call_typed<Pong>(kEcho, ping_bytes(7));
    CHECK(get_within(late, 5000ms).status().code() == StatusCode::kUnavailable);
    const auto s = other->stats();
    CHECK_FALSE(s.closed);
    CHECK(s.free_slots == 64);
    CHECK(ts.server->session_count() == 1);
    check_echo(*other, 9200, 3000);
  }
}

// ====================================================== configuration

TEST_CASE("verbs: invalid configuration is refused with the setting, value and what exists") {
  const std::string dev = device_name();
  TestServer ts;
  SUBCASE("an unknown device, verbs forced") {
    EnvVar t("SLOTRPC_TRANSPORT", "verbs");
    EnvVar d("SLOTRPC_DEVICE", "nosuch0");
    auto ch = Channel::connect(ts.address, base_config());
    REQUIRE_FALSE(ch.ok());
    CHECK(ch.status().code() == StatusCode::kUnavailable);
    CHECK_MESSAGE(contains(ch.status().message(), "'nosuch0'"), ch.status().message());
    CHECK_MESSAGE(contains(ch.status().message(), "SLOTRPC_DEVICE"), ch.status().message());
    CHECK_MESSAGE(contains(ch.status().message(), "found: " + dev), ch.status().message());
    Server s(base_config());
    const Status st = s.start("127.0.0.1:0");
    REQUIRE_FALSE(st.ok());
    CHECK_MESSAGE(contains(st.message(), "'nosuch0'"), st.message());
  }
  SUBCASE("an unknown device with auto: tcp") {
    EnvVar d("SLOTRPC_DEVICE", "nosuch0");
    auto ch = connect(ts.address);
    CHECK(ch->transport() == TransportKind::kTcp);
    check_echo(*ch, 1);
  }
  SUBCASE("a port the device lacks, a GID index that is empty") {
    EnvVar t("SLOTRPC_TRANSPORT", "verbs");
    {
      EnvVar p("SLOTRPC_PORT", "255");
      auto ch = Channel::connect(ts.address, base_config());
      REQUIRE_FALSE(ch.ok());
      CHECK_MESSAGE(contains(ch.status().message(), "no port 255"), ch.status().message());
    }
    {
      EnvVar g("SLOTRPC_GID_INDEX", "250");
      auto ch = Channel::connect(ts.address, base_config());
      REQUIRE_FALSE(ch.ok());
      CHECK_MESSAGE(contains(ch.status().message(), "GID index 250"), ch.status().message());
      CHECK_MESSAGE(contains(ch.status().message(), "valid entries: "), ch.status().message());
      if (verbs_test::in_rxe_vm())
        CHECK_MESSAGE(contains(ch.status().message(), "valid entries: 0"), ch.status().message());
    }
  }
  SUBCASE("out-of-range verbs settings") {
    for (auto [var, value] : {std::pair{"SLOTRPC_SERVICE_LEVEL", "16"}, std::pair{"SLOTRPC_QP_TIMEOUT", "32"},
                              std::pair{"SLOTRPC_RETRY_COUNT", "8"}, std::pair{"SLOTRPC_RNR_RETRY", "8"},
                              std::pair{"SLOTRPC_MIN_RNR_TIMER", "32"}, std::pair{"SLOTRPC_TRAFFIC_CLASS", "256"},
                              std::pair{"SLOTRPC_PORT", "0"}, std::pair{"SLOTRPC_INLINE_BYTES", "4097"},
                              std::pair{"SLOTRPC_GID_INDEX", "x"}, std::pair{"SLOTRPC_RELAXED_ORDERING", "yes"},
                              std::pair{"SLOTRPC_SRQ", "yes"}, std::pair{"SLOTRPC_SRQ_DEPTH", "63"},
                              std::pair{"SLOTRPC_SRQ_DEPTH", "1048577"}}) {
      const std::string setting = std::string(var) + "=" + value;
      CAPTURE(setting);
      EnvVar v(var, value);
      auto ch = Channel::connect(ts.address, base_config());
      REQUIRE_FALSE(ch.ok());
      CHECK(ch.status().code() == StatusCode::kInvalidArgument);
      CHECK(contains(ch.status().message(), var));
      CHECK(contains(ch.status().message(), value));
    }
  }
  SUBCASE("valid settings at their edges all work") {
    for (auto [var, value] :
         {std::pair{"SLOTRPC_INLINE_BYTES", "0"}, std::pair{"SLOTRPC_INLINE_BYTES", "4096"},
          std::pair{"SLOTRPC_RELAXED_ORDERING", "on"}, std::pair{"SLOTRPC_RELAXED_ORDERING", "auto"},
          std::pair{"SLOTRPC_GID_INDEX", "0"}, std::pair{"SLOTRPC_TRAFFIC_CLASS", "184"},
          std::pair{"SLOTRPC_SERVICE_LEVEL", "15"}, std::pair{"SLOTRPC_QP_TIMEOUT", "31"},
          std::pair{"SLOTRPC_RETRY_COUNT", "0"}, std::pair{"SLOTRPC_RNR_RETRY", "0"},
          std::pair{"SLOTRPC_MIN_RNR_TIMER", "1"}}) {
      const std::string setting = std::string(var) + "=" + value;
      CAPTURE(setting);
      EnvVar v(var, value);
      EnvVar t("SLOTRPC_TRANSPORT", "verbs");
      // No retransmissions at all: with the default ACK timeout (67 ms) one
      // ACK delayed inside the emulated VM under the sanitizers failed the
      // session ("transport retry counter exceeded"). A 4 s timeout keeps
      // the edge value under test without making the run a bet on timing.
      std::optional<EnvVar> patient;
      if (std::string(var) == "SLOTRPC_RETRY_COUNT") patient.emplace("SLOTRPC_QP_TIMEOUT", "20");
      auto ch = connect(ts.address);
      REQUIRE(ch->transport() == TransportKind::kVerbs);
      for (uint64_t i = 0; i < 20; ++i) check_echo(*ch, i, i * 300);
      if (std::string(var) == "SLOTRPC_INLINE_BYTES") {
        const auto s = verbs_metrics(*ch);
        MESSAGE("inline_bytes " << std::string(value) << " -> max_inline " << s.max_inline);
        if (std::string(value) == "0") {
          CHECK(s.max_inline == 0);
          CHECK(s.inline_sends == 0);
        }
      }
    }
  }
}
