// Admission control of a Server: how many sessions and how many bytes of
// ring memory it holds, and the log lines an attacker must not be able to
// multiply.
//
// The acceptor reserves a session's share before the session is created
// (so two handshakes finishing at once cannot both take the last place),
// and the event loop gives it back when the session is destroyed or its
// setup fails.  Not on the hot path: once per session, under a mutex.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

#include "slotrpc/config.h"
#include "slotrpc/status.h"

namespace slotrpc::rpc {

// The ring-memory budget SLOTRPC_MAX_RING_MEMORY resolves to, and the rule
// that produced it (for the refusal message and the start-up log line).
struct RingBudget {
  uint64_t bytes = 0;
  std::string rule;  // "SLOTRPC_MAX_RING_MEMORY = 1048576" or "auto: ..."
};

// Config::max_ring_memory, or for 0 (auto) a quarter of physical memory,
// capped by RLIMIT_MEMLOCK when `verbs_possible` and that limit is finite.
RingBudget resolve_ring_budget(const Config& config, bool verbs_possible);

// "8388608 bytes" or "unlimited": the current RLIMIT_MEMLOCK, for messages.
std::string memlock_limit_text();
// The current soft RLIMIT_NOFILE, for messages.
std::string nofile_limit_text();

class Admission {
 public:
  Admission(uint32_t max_sessions, RingBudget ring_budget)
      : max_sessions_(max_sessions), budget_(std::move(ring_budget)) {}

  // Any thread.  Takes one session and `ring_bytes`, or RESOURCE_EXHAUSTED
  // naming the limit that is reached and its value.
  Status reserve(uint64_t ring_bytes);
  // Any thread.  Gives back what reserve() took.
  void release(uint64_t ring_bytes);

  uint32_t sessions() const;
  uint64_t ring_bytes() const;
  const RingBudget& budget() const { return budget_; }

 private:
  const uint32_t max_sessions_;
  const RingBudget budget_;
  mutable std::mutex mu_;
  uint32_t sessions_ = 0;
  uint64_t ring_bytes_ = 0;
};

// A warning that a peer can trigger at will (a junk connection, a refused
// session) is logged at most once per second per limiter; the next line
// says how many were left out.  Thread-safe.
class RateLimitedLog {
 public:
  explicit RateLimitedLog(std::chrono::milliseconds interval = std::chrono::seconds(1))
      : interval_(interval) {}
  void warn(const std::string& line);

 private:
  const std::chrono::milliseconds interval_;
  std::mutex mu_;
  std::chrono::steady_clock::time_point last_{};
  uint64_t suppressed_ = 0;
};

}  // namespace slotrpc::rpc
