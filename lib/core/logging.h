// Log level from Config::log_level / SLOTRPC_LOG_LEVEL (already validated).
#pragma once

#include <string_view>

namespace slotrpc::core {
void apply_log_level(std::string_view level);
}
