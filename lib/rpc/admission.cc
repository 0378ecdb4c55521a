#include "rpc/admission.h"

#include <sys/resource.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>

#include "base/logging.h"

namespace slotrpc::rpc {

namespace {

std::string rlimit_text(int resource) {
  rlimit rl{};
  if (::getrlimit(resource, &rl) != 0) return "unknown";
  if (rl.rlim_cur == RLIM_INFINITY) return "unlimited";
  return fmt::format("{}", static_cast<uint64_t>(rl.rlim_cur));
}

}  // namespace

std::string memlock_limit_text() {
  const std::string t = rlimit_text(RLIMIT_MEMLOCK);
  return t == "unlimited" || t == "unknown" ? t : t + " bytes";
}

std::string nofile_limit_text() { return rlimit_text(RLIMIT_NOFILE); }

RingBudget resolve_ring_budget(const Config& config, bool verbs_possible) {
  if (config.max_ring_memory != 0) {
    return {config.max_ring_memory,
            fmt::format("SLOTRPC_MAX_RING_MEMORY = {}", config.max_ring_memory)};
  }
  // Rings are mmap'ed lazily on TCP, but a client that fills its slots makes
  // them resident: a quarter of RAM leaves the rest for handlers and the OS.
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  uint64_t ram = pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : (uint64_t{1} << 32);
  RingBudget b{ram / 4, fmt::format("SLOTRPC_MAX_RING_MEMORY = auto: {} bytes, a quarter of "
                                    "physical memory", ram / 4)};
  rlimit rl{};
  if (verbs_possible && ::getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
      uint64_t(rl.rlim_cur) < b.bytes) {
    // Verbs pins every ring: past RLIMIT_MEMLOCK ibv_reg_mr fails anyway.
    b.bytes = std::max<uint64_t>(rl.rlim_cur, 1);
    b.rule = fmt::format("SLOTRPC_MAX_RING_MEMORY = auto: {} bytes, the RLIMIT_MEMLOCK of this "
                         "process (verbs pins the rings)", b.bytes);
  }
  return b;
}

Status Admission::reserve(uint64_t ring_bytes) {
  std::lock_guard lock(mu_);
  if (sessions_ >= max_sessions_) {
    return Status(StatusCode::kResourceExhausted,
                  fmt::format("SLOTRPC_MAX_SESSIONS = {} reached (the server has {} sessions)",
                              max_sessions_, sessions_));
  }
  if (ring_bytes > budget_.bytes || ring_bytes_ > budget_.bytes - ring_bytes) {
    return Status(StatusCode::kResourceExhausted,
                  fmt::format("ring memory limit reached: {}; {} bytes are in use and this "
                              "session's rings need {}", budget_.rule, ring_bytes_, ring_bytes));
  }
  ++sessions_;
  ring_bytes_ += ring_bytes;
  return {};
}

void Admission::release(uint64_t ring_bytes) {
  std::lock_guard lock(mu_);
  if (sessions_ > 0) --sessions_;
  ring_bytes_ -= std::min(ring_bytes_, ring_bytes);
}

uint32_t Admission::sessions() const {
  std::lock_guard lock(mu_);
  return sessions_;
}

uint64_t Admission::ring_bytes() const {
  std::lock_guard lock(mu_);
  return ring_bytes_;
}

void RateLimitedLog::warn(const std::string& line) {
  std::lock_guard lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  if (last_ != std::chrono::steady_clock::time_point{} && now - last_ < interval_) {
    ++suppressed_;
    return;
  }
  if (suppressed_ != 0) {
    base::log().warn("{} (and {} more like it since the last such line)", line, suppressed_);
  } else {
    base::log().warn("{}", line);
  }
  last_ = now;
  suppressed_ = 0;
}

}  // namespace slotrpc::rpc
