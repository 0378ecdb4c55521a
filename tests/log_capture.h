// Captures what the library logs (slotrpc::core::log()): CaptureSink keeps
// the lines; LogCapture adds one to the "slotrpc" logger for a test's
// lifetime and removes it again.
#pragma once

#include <spdlog/sinks/base_sink.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/logging.h"

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

// A CaptureSink on the library's logger for the capture's lifetime.
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<CaptureSink>()) {
    auto& l = core::log();
    level_ = l.level();
    if (l.level() > spdlog::level::warn) l.set_level(spdlog::level::warn);
    l.sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& sinks = core::log().sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
    core::log().set_level(level_);
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
