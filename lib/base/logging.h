// The library's logger.
//
// Everything slotrpc logs goes through one spdlog logger named "slotrpc"
// (stderr, colour when a terminal), never through spdlog's default logger:
// the application's loggers and their levels are the application's.  Config's
// log_level (SLOTRPC_LOG_LEVEL) sets this logger's level only.
//
// An application that wants our lines in its own sinks registers a logger
// named "slotrpc" before the first Server or Channel exists; we then use
// that one (and still set its level from the config).
#pragma once

#include <spdlog/logger.h>

#include <string_view>

namespace slotrpc::base {

// The "slotrpc" logger: the registered one if the application made it, else
// ours, created once (std::call_once) and registered.  Any thread.
spdlog::logger& log();

// Sets the "slotrpc" logger's level (already validated by the config).
void apply_log_level(std::string_view level);

}  // namespace slotrpc::base
