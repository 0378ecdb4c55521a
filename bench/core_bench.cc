// core_bench: the protocol core's cost per call, with no network under it.
//
// A ClientSession and a ServerSession (lib/core) talk over the in-memory
// link (lib/transport/memory): both ends in this process, on one event loop,
// with no system call per message.  What a call costs here is the core's
// own work -- building and verifying, the call table, credits, deadlines,
// clocks, metrics, fibers, the loop's turn -- on both sides together, since
// both run on the one thread.
//
// The loop is the real reactor (lib/reactor), started on its thread in busy
// mode: the sessions assert they run on their loop's thread, which only the
// reactor's own thread sets, and its turn (poll, timers, fibers, flush, one
// clock read) is what the product runs per call.  Each case runs entirely
// on that thread: a task starts it, the completions keep it going, and the
// last one stops the clocks.  So the CPU time measured (the thread's, from
// CLOCK_THREAD_CPUTIME_ID) is the work of exactly those calls, and the
// main thread only waits.
//
// Cases (one line each, key=value, for scripts and the smoke test):
//   unary64    unary Echo calls with a 64-byte payload, 1 and N outstanding;
//              the typed client's view: the reply is verified (Reply<T>).
//   packed64   the same with PACK on both sides (Config::pack_small): the
//              replies one turn produces go back as one message.
//   stream64   one server stream of `--calls` messages of 64 bytes; the
//              cost is per message.
//
//   build-h/bench/core_bench --calls 200000 --outstanding 1,32
//   valgrind --tool=callgrind build-h/bench/core_bench --calls 20000 --warmup 2000
// Under callgrind each measured case is one dump of its own (zeroed when
// the case starts, dumped when its last call completes, named by the
// case), so set-up, warm-up and shutdown stay out of the profile:
// callgrind_annotate callgrind.out.<pid>.<n> gives instructions per case.
#include <time.h>

#include <CLI/CLI.hpp>
#include <flatbuffers/flatbuffers.h>

#include <array>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "core/client_session.h"
#include "core/handshake.h"
#include "core/method_table.h"
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>  // no-ops unless run under valgrind --tool=callgrind
#else
#define CALLGRIND_ZERO_STATS
#define CALLGRIND_DUMP_STATS_AT(name) ((void)(name))
#endif

#include "base/logging.h"
#include "core/server_session.h"
#include "echo_service.h"  // examples/echo: the generated Echo service
#include "reactor/reactor.h"
#include "slotrpc/reply.h"
#include "transport/memory/memory_transport.h"

namespace {

using namespace slotrpc;
using examples::EchoReply;
using examples::EchoRequest;

constexpr size_t kPayload = 64;

uint64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000u + uint64_t(ts.tv_nsec);
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "core_bench: %s\n", what.c_str());
  std::exit(1);
}

// A server stream of req.seq() messages of the request's payload.
ServiceDefinition stream_service() {
  ServiceDefinition def("slotrpc.bench.Core");
  def.add_server_stream<EchoRequest, EchoReply>(
      "Stream", [](const EchoRequest& req, ServerWriter<EchoReply>& out, ServerCall&) -> Status {
        const auto* p = req.payload();
        for (uint64_t i = 0; i < req.seq(); ++i) {
          if (!out.Write([&](flatbuffers::FlatBufferBuilder& fbb) {
                return examples::CreateEchoReply(fbb, i, fbb.CreateVector(p->data(), p->size()));
              }))
            return out.error();
        }
        return {};
      });
  return def;
}

// One client session and one server session over a memory link, on `loop`.
struct Pair {
  std::unique_ptr<core::ServerSession> server;
  std::shared_ptr<core::ClientSession> client;
};

struct CaseResult {
  uint64_t calls = 0;     // completed OK
  uint64_t failed = 0;
  uint64_t cpu_ns = 0;    // the loop thread's CPU time over the case
  uint64_t wall_ns = 0;
  uint64_t turns = 0;     // reactor turns over the case
  uint64_t packs = 0;     // PACKs both sides sent (packed case)
  uint64_t packed = 0;    // messages inside them
};

class Bench {
 public:
  explicit Bench(const Config& config) : config_(config) {
    loop_ = std::make_unique<reactor::Reactor>(config_, "core-bench");
    auto added = loop_->add_transport(std::make_unique<transport::memory::MemoryTransport>());
    if (!added.ok()) die(added.status().message());
    memory_ = static_cast<transport::memory::MemoryTransport*>(added.value());
    echo_def_ = echo_.definition();
    stream_def_ = stream_service();
    if (Status st = methods_.add(echo_def_); !st.ok()) die(st.message());
    if (Status st = methods_.add(stream_def_); !st.ok()) die(st.message());
    echo_id_ = echo_def_.methods().front().id;
    stream_id_ = stream_def_.methods().front().id;
    pairs_.reserve(8);  // connect() hands out references into it
    loop_->start();
    // The server's per-method counters exist before the first call, as a
    // Server inserts them (lib/rpc/server.cc): no lookup allocates.
    on_loop([this] {
      for (const auto* def : {&echo_def_, &stream_def_})
        for (const MethodDescriptor& m : def->methods()) loop_->counters().server.methods[m.id];
    });
  }

  ~Bench() {
    on_loop([this] {
      for (Pair& p : pairs_) {
        p.client->shutdown(Status(StatusCode::kCancelled, "benchmark over"));
        p.server->close("benchmark over");
      }
    });
    // The server sessions go once their links are down and handlers done;
    // the loop's last turns run before it stops.
    on_loop([this] { pairs_.clear(); });
    loop_->stop();
  }

  // A connected pair, set up as a handshake would (packing both ways when
  // `pack_small` != 0).
  Pair& connect(uint32_t pack_small) {
    on_loop([&] {
      auto [a, b] = memory_->pair("bench" + std::to_string(pairs_.size()));
      auto s = core::ServerSession::create(*loop_, std::move(b), {config_.slot_count, config_.slot_size},
                                           methods_, "core_bench client", [](core::ServerSession*) {});
      if (!s.ok()) die("server session: " + s.status().message());
      auto c = core::ClientSession::create(*loop_, std::move(a), {config_.slot_count, config_.slot_size},
                                           "core_bench server");
      if (!c.ok()) die("client session: " + c.status().message());
      Pair p{std::move(s.value()), std::move(c.value())};
      p.server->set_client_takes_all_status_codes(true);
      p.server->set_client_takes_trailers(true);
      p.client->set_peer_features(core::kFeatureStatusCodes | core::kFeatureMetadata |
                                  (pack_small != 0 ? core::kFeaturePack : 0));
      if (pack_small != 0) {
        p.server->configure_packing(pack_small, true);
        p.client->configure_packing(pack_small, true);
      }
      p.client->link_ready();
      pairs_.push_back(std::move(p));
    });
    return pairs_.back();
  }

  // `calls` unary Echo calls, `outstanding` at a time.
  CaseResult unary(Pair& pair, uint64_t calls, uint32_t outstanding, const char* profile) {
    Run run;
    run.profile = profile;
    run.pair = &pair;
    run.target = calls;
    run.method = echo_id_;
    run.bench = this;
    const auto before = pack_counts(pair);
    run_on_loop([&run, outstanding] {
      run.start();
      for (uint32_t i = 0; i < outstanding && run.issued < run.target; ++i) run.issue();
    });
    const auto after = pack_counts(pair);
    run.result.packs = after.first - before.first;
    run.result.packed = after.second - before.second;
    return run.result;
  }

  // One server stream of `messages` messages.
  CaseResult stream(Pair& pair, uint64_t messages, const char* profile) {
    Run run;
    run.profile = profile;
    run.pair = &pair;
    run.target = messages;
    run.bench = this;
    run_on_loop([&run, this, messages] {
      run.start();
      auto* pc = new core::PendingCall;
      pc->method_id = stream_id_;
      pc->stream = true;
      pc->window = config_.stream_window;
      pc->request_id = run.pair->client->next_request_id();
      pc->writer = [messages](flatbuffers::FlatBufferBuilder& fbb) { write_request(fbb, messages); };
      pc->sink = [&run](RawReply&& raw) {
        Reply<EchoReply> reply(std::move(raw));
        if (reply.ok()) ++run.result.calls;
        else ++run.result.failed;
      };
      pc->on_end = [&run](Status st) {
        if (!st.ok()) {
          std::fprintf(stderr, "core_bench: stream ended: %s\n", st.to_string().c_str());
          ++run.result.failed;
        }
        run.finish();
      };
      run.pair->client->submit(pc);
    });
    return run.result;
  }

  reactor::Reactor& loop() { return *loop_; }

 private:
  struct Run {
    Bench* bench = nullptr;
    Pair* pair = nullptr;
    uint32_t method = 0;
    uint64_t target = 0;
    uint64_t issued = 0;
    uint64_t cpu0 = 0;
    uint64_t turns0 = 0;
    std::chrono::steady_clock::time_point wall0;
    const char* profile = nullptr;  // the callgrind dump's name; null for warm-ups
    CaseResult result;

    void start() {
      if (profile != nullptr) CALLGRIND_ZERO_STATS;
      turns0 = bench->loop_->stats().turns;
      wall0 = std::chrono::steady_clock::now();
      cpu0 = thread_cpu_ns();
    }
    void finish() {
      result.cpu_ns = thread_cpu_ns() - cpu0;
      result.wall_ns = uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                    std::chrono::steady_clock::now() - wall0)
                                    .count());
      result.turns = bench->loop_->stats().turns - turns0;
      if (profile != nullptr) CALLGRIND_DUMP_STATS_AT(profile);
      bench->signal();  // the last touch of this Run: the main thread may free it now
    }
    // One call, as a typed client's Echo would make it: a writer that
    // builds the request in the send slot, a sink that verifies the reply.
    // The sink of each call issues the next.
    void issue() {
      ++issued;
      auto* pc = new core::PendingCall;
      pc->method_id = method;
      pc->request_id = pair->client->next_request_id();
      const uint64_t seq = issued;
      pc->writer = [seq](flatbuffers::FlatBufferBuilder& fbb) { write_request(fbb, seq); };
      pc->sink = [this](RawReply&& raw) {
        Reply<EchoReply> reply(std::move(raw));
        if (reply.ok() && reply->payload() != nullptr && reply->payload()->size() == kPayload)
          ++result.calls;
        else
          ++result.failed;
        if (issued < target) {
          issue();
        } else if (result.calls + result.failed == target) {
          finish();
        }
      };
      pair->client->submit(pc);
    }
  };

  static void write_request(flatbuffers::FlatBufferBuilder& fbb, uint64_t seq) {
    static const std::array<uint8_t, kPayload> payload = [] {
      std::array<uint8_t, kPayload> p{};
      for (size_t i = 0; i < p.size(); ++i) p[i] = echo::pattern(1, i);
      return p;
    }();
    fbb.Finish(examples::CreateEchoRequest(fbb, seq, fbb.CreateVector(payload.data(), payload.size())));
  }

  std::pair<uint64_t, uint64_t> pack_counts(Pair& p) {
    std::pair<uint64_t, uint64_t> out;
    on_loop([&] {
      const auto c = p.client->counters();
      const transport::LinkStats s = p.server->link().stats();
      out.first = c.packs_sent + s.packs;
      out.second = c.packed_messages;
      // The server's replies in PACKs: each PACK carried `messages`, which
      // the link counts; messages beyond one per send were packed.
      out.second += s.messages - (s.slot_sends + s.control_sends) + s.packs;
    });
    return out;
  }

  // The main thread waits for the loop through a counter that outlives
  // both (a promise on the waiter's stack could be freed while set_value
  // still runs on the loop).
  void signal() {
    signals_.fetch_add(1, std::memory_order_release);
    signals_.notify_all();
  }
  // Posts `fn`, which calls signal() when it is done (now or later), and
  // waits for that.
  template <class Fn>
  void run_on_loop(Fn fn) {
    const uint64_t seen = signals_.load(std::memory_order_acquire);
    loop_->post(std::move(fn));
    for (uint64_t now = seen; now == seen; now = signals_.load(std::memory_order_acquire))
      signals_.wait(seen, std::memory_order_acquire);
  }
  // Runs `fn` on the loop and waits for it.
  template <class Fn>
  void on_loop(Fn fn) {
    run_on_loop([this, &fn] {
      fn();
      signal();
    });
  }

  std::atomic<uint64_t> signals_{0};

  Config config_;
  std::unique_ptr<reactor::Reactor> loop_;
  transport::memory::MemoryTransport* memory_ = nullptr;
  echo::EchoHandler echo_;
  ServiceDefinition echo_def_{""};
  ServiceDefinition stream_def_{""};
  core::MethodTable methods_;
  uint32_t echo_id_ = 0;
  uint32_t stream_id_ = 0;
  std::vector<Pair> pairs_;
};

void print(const char* name, const char* extra, uint64_t outstanding, const CaseResult& r,
           const char* unit) {
  const double per = r.calls != 0 ? double(r.cpu_ns) / double(r.calls) : 0.0;
  const double rate = r.wall_ns != 0 ? double(r.calls) * 1e9 / double(r.wall_ns) : 0.0;
  std::printf("case=%s outstanding=%" PRIu64 " %s=%" PRIu64 " failed=%" PRIu64
              " cpu_ns=%" PRIu64 " wall_ns=%" PRIu64 " %s_per_s=%.0f cpu_ns_per_%s=%.1f turns_per_%s=%.2f%s\n",
              name, outstanding, unit, r.calls, r.failed, r.cpu_ns, r.wall_ns, unit, rate,
              unit[0] == 'c' ? "call" : "message", per, unit[0] == 'c' ? "call" : "message",
              r.calls != 0 ? double(r.turns) / double(r.calls) : 0.0, extra);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"core_bench: the protocol core's CPU per call over the in-memory link"};
  uint64_t calls = 200'000;
  uint64_t warmup = 20'000;
  std::vector<uint32_t> outstanding{1, 32};
  std::vector<std::string> cases{"unary64", "packed64", "stream64"};
  app.add_option("--calls", calls, "calls (stream64: messages) per case")->check(CLI::Range(1ull, 1ull << 40));
  app.add_option("--warmup", warmup, "calls run before each case, not counted (0: none)");
  app.add_option("--outstanding", outstanding, "calls in flight, one run each (unary64)")
      ->delimiter(',')
      ->check(CLI::Range(1u, 4096u));
  app.add_option("--cases", cases, "unary64, packed64, stream64")->delimiter(',')
      ->check(CLI::IsMember({"unary64", "packed64", "stream64"}));
  CLI11_PARSE(app, argc, argv);

  // Only the log level comes from the environment (SLOTRPC_LOG_LEVEL,
  // default warn): the sessions' other settings are the benchmark's.
  {
    Config env;
    env.log_level = "warn";
    auto overlaid = env.with_environment();
    if (!overlaid.ok()) die(overlaid.status().message());
    base::apply_log_level(overlaid.value().log_level);
  }
  Config config;
  config.poll_mode = PollMode::kBusy;
  config.busy_sleep_us = 0;
  config.busy_yield_us = 0;
  // No keepalive pings inside a run (the peer is always heard anyway).
  config.keepalive_ms = 600'000;
  config.peer_timeout_ms = 3'600'000;
  uint32_t max_outstanding = 1;
  for (uint32_t o : outstanding) max_outstanding = std::max(max_outstanding, o);
  if (max_outstanding > config.slot_count) config.slot_count = max_outstanding;
  config.slot_size = 4096;  // 64 B calls; a smaller ring keeps the working set honest

  Bench bench(config);
  for (const std::string& c : cases) {
    if (c == "stream64") {
      auto& pair = bench.connect(0);
      if (warmup != 0) bench.stream(pair, warmup, nullptr);
      const CaseResult r = bench.stream(pair, calls, "stream64");
      print("stream64", "", 1, r, "messages");
      if (r.failed != 0 || r.calls != calls) return 1;
      continue;
    }
    const bool packed = c == "packed64";
    auto& pair = bench.connect(packed ? config.pack_small : 0);
    for (uint32_t o : outstanding) {
      if (packed && o == 1) continue;  // one call in flight has nothing to pack with
      if (warmup != 0) bench.unary(pair, warmup, o, nullptr);
      const std::string profile = c + " outstanding=" + std::to_string(o);
      const CaseResult r = bench.unary(pair, calls, o, profile.c_str());
      char extra[96] = "";
      if (packed)
        std::snprintf(extra, sizeof extra, " packs=%" PRIu64 " packed_messages=%" PRIu64, r.packs, r.packed);
      print(c.c_str(), extra, o, r, "calls");
      if (r.failed != 0 || r.calls != calls) return 1;
    }
  }
  return 0;
}
