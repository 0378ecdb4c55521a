#include "transport/verbs/monitor.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "base/logging.h"
#include "transport/verbs/device.h"
#include "transport/verbs/verbs_transport.h"

namespace slotrpc::monitor {

namespace {

// The registry of PortSamplers: created by the first loop that asks, found
// by the others, gone with the last (weak references).  Cold path: once per
// loop that starts using verbs.
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, std::weak_ptr<PortSampler>>& registry() {
  static auto* r = new std::map<std::string, std::weak_ptr<PortSampler>>;  // outlives static destruction
  return *r;
}

std::string_view kind_words(HwCounter::Kind kind) {
  switch (kind) {
    case HwCounter::Kind::kRnr: return "receiver-not-ready NAKs";
    case HwCounter::Kind::kRetry: return "transport retries";
    case HwCounter::Kind::kSequence: return "sequence errors";
    case HwCounter::Kind::kCongestion: return "congestion notifications";
    case HwCounter::Kind::kOther: return "";
  }
  return "";
}

bool warns(HwCounter::Kind kind) {
  return kind == HwCounter::Kind::kRnr || kind == HwCounter::Kind::kRetry ||
         kind == HwCounter::Kind::kSequence;
}

}  // namespace

std::string advice(HwCounter::Kind kind, const Config& c) {
  switch (kind) {
    case HwCounter::Kind::kRnr:
      return fmt::format(
          "a message found no receive posted at its receiver, which NAKed it and made the sender "
          "wait and retry. slotrpc's credits keep a receive posted for every message, so a receive "
          "queue is too short or not reposted in time: raise the receive depth (SLOTRPC_SRQ_DEPTH "
          "= {}; each session reserves 3 x slot_count + 16), lower SLOTRPC_SLOT_COUNT (= {}) or "
          "spread sessions over more SLOTRPC_REACTOR_THREADS (= {}); a peer outside slotrpc must "
          "repost its receives. The sender waits SLOTRPC_MIN_RNR_TIMER (= {}) before each retry, "
          "SLOTRPC_RNR_RETRY (= {}) times (7: forever)",
          c.srq_depth, c.slot_count, c.reactor_threads, c.min_rnr_timer, c.rnr_retry);
    case HwCounter::Kind::kRetry:
      return fmt::format(
          "a packet or its ACK was lost or late and the sender retransmitted after the ACK "
          "timeout: check the fabric (link errors, drops, congestion, PFC); raise "
          "SLOTRPC_QP_TIMEOUT (= {}: 4.096 us x 2^N) for a slow or distant peer; after "
          "SLOTRPC_RETRY_COUNT (= {}) retries a send fails",
          c.qp_timeout, c.retry_count);
    case HwCounter::Kind::kSequence:
      return fmt::format(
          "packets arrived out of order, twice, or after a gap (a loss upstream, then a "
          "retransmission): check the fabric for drops; the retry counters show whether the ACK "
          "timeout (SLOTRPC_QP_TIMEOUT = {}) fired",
          c.qp_timeout);
    case HwCounter::Kind::kCongestion:
    case HwCounter::Kind::kOther:
      return {};
  }
  return {};
}

// ---------------------------------------------------------------- PortSampler

std::shared_ptr<PortSampler> PortSampler::acquire(const std::string& device, uint32_t port,
                                                  const std::string& sysfs_root) {
  const std::string key = sysfs_root + "\n" + device + "\n" + std::to_string(port);
  std::lock_guard lock(registry_mutex());
  auto& slot = registry()[key];
  if (auto existing = slot.lock()) return existing;
  std::shared_ptr<PortSampler> s(new PortSampler(key, device, port));
  auto opened = PortCounters::open(device, port, sysfs_root);
  if (opened.ok()) {
    s->counters_ = std::move(opened.value());
    for (const auto& e : s->counters_->errors()) base::log().warn("slotrpc: monitor: {}", e);
    s->last_ = Clock::now();
    s->sequence_ = 1;
  } else {
    base::log().warn("slotrpc: monitor: no hardware counters for {} port {}: {}", device, port,
                     opened.status().message());
  }
  slot = s;
  return s;
}

PortSampler::~PortSampler() {
  std::lock_guard lock(registry_mutex());
  auto it = registry().find(key_);
  // A new sampler for the same key may already be registered (the last
  // owner of this one went away while another loop acquired a fresh one).
  if (it != registry().end() && it->second.expired()) registry().erase(it);
}

bool PortSampler::maybe_sample(Clock::time_point now, std::chrono::milliseconds interval,
                               const Config& config) {
  std::lock_guard lock(mu_);
  if (!counters_) return false;
  // 0.9 x interval: the loop that read last comes back after one interval
  // (a little later, never earlier), so it always reads again; a loop whose
  // timer is out of phase by less than that reuses the reading.
  if (now - last_ < interval * 9 / 10) return false;
  const Clock::duration since = now - last_;
  for (const auto& e : counters_->sample(now)) base::log().warn("slotrpc: monitor: {}", e);
  last_ = now;
  ++sequence_;
  for (const HwCounter& c : counters_->counters()) {
    if (c.delta != 0 && warns(c.kind)) warn(c, since, config);
  }
  return true;
}

void PortSampler::warn(const HwCounter& c, Clock::duration since, const Config& config) {
  ++warnings_;
  base::log().warn("slotrpc: RDMA {} port {}: {} rose by {} in {} ms ({}): {}", device_, port_, c.name,
                   c.delta, std::chrono::duration_cast<std::chrono::milliseconds>(since).count(),
                   kind_words(c.kind), advice(c.kind, config));
}

PortSampler::Reading PortSampler::reading() const {
  std::lock_guard lock(mu_);
  Reading r;
  if (!counters_) return r;
  r.counters = counters_->counters();
  r.absent = counters_->absent();
  r.when = last_;
  r.sequence = sequence_;
  return r;
}

uint64_t PortSampler::warnings() const {
  std::lock_guard lock(mu_);
  return warnings_;
}

// ----------------------------------------------------------------- SampleHook

namespace {
// The hook whose callback runs on this thread (nested calls of different
// hooks: a callback that triggers another's sample is not a thing, but
// saved and restored all the same).  close() must not wait for itself.
thread_local const SampleHook* t_calling = nullptr;
}  // namespace

void SampleHook::set(Fn fn) {
  auto p = fn ? std::make_shared<const Fn>(std::move(fn)) : nullptr;
  std::lock_guard lock(mu_);
  if (!closed_) fn_ = std::move(p);
}

bool SampleHook::empty() const {
  std::lock_guard lock(mu_);
  return fn_ == nullptr;
}

void SampleHook::call(const MetricsSnapshot& snapshot) const {
  std::shared_ptr<const Fn> fn;
  {
    std::lock_guard lock(mu_);
    if (fn_ == nullptr) return;
    fn = fn_;
    ++running_;
  }
  struct Done {  // also when the callback throws
    const SampleHook* self;
    const SampleHook* outer = t_calling;
    ~Done() {
      t_calling = outer;
      std::lock_guard lock(self->mu_);
      if (--self->running_ == 0) self->idle_.notify_all();
    }
  } done{this};
  t_calling = this;
  (*fn)(snapshot);
}

void SampleHook::close() {
  std::unique_lock lock(mu_);
  closed_ = true;
  fn_ = nullptr;
  const int mine = t_calling == this ? 1 : 0;
  idle_.wait(lock, [&] { return running_ <= mine; });
}

// -------------------------------------------------------------------- Monitor

Monitor::Monitor(base::TimerHeap& timers, std::string loop_name, const Config& config,
                 transport::verbs::VerbsTransport& verbs, std::shared_ptr<SampleHook> hook,
                 std::string sysfs_root)
    : timers_(timers),
      loop_name_(std::move(loop_name)),
      config_(config),
      verbs_(verbs),
      hook_(std::move(hook)),
      sampler_(PortSampler::acquire(verbs.device().name(), verbs.device().port(), sysfs_root)),
      interval_(config_.monitor_interval_ms) {
  // The baseline: this loop's deltas start from the sampler's reading now.
  PortSampler::Reading r = sampler_->reading();
  hw_ = std::move(r.counters);
  for (auto& c : hw_) {
    c.delta = 0;
    c.per_second = 0;
  }
  absent_ = std::move(r.absent);
  hw_when_ = r.when;
  hw_sequence_ = r.sequence;
  arm();
}

Monitor::~Monitor() { timers_.cancel(timer_); }

void Monitor::arm() {
  timer_ = timers_.add(Clock::now() + interval_, &Monitor::on_timer, this, 0);
}

void Monitor::on_timer(void* self, uint64_t) {
  auto* m = static_cast<Monitor*>(self);
  m->timer_ = 0;
  m->arm();  // first: a tick that throws must not stop the monitor
  m->tick();
}

void Monitor::tick(Clock::time_point now) {
  ++ticks_;
  sampler_->maybe_sample(now, interval_, config_);
  PortSampler::Reading r = sampler_->reading();
  if (r.sequence != hw_sequence_) {
    // A reading this loop has not seen: growth since this loop's previous
    // one (a counter that went backwards was reset: it counts from 0).
    const double seconds = std::chrono::duration<double>(r.when - hw_when_).count();
    for (size_t i = 0; i < r.counters.size(); ++i) {
      HwCounter& now_c = r.counters[i];
      const HwCounter* before = i < hw_.size() && hw_[i].name == now_c.name ? &hw_[i] : nullptr;
      if (before == nullptr || hw_sequence_ == 0) {
        now_c.delta = 0;
      } else {
        now_c.delta = now_c.value >= before->value ? now_c.value - before->value : now_c.value;
      }
      now_c.per_second = seconds > 0 ? static_cast<double>(now_c.delta) / seconds : 0.0;
    }
    hw_ = std::move(r.counters);
    absent_ = std::move(r.absent);
    hw_when_ = r.when;
    hw_sequence_ = r.sequence;
  } else {
    // Nothing new: no growth seen since this loop's previous tick.
    for (auto& c : hw_) {
      c.delta = 0;
      c.per_second = 0;
    }
  }

  std::vector<transport::verbs::VerbsTransport::ReceiveQueueInfo> queues;
  verbs_.receive_queues(queues);
  pools_.clear();
  for (auto& q : queues) {
    pools_.push_back(ReceivePool{loop_name_, std::move(q.queue), q.capacity, q.posted, q.low_water});
  }

  if (hook_ && !hook_->empty()) {
    MetricsSnapshot s;
    s.taken = std::chrono::system_clock::now();
    fill(s);
    hook_->call(s);
  }
}

void Monitor::fill(MetricsSnapshot& out) const {
  const std::string& dev = sampler_->device();
  const uint32_t port = sampler_->port();
  const bool have = std::any_of(out.hw_counters.begin(), out.hw_counters.end(), [&](const HwCounter& c) {
    return c.device == dev && c.port == port;
  });
  if (!have) {
    out.hw_counters.insert(out.hw_counters.end(), hw_.begin(), hw_.end());
    for (const auto& a : absent_) {
      if (std::find(out.hw_counters_absent.begin(), out.hw_counters_absent.end(), a) ==
          out.hw_counters_absent.end())
        out.hw_counters_absent.push_back(a);
    }
  }
  out.receive_pools.insert(out.receive_pools.end(), pools_.begin(), pools_.end());
}

}  // namespace slotrpc::monitor
