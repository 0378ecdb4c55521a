// Integration: the framework counters add up exactly over loopback TCP.
//
// An echo of N calls: calls started = finished OK = N on both sides, bytes
// in and out equal the messages that were sent (measured independently, in
// the request writer and from the replies), per-method histograms count
// every call under the service descriptor's name, status codes land in their
// own counters, credit stalls and queued calls are exact when the server
// holds its replies, and a closed session's transport counters survive it.
#include <doctest/doctest.h>
#include <slotrpc/slotrpc.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/wire_format.h"
#include "env_var.h"
#include "rpc/admin/admin.h"

namespace {

using namespace std::chrono_literals;
using slotrpc::CallOptions;
using slotrpc::Channel;
using slotrpc::Config;
using slotrpc::MethodMetrics;
using slotrpc::MetricsSnapshot;
using slotrpc::RawReply;
using slotrpc::Server;
using slotrpc::ServerCall;
using slotrpc::ServiceDefinition;
using slotrpc::Status;
using slotrpc::StatusCode;

constexpr uint32_t kEcho = slotrpc::method_id("slotrpc.test.Metrics.Echo");
constexpr uint32_t kFail = slotrpc::method_id("slotrpc.test.Metrics.Fail");
constexpr uint32_t kHold = slotrpc::method_id("slotrpc.test.Metrics.Hold");
constexpr uint64_t kHeader = slotrpc::core::kHeaderSize;

template <class Pred>
bool wait_until(Pred pred, std::chrono::milliseconds limit = 20s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(1ms);
  }
  return pred();
}

const MethodMetrics* find_method(const MetricsSnapshot& m, const std::string& name, bool server) {
  for (const auto& mm : m.methods) {
    if (mm.name == name && mm.server == server) return &mm;
  }
  return nullptr;
}

const slotrpc::TransportMetrics* find_transport(const MetricsSnapshot& m, const std::string& kind) {
  for (const auto& t : m.transports) {
    if (t.transport == kind) return &t;
  }
  return nullptr;
}

size_t code(StatusCode c) { return static_cast<size_t>(c); }

struct Fixture {
  std::atomic<bool> release{false};
  std::atomic<int> holding{0};
  Server server;

  explicit Fixture(Config c = {}) : server(c) {
    ServiceDefinition svc("slotrpc.test.Metrics");
    // Echoes the request's bytes as the reply.
    svc.add_method("Echo", [](ServerCall& call) -> Status {
      call.reply().PushFlatBuffer(reinterpret_cast<const uint8_t*>(call.request().data()),
                                  call.request().size());
      return {};
    });
    svc.add_method("Fail", [](ServerCall&) -> Status {
      return Status(StatusCode::kInvalidArgument, "no");
    });
    // Holds its reply until the test releases it.
    svc.add_method("Hold", [this](ServerCall& call) -> Status {
      ++holding;
      while (!release.load()) slotrpc::this_fiber::sleep_for(1ms);
      call.reply().PushFlatBuffer(reinterpret_cast<const uint8_t*>(call.request().data()),
                                  call.request().size());
      return {};
    });
    REQUIRE(server.add_service(std::move(svc)).ok());
    REQUIRE(server.start("127.0.0.1:0").ok());
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(server.port()); }
};

}  // namespace

TEST_CASE("metrics: an echo of N calls adds up exactly") {
  Config sc;
  sc.reactor_threads = 2;  // metrics() adds both loops up
  Fixture f(sc);
  constexpr uint64_t kCalls = 3000;
  constexpr uint64_t kOutstanding = 16;
  std::atomic<uint64_t> request_bytes{0}, reply_bytes{0}, ok{0}, done{0}, next{0};
  uint64_t server_slot_sends = 0;
  {
    auto ch = Channel::connect(f.address()).value();
    std::function<void()> issue = [&] {
      const uint64_t seq = next.fetch_add(1);
      if (seq >= kCalls) return;
      const size_t size = 8 + seq % 300;  // varied sizes, so bytes are not calls x constant
      slotrpc::raw::call(*ch,
          kEcho,
          [&, seq, size](flatbuffers::FlatBufferBuilder& fbb) {
            std::vector<uint8_t> body(size, static_cast<uint8_t>(seq));
            fbb.PushFlatBuffer(body.data(), body.size());
            request_bytes += kHeader + fbb.GetSize();
          },
          {},
          [&](RawReply&& r) {
            if (r.ok()) {
              ++ok;
              reply_bytes += kHeader + r.size();
            }
            r.release();
            ++done;
            issue();
          });
    };
    for (uint64_t i = 0; i < kOutstanding; ++i) issue();
    REQUIRE(wait_until([&] { return done.load() == kCalls; }));
    REQUIRE(ok.load() == kCalls);

    const MetricsSnapshot c = ch->metrics();
    CHECK(c.loops == 1);
    CHECK(c.client.started == kCalls);
    CHECK(c.client.finished[code(StatusCode::kOk)] == kCalls);
    CHECK(c.client.finished_total() == kCalls);
    CHECK(c.client.bytes_out == request_bytes.load());
    CHECK(c.client.bytes_in == reply_bytes.load());
    CHECK(c.client.queued == 0);
    CHECK(c.server.started == 0);
    const MethodMetrics* cm = find_method(c, "slotrpc.test.Metrics/Echo", false);
    REQUIRE(cm != nullptr);
    CHECK(cm->id == kEcho);
    CHECK(cm->started == kCalls);
    CHECK(cm->finished[code(StatusCode::kOk)] == kCalls);
    CHECK(cm->latency_us.count == kCalls);
    CHECK(cm->latency_us.max >= slotrpc::Histogram::quantile(cm->latency_us, 0.99));
    const auto* ct = find_transport(c, "tcp");
    REQUIRE(ct != nullptr);
    CHECK(ct->sessions == 1);
    // One request each, nothing else in slots; with 16 outstanding some
    // went out together in PACKs (one slot send each).
    CHECK(ct->messages - ct->control_sends == kCalls);
    CHECK(ct->slot_sends <= kCalls);
    CHECK(ct->slot_sends >= 1);
    CHECK(ct->packs <= ct->slot_sends);
    CHECK(ct->completions_per_poll.count >= 1);
    CHECK(ct->completions_per_poll.count <= ct->completions_per_poll.sum);

    const MetricsSnapshot s = f.server.metrics();
    CHECK(s.loops == 2);
    CHECK(s.server.started == kCalls);
    CHECK(s.server.finished[code(StatusCode::kOk)] == kCalls);
    CHECK(s.server.finished_total() == kCalls);
    CHECK(s.server.bytes_in == request_bytes.load());
    CHECK(s.server.bytes_out == reply_bytes.load());
    CHECK(s.client.started == 0);
    const MethodMetrics* sm = find_method(s, "slotrpc.test.Metrics/Echo", true);
    REQUIRE(sm != nullptr);
    CHECK(sm->started == kCalls);
    CHECK(sm->latency_us.count == kCalls);
    // Registered but never called: present, at zero.
    const MethodMetrics* idle = find_method(s, "slotrpc.test.Metrics/Fail", true);
    REQUIRE(idle != nullptr);
    CHECK(idle->started == 0);
    const auto* st = find_transport(s, "tcp");
    REQUIRE(st != nullptr);
    CHECK(st->sessions == 1);
    CHECK(st->messages - st->control_sends == kCalls);
    CHECK(st->slot_sends <= kCalls);
    // Every slot send of one side arrived through a poll of the other
    // that returned it.
    CHECK(st->completions_per_poll.sum >= ct->slot_sends);
    CHECK(ct->completions_per_poll.sum >= st->slot_sends);
    server_slot_sends = st->slot_sends;
  }
  // The channel is gone: its session closes on the server, whose transport
  // counters keep what the link sent.
  REQUIRE(wait_until([&] { return f.server.session_count() == 0; }));
  const MetricsSnapshot after = f.server.metrics();
  const auto* st = find_transport(after, "tcp");
  REQUIRE(st != nullptr);
  CHECK(st->sessions == 0);
  CHECK(st->slot_sends == server_slot_sends);
  CHECK(st->messages - st->control_sends == kCalls);
  CHECK(after.server.started == kCalls);
}

TEST_CASE("metrics: status codes, credit stalls and queued calls") {
  Fixture f;
  Config cc;
  cc.slot_count = 2;
  auto ch = Channel::connect(f.address(), cc).value();
  auto body = [](flatbuffers::FlatBufferBuilder& fbb) {
    const uint8_t b[16] = {};
    fbb.PushFlatBuffer(b, sizeof b);
  };

  // Errors: one unknown method, three failing calls.
  CHECK(slotrpc::raw::call(*ch, 0x12345678u, body).get().status().code() == StatusCode::kUnimplemented);
  for (int i = 0; i < 3; ++i) {
    CHECK(slotrpc::raw::call(*ch, kFail, body).get().status().code() == StatusCode::kInvalidArgument);
  }

  // Six calls on two credits, held by the server: two run, four wait.
  std::vector<slotrpc::Future<RawReply>> held;
  for (int i = 0; i < 6; ++i) held.push_back(slotrpc::raw::call(*ch, kHold, body));
  REQUIRE(wait_until([&] { return f.holding.load() == 2; }));
  REQUIRE(wait_until([&] { return ch->metrics().client.queued == 4; }));
  MetricsSnapshot c = ch->metrics();
  CHECK(c.client.credit_stalls == 4);
  CHECK(c.client.started == 10);
  CHECK(c.client.finished_total() == 4);
  f.release = true;
  for (auto& h : held) CHECK(h.get().ok());

  c = ch->metrics();
  CHECK(c.client.queued == 0);
  CHECK(c.client.started == 10);
  CHECK(c.client.finished[code(StatusCode::kOk)] == 6);
  CHECK(c.client.finished[code(StatusCode::kUnimplemented)] == 1);
  CHECK(c.client.finished[code(StatusCode::kInvalidArgument)] == 3);
  CHECK(c.client.finished_total() == 10);
  const MethodMetrics* unknown = find_method(c, "0x12345678", false);
  REQUIRE(unknown != nullptr);
  CHECK(unknown->finished[code(StatusCode::kUnimplemented)] == 1);

  const MetricsSnapshot s = f.server.metrics();
  CHECK(s.server.started == 10);
  CHECK(s.server.finished[code(StatusCode::kOk)] == 6);
  CHECK(s.server.finished[code(StatusCode::kUnimplemented)] == 1);
  CHECK(s.server.finished[code(StatusCode::kInvalidArgument)] == 3);
  const MethodMetrics* fail = find_method(s, "slotrpc.test.Metrics/Fail", true);
  REQUIRE(fail != nullptr);
  CHECK(fail->finished[code(StatusCode::kInvalidArgument)] == 3);
  CHECK(fail->latency_us.count == 3);
  const MethodMetrics* hold = find_method(s, "slotrpc.test.Metrics/Hold", true);
  REQUIRE(hold != nullptr);
  CHECK(hold->latency_us.count == 6);
  // The unknown method has no entry of its own on the server (a client can
  // send any id; only registered methods are counted per method).
  CHECK(find_method(s, "0x12345678", true) == nullptr);
}

TEST_CASE("metrics: Server::metrics() from inside a handler does not deadlock") {
  Config sc;
  sc.reactor_threads = 2;
  Server server(sc);
  ServiceDefinition svc("slotrpc.test.MetricsInside");
  svc.add_method("Count", [&server](ServerCall& call) -> Status {
    const MetricsSnapshot m = server.metrics();
    const uint64_t started = m.server.started;
    call.reply().PushFlatBuffer(reinterpret_cast<const uint8_t*>(&started), sizeof started);
    return {};
  });
  REQUIRE(server.add_service(std::move(svc)).ok());
  REQUIRE(server.start("127.0.0.1:0").ok());
  // Two channels land on the two loops: concurrent metrics() from both.
  auto a = Channel::connect("127.0.0.1:" + std::to_string(server.port())).value();
  auto b = Channel::connect("127.0.0.1:" + std::to_string(server.port())).value();
  const uint32_t id = slotrpc::method_id("slotrpc.test.MetricsInside.Count");
  auto body = [](flatbuffers::FlatBufferBuilder& fbb) {
    const uint8_t x[8] = {};
    fbb.PushFlatBuffer(x, sizeof x);
  };
  for (int i = 0; i < 20; ++i) {
    auto fa = slotrpc::raw::call(*a, id, body);
    auto fb = slotrpc::raw::call(*b, id, body);
    REQUIRE(fa.wait_for(10s));
    REQUIRE(fb.wait_for(10s));
    CHECK(fa.get().ok());
    CHECK(fb.get().ok());
  }
  CHECK(server.metrics().server.finished_total() == 40);
}

TEST_CASE("metrics: snapshots taken while the server stops are whole or empty, and stop() waits for them") {
  // metrics() is for any thread at any time (server.h), stop() included:
  // a snapshot under way must not read the loops and session tables that
  // stop() takes apart.  Two readers race the stop: a thread of the
  // application, and handlers on both loops (an Admin call does the
  // same).  Under ThreadSanitizer (scripts/tsan.sh) the unguarded version
  // is reported at once; here a torn snapshot shows as a loop count that
  // is neither 0 (stopped) nor 2, or a crash.
  Config sc;
  sc.reactor_threads = 2;
  Server server(sc);
  std::atomic<uint64_t> inside{0};
  std::atomic<bool> torn{false};
  ServiceDefinition svc("slotrpc.test.MetricsStop");
  svc.add_method("Count", [&](ServerCall& call) -> Status {
    const MetricsSnapshot m = server.metrics();
    if (m.loops != 0 && m.loops != 2) torn = true;
    ++inside;
    call.reply().PushFlatBuffer(reinterpret_cast<const uint8_t*>(&m.loops), sizeof m.loops);
    return {};
  });
  REQUIRE(server.add_service(std::move(svc)).ok());
  REQUIRE(server.start("127.0.0.1:0").ok());
  const std::string address = "127.0.0.1:" + std::to_string(server.port());
  const uint32_t id = slotrpc::method_id("slotrpc.test.MetricsStop.Count");
  auto body = [](flatbuffers::FlatBufferBuilder& fbb) {
    const uint8_t x[8] = {};
    fbb.PushFlatBuffer(x, sizeof x);
  };
  // Callers on two channels (the two loops), each with a call always in
  // flight, until the server is gone.
  std::atomic<bool> done{false};
  std::atomic<uint64_t> unexpected{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 2; ++c) {
    callers.emplace_back([&] {
      auto ch = Channel::connect(address).value();
      while (!done) {
        auto f = slotrpc::raw::call(*ch, id, body);
        if (!f.wait_for(10s)) {
          ++unexpected;
          return;
        }
        const StatusCode got = f.get().status().code();
        if (got != StatusCode::kOk && got != StatusCode::kUnavailable) ++unexpected;
      }
    });
  }
  std::atomic<uint64_t> outside{0};
  std::thread reader([&] {
    while (!done) {
      const MetricsSnapshot m = server.metrics();
      if (m.loops != 0 && m.loops != 2) torn = true;
      ++outside;
    }
  });
  // Both kinds of snapshot are being taken before the stop.
  REQUIRE(wait_until([&] { return inside.load() >= 20 && outside.load() >= 20; }, 10s));
  server.stop();
  const uint64_t after_stop = outside.load();
  // And after it: a stopped server's snapshot is empty.
  REQUIRE(wait_until([&] { return outside.load() >= after_stop + 5; }, 10s));
  CHECK(server.metrics().loops == 0);
  done = true;
  reader.join();
  for (auto& t : callers) t.join();
  CHECK_FALSE(torn.load());
  CHECK(unexpected.load() == 0);
}

TEST_CASE("metrics: slotrpc.Admin/Metrics over the RPC port returns the snapshot") {
  Fixture f;
  auto ch = Channel::connect(f.address()).value();
  constexpr int kCalls = 25;
  for (int i = 0; i < kCalls; ++i) {
    REQUIRE(slotrpc::raw::call(*ch, kEcho, [](flatbuffers::FlatBufferBuilder& fbb) {
      const uint8_t b[40] = {};
      fbb.PushFlatBuffer(b, sizeof b);
    }).get().ok());
  }
  auto fetched = slotrpc::admin::fetch_metrics(*ch);
  REQUIRE_MESSAGE(fetched.ok(), fetched.status().to_string());
  const MetricsSnapshot& m = fetched.value();
  // The Admin call itself has started, not finished, when the snapshot is taken.
  CHECK(m.server.started == kCalls + 1);
  CHECK(m.server.finished[code(StatusCode::kOk)] == kCalls);
  CHECK(m.server.bytes_in > 0);
  CHECK(m.loops == 1);
  const MethodMetrics* echo = find_method(m, "slotrpc.test.Metrics/Echo", true);
  REQUIRE(echo != nullptr);
  CHECK(echo->id == kEcho);
  CHECK(echo->latency_us.count == kCalls);
  CHECK(echo->finished[code(StatusCode::kOk)] == kCalls);
  const MetricsSnapshot local = f.server.metrics();
  const MethodMetrics* local_echo = find_method(local, "slotrpc.test.Metrics/Echo", true);
  REQUIRE(local_echo != nullptr);
  CHECK(echo->latency_us.buckets == local_echo->latency_us.buckets);
  CHECK(echo->latency_us.sum == local_echo->latency_us.sum);
  const MethodMetrics* admin = find_method(m, "slotrpc.Admin/Metrics", true);
  REQUIRE(admin != nullptr);
  CHECK(admin->started == 1);
  const auto* t = find_transport(m, "tcp");
  REQUIRE(t != nullptr);
  CHECK(t->sessions == 1);
  CHECK(t->slot_sends == kCalls);  // the Admin reply is not sent yet
  // And the text renders from the fetched snapshot.
  CHECK(slotrpc::to_prometheus(m).find("slotrpc_calls_started_total{side=\"server\"} 26\n") != std::string::npos);
}

TEST_CASE("metrics: a user service cannot take slotrpc.Admin's method id") {
  Server server;
  ServiceDefinition clash("slotrpc.Admin");
  clash.add_method("Metrics", [](ServerCall&) -> Status { return {}; });
  const Status st = server.add_service(std::move(clash));
  REQUIRE_FALSE(st.ok());
  CHECK(st.message().find("slotrpc.Admin.Metrics") != std::string::npos);
}

TEST_CASE("metrics: shm sessions and traffic count under their own transport label") {
  // The suite runs with SLOTRPC_UNIX_PATH=off (tcp); here the server also
  // listens on its Unix socket and the channel must take shm.
  slotrpc::test::EnvVar unix_path("SLOTRPC_UNIX_PATH", std::nullopt);
  slotrpc::test::EnvVar transport("SLOTRPC_TRANSPORT", std::string("shm"));
  Fixture f;
  constexpr uint64_t kCalls = 200;
  {
    auto ch = Channel::connect(f.address()).value();
    REQUIRE(ch->transport() == slotrpc::TransportKind::kShm);
    std::atomic<uint64_t> done{0}, ok{0};
    for (uint64_t seq = 0; seq < kCalls; ++seq) {
      slotrpc::raw::call(*ch,
          kEcho,
          [seq](flatbuffers::FlatBufferBuilder& fbb) {
            // Over the 40 bytes that travel inside an shm descriptor: the
            // message goes through the slot, built there (no copy).
            std::vector<uint8_t> body(100, static_cast<uint8_t>(seq));
            fbb.PushFlatBuffer(body.data(), body.size());
          },
          {},
          [&](RawReply&& r) {
            if (r.ok()) ++ok;
            r.release();
            ++done;
          });
      REQUIRE(wait_until([&] { return done.load() == seq + 1; }));
    }
    REQUIRE(ok.load() == kCalls);
    for (const MetricsSnapshot& m : {ch->metrics(), f.server.metrics()}) {
      const auto* shm = find_transport(m, "shm");
      REQUIRE(shm != nullptr);
      CHECK(shm->sessions == 1);
      CHECK(shm->slot_sends == kCalls);  // requests (client) or replies (server)
      // Built in the shared segment, read by the peer in place: on both
      // sides, requests and replies alike.
      CHECK(shm->noninline_sends == kCalls);
      CHECK(shm->completions_per_poll.sum >= kCalls);
      // Nothing of it under tcp.
      const auto* tcp = find_transport(m, "tcp");
      REQUIRE(tcp != nullptr);
      CHECK(tcp->sessions == 0);
      CHECK(tcp->slot_sends == 0);
    }
  }
  // Closed: the server keeps what the link sent, still under shm.
  REQUIRE(wait_until([&] { return f.server.session_count() == 0; }));
  const MetricsSnapshot after = f.server.metrics();
  const auto* shm = find_transport(after, "shm");
  REQUIRE(shm != nullptr);
  CHECK(shm->sessions == 0);
  CHECK(shm->slot_sends == kCalls);
}

// Admin calls would make a cheap amplifier (a snapshot walks every loop's
// sessions and builds KiBs of histograms): a server answers at most 64 at
// once and then 200 a second, refusing the rest with RESOURCE_EXHAUSTED,
// and takes at most 8 fresh snapshots at once and then 20 a second,
// answering with the latest one again.  Bounds over the time the calls
// took, not timings.
TEST_CASE("metrics: Admin/Metrics calls are rationed server-wide") {
  Fixture f;
  auto ch = Channel::connect(f.address()).value();
  constexpr int kThreads = 8;
  constexpr int kPerThread = 100;
  std::mutex mu;
  std::set<int64_t> taken;
  int answered = 0;
  int refused = 0;
  std::string unexpected;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> callers;
  for (int t = 0; t < kThreads; ++t) {
    callers.emplace_back([&] {
      for (int i = 0; i < kPerThread; ++i) {
        auto m = slotrpc::admin::fetch_metrics(*ch);
        std::lock_guard<std::mutex> lock(mu);
        if (m.ok()) {
          ++answered;
          taken.insert(std::chrono::duration_cast<std::chrono::nanoseconds>(m->taken.time_since_epoch()).count());
        } else if (m.status().code() == StatusCode::kResourceExhausted &&
                   m.status().message().find("at most 200 calls a second") != std::string::npos) {
          ++refused;
        } else {
          unexpected = m.status().to_string();
        }
      }
    });
  }
  for (auto& t : callers) t.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CAPTURE(secs);
  CHECK_MESSAGE(unexpected.empty(), unexpected);
  CHECK(answered + refused == kThreads * kPerThread);
  CHECK_MESSAGE(answered <= 64 + 200 * secs + 1, answered << " answered in " << secs << " s");
  CHECK(answered >= 64);  // the burst
  CHECK_MESSAGE(static_cast<double>(taken.size()) <= 8 + 20 * secs + 1,
                taken.size() << " fresh snapshots in " << secs << " s");

  // After a pause both buckets have refilled: a call is answered with a
  // fresh snapshot (taken after the pause began).
  const auto before = std::chrono::system_clock::now();
  std::this_thread::sleep_for(100ms);  // refill time, not a synchronisation
  auto m = slotrpc::admin::fetch_metrics(*ch);
  REQUIRE_MESSAGE(m.ok(), m.status().to_string());
  CHECK(m->taken > before);
}
