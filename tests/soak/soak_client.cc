// One client process of scripts/soak.sh: N echo calls against a server that
// the script kills and restarts at random, while this process may itself be
// killed (SIGKILL) and started again.
//
// What it proves about every call it makes:
//   * it ends: a watchdog thread fails the process when any call has been
//     outstanding longer than its deadline plus a margin (none hangs);
//   * it ends once: completions are counted per call, a second one is a
//     violation (none is answered twice);
//   * it ends with OK and the right payload, or a status (counted by code).
//
// Calls are issued application-style: each completion issues the next call
// from the reply callback, keeping `outstanding` in flight, until the
// session is seen dead (UNAVAILABLE); then the process drains what is in
// flight, drops the Channel and connects again (with backoff) until it has
// made its N calls.
//
// Progress survives a SIGKILL: the counts are written to --state (whole,
// by rename) every 100 ms and at exit, and a restarted process resumes from
// them.  Calls in flight when the process was killed are not counted; the
// restarted process makes them again.
#include <unistd.h>

#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "echo_service.h"

namespace {

using slotrpc::examples::EchoClient;
using slotrpc::examples::EchoReply;
using Clock = std::chrono::steady_clock;

constexpr int kCodes = 17;  // StatusCode values 0..16

bool parse(const char* text, uint64_t min, uint64_t max, uint64_t& out) {
  std::string_view s(text);
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size() && out >= min && out <= max;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// The counts kept across restarts of this client.
struct Counts {
  uint64_t done = 0;                // calls that ended, any status
  std::array<uint64_t, kCodes> by_code{};
  uint64_t twice = 0;               // calls answered more than once
  uint64_t bad_reply = 0;           // OK with a wrong seq or payload
  uint64_t sessions = 0;            // successful connects
  uint64_t connect_failures = 0;
  uint64_t starts = 0;              // processes (1 + restarts after a kill)

  std::string text() const {
    std::ostringstream o;
    o << "done=" << done << " twice=" << twice << " bad_reply=" << bad_reply << " sessions=" << sessions
      << " connect_failures=" << connect_failures << " starts=" << starts;
    for (int c = 0; c < kCodes; ++c) o << " code" << c << "=" << by_code[c];
    return o.str();
  }
  void load(const std::string& path) {
    std::ifstream in(path);
    std::string kv;
    while (in >> kv) {
      const auto eq = kv.find('=');
      if (eq == std::string::npos) continue;
      const std::string k = kv.substr(0, eq);
      const uint64_t v = std::strtoull(kv.c_str() + eq + 1, nullptr, 10);
      if (k == "done") done = v;
      else if (k == "twice") twice = v;
      else if (k == "bad_reply") bad_reply = v;
      else if (k == "sessions") sessions = v;
      else if (k == "connect_failures") connect_failures = v;
      else if (k == "starts") starts = v;
      else if (k.rfind("code", 0) == 0) {
        const int c = std::atoi(k.c_str() + 4);
        if (c >= 0 && c < kCodes) by_code[c] = v;
      }
    }
  }
};

struct Soak {
  std::string address;
  uint64_t total = 0;  // calls to make, across restarts
  uint64_t outstanding = 8;
  uint64_t size = 64;
  uint64_t deadline_ms = 2000;
  uint64_t margin_ms = 3000;
  uint64_t rate = 0;  // calls per second, 0 = as fast as the window allows
  std::string state_path;
  Clock::time_point t_start;
  uint64_t start_seq = 0;

  Counts saved;  // from the state file, at start
  uint64_t base = 0;  // saved.done: this process makes calls [base, total)

  // Per call of this process (index seq - base).
  std::vector<std::atomic<uint8_t>> answers;
  std::vector<std::atomic<int64_t>> started;  // ns; 0 = not issued

  std::atomic<uint64_t> next{0};  // next seq to issue
  std::atomic<uint64_t> done{0};  // calls of this process that ended
  std::array<std::atomic<uint64_t>, kCodes> by_code{};
  std::atomic<uint64_t> twice{0};
  std::atomic<uint64_t> bad_reply{0};
  // Counted by the calling thread, read by the watchdog's save().
  std::atomic<uint64_t> sessions{0};
  std::atomic<uint64_t> connect_failures{0};

  // The current session's calls; guarded by mu for the drain wait.
  EchoClient* client = nullptr;
  std::atomic<bool> dead{false};
  std::atomic<uint64_t> in_flight{0};
  std::mutex mu;
  std::condition_variable cv;

  Counts snapshot() {
    Counts c = saved;
    c.done += done.load();
    for (int i = 0; i < kCodes; ++i) c.by_code[i] += by_code[i].load();
    c.twice += twice.load();
    c.bad_reply += bad_reply.load();
    c.sessions += sessions.load();
    c.connect_failures += connect_failures.load();
    return c;
  }
  void save() {
    const std::string tmp = state_path + ".tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << snapshot().text() << "\n";
    }
    std::rename(tmp.c_str(), state_path.c_str());
  }

  // The calls the pace allows by now (all of them without --rate).
  uint64_t allowed() const {
    if (rate == 0) return total;
    const double s = std::chrono::duration<double>(Clock::now() - t_start).count();
    return std::min<uint64_t>(total, start_seq + 1 + static_cast<uint64_t>(s * static_cast<double>(rate)));
  }

  // Issues one call if any is left, the pace allows it and the session is
  // believed alive.  Called from reply callbacks and from the pacer.
  void issue() {
    if (dead.load()) return;
    uint64_t seq = next.load();
    do {
      if (seq >= allowed()) return;
    } while (!next.compare_exchange_weak(seq, seq + 1));
    in_flight.fetch_add(1);
    started[seq - base].store(now_ns());
    const uint64_t n = size;
    client->Echo(
        [seq, n](flatbuffers::FlatBufferBuilder& fbb) {
          uint8_t* bytes = nullptr;
          auto payload = fbb.CreateUninitializedVector(n, &bytes);
          for (size_t i = 0; i < n; ++i) bytes[i] = echo::pattern(seq, i);
          return slotrpc::examples::CreateEchoRequest(fbb, seq, payload);
        },
        slotrpc::CallOptions::with_timeout(std::chrono::milliseconds(deadline_ms)),
        [this, seq](slotrpc::Reply<EchoReply>&& reply) { on_reply(seq, reply); });
  }

  void on_reply(uint64_t seq, const slotrpc::Reply<EchoReply>& reply) {
    if (answers[seq - base].fetch_add(1) != 0) {
      ++twice;
      std::fprintf(stderr, "soak_client: call %llu answered twice (now %s)\n",
                   static_cast<unsigned long long>(seq), reply.status().to_string().c_str());
      return;  // counted once already
    }
    const auto code = static_cast<unsigned>(reply.status().code());
    ++by_code[code < kCodes ? code : kCodes - 1];
    if (reply.ok()) {
      bool good = reply->seq() == seq && reply->payload() != nullptr && reply->payload()->size() == size;
      for (size_t i = 0; good && i < size; ++i)
        good = reply->payload()->Get(static_cast<flatbuffers::uoffset_t>(i)) == echo::pattern(seq, i);
      if (!good) ++bad_reply;
    } else if (reply.status().code() == slotrpc::StatusCode::kUnavailable) {
      dead = true;  // stop issuing on this session; reconnect after the drain
    }
    done.fetch_add(1);
    issue();
    if (in_flight.fetch_sub(1) == 1) {
      std::lock_guard<std::mutex> lock(mu);
      cv.notify_all();
    }
  }

  // Fails the process when a call outlives its deadline by the margin.
  [[noreturn]] void hung(uint64_t seq, int64_t age_ns) {
    std::fprintf(stderr, "soak_client: VIOLATION call %llu outstanding for %lld ms (deadline %llu + margin %llu)\n",
                 static_cast<unsigned long long>(seq), static_cast<long long>(age_ns / 1000000),
                 static_cast<unsigned long long>(deadline_ms), static_cast<unsigned long long>(margin_ms));
    save();
    std::fflush(stderr);
    std::_Exit(4);
  }
  void watchdog(const std::atomic<bool>& stop) {
    uint64_t low = base;
    const int64_t limit = static_cast<int64_t>(deadline_ms + margin_ms) * 1000000;
    while (!stop.load()) {
      const uint64_t high = std::min(next.load(), total);
      while (low < high && answers[low - base].load() != 0) ++low;
      const int64_t now = now_ns();
      for (uint64_t s = low; s < high; ++s) {
        if (answers[s - base].load() != 0) continue;
        const int64_t t = started[s - base].load();
        if (t != 0 && now - t > limit) hung(s, now - t);
      }
      save();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  int run() {
    saved.load(state_path);
    saved.starts += 1;
    base = std::min(saved.done, total);
    next = base;
    t_start = Clock::now();
    start_seq = base;
    answers = std::vector<std::atomic<uint8_t>>(total - base);
    started = std::vector<std::atomic<int64_t>>(total - base);
    std::atomic<bool> stop{false};
    std::thread dog([&] { watchdog(stop); });

    slotrpc::Config cfg;
    cfg.slot_count = 16;
    cfg.slot_size = 4096;
    cfg.connect_timeout_ms = 2000;
    auto last_connected = Clock::now();
    int backoff_ms = 5;
    int rc = 0;
    while (next.load() < total) {
      auto ch = slotrpc::Channel::connect(address, cfg);
      if (!ch.ok()) {
        ++connect_failures;
        if (Clock::now() - last_connected > std::chrono::seconds(60)) {
          std::fprintf(stderr, "soak_client: VIOLATION no server for 60 s: %s\n", ch.status().to_string().c_str());
          rc = 5;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(backoff_ms));
        backoff_ms = std::min(backoff_ms * 2, 200);
        continue;
      }
      ++sessions;
      last_connected = Clock::now();
      backoff_ms = 5;
      EchoClient ec(**ch);
      client = &ec;
      dead = false;
      // Keep the window full (callbacks refill it too; this loop is what
      // issues when the pace held a callback back), until the session is
      // dead or every call is out, then until what is in flight has ended.
      for (;;) {
        // One count held while topping up, so the exit test below cannot
        // see zero while a call is being issued.
        in_flight.fetch_add(1);
        for (uint64_t i = in_flight.load() - 1; i < outstanding && !dead.load() && next.load() < total; ++i) issue();
        const bool all_out = dead.load() || next.load() >= total;
        in_flight.fetch_sub(1);
        std::unique_lock<std::mutex> lock(mu);
        if (all_out && in_flight.load() == 0) break;
        cv.wait_for(lock, std::chrono::milliseconds(1));
      }
      client = nullptr;
      ch.value().reset();  // the session's calls have all ended
    }
    stop = true;
    dog.join();
    save();
    const Counts c = snapshot();
    std::printf("soak_client: %s\n", c.text().c_str());
    if (c.twice != 0 || c.bad_reply != 0) rc = 3;
    return rc;
  }
};

}  // namespace

int main(int argc, char** argv) {
  auto soak = std::make_unique<Soak>();
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    bool ok = i + 1 < argc;
    if (ok && a == "--connect") {
      soak->address = argv[++i];
    } else if (ok && a == "--calls") {
      ok = parse(argv[++i], 1, 1'000'000'000, soak->total);
    } else if (ok && a == "--outstanding") {
      ok = parse(argv[++i], 1, 16, soak->outstanding);
    } else if (ok && a == "--size") {
      ok = parse(argv[++i], 0, 2048, soak->size);
    } else if (ok && a == "--deadline-ms") {
      ok = parse(argv[++i], 1, 600000, soak->deadline_ms);
    } else if (ok && a == "--margin-ms") {
      ok = parse(argv[++i], 1, 600000, soak->margin_ms);
    } else if (ok && a == "--rate") {
      ok = parse(argv[++i], 0, 100'000'000, soak->rate);
    } else if (ok && a == "--state") {
      soak->state_path = argv[++i];
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr,
                   "usage: soak_client --connect HOST:PORT --calls N --state FILE [--outstanding 1..16] "
                   "[--size 0..2048] [--deadline-ms MS] [--margin-ms MS] [--rate CALLS_PER_S]\n");
      return 2;
    }
  }
  if (soak->address.empty() || soak->state_path.empty() || soak->total == 0) {
    std::fprintf(stderr, "soak_client: --connect, --calls and --state are required\n");
    return 2;
  }
  return soak->run();
}
