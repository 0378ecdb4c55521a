// Captures what the library logs (slotrpc::base::log()): CaptureSink keeps
// the lines; LogCapture adds one to the "slotrpc" logger for a test's
// lifetime and removes it again.
#pragma once

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/dist_sink.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/logging.h"

namespace slotrpc::test {

// Keeps every line logged to it, so a test can read which session the
// server closed and why.
class CaptureSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::vector<std::string> lines() {
    std::lock_guard<std::mutex> lock(mutex_);
    return lines_;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    lines_.emplace_back(msg.payload.data(), msg.payload.size());
  }
  void flush_() override {}

 private:
  std::vector<std::string> lines_;
};

// Where captures attach.  The logger's own sink list is a plain vector
// that spdlog reads without a lock while any thread logs (a test's loops,
// the default runtime's, a server session closing after the test's last
// check), so changing it while they run is a data race: ASan caught a
// capture's destructor freeing lines a loop thread was appending to
// (bulk_lane_call_test, several runs in 30 beside another test).  So the
// list changes once, before main() while the process has one thread: this
// dist sink joins it, and captures come and go inside the dist sink, under
// its lock.
inline std::shared_ptr<spdlog::sinks::dist_sink_mt> capture_hub() {
  static const std::shared_ptr<spdlog::sinks::dist_sink_mt> hub = [] {
    auto h = std::make_shared<spdlog::sinks::dist_sink_mt>();
    base::log().sinks().push_back(h);
    return h;
  }();
  return hub;
}
inline const bool capture_hub_installed = (capture_hub(), true);  // before main()

// A CaptureSink on the library's logger for the capture's lifetime.
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<CaptureSink>()) {
    auto& l = base::log();
    level_ = l.level();
    if (l.level() > spdlog::level::warn) l.set_level(spdlog::level::warn);
    capture_hub()->add_sink(sink_);
  }
  ~LogCapture() {
    capture_hub()->remove_sink(sink_);
    base::log().set_level(level_);
  }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  std::vector<std::string> lines() const { return sink_->lines(); }
  // Lines that contain every one of `parts`.
  std::vector<std::string> matching(std::initializer_list<std::string> parts) const {
    std::vector<std::string> out;
    for (auto& l : lines()) {
      if (std::all_of(parts.begin(), parts.end(), [&](const std::string& p) { return l.find(p) != std::string::npos; }))
        out.push_back(l);
    }
    return out;
  }

 private:
  std::shared_ptr<CaptureSink> sink_;
  spdlog::level::level_enum level_;
};

}  // namespace slotrpc::test
