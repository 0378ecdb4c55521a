#include "transport/tcp/lane_placement.h"

#include "base/cpu_list.h"

namespace slotrpc::transport {

std::optional<cpu_set_t> lane_placement(std::string_view lane_cpus, std::string_view loop_cpus,
                                        const cpu_set_t& process, std::string* error) {
  auto parse = [error](std::string_view setting, std::string_view text) -> std::optional<cpu_set_t> {
    auto set = base::parse_cpu_list(setting, text);
    if (!set.ok()) {
      *error = set.status().message();
      return std::nullopt;
    }
    return set.value();
  };
  if (!lane_cpus.empty()) return parse("SLOTRPC_TCP_LANE_CPUS", lane_cpus);
  if (loop_cpus.empty()) return std::nullopt;
  const std::optional<cpu_set_t> loops = parse("SLOTRPC_LOOP_CPUS", loop_cpus);
  if (!loops) return std::nullopt;
  // The process's CPUs without the loops': bulk copies off their cores.
  cpu_set_t rest = process;
  for (unsigned c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &*loops)) CPU_CLR(c, &rest);
  if (CPU_COUNT(&rest) == 0) return std::nullopt;
  return rest;
}

LaneSpare::LaneSpare(const cpu_set_t& process, uint32_t rate, Clock::time_point now)
    : rate_(rate), full_(process), spare_(process), window_start_(now) {
  for (unsigned c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &spare_)) {
      CPU_CLR(c, &spare_);  // the first CPU: the same one in every process
      break;
    }
  }
  enabled_ = rate != 0 && CPU_COUNT(&spare_) > 0;
}

LaneSpare::Change LaneSpare::observe(Clock::time_point now, uint64_t frames) {
  if (!enabled_) return Change::kNone;
  if (!counting_) {  // the first look only sets the baseline
    counting_ = true;
    frames_at_start_ = frames;
    window_start_ = now;
    return Change::kNone;
  }
  const Clock::duration elapsed = now - window_start_;
  if (elapsed < kWindow) return Change::kNone;
  // The rate over the whole time since the last verdict: a lane thread
  // that slept 100 ms in epoll_wait judges those 100 ms, not the last 5.
  const uint64_t seen = frames - frames_at_start_;
  const bool busy = seen != 0 && static_cast<double>(seen) >= rate_ * std::chrono::duration<double>(elapsed).count();
  frames_at_start_ = frames;
  window_start_ = now;
  if (busy) {
    quiet_ = 0;
    if (sparing_) return Change::kNone;
    sparing_ = true;
    return Change::kSpare;
  }
  if (!sparing_ || ++quiet_ < kQuietWindows) return Change::kNone;
  sparing_ = false;
  quiet_ = 0;
  return Change::kRestore;
}

}  // namespace slotrpc::transport
