// When a session pings its peer, and when it declares the peer dead: the
// same rule on both ends (docs/protocol.md, "Liveness").
//
// Timing: the session's liveness timer is armed for the moment something is
// due -- the next PING or the peer's death, whichever comes first, counted
// from when the peer was last heard -- not on a fixed period.  So a frozen
// peer is declared dead peer_timeout_ms after it was last heard (plus the
// loop's timer tick), not up to keepalive_ms later.  Hearing costs no clock
// read on the hot path: a message marks its session (Reactor::heard), the
// reactor stamps SessionBase::last_heard once the turn's completions have
// been handed out, with the clock read it makes for its timers anyway, so
// "last heard" is never earlier than the handling of what was heard (a
// caller that saw a reply knows the peer's death is at least
// peer_timeout_ms away).  Nothing is re-armed per message; a timer that
// fires and finds the peer heard since simply re-arms for the new due time.
#pragma once

#include <algorithm>
#include <chrono>
#include <string>

#include <fmt/format.h>

#include "core/session_base.h"
#include "core/wire_format.h"
#include "slotrpc/config.h"

namespace slotrpc::core {

class Liveness {
 public:
  enum class Verdict { kQuiet, kPing, kDead };

  // `last_heard` is the session's SessionBase::last_heard, which the
  // reactor stamps; it outlives this object (both are the session's).
  Liveness(Clock::time_point& last_heard, Clock::time_point now) : last_heard_(last_heard) {
    last_heard_ = now;
  }
  // Off the message path (a link that just came up, say).
  void heard(Clock::time_point now) { last_heard_ = std::max(last_heard_, now); }
  Clock::time_point last_heard() const { return last_heard_; }

  Verdict check(Clock::time_point now, const Config& cfg) const {
    const auto silent = now - last_heard_;
    if (silent >= std::chrono::milliseconds(cfg.peer_timeout_ms)) return Verdict::kDead;
    if (silent >= std::chrono::milliseconds(cfg.keepalive_ms)) return Verdict::kPing;
    return Verdict::kQuiet;
  }

  // When the liveness timer should fire next, seen from `now`: while the
  // peer was heard within keepalive_ms, when that silence reaches
  // keepalive_ms (a PING is due); once silent longer (a PING just went), the
  // next PING keepalive_ms on (the peer may have lost the last one) or the
  // peer's death, whichever comes first.  Never before `now`.
  Clock::time_point next_check(Clock::time_point now, const Config& cfg) const {
    const auto keepalive = std::chrono::milliseconds(cfg.keepalive_ms);
    const Clock::time_point death = last_heard_ + std::chrono::milliseconds(cfg.peer_timeout_ms);
    const Clock::time_point ping = now - last_heard_ < keepalive ? last_heard_ + keepalive : now + keepalive;
    return std::max(now, std::min(ping, death));
  }

  // What a session's liveness timer does when it fires, the same on both
  // ends: `ping()` when a PING is due; the reason when the peer is dead
  // (the session then closes with it and does not re-arm); otherwise
  // nothing.  Empty: the session re-arms (next_check).
  //
  // `listening` is the link's Link::listening(): false while this side
  // has paused reading from the peer (its output for the peer is backed
  // up).  The peer may be talking all along, so that silence counts as
  // heard, and no PING joins the backed-up output; the link's own clock
  // closes a peer that reads nothing (a flooding peer was otherwise
  // called "silent" whenever that clock came second).
  template <typename Ping>
  std::string on_timer(Clock::time_point now, const Config& cfg, const std::string& peer, bool listening,
                       Ping&& ping) {
    if (!listening) {
      heard(now);
      return {};
    }
    switch (check(now, cfg)) {
      case Verdict::kDead:
        return dead_reason(now, cfg, peer);
      case Verdict::kPing:
        ping();
        break;
      case Verdict::kQuiet:
        break;
    }
    return {};
  }

  std::string dead_reason(Clock::time_point now, const Config& cfg, const std::string& peer) const {
    return fmt::format("peer {} silent for {} ms (peer_timeout_ms = {})", peer,
                       std::chrono::duration_cast<std::chrono::milliseconds>(now - last_heard_).count(),
                       cfg.peer_timeout_ms);
  }

 private:
  Clock::time_point& last_heard_;
};

// The liveness timer of a session, one copy for both ends.  `S` (a
// ClientSession or ServerSession, which befriend this) has loop_,
// liveness_, keepalive_timer_, closed_, peer_, link_, send_control(), and
// peer_dead(reason), which ends the session its own way.
template <class S>
struct KeepaliveTimer {
  // Schedules the next check (Liveness::next_check) on the session's loop.
  static void arm(S* s) {
    s->keepalive_timer_ = s->loop_.timers().add(s->liveness_.next_check(Clock::now(), s->loop_.config()),
                                                &KeepaliveTimer::fire, s, 0);
  }
  // The timer's callback: a PING when one is due, the end of the session
  // when the peer is dead (no re-arm then), otherwise the next check.
  static void fire(void* self_ptr, uint64_t) {
    auto* self = static_cast<S*>(self_ptr);
    self->keepalive_timer_ = 0;
    if (self->closed_) return;
    const bool listening = self->link_ == nullptr || self->link_->listening();
    std::string dead = self->liveness_.on_timer(Clock::now(), self->loop_.config(), self->peer_, listening,
                                                [self] { self->send_control(Kind::kPing, 0, 0, 0); });
    if (!dead.empty()) return self->peer_dead(std::move(dead));
    arm(self);
  }
};

}  // namespace slotrpc::core
