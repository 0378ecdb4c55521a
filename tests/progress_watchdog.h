// A watchdog for tests whose failure mode is a hang (a lost wake-up, a loop
// nobody drives): it ends the process, naming what hung and at which step,
// unless step() is called within the limit.  A hung test would otherwise
// only hit meson's timeout without saying where.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace slotrpc::test {

class ProgressWatchdog {
 public:
  ProgressWatchdog(const char* what, std::chrono::seconds limit) : what_(what), limit_(limit) {
    thread_ = std::thread([this] {
      using Clock = std::chrono::steady_clock;
      uint64_t last = progress_.load();
      auto since = Clock::now();
      while (!stop_.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        const uint64_t now = progress_.load();
        if (now != last) {
          last = now;
          since = Clock::now();
        } else if (Clock::now() - since > limit_) {
          std::fprintf(stderr, "FAIL: %s: no progress for %lld s at step %llu\n", what_,
                       static_cast<long long>(limit_.count()), static_cast<unsigned long long>(now));
          std::fflush(stderr);
          std::_Exit(1);
        }
      }
    });
  }
  ~ProgressWatchdog() {
    stop_.store(true);
    thread_.join();
  }
  ProgressWatchdog(const ProgressWatchdog&) = delete;
  ProgressWatchdog& operator=(const ProgressWatchdog&) = delete;

  void step() { progress_.fetch_add(1, std::memory_order_relaxed); }

 private:
  const char* what_;
  std::chrono::seconds limit_;
  std::atomic<uint64_t> progress_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace slotrpc::test
