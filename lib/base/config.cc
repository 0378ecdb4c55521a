// Strict parsing and validation of Config and SLOTRPC_* variables.
//
// No atoi: a value must be all digits, fit in 64 bits and lie in its range,
// otherwise the error says which setting, which value and what is allowed.
#include <algorithm>
#include <cctype>
#include <atomic>
#include <cstdint>
#include <charconv>
#include <mutex>
#include <set>
#include <utility>
#include <vector>
#include <cstdlib>
#include <string_view>
#include <unistd.h>
#include <string>

#include <fmt/format.h>

#include "base/cpu_list.h"
#include "base/logging.h"
#include "base/settings.h"
#include "base/uid_policy.h"
#include "slotrpc/config.h"

namespace slotrpc {
namespace base {

std::span<const UintSetting> uint_settings() {
  static constexpr UintSetting kTable[] = {
      {"SLOTRPC_SLOT_COUNT", "slot_count", &Config::slot_count, 1, kMaxSlotCount,
       "slots per ring and direction; a Channel's credits"},
      {"SLOTRPC_SLOT_SIZE", "slot_size", &Config::slot_size, kMinSlotSize, kMaxSlotSize,
       "bytes per slot (32-byte header + payload), multiple of 64"},
      {"SLOTRPC_SPIN_US", "spin_us", &Config::spin_us, 0, 10'000'000,
       "adaptive mode: microseconds a reactor spins idle before sleeping"},
      {"SLOTRPC_SPIN_MAX_US", "spin_max_us", &Config::spin_max_us, 0, 10'000'000,
       "adaptive mode: the most the idle spin grows to while sleeps keep ending sooner than it"},
      {"SLOTRPC_BUSY_YIELD_US", "busy_yield_us", &Config::busy_yield_us, 0, 10'000'000,
       "busy mode and adaptive spin: microseconds idle after which each idle turn yields the CPU; 0 = never"},
      {"SLOTRPC_BUSY_SLEEP_US", "busy_sleep_us", &Config::busy_sleep_us, 0, 600'000'000,
       "busy mode: microseconds idle after which the loop sleeps until work; 0 = never"},
      {"SLOTRPC_POLL_BATCH", "poll_batch", &Config::poll_batch, 1, 1024,
       "completions taken per poll call"},
      {"SLOTRPC_CONNECT_TIMEOUT_MS", "connect_timeout_ms", &Config::connect_timeout_ms, 1,
       600'000, "TCP connect plus handshake"},
      {"SLOTRPC_KEEPALIVE_MS", "keepalive_ms", &Config::keepalive_ms, 10, 600'000,
       "a session silent this long sends a ping"},
      {"SLOTRPC_PEER_TIMEOUT_MS", "peer_timeout_ms", &Config::peer_timeout_ms, 20, 3'600'000,
       "a peer silent this long is dead: its calls fail with UNAVAILABLE"},
      {"SLOTRPC_BULK_TIMEOUT_MS", "bulk_timeout_ms", &Config::bulk_timeout_ms, 10, 86'400'000,
       "server: a handler's bulk transfer of a call without a deadline that the client has not "
       "completed this long fails, and its session is closed"},
      {"SLOTRPC_FIBER_STACK_KB", "fiber_stack_kb", &Config::fiber_stack_kb, 16, 65536,
       "stack of each handler fiber"},
      {"SLOTRPC_REACTOR_THREADS", "reactor_threads", &Config::reactor_threads, 1, 256,
       "event-loop threads of a Server"},
      {"SLOTRPC_MAX_QUEUED_CALLS", "max_queued_calls", &Config::max_queued_calls, 0,
       1u << 24, "calls that may wait for a credit; more fail with RESOURCE_EXHAUSTED"},
      {"SLOTRPC_STREAM_WINDOW", "stream_window", &Config::stream_window, 1, kMaxSlotCount - 1,
       "per stream and direction: messages a writer may have in flight before the reader read them"},
      {"SLOTRPC_TCP_BULK_SLICE", "tcp_bulk_slice", &Config::tcp_bulk_slice, 4096, 1u << 20,
       "tcp: bulk bytes per data frame while calls share the connection; small calls beside bulk data wait for about one"},
      {"SLOTRPC_TCP_BULK_LANE", "tcp_bulk_lane", &Config::tcp_bulk_lane, 0, 1u << 31,
       "tcp: bulk segments of at least this many bytes move on a second connection and thread (0: never)"},
      {"SLOTRPC_TCP_BULK_PUSH", "tcp_bulk_push", &Config::tcp_bulk_push, 0, 16u << 20,
       "tcp: send_bulk segments up to this many bytes follow their request unasked (0: never)"},
      {"SLOTRPC_TCP_LANE_SPIN_US", "tcp_lane_spin_us", &Config::tcp_lane_spin_us, 0, 10'000'000,
       "tcp: microseconds a bulk lane thread polls on, yielding, after its last work before it sleeps (0: at once)"},
      {"SLOTRPC_TCP_FLUSH_EVERY", "tcp_flush_every", &Config::tcp_flush_every, 0, 65536,
       "tcp: a session sends once this many messages wait, not only at the end of the loop turn (0: end of turn only)"},
      {"SLOTRPC_PACK_SMALL", "pack_small", &Config::pack_small, 0, 16384,
       "requests and replies up to this many bytes that are ready together share one work request (0: never)"},
      {"SLOTRPC_MAX_SESSIONS", "max_sessions", &Config::max_sessions, 1, 1'000'000,
       "server: open sessions; one more is refused with RESOURCE_EXHAUSTED"},
      {"SLOTRPC_MAX_PENDING_HANDSHAKES", "max_pending_handshakes",
       &Config::max_pending_handshakes, 1, 1'000'000,
       "server: connections whose Hello is not complete; one more closes the oldest"},
      {"SLOTRPC_MAX_PENDING_HANDSHAKES_PER_HOST", "max_pending_handshakes_per_host",
       &Config::max_pending_handshakes_per_host, 1, 1'000'000,
       "server: the same, per source address; one more closes that address's oldest"},
      {"SLOTRPC_PORT", "device_port", &Config::device_port, 1, 255,
       "verbs: port number of the RDMA device"},
      {"SLOTRPC_TRAFFIC_CLASS", "traffic_class", &Config::traffic_class, 0, 255,
       "verbs: traffic class in the GRH (RoCE: DSCP and ECN bits)"},
      {"SLOTRPC_SERVICE_LEVEL", "service_level", &Config::service_level, 0, 15,
       "verbs: service level of the queue pair's path"},
      {"SLOTRPC_QP_TIMEOUT", "qp_timeout", &Config::qp_timeout, 0, 31,
       "verbs: local ACK timeout, 4.096 us * 2^N; 0 waits forever"},
      {"SLOTRPC_RETRY_COUNT", "retry_count", &Config::retry_count, 0, 7,
       "verbs: retransmissions before a send fails"},
      {"SLOTRPC_RNR_RETRY", "rnr_retry", &Config::rnr_retry, 0, 7,
       "verbs: receiver-not-ready retries; 7 = forever"},
      {"SLOTRPC_MIN_RNR_TIMER", "min_rnr_timer", &Config::min_rnr_timer, 0, 31,
       "verbs: RNR NAK delay the peer is told to wait (IB encoding)"},
      {"SLOTRPC_INLINE_BYTES", "inline_bytes", &Config::inline_bytes, 0, 4096,
       "verbs: header + payload up to this many bytes is posted inline"},
      {"SLOTRPC_SRQ_DEPTH", "srq_depth", &Config::srq_depth, 64, 1u << 20,
       "verbs: receive requests in an event loop's shared receive queue (capped by the device)"},
      {"SLOTRPC_MONITOR_INTERVAL_MS", "monitor_interval_ms", &Config::monitor_interval_ms, 0,
       3'600'000, "verbs: how often a loop samples hardware counters and receive pools; 0 = off"},
  };
  return kTable;
}

std::span<const std::string_view> named_settings() {
  static constexpr std::string_view kNames[] = {
      "SLOTRPC_POLL_MODE", "SLOTRPC_TRANSPORT",  "SLOTRPC_LB_POLICY", "SLOTRPC_LOG_LEVEL",
      "SLOTRPC_DEVICE",    "SLOTRPC_GID_INDEX", "SLOTRPC_RELAXED_ORDERING",
      "SLOTRPC_SRQ",       "SLOTRPC_MAX_RING_MEMORY", "SLOTRPC_METRICS_ADDRESS",
      "SLOTRPC_UNIX_PATH", "SLOTRPC_SHM_PEER_UIDS", "SLOTRPC_MAX_BULK_BYTES",
      "SLOTRPC_LOOP_CPUS", "SLOTRPC_TCP_LANE_CPUS", "SLOTRPC_ADMIN_ACCESS", "SLOTRPC_TLS",
      "SLOTRPC_TLS_CERT",  "SLOTRPC_TLS_KEY",   "SLOTRPC_TLS_CA",
      "SLOTRPC_TLS_CLIENT_AUTH", "SLOTRPC_TLS_SERVER_NAME",
  };
  return kNames;
}

namespace {

Status out_of_range(std::string_view setting, std::string_view value, std::string_view allowed) {
  return Status(StatusCode::kInvalidArgument,
                fmt::format("invalid setting {}={}: allowed {}", setting, value, allowed));
}

Result<uint64_t> parse_uint(std::string_view setting, std::string_view text, uint64_t min,
                            uint64_t max) {
  const std::string allowed = fmt::format("a whole number from {} to {}", min, max);
  uint64_t value = 0;
  const char* first = text.data();
  const char* last = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(first, last, value);
  if (text.empty() || ec != std::errc() || ptr != last) {
    return out_of_range(setting, fmt::format("'{}'", text), allowed);
  }
  if (value < min || value > max) return out_of_range(setting, text, allowed);
  return value;
}

template <class Enum, size_t N>
Result<Enum> parse_name(std::string_view setting, std::string_view text,
                        const std::pair<std::string_view, Enum> (&names)[N]) {
  std::string allowed = "one of";
  for (const auto& [name, value] : names) {
    if (name == text) return value;
    allowed += " ";
    allowed += name;
  }
  return out_of_range(setting, fmt::format("'{}'", text), allowed);
}

constexpr std::pair<std::string_view, PollMode> kPollModes[] = {
    {"busy", PollMode::kBusy}, {"blocking", PollMode::kBlocking}, {"adaptive", PollMode::kAdaptive}};
constexpr std::pair<std::string_view, TransportKind> kTransports[] = {
    {"auto", TransportKind::kAuto}, {"tcp", TransportKind::kTcp}, {"verbs", TransportKind::kVerbs},
    {"shm", TransportKind::kShm}};
constexpr std::pair<std::string_view, LbPolicy> kLbPolicies[] = {
    {"round_robin", LbPolicy::kRoundRobin}, {"pick_first", LbPolicy::kPickFirst}, {"p2c", LbPolicy::kP2c}};
constexpr std::pair<std::string_view, AdminAccess> kAdminAccess[] = {
    {"same-user", AdminAccess::kSameUser}, {"any", AdminAccess::kAny}, {"off", AdminAccess::kOff}};
constexpr std::pair<std::string_view, RelaxedOrdering> kRelaxedOrdering[] = {
    {"off", RelaxedOrdering::kOff}, {"on", RelaxedOrdering::kOn}, {"auto", RelaxedOrdering::kAuto}};
constexpr std::pair<std::string_view, SharedReceiveQueue> kSrqModes[] = {
    {"off", SharedReceiveQueue::kOff}, {"on", SharedReceiveQueue::kOn}, {"auto", SharedReceiveQueue::kAuto}};
constexpr std::pair<std::string_view, TlsClientAuth> kTlsClientAuth[] = {
    {"none", TlsClientAuth::kNone}, {"optional", TlsClientAuth::kOptional},
    {"required", TlsClientAuth::kRequired}};
constexpr std::pair<std::string_view, bool> kOnOff[] = {{"off", false}, {"on", true}};
constexpr std::pair<std::string_view, int> kLogLevels[] = {
    {"trace", 0}, {"debug", 1}, {"info", 2}, {"warn", 3}, {"error", 4}, {"critical", 5}, {"off", 6}};

constexpr size_t kMaxDeviceName = 63;  // IBV_SYSFS_NAME_MAX - 1

// A device name is what `ibv_devices` prints: letters, digits, '_', '-', '.'.
Status check_device_name(std::string_view setting, std::string_view name) {
  const std::string allowed = fmt::format(
      "empty (the first device with an active port) or a device name of up to {} letters, "
      "digits, '_', '-', '.'", kMaxDeviceName);
  if (name.size() > kMaxDeviceName) return out_of_range(setting, fmt::format("'{}'", name), allowed);
  for (char ch : name) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                    (ch >= '0' && ch <= '9') || ch == '_' || ch == '-' || ch == '.';
    if (!ok) return out_of_range(setting, fmt::format("'{}'", name), allowed);
  }
  return {};
}

std::string gid_index_allowed() { return fmt::format("auto or a whole number from 0 to {}", kMaxGidIndex); }

Result<int32_t> parse_gid_index(std::string_view setting, std::string_view text) {
  if (text == "auto") return -1;
  uint64_t value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() ||
      value > static_cast<uint64_t>(kMaxGidIndex)) {
    return out_of_range(setting, fmt::format("'{}'", text), gid_index_allowed());
  }
  return static_cast<int32_t>(value);
}

// SLOTRPC_MAX_RING_MEMORY: "auto" (stored as 0) or a byte count.
std::string ring_memory_allowed() {
  return fmt::format("auto or a whole number of bytes from {} to {}", kMinRingMemory, kMaxRingMemory);
}

Result<uint64_t> parse_ring_memory(std::string_view setting, std::string_view text) {
  if (text == "auto") return uint64_t{0};
  uint64_t value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() ||
      value < kMinRingMemory || value > kMaxRingMemory) {
    return out_of_range(setting, fmt::format("'{}'", text), ring_memory_allowed());
  }
  return value;
}

// SLOTRPC_METRICS_ADDRESS: empty, or HOST:PORT with an IPv4 address, a
// bracketed IPv6 address or a host name, and a port from 0 to 65535, or the
// port alone (PORT or :PORT), which serves on 127.0.0.1.  The address itself
// is resolved and bound by Server::start().
constexpr std::string_view kMetricsAddressAllowed =
    "empty (off), PORT or :PORT (127.0.0.1), or HOST:PORT (an IPv4 address, [IPv6] or a host "
    "name, and a port from 0 to 65535)";

Status check_metrics_address(std::string_view setting, std::string_view text) {
  if (text.empty()) return {};
  const size_t colon = text.rfind(':');
  auto bad = [&] { return out_of_range(setting, fmt::format("'{}'", text), kMetricsAddressAllowed); };
  if (colon + 1 == text.size()) return bad();
  const bool port_only = colon == std::string_view::npos || colon == 0;
  std::string_view host = port_only ? std::string_view("127.0.0.1") : text.substr(0, colon);
  const std::string_view port = colon == std::string_view::npos ? text : text.substr(colon + 1);
  uint32_t value = 0;
  auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (ec != std::errc() || ptr != port.data() + port.size() || value > 65535) return bad();
  const bool v6 = host.front() == '[';
  if (v6) {
    if (host.size() < 3 || host.back() != ']') return bad();
    host = host.substr(1, host.size() - 2);
  }
  for (char ch : host) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                    (ch >= '0' && ch <= '9') || ch == '.' || ch == '-' || (v6 && ch == ':');
    if (!ok) return bad();
  }
  return {};
}

// SLOTRPC_UNIX_PATH: empty (the default abstract name), /absolute/path or
// @abstract-name, short enough for sun_path (108 bytes with its NUL).
constexpr std::string_view kUnixPathAllowed =
    "empty (@slotrpc-<port>), off, /absolute/path or @abstract-name, 2 to 107 bytes";

Status check_unix_path(std::string_view setting, std::string_view text) {
  if (text.empty() || text == "off") return {};
  if (text.size() < 2 || text.size() > 107 || (text.front() != '/' && text.front() != '@') ||
      text.find('\0') != std::string_view::npos) {
    return out_of_range(setting, fmt::format("'{}'", text), kUnixPathAllowed);
  }
  return {};
}

}  // namespace
}  // namespace base

std::string_view to_string(RelaxedOrdering mode) {
  for (const auto& [name, value] : base::kRelaxedOrdering)
    if (value == mode) return name;
  return "?";
}

std::string_view to_string(SharedReceiveQueue mode) {
  for (const auto& [name, value] : base::kSrqModes)
    if (value == mode) return name;
  return "?";
}

std::string_view to_string(TlsClientAuth mode) {
  for (const auto& [name, value] : base::kTlsClientAuth)
    if (value == mode) return name;
  return "?";
}

std::string_view to_string(PollMode mode) {
  for (const auto& [name, value] : base::kPollModes)
    if (value == mode) return name;
  return "?";
}

std::string_view to_string(TransportKind kind) {
  for (const auto& [name, value] : base::kTransports)
    if (value == kind) return name;
  return "?";
}

std::string_view to_string(LbPolicy policy) {
  for (const auto& [name, value] : base::kLbPolicies)
    if (value == policy) return name;
  return "?";
}

std::string_view to_string(AdminAccess access) {
  for (const auto& [name, value] : base::kAdminAccess)
    if (value == access) return name;
  return "?";
}

Status Config::validate() const {
  using namespace base;
  for (const UintSetting& s : uint_settings()) {
    const uint64_t v = this->*s.member;
    if (v < s.min || v > s.max) {
      return out_of_range(fmt::format("Config.{} ({})", s.field, s.env), std::to_string(v),
                          fmt::format("a whole number from {} to {}", s.min, s.max));
    }
  }
  if (slot_size % kSlotSizeAlign != 0) {
    return out_of_range("Config.slot_size (SLOTRPC_SLOT_SIZE)", std::to_string(slot_size),
                        fmt::format("a multiple of {} from {} to {}", kSlotSizeAlign,
                                    kMinSlotSize, kMaxSlotSize));
  }
  if (uint64_t{slot_count} * slot_size > kMaxRingBytes) {
    return out_of_range("Config.slot_count * Config.slot_size",
                        fmt::format("{} * {}", slot_count, slot_size),
                        fmt::format("at most {} bytes per ring", kMaxRingBytes));
  }
  if (peer_timeout_ms <= keepalive_ms) {
    return out_of_range("Config.peer_timeout_ms (SLOTRPC_PEER_TIMEOUT_MS)",
                        std::to_string(peer_timeout_ms),
                        fmt::format("greater than keepalive_ms ({})", keepalive_ms));
  }
  if (!parse_name("Config.lb_policy (SLOTRPC_LB_POLICY)", to_string(lb_policy), kLbPolicies).ok()) {
    return out_of_range("Config.lb_policy (SLOTRPC_LB_POLICY)", std::to_string(static_cast<int>(lb_policy)),
                        "one of round_robin pick_first p2c");
  }
  if (!parse_name("Config.log_level (SLOTRPC_LOG_LEVEL)", log_level, kLogLevels).ok()) {
    return parse_name("Config.log_level (SLOTRPC_LOG_LEVEL)", log_level, kLogLevels).status();
  }
  if (Status st = check_device_name("Config.device (SLOTRPC_DEVICE)", device); !st.ok()) return st;
  if (gid_index < -1 || gid_index > kMaxGidIndex) {
    return out_of_range("Config.gid_index (SLOTRPC_GID_INDEX)", std::to_string(gid_index),
                        fmt::format("-1 (auto) or a whole number from 0 to {}", kMaxGidIndex));
  }
  if (!parse_name("Config.relaxed_ordering (SLOTRPC_RELAXED_ORDERING)",
                  to_string(relaxed_ordering), kRelaxedOrdering).ok()) {
    return out_of_range("Config.relaxed_ordering (SLOTRPC_RELAXED_ORDERING)",
                        std::to_string(static_cast<int>(relaxed_ordering)), "off, on or auto");
  }
  if (!parse_name("Config.srq (SLOTRPC_SRQ)", to_string(srq), kSrqModes).ok()) {
    return out_of_range("Config.srq (SLOTRPC_SRQ)", std::to_string(static_cast<int>(srq)),
                        "off, on or auto");
  }
  if (Status st = check_metrics_address("Config.metrics_address (SLOTRPC_METRICS_ADDRESS)",
                                        metrics_address);
      !st.ok()) {
    return st;
  }
  if (Status st = check_unix_path("Config.unix_path (SLOTRPC_UNIX_PATH)", unix_path); !st.ok()) return st;
  if (auto p = parse_uid_policy("Config.shm_peer_uids (SLOTRPC_SHM_PEER_UIDS)", shm_peer_uids); !p.ok())
    return p.status();
  if (Status st = check_cpu_list("Config.loop_cpus (SLOTRPC_LOOP_CPUS)", loop_cpus); !st.ok()) return st;
  if (Status st = check_cpu_list("Config.tcp_lane_cpus (SLOTRPC_TCP_LANE_CPUS)", tcp_lane_cpus); !st.ok())
    return st;
  if (max_ring_memory != 0 &&
      (max_ring_memory < kMinRingMemory || max_ring_memory > kMaxRingMemory)) {
    return out_of_range("Config.max_ring_memory (SLOTRPC_MAX_RING_MEMORY)",
                        std::to_string(max_ring_memory),
                        "0 (auto) or " + ring_memory_allowed().substr(8));
  }
  if (!parse_name("Config.tls_client_auth (SLOTRPC_TLS_CLIENT_AUTH)", to_string(tls_client_auth),
                  kTlsClientAuth).ok()) {
    return out_of_range("Config.tls_client_auth (SLOTRPC_TLS_CLIENT_AUTH)",
                        std::to_string(static_cast<int>(tls_client_auth)), "none, optional or required");
  }
  // A key without its certificate (or the reverse) is a mistake whatever
  // the side; which files a side needs is checked where it loads them.
  if (tls_cert.empty() != tls_key.empty()) {
    return tls_cert.empty()
               ? out_of_range("Config.tls_cert (SLOTRPC_TLS_CERT)", "''",
                              "a PEM file path, since tls_key is set")
               : out_of_range("Config.tls_key (SLOTRPC_TLS_KEY)", "''",
                              "a PEM file path, since tls_cert is set");
  }
  if (max_bulk_bytes < 1 || max_bulk_bytes > kMaxBulkBytesLimit) {
    return out_of_range("Config.max_bulk_bytes (SLOTRPC_MAX_BULK_BYTES)",
                        std::to_string(max_bulk_bytes),
                        fmt::format("a whole number of bytes from 1 to {}", kMaxBulkBytesLimit));
  }
  return {};
}

namespace {

std::atomic<bool> g_environment_overlay{true};

// The one label a settings error names a setting by, whether its value
// came from the environment or from the Config: "Config.slot_size
// (SLOTRPC_SLOT_SIZE)".  A named setting's field is its variable's suffix
// in lower case (SLOTRPC_POLL_MODE: poll_mode).
std::string env_label(std::string_view env) {
  for (const base::UintSetting& s : base::uint_settings()) {
    if (s.env == env) return fmt::format("Config.{} ({})", s.field, env);
  }
  std::string field(env.substr(std::string_view("SLOTRPC_").size()));
  for (char& c : field) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return fmt::format("Config.{} ({})", field, env);
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// A SLOTRPC_* variable that names no setting is ignored; a misspelt one
// (SLOTRPC_TRANSPRT) would otherwise go unnoticed, so each is warned about
// once per process, with the nearest setting's name.  SLOTRPC_TEST_* are
// the test suite's own (scripts/test.sh).  Read where a config takes the
// environment, which is no hot path.
void warn_unknown_variables() {
  static std::mutex mu;
  static std::set<std::string, std::less<>> warned;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    if (!entry.starts_with("SLOTRPC_") || entry.starts_with("SLOTRPC_TEST_")) continue;
    const std::string_view name = entry.substr(0, entry.find('='));
    std::string_view nearest;
    size_t best = SIZE_MAX;
    auto consider = [&](std::string_view known) {
      const size_t d = known == name ? 0 : edit_distance(name, known);
      if (d < best) best = d, nearest = known;
    };
    for (const base::UintSetting& s : base::uint_settings()) consider(s.env);
    for (std::string_view n : base::named_settings()) consider(n);
    if (best == 0) continue;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!warned.emplace(name).second) continue;
    }
    base::log().warn("slotrpc: {} is not a slotrpc setting and is ignored; the nearest is {} "
                     "(docs/tuning.md lists every setting)",
                     name, nearest);
  }
}

// Each SLOTRPC_* value the environment set, logged once per process (a
// program makes many Servers and Channels; the operator needs to read it
// once), at info, unless the resulting log level hides info.
void log_overrides(const std::vector<std::pair<std::string, std::string>>& set,
                   std::string_view log_level) {
  if (set.empty()) return;
  if (log_level != "trace" && log_level != "debug" && log_level != "info") return;
  static std::mutex mu;
  static std::set<std::string, std::less<>> logged;
  for (const auto& [name, text] : set) {
    std::string line = fmt::format("{}={}", name, text);
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!logged.insert(line).second) continue;
    }
    base::log().info("slotrpc: setting from the environment: {}", line);
  }
}

}  // namespace

void set_environment_overlay(bool enabled) { g_environment_overlay.store(enabled); }
bool environment_overlay() { return g_environment_overlay.load(); }

Result<Config> Config::with_environment() const {
  using namespace base;
  if (!environment_overlay()) {
    if (Status st = validate(); !st.ok()) return st;
    return *this;
  }
  warn_unknown_variables();
  Config out = *this;
  // Every variable that is set, as it was read: logged once validated.
  std::vector<std::pair<std::string, std::string>> set;
  auto env = [&set](const char* name) -> const char* {
    const char* text = std::getenv(name);
    if (text != nullptr) set.emplace_back(name, text);
    return text;
  };
  for (const UintSetting& s : uint_settings()) {
    const char* text = env(std::string(s.env).c_str());
    if (text == nullptr) continue;
    auto v = parse_uint(fmt::format("Config.{} ({})", s.field, s.env), text, s.min, s.max);
    if (!v.ok()) return v.status();
    out.*s.member = static_cast<uint32_t>(v.value());
  }
  if (const char* text = env("SLOTRPC_POLL_MODE")) {
    auto v = parse_name(env_label("SLOTRPC_POLL_MODE"), text, kPollModes);
    if (!v.ok()) return v.status();
    out.poll_mode = v.value();
  }
  if (const char* text = env("SLOTRPC_TRANSPORT")) {
    auto v = parse_name(env_label("SLOTRPC_TRANSPORT"), text, kTransports);
    if (!v.ok()) return v.status();
    out.transport = v.value();
  }
  if (const char* text = env("SLOTRPC_LB_POLICY")) {
    auto v = parse_name(env_label("SLOTRPC_LB_POLICY"), text, kLbPolicies);
    if (!v.ok()) return v.status();
    out.lb_policy = v.value();
  }
  if (const char* text = env("SLOTRPC_ADMIN_ACCESS")) {
    auto v = parse_name(env_label("SLOTRPC_ADMIN_ACCESS"), text, kAdminAccess);
    if (!v.ok()) return v.status();
    out.admin_access = v.value();
  }
  if (const char* text = env("SLOTRPC_LOG_LEVEL")) {
    auto v = parse_name(env_label("SLOTRPC_LOG_LEVEL"), text, kLogLevels);
    if (!v.ok()) return v.status();
    out.log_level = text;
  }
  if (const char* text = env("SLOTRPC_DEVICE")) {
    if (Status st = check_device_name(env_label("SLOTRPC_DEVICE"), text); !st.ok()) return st;
    out.device = text;
  }
  if (const char* text = env("SLOTRPC_GID_INDEX")) {
    auto v = parse_gid_index(env_label("SLOTRPC_GID_INDEX"), text);
    if (!v.ok()) return v.status();
    out.gid_index = v.value();
  }
  if (const char* text = env("SLOTRPC_RELAXED_ORDERING")) {
    auto v = parse_name(env_label("SLOTRPC_RELAXED_ORDERING"), text, kRelaxedOrdering);
    if (!v.ok()) return v.status();
    out.relaxed_ordering = v.value();
  }
  if (const char* text = env("SLOTRPC_SRQ")) {
    auto v = parse_name(env_label("SLOTRPC_SRQ"), text, kSrqModes);
    if (!v.ok()) return v.status();
    out.srq = v.value();
  }
  if (const char* text = env("SLOTRPC_MAX_RING_MEMORY")) {
    auto v = parse_ring_memory(env_label("SLOTRPC_MAX_RING_MEMORY"), text);
    if (!v.ok()) return v.status();
    out.max_ring_memory = v.value();
  }
  if (const char* text = env("SLOTRPC_MAX_BULK_BYTES")) {
    auto v = parse_uint(env_label("SLOTRPC_MAX_BULK_BYTES"), text, 1, kMaxBulkBytesLimit);
    if (!v.ok()) return v.status();
    out.max_bulk_bytes = v.value();
  }
  if (const char* text = env("SLOTRPC_METRICS_ADDRESS")) {
    if (Status st = check_metrics_address(env_label("SLOTRPC_METRICS_ADDRESS"), text); !st.ok()) return st;
    out.metrics_address = text;
  }
  if (const char* text = env("SLOTRPC_UNIX_PATH")) {
    if (Status st = check_unix_path(env_label("SLOTRPC_UNIX_PATH"), text); !st.ok()) return st;
    out.unix_path = text;
  }
  if (const char* text = env("SLOTRPC_SHM_PEER_UIDS")) {
    if (auto p = parse_uid_policy(env_label("SLOTRPC_SHM_PEER_UIDS"), text); !p.ok()) return p.status();
    out.shm_peer_uids = text;
  }
  if (const char* text = env("SLOTRPC_TLS")) {
    auto v = parse_name(env_label("SLOTRPC_TLS"), text, kOnOff);
    if (!v.ok()) return v.status();
    out.tls = v.value();
  }
  if (const char* text = env("SLOTRPC_TLS_CLIENT_AUTH")) {
    auto v = parse_name(env_label("SLOTRPC_TLS_CLIENT_AUTH"), text, kTlsClientAuth);
    if (!v.ok()) return v.status();
    out.tls_client_auth = v.value();
  }
  // File paths and a name: checked where they are used (the files are
  // read then, and an unreadable one is named with OpenSSL's reason).
  for (auto [name, field] : {std::pair{"SLOTRPC_TLS_CERT", &Config::tls_cert},
                             std::pair{"SLOTRPC_TLS_KEY", &Config::tls_key},
                             std::pair{"SLOTRPC_TLS_CA", &Config::tls_ca},
                             std::pair{"SLOTRPC_TLS_SERVER_NAME", &Config::tls_server_name}}) {
    if (const char* text = env(name)) out.*field = text;
  }
  for (auto [name, field] : {std::pair{"SLOTRPC_LOOP_CPUS", &Config::loop_cpus},
                             std::pair{"SLOTRPC_TCP_LANE_CPUS", &Config::tcp_lane_cpus}}) {
    if (const char* text = env(name)) {
      if (Status st = check_cpu_list(env_label(name), text); !st.ok()) return st;
      out.*field = text;
    }
  }
  Status st = out.validate();
  if (!st.ok()) return st;
  log_overrides(set, out.log_level);
  return out;
}

}  // namespace slotrpc
