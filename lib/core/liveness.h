// When a session pings its peer, and when it declares the peer dead: the
// same rule on both ends (docs/protocol.md, "Liveness").
#pragma once

#include <chrono>
#include <string>

#include <fmt/format.h>

#include "core/session_base.h"
#include "slotrpc/config.h"

namespace slotrpc::core {

class Liveness {
 public:
  enum class Verdict { kQuiet, kPing, kDead };

  explicit Liveness(Clock::time_point now) : last_heard_(now) {}
  void heard(Clock::time_point now) { last_heard_ = now; }
  Clock::time_point last_heard() const { return last_heard_; }

  Verdict check(Clock::time_point now, const Config& cfg) const {
    const auto silent = now - last_heard_;
    if (silent >= std::chrono::milliseconds(cfg.peer_timeout_ms)) return Verdict::kDead;
    if (silent >= std::chrono::milliseconds(cfg.keepalive_ms)) return Verdict::kPing;
    return Verdict::kQuiet;
  }

  std::string dead_reason(Clock::time_point now, const Config& cfg, const std::string& peer) const {
    return fmt::format("peer {} silent for {} ms (peer_timeout_ms = {})", peer,
                       std::chrono::duration_cast<std::chrono::milliseconds>(now - last_heard_).count(),
                       cfg.peer_timeout_ms);
  }

 private:
  Clock::time_point last_heard_;
};

}  // namespace slotrpc::core
