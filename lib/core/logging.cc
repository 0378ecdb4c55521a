#include "core/logging.h"

#include <spdlog/spdlog.h>

#include <string>

namespace slotrpc::core {

// spdlog's level is process-wide: the last Server or Channel created sets it.
void apply_log_level(std::string_view level) {
  spdlog::set_level(spdlog::level::from_str(std::string(level)));
}

}  // namespace slotrpc::core
