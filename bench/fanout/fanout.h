// The fan-out benchmark's seams: each system (slotrpc over
// TCP or shared memory, gRPC) serves the four roles and offers a load
// target; fanout_main.cc drives them all through the same open-loop loop.
// No generated header here: the slotrpc and the gRPC side each compile the
// schema on their own (their FlatBuffers-gRPC and slotrpc headers never meet).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace bench::fanout {

using Clock = std::chrono::steady_clock;

// One load step's requests, shared by the loader and every call in flight
// (a shared_ptr each): a reply that arrives after the loader gave up on the
// step still writes into live memory.
class StepState {
 public:
  StepState(uint64_t n, Clock::time_point start) : n_(n), start_(start), latency_ns_(new std::atomic<uint64_t>[n]) {
    for (uint64_t i = 0; i < n; ++i) latency_ns_[i].store(0, std::memory_order_relaxed);
  }

  // Request i, due at `due`, is over: `error` empty when it succeeded.
  // Called once per request, from whichever thread completes it.
  void complete(uint64_t i, Clock::time_point due, const std::string& error) {
    const auto now = Clock::now();
    if (error.empty()) {
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now - due).count();
      latency_ns_[i].store(ns > 0 ? static_cast<uint64_t>(ns) : 1, std::memory_order_relaxed);
    } else if (failed_.fetch_add(1, std::memory_order_relaxed) == 0) {
      std::lock_guard<std::mutex> lock(mu_);
      first_error_ = error;
    }
    const uint64_t since = static_cast<uint64_t>((now - start_).count());
    uint64_t last = last_ns_.load(std::memory_order_relaxed);
    while (since > last && !last_ns_.compare_exchange_weak(last, since, std::memory_order_relaxed)) {
    }
    done_.fetch_add(1, std::memory_order_release);
  }

  uint64_t done() const { return done_.load(std::memory_order_acquire); }
  uint64_t failed() const { return failed_.load(std::memory_order_relaxed); }
  // Due time to reply, 0 for a request that failed or is still out.
  uint64_t latency_ns(uint64_t i) const { return latency_ns_[i].load(std::memory_order_relaxed); }
  // From the step's start to the last completion.
  std::chrono::nanoseconds elapsed() const { return std::chrono::nanoseconds(last_ns_.load(std::memory_order_relaxed)); }
  std::string first_error() {
    std::lock_guard<std::mutex> lock(mu_);
    return first_error_;
  }

 private:
  const uint64_t n_;
  const Clock::time_point start_;
  std::unique_ptr<std::atomic<uint64_t>[]> latency_ns_;
  std::atomic<uint64_t> done_{0}, failed_{0}, last_ns_{0};
  std::mutex mu_;
  std::string first_error_;
};

// The client side of one system: one connection to the frontend.
class LoadTarget {
 public:
  virtual ~LoadTarget() = default;
  // Sends Home(user_of(i)) with `deadline`; on its reply, error or deadline
  // calls state->complete(i, due, ...) from any thread.  Never blocks on
  // the reply: the loader keeps its schedule.
  virtual void issue(uint64_t i, Clock::time_point due, std::chrono::milliseconds deadline,
                     const std::shared_ptr<StepState>& state) = 0;
};

// slotrpc (fanout_slotrpc.cc).  The transport comes from SLOTRPC_TRANSPORT,
// which the caller sets for its children too; connect fails unless the
// channel really runs on `transport`.
std::unique_ptr<LoadTarget> slotrpc_target(const std::string& address, const std::string& transport,
                                           std::string& error);
// Serves `role` (timeline, posts, media, or frontend calling `backends`,
// three addresses) until SIGTERM; writes its port to `port_file`.
int serve_slotrpc(const std::string& role, const std::vector<std::string>& backends, const std::string& port_file);

// gRPC (grpc/fanout_grpc.cc, or fanout_grpc_missing.cc without grpc++).
bool grpc_available();
std::unique_ptr<LoadTarget> grpc_target(const std::string& address, std::string& error);
int serve_grpc(const std::string& role, const std::vector<std::string>& backends, const std::string& port_file);

}  // namespace bench::fanout
