#include "base/cpu_list.h"

#include <pthread.h>
#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

namespace slotrpc::base {

namespace {

constexpr std::string_view kSyntax =
    "CPU numbers and ranges such as 0-3,8 (comma-separated, no spaces, each below {})";

Status bad_list(std::string_view setting, std::string_view text, std::string_view why) {
  return Status(StatusCode::kInvalidArgument,
                fmt::format("invalid setting {}='{}': {}; allowed {}", setting, text, why,
                            fmt::format(fmt::runtime(kSyntax), CPU_SETSIZE)));
}

// One CPU number at the front of `s`, consumed.  Empty: fine; else why not.
std::string take_cpu(std::string_view& s, unsigned& out) {
  const char* first = s.data();
  const char* last = s.data() + s.size();
  auto [end, ec] = std::from_chars(first, last, out);
  if (end == first) return "expected a CPU number";
  if (ec != std::errc() || out >= CPU_SETSIZE)
    return fmt::format("CPU {} is too large", std::string_view(first, static_cast<size_t>(end - first)));
  s.remove_prefix(static_cast<size_t>(end - first));
  return {};
}

}  // namespace

Result<cpu_set_t> parse_cpu_list(std::string_view setting, std::string_view text) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (text.empty()) return bad_list(setting, text, "empty");
  std::string_view rest = text;
  for (;;) {
    unsigned lo = 0, hi = 0;
    if (std::string why = take_cpu(rest, lo); !why.empty()) return bad_list(setting, text, why);
    hi = lo;
    if (!rest.empty() && rest.front() == '-') {
      rest.remove_prefix(1);
      if (std::string why = take_cpu(rest, hi); !why.empty()) return bad_list(setting, text, why);
      if (hi < lo) return bad_list(setting, text, fmt::format("the range {}-{} runs backwards", lo, hi));
    }
    for (unsigned c = lo; c <= hi; ++c) CPU_SET(c, &set);
    if (rest.empty()) return set;
    if (rest.front() != ',') return bad_list(setting, text, fmt::format("unexpected '{}'", rest.front()));
    rest.remove_prefix(1);
  }
}

cpu_set_t process_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(::getpid(), sizeof set, &set) != 0) {
    // Cannot know: say every CPU, and let the kernel judge when pinning.
    for (unsigned c = 0; c < CPU_SETSIZE; ++c) CPU_SET(c, &set);
  }
  return set;
}

cpu_set_t online_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (std::FILE* f = std::fopen("/sys/devices/system/cpu/online", "re")) {
    char buf[4096];
    const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
    std::fclose(f);
    std::string_view text(buf, n);
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
    if (auto parsed = parse_cpu_list("/sys/devices/system/cpu/online", text); parsed.ok()) return parsed.value();
  }
  // No sysfs: count them.
  const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  for (long c = 0; c < n && c < CPU_SETSIZE; ++c) CPU_SET(static_cast<unsigned>(c), &set);
  return set;
}

Status check_cpu_list(std::string_view setting, std::string_view text) {
  if (text.empty()) return {};
  auto parsed = parse_cpu_list(setting, text);
  if (!parsed.ok()) return parsed.status();
  cpu_set_t online = online_cpus();
  cpu_set_t both;
  CPU_AND(&both, &online, &parsed.value());
  if (CPU_COUNT(&both) == 0) {
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("invalid setting {}='{}': none of these CPUs is online; allowed CPUs "
                              "from {}",
                              setting, text, format_cpu_list(online)));
  }
  return {};
}

std::string format_cpu_list(const cpu_set_t& set) {
  std::string out;
  for (unsigned c = 0; c < CPU_SETSIZE;) {
    if (!CPU_ISSET(c, &set)) {
      ++c;
      continue;
    }
    unsigned end = c;
    while (end + 1 < CPU_SETSIZE && CPU_ISSET(end + 1, &set)) ++end;
    if (!out.empty()) out += ',';
    out += end == c ? fmt::format("{}", c) : fmt::format("{}-{}", c, end);
    c = end + 1;
  }
  return out;
}

bool pin_this_thread(const cpu_set_t& set) {
  const int err = ::pthread_setaffinity_np(::pthread_self(), sizeof set, &set);
  if (err != 0) errno = err;
  return err == 0;
}

}  // namespace slotrpc::base
