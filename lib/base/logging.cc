#include "base/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <mutex>
#include <string>

namespace slotrpc::base {

namespace {
constexpr const char* kLoggerName = "slotrpc";
}

spdlog::logger& log() {
  // Created once and kept for the life of the process: lines logged from
  // loop threads during static destruction must still find a logger, so the
  // shared_ptr is deliberately never released.
  static std::once_flag once;
  static std::shared_ptr<spdlog::logger>* logger = nullptr;
  std::call_once(once, [] {
    auto found = spdlog::get(kLoggerName);
    if (!found) {
      found = std::make_shared<spdlog::logger>(
          kLoggerName, std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
      // Registering lets the application find it (spdlog::get("slotrpc")) to
      // add sinks or change its level; initialize_logger also gives it the
      // registry's defaults (pattern, and the level spdlog::set_level last
      // set), as for any logger the application makes.  It fails only if a
      // logger of that name appeared since the get() above: use that one.
      try {
        spdlog::initialize_logger(found);
      } catch (const spdlog::spdlog_ex&) {
        if (auto raced = spdlog::get(kLoggerName)) found = std::move(raced);
      }
    }
    logger = new std::shared_ptr<spdlog::logger>(std::move(found));
  });
  return **logger;
}

void apply_log_level(std::string_view level) {
  log().set_level(spdlog::level::from_str(std::string(level)));
}

}  // namespace slotrpc::base
