// Shared by the tests of what a client sees when its server dies
// (client_failure_test, timeouts_test, verbs/verbs_failure_test):
//
//   * EchoServerProcess: examples/echo/echo_server (ECHO_SERVER) as a child
//     process that a test kills (SIGKILL), freezes (SIGSTOP, waited for until
//     /proc/PID/stat says 'T') or stops gracefully (SIGTERM -> Server::stop);
//   * Reissuer: an application-style client that keeps N calls in flight by
//     issuing the next call from each completion callback, the way
//     echo_client does, and counts how every call ended.
//
// Every wait is bounded; the child is killed and reaped even when a check
// fails.  The process plumbing (Child, waits, /proc) is process_util.h's.
#pragma once

#include <doctest/doctest.h>
#include <signal.h>
#include <slotrpc/slotrpc.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "payloads.h"
#include "process_util.h"

namespace failure_test {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// The echo example's method (examples/echo/echo_service.h).
constexpr uint32_t kEcho = slotrpc::method_id("slotrpc.examples.Echo.Echo");

// The echo example's request (tests/payloads.h).
using slotrpc::test_payloads::echo_request;

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

inline double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

using test_process::Child;
using test_process::cpu_ticks;
using test_process::process_state;
using test_process::read_file;
using test_process::SpawnOptions;
using test_process::wait_until;

struct TempDir : test_process::TempDir {
  TempDir() : test_process::TempDir("slotrpc-fail") {}
};

inline const char* binary(const char* env) {
  std::string error;
  const char* exe = test_process::binary_from_env(env, &error);
  REQUIRE_MESSAGE(exe != nullptr, error);
  return exe;
}

// echo_server --listen 127.0.0.1:0 --port-file <dir>/port, listening.
struct EchoServerProcess {
  TempDir dir;
  std::unique_ptr<Child> child;
  uint16_t port = 0;

  EchoServerProcess() {
    auto up = test_process::start_echo_server(dir.path, SpawnOptions::to_files(dir.path, "echo_server"), 20s);
    child = std::move(up.child);
    REQUIRE_MESSAGE(up.port != 0, up.error);
    port = up.port;
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
  pid_t pid() const { return child->pid; }

  // SIGKILL and reap.
  void kill() {
    REQUIRE(child->pid > 0);
    REQUIRE(child->signal(SIGKILL));
    int status = 0;
    REQUIRE_MESSAGE(child->wait(10000ms, &status), "echo_server was not reaped after SIGKILL");
    CHECK(WIFSIGNALED(status));
  }
  // SIGSTOP, and returns once the kernel reports the process stopped.
  Clock::time_point freeze() {
    REQUIRE(child->pid > 0);
    REQUIRE_MESSAGE(child->stop(10000ms), "echo_server did not stop after SIGSTOP");
    return Clock::now();
  }
  // SIGTERM: echo_server calls Server::stop and exits 0.
  void terminate() {
    REQUIRE(child->pid > 0);
    REQUIRE(child->signal(SIGTERM));
    int status = 0;
    REQUIRE_MESSAGE(child->wait(15000ms, &status), "echo_server did not exit after SIGTERM");
    CHECK(WIFEXITED(status));
    if (WIFEXITED(status)) CHECK(WEXITSTATUS(status) == 0);
  }
};

inline std::unique_ptr<slotrpc::Channel> connect(const std::string& address, slotrpc::Config cfg = {}) {
  auto ch = slotrpc::Channel::connect(address, cfg);
  REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
  return std::move(ch).value();
}

// Keeps `window` calls in flight by issuing the next call from each
// completion callback (on the channel's loop), also from failed ones, until
// `failures_to_reissue` calls have failed: so after the server's death the
// client goes on issuing into a dead channel for a while, as echo_client
// used to.  Every call's ending is counted per call.
class Reissuer {
 public:
  static constexpr uint64_t kMaxCalls = uint64_t{1} << 22;

  Reissuer(slotrpc::Channel& ch, size_t window, uint64_t failures_to_reissue,
           std::optional<std::chrono::milliseconds> timeout = std::nullopt, size_t payload = 32)
      : ch_(ch), window_(window), failures_to_reissue_(failures_to_reissue), timeout_(timeout),
        payload_(payload), ends_(new std::atomic<uint8_t>[kMaxCalls]()) {}

  // The first window, from the test's thread.  `out_` holds one extra count
  // meanwhile, so it cannot reach zero before the window is complete.
  void start() {
    out_.fetch_add(1);
    for (size_t i = 0; i < window_; ++i) issue();
    out_.fetch_sub(1);
  }

  uint64_t ok() const { return ok_.load(); }
  uint64_t failures() const { return unavailable_.load() + deadline_.load() + other_.load(); }
  // The run is over: it failed enough and nothing is out (no callback can
  // issue again).
  bool finished() const { return failures() >= failures_to_reissue_ && out_.load() == 0; }
  Clock::time_point last_ok() const { return Clock::time_point(Clock::duration(last_ok_.load())); }
  Clock::time_point first_unavailable_at() const {
    return Clock::time_point(Clock::duration(first_unavailable_at_.load()));
  }
  std::string first_unavailable() {
    std::lock_guard<std::mutex> lock(mu_);
    return first_unavailable_;
  }

  // Every call issued ended exactly once, with OK before the death and
  // UNAVAILABLE or DEADLINE_EXCEEDED after; no callback ran inside another.
  void check_every_call_ended_once() {
    const uint64_t n = issued_.load();
    REQUIRE(n < kMaxCalls);
    uint64_t missing = 0, twice = 0;
    for (uint64_t i = 0; i < n; ++i) {
      const uint8_t e = ends_[i].load();
      if (e == 0) ++missing;
      if (e > 1) ++twice;
    }
    INFO("issued " << n << ", ok " << ok_ << ", unavailable " << unavailable_ << ", deadline "
                   << deadline_ << ", other " << other_ << " (first: " << first_other_ << ")");
    CHECK(missing == 0);
    CHECK(twice == 0);
    CHECK(ok_ + unavailable_ + deadline_ + other_ == n);
    CHECK(other_ == 0);
    CHECK(unavailable_ >= 1);
    CHECK(failures() >= failures_to_reissue_);
    // A callback that ran inside the call issued by another callback would
    // show as depth 2 (before the fix: ~36,000, then a stack overflow).
    CHECK(max_depth_.load() == 1);
  }
  uint64_t deadline_exceeded() const { return deadline_.load(); }
  uint64_t unavailable() const { return unavailable_.load(); }

 private:
  void issue() {
    const uint64_t idx = issued_.fetch_add(1);
    if (idx >= kMaxCalls) return;  // check_every_call_ended_once() reports it
    out_.fetch_add(1);
    slotrpc::CallOptions o;
    if (timeout_) o = slotrpc::CallOptions::with_timeout(*timeout_);
    slotrpc::raw::call(ch_, kEcho, echo_request(idx, payload_), o,
             [this, idx](slotrpc::RawReply&& r) { done(idx, r.status()); });
  }

  void done(uint64_t idx, const slotrpc::Status& st) {
    static thread_local int depth = 0;
    ++depth;
    int seen = max_depth_.load();
    while (depth > seen && !max_depth_.compare_exchange_weak(seen, depth)) {
    }
    ends_[idx].fetch_add(1);
    const int64_t now = Clock::now().time_since_epoch().count();
    switch (st.code()) {
      case slotrpc::StatusCode::kOk:
        ++ok_;
        last_ok_.store(now);
        break;
      case slotrpc::StatusCode::kUnavailable:
        if (unavailable_++ == 0) {
          first_unavailable_at_.store(now);
          std::lock_guard<std::mutex> lock(mu_);
          first_unavailable_ = st.to_string();
        }
        break;
      case slotrpc::StatusCode::kDeadlineExceeded:
        ++deadline_;
        break;
      default:
        if (other_++ == 0) {
          std::lock_guard<std::mutex> lock(mu_);
          first_other_ = st.to_string();
        }
        break;
    }
    if (failures() < failures_to_reissue_) issue();
    --depth;
    out_.fetch_sub(1);
  }

  slotrpc::Channel& ch_;
  const size_t window_;
  const uint64_t failures_to_reissue_;
  const std::optional<std::chrono::milliseconds> timeout_;
  const size_t payload_;
  std::unique_ptr<std::atomic<uint8_t>[]> ends_;
  std::atomic<uint64_t> issued_{0}, out_{0}, ok_{0}, unavailable_{0}, deadline_{0}, other_{0};
  std::atomic<int> max_depth_{0};
  std::atomic<int64_t> last_ok_{0}, first_unavailable_at_{0};
  std::mutex mu_;
  std::string first_unavailable_, first_other_;
};

}  // namespace failure_test
