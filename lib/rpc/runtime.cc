#include "slotrpc/runtime.h"

#include <fmt/format.h>

#include <atomic>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "base/logging.h"
#include "rpc/runtime_core.h"
#include "rpc/loop_transports.h"

namespace slotrpc {
namespace detail {

namespace {

// The loop settings, by name: everything the reactor, its transports and the
// sessions on it read from the loop's config (grep loop_.config() and
// Reactor::config_).  Keep in step with docs/tuning.md's "Runtimes and
// shared loops".
template <class Fn>
void for_each_loop_setting(Fn&& fn) {
  fn("poll_mode", &Config::poll_mode);
  fn("spin_us", &Config::spin_us);
  fn("spin_max_us", &Config::spin_max_us);
  fn("busy_yield_us", &Config::busy_yield_us);
  fn("busy_sleep_us", &Config::busy_sleep_us);
  fn("poll_batch", &Config::poll_batch);
  fn("fiber_stack_kb", &Config::fiber_stack_kb);
  fn("keepalive_ms", &Config::keepalive_ms);
  fn("peer_timeout_ms", &Config::peer_timeout_ms);
  fn("max_queued_calls", &Config::max_queued_calls);
  fn("monitor_interval_ms", &Config::monitor_interval_ms);
  fn("device", &Config::device);
  fn("device_port", &Config::device_port);
  fn("gid_index", &Config::gid_index);
  fn("traffic_class", &Config::traffic_class);
  fn("service_level", &Config::service_level);
  fn("relaxed_ordering", &Config::relaxed_ordering);
  fn("qp_timeout", &Config::qp_timeout);
  fn("retry_count", &Config::retry_count);
  fn("rnr_retry", &Config::rnr_retry);
  fn("min_rnr_timer", &Config::min_rnr_timer);
  fn("inline_bytes", &Config::inline_bytes);
  fn("srq", &Config::srq);
  fn("srq_depth", &Config::srq_depth);
}

// The default runtimes, one per side (runtime_core.h, default_core).
std::once_flag g_default_once[2];
std::shared_ptr<RuntimeCore> g_default[2];  // destroyed at exit: their loops stop then
std::atomic<bool> g_default_made[2] = {false, false};

}  // namespace

std::string loop_setting_difference(const Config& a, const Config& b) {
  std::string first;
  for_each_loop_setting([&](const char* name, auto member) {
    if (first.empty() && !(a.*member == b.*member)) first = name;
  });
  return first;
}

void take_loop_settings(Config& into, const Config& from) {
  for_each_loop_setting([&](const char*, auto member) { into.*member = from.*member; });
}

Result<std::shared_ptr<RuntimeCore>> RuntimeCore::make(const Config& validated, const std::string& prefix,
                                                       bool numbered) {
  // The deleter: the last reference may be dropped by a task on one of the
  // loops (a CallHandle's cancel, a reconnect result).  A loop cannot join
  // itself, so then the loops are stopped from a thread of their own.
  auto deleter = [](RuntimeCore* core) {
    if (core->current_index() >= 0) {
      std::thread([core] { delete core; }).detach();
    } else {
      delete core;
    }
  };
  std::shared_ptr<RuntimeCore> core(new RuntimeCore, deleter);
  core->config = validated;
  const uint32_t n = validated.reactor_threads;
  core->keep_until_stop.resize(n);
  core->orphans.resize(n);
  try {
    for (uint32_t i = 0; i < n; ++i) {
      core->loops.push_back(std::make_shared<reactor::Reactor>(validated, numbered ? fmt::format("{}{}", prefix, i) : prefix));
      // Every loop has TCP from the start (connect and accept hand it
      // sockets from other threads); verbs and shm come with their first
      // session (rpc/loop_transports.h).
      rpc::loop_tcp(*core->loops.back());
    }
  } catch (const std::exception& e) {
    return Status(StatusCode::kResourceExhausted, fmt::format("slotrpc runtime: {}", e.what()));
  }
  // Caller turns (reactor/caller_turns.cc) until a server starts on these
  // loops (Server::start takes them away: handler fibers must never change
  // threads).  Not where a loop sleeps at once (blocking, or adaptive with
  // spin_us 0): its user asked for no spinning, and a caller's turns spin.
  const bool spins = validated.poll_mode == PollMode::kBusy ||
                     (validated.poll_mode == PollMode::kAdaptive && validated.spin_us != 0);
  for (auto& loop : core->loops) {
    loop->allow_caller_turns(spins);
    loop->start();
  }
  return core;
}

RuntimeCore::~RuntimeCore() {
  for (auto& loop : loops) loop->stop();
  // The loops are stopped: what they kept is ours now, and goes before them
  // (sessions unregister from their loop; suspended fibers are unwound when
  // the loops are destroyed).
  keep_until_stop.clear();
  orphans.clear();
  loops.clear();
}

void RuntimeCore::retire(size_t i, std::shared_ptr<void> object) {
  auto& list = orphans[i];
  std::erase_if(list, [](const std::shared_ptr<void>& p) { return p.use_count() == 1; });
  if (object && object.use_count() > 1) list.push_back(std::move(object));
}

size_t RuntimeCore::pick_loop(Side side) const {
  const int here = current_index();
  if (here >= 0) return static_cast<size_t>(here);
  return next_loop[static_cast<int>(side)].fetch_add(1, std::memory_order_relaxed) % loops.size();
}

int RuntimeCore::index_of(const reactor::Reactor* loop) const {
  if (loop == nullptr) return -1;
  for (size_t i = 0; i < loops.size(); ++i) {
    if (loops[i].get() == loop) return static_cast<int>(i);
  }
  return -1;
}

const std::shared_ptr<RuntimeCore>& default_core(RuntimeCore::Side side) {
  const int i = static_cast<int>(side);
  std::call_once(g_default_once[i], [i, side] {
    // The environment can make Config{} invalid (a bad SLOTRPC_* value):
    // then the defaults alone, and the error is the caller's to see when it
    // validates its own config.
    auto cfg = Config{}.with_environment();
    auto core = RuntimeCore::make(cfg.ok() ? cfg.value() : Config{},
                                  side == RuntimeCore::Side::kServer ? "slotrpc-serve" : "slotrpc-loop");
    if (!core.ok()) throw std::runtime_error(core.status().message());
    g_default[i] = std::move(core.value());
    g_default_made[i].store(true, std::memory_order_release);
  });
  return g_default[i];
}

const std::shared_ptr<RuntimeCore>& default_core_here_or(RuntimeCore::Side side) {
  for (int i = 0; i < 2; ++i) {
    if (g_default_made[i].load(std::memory_order_acquire) && g_default[i]->current_index() >= 0) {
      return g_default[i];
    }
  }
  return default_core(side);
}

}  // namespace detail

Result<Runtime> Runtime::create(Config config) {
  auto cfg = config.with_environment();
  if (!cfg.ok()) return cfg.status();
  auto core = detail::RuntimeCore::make(cfg.value(), "slotrpc-loop");
  if (!core.ok()) return core.status();
  return Runtime(std::move(core.value()));
}

Runtime::Runtime(Config config) {
  auto rt = create(std::move(config));
  if (!rt.ok()) throw std::invalid_argument(rt.status().message());
  core_ = rt.value().core_;
}

Runtime Runtime::default_runtime() { return Runtime(detail::default_core(detail::RuntimeCore::Side::kClient)); }
Runtime Runtime::default_server_runtime() {
  return Runtime(detail::default_core(detail::RuntimeCore::Side::kServer));
}

size_t Runtime::loop_count() const { return core_->loops.size(); }
const Config& Runtime::config() const { return core_->config; }

}  // namespace slotrpc
