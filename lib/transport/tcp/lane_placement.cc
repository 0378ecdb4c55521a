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

}  // namespace slotrpc::transport
