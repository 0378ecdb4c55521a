// A fleet's endpoints: connected, ejected when their session dies and
// probed back with backoff, picked per call, and counted in stats() even
// after they left (fleet_health.cc watches their health).
#include "rpc/fleet/fleet.h"

#include <fmt/format.h>

#include <algorithm>
#include <random>
#include <utility>

#include "base/logging.h"
#include "slotrpc/health.h"

namespace slotrpc::fleet {

namespace {
// The same policy as a one-server channel's reconnects (channel_impl.h):
// the first probe after a failure waits kBase, each failure in a row
// doubles it up to kMax, with a random factor in [0.5, 1].
constexpr std::chrono::milliseconds kProbeBackoffBase{100};
constexpr std::chrono::milliseconds kProbeBackoffMax{10'000};
// How often the maintainer looks at its endpoints' sessions: the bound on
// noticing a dead session that no call noticed first.  Parked calls are
// looked at more often.
constexpr std::chrono::milliseconds kTick{100};
constexpr std::chrono::milliseconds kParkedTick{10};

// What only grows over a channel's life: summed over every endpoint the
// fleet ever had.
void add_counters(Channel::Stats& out, const Channel::Stats& s) {
  out.late_replies_dropped += s.late_replies_dropped;
  out.messages_sent += s.messages_sent;
  out.reconnect_attempts += s.reconnect_attempts;
  out.reconnects += s.reconnects;
  out.cross_loop_handoffs += s.cross_loop_handoffs;
  out.packs_sent += s.packs_sent;
  out.packed_requests += s.packed_requests;
  out.packs_received += s.packs_received;
  out.work_requests += s.work_requests;
  out.link_messages += s.link_messages;
}

// What is true now: summed over the endpoints that have it now.
void add_gauges(Channel::Stats& out, const Channel::Stats& s) {
  out.in_flight += s.in_flight;
  out.zombies += s.zombies;
  out.held_replies += s.held_replies;
  out.queued += s.queued;
  out.lent += s.lent;
}
}  // namespace

Result<std::shared_ptr<Fleet>> Fleet::start(std::unique_ptr<Resolver> resolver, Options options) {
  std::shared_ptr<Fleet> f(new Fleet(std::move(options)));
  f->snapshot_.store(std::make_shared<const Snapshot>());
  f->resolver_ = std::move(resolver);
  f->maintainer_ = std::thread([self = f] { self->maintain(); });
  std::weak_ptr<Fleet> weak = f;
  f->resolver_->start([weak](Result<std::vector<std::string>> update) {
    if (auto self = weak.lock()) self->on_update(std::move(update));
  });
  // The first answer, and one connect attempt per endpoint it names.
  const auto limit = std::chrono::milliseconds(f->opt_.connect_timeout_ms) + std::chrono::seconds(1);
  std::unique_lock<std::mutex> lock(f->mu_);
  const bool settled = f->cv_.wait_for(lock, limit, [&] {
    if (!f->have_update_) return !f->resolver_error_.ok();
    return std::all_of(f->slots_.begin(), f->slots_.end(), [](const auto& s) { return s.second.attempted; });
  });
  Status failed;
  if (!f->have_update_) {
    failed = !f->resolver_error_.ok()
                 ? f->resolver_error_
                 : Status(StatusCode::kUnavailable,
                          fmt::format("{}: the resolver gave no answer within {} ms (connect_timeout_ms)",
                                      f->opt_.target, f->opt_.connect_timeout_ms));
  } else if (settled && !f->slots_.empty() &&
             std::none_of(f->slots_.begin(), f->slots_.end(), [](const auto& s) { return s.second.live != nullptr; })) {
    std::string why;
    for (const auto& [address, slot] : f->slots_)
      why += fmt::format("{}{}: {}", why.empty() ? "" : "; ", address, slot.last_error.message());
    failed = Status(StatusCode::kUnavailable,
                    fmt::format("{}: no endpoint could be reached ({})", f->opt_.target, why));
  }
  lock.unlock();
  if (!failed.ok()) {
    f->close();
    return failed;
  }
  return f;
}

Fleet::~Fleet() { close(); }

void Fleet::close(bool may_block) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_) return;
    closing_ = true;
    cv_.notify_all();
  }
  // Outside the lock: the resolver waits for an update in progress, which
  // takes it.
  if (resolver_) resolver_->stop();
  if (maintainer_.joinable()) {
    if (!may_block || maintainer_.get_id() == std::this_thread::get_id()) {
      maintainer_.detach();
    } else {
      maintainer_.join();
    }
  }
  std::deque<Parked> parked;
  std::map<std::string, Slot> slots;
  {
    std::lock_guard<std::mutex> lock(mu_);
    parked.swap(parked_);
    slots.swap(slots_);
    snapshot_.store(std::make_shared<const Snapshot>());
    closed_ = true;
  }
  for (Parked& p : parked) finish_parked(p.call, Status(StatusCode::kCancelled, "channel closed"));
  // The endpoints' channels close as their last call lets go of them:
  // each fails its outstanding calls with CANCELLED.
}

void Fleet::on_update(Result<std::vector<std::string>> update) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closing_) return;
  if (!update.ok()) {
    // Keep the endpoints we have: a resolver that cannot answer for a while
    // (DNS down) should not take a working fleet down with it.
    resolver_error_ = update.status();
    cv_.notify_all();
    return;
  }
  resolver_error_ = Status();
  have_update_ = true;
  order_ = std::move(update.value());
  for (const std::string& a : order_) slots_.try_emplace(a);
  for (auto it = slots_.begin(); it != slots_.end();) {
    if (std::find(order_.begin(), order_.end(), it->first) == order_.end() && !it->second.connecting) {
      base::log().info("slotrpc: {}: endpoint {} left the resolver's list", opt_.target, it->first);
      if (it->second.live) retire_locked(std::move(it->second.live));
      it = slots_.erase(it);
    } else {
      ++it;
    }
  }
  publish_locked();
  cv_.notify_all();
}

void Fleet::publish_locked() {
  auto next = std::make_shared<Snapshot>();
  for (const std::string& a : order_) {
    auto it = slots_.find(a);
    if (it != slots_.end() && it->second.live) next->endpoints.push_back(it->second.live);
  }
  snapshot_.store(std::move(next));
}

std::chrono::milliseconds Fleet::backoff(uint32_t failures) {
  const uint32_t doublings = std::min<uint32_t>(failures == 0 ? 0 : failures - 1, 20);
  const auto delay = std::min<std::chrono::milliseconds>(kProbeBackoffMax, kProbeBackoffBase * (uint64_t{1} << doublings));
  const double factor = std::uniform_real_distribution<double>(0.5, 1.0)(jitter_);
  return std::chrono::duration_cast<std::chrono::milliseconds>(delay * factor);
}

void Fleet::eject_locked(Slot& slot, const Status& why) {
  if (!slot.live) return;
  ++slot.failures;
  const auto wait = backoff(slot.failures);
  slot.next_attempt = Clock::now() + wait;
  slot.last_error = why;
  base::log().warn("slotrpc: {}: endpoint {} ejected, probed again in {} ms: {}", opt_.target,
                   slot.live->address, wait.count(), why.message());
  retire_locked(std::move(slot.live));
  slot.live.reset();
  publish_locked();
}

void Fleet::retire_locked(std::shared_ptr<Endpoint> ep) {
  // Its watches would keep a call in flight there for good, and its calls
  // still out finish on its channel, which lives on here until then.
  ep->cancel_watches();
  retired_.push_back({std::move(ep), Clock::now()});
}

void Fleet::fold_retired() {
  // Each endpoint is counted once by stats() without a lock held across
  // the reads (which wait for the endpoints' loops, where a callback may be
  // calling stats() itself): stats() copies the list and the sum in one
  // critical section, and this adds an endpoint to the sum and takes it
  // off the list in one.
  std::vector<Retired> candidates;
  {
    std::lock_guard<std::mutex> lock(mu_);
    candidates = retired_;
  }
  if (candidates.empty()) return;
  // An endpoint whose calls are all over, or that has been gone long
  // enough that what it still does is noise: its counters join the sum and
  // its channel closes.
  constexpr auto kRetiredAtMost = std::chrono::seconds(10);
  const auto now = Clock::now();
  std::vector<std::pair<std::shared_ptr<Endpoint>, Channel::Stats>> done;
  for (const Retired& r : candidates) {
    const Channel::Stats s = r.ep->channel->stats();
    const bool idle = s.in_flight == 0 && s.queued == 0 && s.held_replies == 0 && s.lent == 0 && s.zombies == 0;
    if (idle || now - r.since >= kRetiredAtMost) done.emplace_back(r.ep, s);
  }
  if (done.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [ep, s] : done) {
    auto it = std::find_if(retired_.begin(), retired_.end(), [&](const Retired& r) { return r.ep == ep; });
    if (it == retired_.end()) continue;
    add_counters(retired_sum_, s);
    retired_.erase(it);
  }
}

void Fleet::report_failure(const std::shared_ptr<Endpoint>& ep, const Status& why) {
  // Only a dead session ejects: UNAVAILABLE from a handler is the
  // application's answer, and the endpoint serves other calls on.
  if (ep->failed.load() || !ep->channel->stats().closed) return;
  ep->failed.store(true);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = slots_.find(ep->address);
    if (it != slots_.end() && it->second.live == ep) eject_locked(it->second, why);
    cv_.notify_all();
  }
  if (resolver_) resolver_->refresh();
}

std::shared_ptr<Endpoint> Fleet::pick(const Endpoint* avoid, uint64_t service) {
  const std::shared_ptr<const Snapshot> snap = snapshot_.load(std::memory_order_acquire);
  const auto& eps = snap->endpoints;
  const size_t n = eps.size();
  if (n == 0) return nullptr;
  auto ok = [avoid, service](const std::shared_ptr<Endpoint>& e) { return e->usable(service) && e.get() != avoid; };
  switch (opt_.policy) {
    case LbPolicy::kPickFirst:
      for (const auto& e : eps)
        if (ok(e)) return e;
      break;
    case LbPolicy::kP2c: {
      if (n >= 2) {
        thread_local std::minstd_rand rng{std::random_device{}()};
        const size_t a = rng() % n;
        size_t b = rng() % (n - 1);
        if (b >= a) ++b;
        const bool ua = ok(eps[a]), ub = ok(eps[b]);
        if (ua && ub) {
          return eps[a]->outstanding.load(std::memory_order_relaxed) <=
                         eps[b]->outstanding.load(std::memory_order_relaxed)
                     ? eps[a]
                     : eps[b];
        }
        if (ua) return eps[a];
        if (ub) return eps[b];
      }
      [[fallthrough]];  // neither usable: any usable one, in turn
    }
    case LbPolicy::kRoundRobin: {
      // Past an unusable endpoint by taking the next turn, not the next
      // index: scanning on from a skipped one would give its successor
      // its turns too (2/3 of the calls on one of two, with one of three
      // NOT_SERVING).
      for (size_t i = 0; i < n; ++i) {
        const auto& e = eps[next_rr_.fetch_add(1, std::memory_order_relaxed) % n];
        if (ok(e)) return e;
      }
      break;
    }
  }
  // Only `avoid` is usable: a retry may go back to it.
  for (const auto& e : eps)
    if (e->usable(service)) return e;
  return nullptr;
}

void Fleet::maintain() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!closing_) {
    // Probes and first connects that are due, all at once, each on a
    // thread of its own (a connect blocks up to connect_timeout_ms).
    std::vector<std::string> due;
    const auto now = Clock::now();
    for (auto& [address, slot] : slots_) {
      if (!slot.live && !slot.connecting && now >= slot.next_attempt) {
        slot.connecting = true;
        due.push_back(address);
      }
    }
    if (!due.empty()) {
      lock.unlock();
      std::vector<Result<std::unique_ptr<Channel>>> results;
      results.reserve(due.size());
      for (size_t i = 0; i < due.size(); ++i) results.emplace_back(Status(StatusCode::kUnavailable, "not tried"));
      std::vector<std::thread> connects;
      for (size_t i = 0; i < due.size(); ++i)
        connects.emplace_back([this, &due, &results, i] { results[i] = opt_.connect(due[i]); });
      for (auto& t : connects) t.join();
      std::vector<std::shared_ptr<Endpoint>> fresh;
      lock.lock();
      for (size_t i = 0; i < due.size(); ++i) {
        auto it = slots_.find(due[i]);
        const bool wanted = it != slots_.end() &&
                            std::find(order_.begin(), order_.end(), due[i]) != order_.end() && !closing_;
        if (!wanted) {
          if (it != slots_.end()) slots_.erase(it);
          continue;  // the channel, if any, closes here
        }
        Slot& slot = it->second;
        slot.connecting = false;
        if (slot.attempted) ++probes_;
        if (results[i].ok()) {
          auto ep = std::make_shared<Endpoint>();
          ep->address = due[i];
          ep->channel = std::shared_ptr<Channel>(std::move(results[i].value()));
          if (slot.attempted) {
            ++reconnects_;
            base::log().info("slotrpc: {}: endpoint {} is back", opt_.target, due[i]);
          }
          slot.live = ep;
          slot.failures = 0;
          slot.last_error = Status();
          fresh.push_back(std::move(ep));
        } else {
          ++slot.failures;
          const auto wait = backoff(slot.failures);
          slot.next_attempt = Clock::now() + wait;
          slot.last_error = results[i].status();
          base::log().debug("slotrpc: {}: endpoint {} unreachable ({} in a row), next probe in {} ms: {}",
                            opt_.target, due[i], slot.failures, wait.count(), slot.last_error.message());
        }
        slot.attempted = true;
      }
      publish_locked();
      cv_.notify_all();  // start() may be waiting for these attempts
      lock.unlock();
      for (const auto& ep : fresh) watch_health(ep);
      settle_parked();
      lock.lock();
      continue;
    }
    // A session that died with no call on it (a drained or killed server
    // that this channel had stopped sending to).
    std::vector<std::shared_ptr<Endpoint>> live;
    for (auto& [address, slot] : slots_)
      if (slot.live) live.push_back(slot.live);
    lock.unlock();
    for (const auto& ep : live) {
      if (ep->channel->stats().closed)
        report_failure(ep, Status(StatusCode::kUnavailable, "its session closed"));
    }
    settle_parked();
    fold_retired();
    lock.lock();
    if (closing_) break;
    auto wake = Clock::now() + (parked_.empty() ? kTick : kParkedTick);
    for (auto& [address, slot] : slots_)
      if (!slot.live && !slot.connecting) wake = std::min(wake, slot.next_attempt);
    cv_.wait_until(lock, wake);
  }
}

std::vector<std::shared_ptr<Channel>> Fleet::channels() const {
  std::vector<std::shared_ptr<Channel>> out;
  // Held in a local: a range-for over a member of the temporary would
  // outlive it (C++20), and the snapshot may be replaced meanwhile.
  const auto snap = snapshot_.load();
  for (const auto& e : snap->endpoints) out.push_back(e->channel);
  return out;
}

Channel::Stats Fleet::stats() const {
  Channel::Stats out;
  const auto snap = snapshot_.load();
  out.closed = snap->endpoints.empty();
  for (const auto& e : snap->endpoints) {
    const Channel::Stats s = e->channel->stats();
    add_counters(out, s);
    add_gauges(out, s);
    out.free_slots += s.free_slots;
  }
  std::vector<std::shared_ptr<Endpoint>> retired;
  {
    std::lock_guard<std::mutex> lock(mu_);
    add_counters(out, retired_sum_);
    for (const Retired& r : retired_) retired.push_back(r.ep);
    // The fleet's own probes of ejected endpoints count as reconnects too.
    out.reconnect_attempts += probes_;
    out.reconnects += reconnects_;
  }
  // Endpoints that left, not yet folded: their counters, and the calls
  // still out there (they take no new ones: no free slots).
  for (const auto& e : retired) {
    const Channel::Stats s = e->channel->stats();
    add_counters(out, s);
    add_gauges(out, s);
  }
  return out;
}

TransportKind Fleet::transport() const {
  const auto snap = snapshot_.load();
  return snap->endpoints.empty() ? TransportKind::kAuto : snap->endpoints.front()->channel->transport();
}

std::string Fleet::describe(uint64_t service) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out = fmt::format("{} endpoint{}", order_.size(), order_.size() == 1 ? "" : "s");
  const char* sep = ": ";
  for (const std::string& a : order_) {
    auto it = slots_.find(a);
    std::string state = "connecting";
    if (it != slots_.end()) {
      const Slot& s = it->second;
      if (s.live && s.live->failed) state = "failed";
      else if (s.live && !s.live->serving) state = "NOT_SERVING";
      else if (s.live && (s.live->services_down.load() & service) != 0)
        state = "NOT_SERVING " + services_.at(static_cast<size_t>(__builtin_ctzll(service)));
      else if (s.live) state = "SERVING";
      else if (s.attempted) state = "ejected: " + s.last_error.message();
    }
    out += fmt::format("{}{} ({})", sep, a, state);
    sep = ", ";
  }
  if (!resolver_error_.ok()) out += "; resolver: " + resolver_error_.message();
  return out;
}

}  // namespace slotrpc::fleet
