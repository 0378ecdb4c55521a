#include "transport/verbs/hw_counters.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <system_error>

namespace slotrpc::monitor {
namespace fs = std::filesystem;
using Kind = HwCounter::Kind;

namespace {

// mlx5 (ConnectX) hw_counters that say something about RNR, retries,
// ordering and congestion.  out_of_buffer counts packets dropped because no
// receive was posted: the receive-side view of an RNR.
constexpr KnownCounter kMlx5[] = {
    {"out_of_buffer", Kind::kRnr},
    {"rnr_nak_retry_err", Kind::kRnr},
    {"local_ack_timeout_err", Kind::kRetry},
    {"out_of_sequence", Kind::kSequence},
    {"packet_seq_err", Kind::kSequence},
    {"implied_nak_seq_err", Kind::kSequence},
    {"np_cnp_sent", Kind::kCongestion},
    {"rp_cnp_handled", Kind::kCongestion},
    {"np_ecn_marked_roce_packets", Kind::kCongestion},
};

// rxe (Soft-RoCE) hw_counters.
constexpr KnownCounter kRxe[] = {
    {"rcvd_rnr_err", Kind::kRnr},
    {"send_rnr_err", Kind::kRnr},
    {"retry_rnr_exceeded_err", Kind::kRnr},
    {"retry_exceeded_err", Kind::kRetry},
    {"rcvd_seq_err", Kind::kSequence},
    {"duplicate_request", Kind::kSequence},
};

std::string port_name(const std::string& device, uint32_t port) {
  return device + "/" + std::to_string(port);
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) {
    if (!out.empty()) out += ", ";
    out += s;
  }
  return out;
}

// Reads a whole (small) sysfs file from offset 0 into `buf`.  Empty string
// on success, else the error.
std::string read_at_zero(int fd, std::string& buf) {
  char tmp[64];
  const ssize_t n = ::pread(fd, tmp, sizeof tmp, 0);
  if (n < 0) return std::strerror(errno);
  buf.assign(tmp, static_cast<size_t>(n));
  return {};
}

std::string printable(std::string_view text) {
  std::string out;
  for (char c : text.substr(0, 32)) {
    if (c == '\n') out += "\\n";
    else if (c >= 0x20 && c < 0x7f) out += c;
    else out += '?';
  }
  return out;
}

}  // namespace

std::string_view device_family(std::string_view device) {
  if (device.starts_with("mlx5")) return "mlx5";
  if (device.starts_with("rxe")) return "rxe";
  return "";
}

std::span<const KnownCounter> known_counters(std::string_view family) {
  if (family == "mlx5") return kMlx5;
  if (family == "rxe") return kRxe;
  return {};
}

Kind classify_counter(std::string_view name) {
  for (std::span<const KnownCounter> table : {std::span<const KnownCounter>(kMlx5),
                                               std::span<const KnownCounter>(kRxe)}) {
    for (const auto& k : table)
      if (name == k.name) return k.kind;
  }
  return Kind::kOther;
}

std::string_view kind_name(Kind kind) {
  switch (kind) {
    case Kind::kRnr: return "rnr";
    case Kind::kRetry: return "retry";
    case Kind::kSequence: return "sequence";
    case Kind::kCongestion: return "congestion";
    case Kind::kOther: return "other";
  }
  return "other";
}

bool parse_counter(std::string_view text, uint64_t& value) {
  auto is_space = [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; };
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  if (text.empty()) return false;
  uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v, 10);
  if (ec != std::errc() || ptr != text.data() + text.size()) return false;
  value = v;
  return true;
}

Result<std::unique_ptr<PortCounters>> PortCounters::open(const std::string& device, uint32_t port,
                                                         const std::string& sysfs_root) {
  const fs::path dev_dir = fs::path(sysfs_root) / device;
  std::error_code ec;
  if (!fs::is_directory(dev_dir, ec)) {
    const auto devices = list_devices(sysfs_root);
    return Status(StatusCode::kInvalidArgument,
                  "unknown RDMA device '" + device + "' (" +
                      (devices.empty() ? "no RDMA devices under " + sysfs_root
                                       : "devices under " + sysfs_root + ": " + join(devices)) +
                      ")");
  }
  const fs::path port_dir = dev_dir / "ports" / std::to_string(port);
  if (!fs::is_directory(port_dir, ec)) {
    std::vector<std::string> ports;
    for (uint32_t p : list_ports(device, sysfs_root)) ports.push_back(std::to_string(p));
    return Status(StatusCode::kInvalidArgument,
                  "RDMA device " + device + " has no port " + std::to_string(port) + " (" +
                      (ports.empty() ? std::string("it has no ports") : "ports: " + join(ports)) + ")");
  }

  std::unique_ptr<PortCounters> pc(new PortCounters(device, port));
  bool any_dir = false;
  for (const char* sub : {"hw_counters", "counters"}) {
    const fs::path dir = port_dir / sub;
    if (!fs::is_directory(dir, ec)) continue;
    any_dir = true;
    std::vector<std::string> names;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      // sysfs counters are regular files; hw_counters also has a
      // "lifespan" attribute (the driver's cache time, not a counter).
      if (!it->is_regular_file(ec)) continue;
      std::string name = it->path().filename().string();
      if (name == "lifespan") continue;
      names.push_back(std::move(name));
    }
    if (ec) {
      pc->open_errors_.push_back(port_name(device, port) + ": cannot list " + dir.string() + ": " +
                                 ec.message());
      ec.clear();
    }
    std::sort(names.begin(), names.end());
    for (auto& name : names) {
      const std::string path = (dir / name).string();
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        pc->open_errors_.push_back(port_name(device, port) + ": cannot open " + path + ": " +
                                   std::strerror(errno));
        continue;
      }
      HwCounter c;
      c.device = device;
      c.port = port;
      // A name in both directories keeps hw_counters' plain name; the PMA
      // one is told apart by its directory.
      const bool dup = std::any_of(pc->counters_.begin(), pc->counters_.end(),
                                   [&](const HwCounter& h) { return h.name == name; });
      c.name = dup ? std::string(sub) + "/" + name : name;
      c.kind = std::string_view(sub) == "hw_counters" ? classify_counter(name) : Kind::kOther;
      pc->counters_.push_back(std::move(c));
      pc->files_.push_back(File{fd, path, {}});
    }
  }
  if (!any_dir) {
    return Status(StatusCode::kUnavailable, "RDMA device " + device + " port " + std::to_string(port) +
                                                " exposes no counters (neither " +
                                                (port_dir / "hw_counters").string() + " nor " +
                                                (port_dir / "counters").string() + " exists)");
  }

  // The family: by name, or else by the known names the port has (a
  // renamed device).
  pc->family_ = std::string(device_family(device));
  if (pc->family_.empty()) {
    for (const char* fam : {"mlx5", "rxe"}) {
      for (const auto& k : known_counters(fam)) {
        for (const auto& c : pc->counters_)
          if (c.name == k.name) pc->family_ = fam;
      }
      if (!pc->family_.empty()) break;
    }
  }
  for (const auto& k : known_counters(pc->family_)) {
    const bool present = std::any_of(pc->counters_.begin(), pc->counters_.end(),
                                     [&](const HwCounter& c) { return c.name == k.name; });
    if (!present) pc->absent_.push_back(port_name(device, port) + ": " + k.name);
  }

  // The baseline: values read, deltas 0.
  pc->sample();
  for (auto& c : pc->counters_) {
    c.delta = 0;
    c.per_second = 0;
  }
  return pc;
}

PortCounters::~PortCounters() {
  for (auto& f : files_)
    if (f.fd >= 0) ::close(f.fd);
}

std::vector<std::string> PortCounters::sample(Clock::time_point now) {
  std::vector<std::string> fresh_errors;
  const double seconds =
      last_ == Clock::time_point{} ? 0.0 : std::chrono::duration<double>(now - last_).count();
  last_ = now;
  std::string buf;
  for (size_t i = 0; i < counters_.size(); ++i) {
    HwCounter& c = counters_[i];
    File& f = files_[i];
    std::string err = read_at_zero(f.fd, buf);
    uint64_t v = 0;
    if (err.empty() && !parse_counter(buf, v)) err = "not a number: '" + printable(buf) + "'";
    if (!err.empty()) {
      if (f.error.empty()) {
        fresh_errors.push_back(port_name(device_, port_) + ": cannot read counter " + c.name + " (" +
                               f.path + "): " + err);
      }
      f.error = std::move(err);
      c.delta = 0;
      c.per_second = 0;
      continue;
    }
    // After a failed read the delta is taken against the last good value;
    // a counter never read before starts at delta 0 (its baseline).
    const bool had_value = f.has_value;
    f.has_value = true;
    f.error.clear();
    // A counter that went backwards was reset (or wrapped): it counts from
    // 0 again, so what it shows now is what happened since.
    c.delta = had_value ? (v >= c.value ? v - c.value : v) : 0;
    c.value = v;
    c.per_second = seconds > 0 ? static_cast<double>(c.delta) / seconds : 0.0;
  }
  return fresh_errors;
}

std::vector<std::string> PortCounters::errors() const {
  std::vector<std::string> out = open_errors_;
  for (size_t i = 0; i < files_.size(); ++i) {
    if (!files_[i].error.empty()) {
      out.push_back(port_name(device_, port_) + ": cannot read counter " + counters_[i].name + " (" +
                    files_[i].path + "): " + files_[i].error);
    }
  }
  return out;
}

std::vector<std::string> list_devices(const std::string& sysfs_root) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(sysfs_root, ec), end; !ec && it != end; it.increment(ec))
    out.push_back(it->path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<uint32_t> list_ports(const std::string& device, const std::string& sysfs_root) {
  std::vector<uint32_t> out;
  std::error_code ec;
  for (fs::directory_iterator it(fs::path(sysfs_root) / device / "ports", ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    uint32_t p = 0;
    auto [ptr, perr] = std::from_chars(name.data(), name.data() + name.size(), p);
    if (perr == std::errc() && ptr == name.data() + name.size()) out.push_back(p);
  }
  std::sort(out.begin(), out.end());
  return out;
}

Result<DeviceCounters> read_device(const std::string& device, const std::string& sysfs_root) {
  std::error_code ec;
  if (device.empty() || device.find('/') != std::string::npos ||
      !fs::is_directory(fs::path(sysfs_root) / device, ec)) {
    const auto devices = list_devices(sysfs_root);
    return Status(StatusCode::kInvalidArgument,
                  "unknown RDMA device '" + device + "' (" +
                      (devices.empty() ? "no RDMA devices under " + sysfs_root
                                       : "devices under " + sysfs_root + ": " + join(devices)) +
                      ")");
  }
  const auto ports = list_ports(device, sysfs_root);
  if (ports.empty()) {
    return Status(StatusCode::kUnavailable, "RDMA device " + device + " has no ports under " +
                                                (fs::path(sysfs_root) / device / "ports").string());
  }
  DeviceCounters out;
  for (uint32_t p : ports) {
    auto pc = PortCounters::open(device, p, sysfs_root);
    if (!pc.ok()) {
      out.errors.push_back(pc.status().message());
      continue;
    }
    const auto& port = *pc.value();
    out.counters.insert(out.counters.end(), port.counters().begin(), port.counters().end());
    out.absent.insert(out.absent.end(), port.absent().begin(), port.absent().end());
    for (auto& e : port.errors()) out.errors.push_back(std::move(e));
  }
  if (out.counters.empty() && !out.errors.empty()) {
    return Status(StatusCode::kUnavailable, "RDMA device " + device + ": " + join(out.errors));
  }
  return out;
}

Result<std::vector<HwCounter>> read_device_counters(const std::string& device,
                                                    const std::string& sysfs_root) {
  auto d = read_device(device, sysfs_root);
  if (!d.ok()) return d.status();
  return std::move(d.value().counters);
}

}  // namespace slotrpc::monitor
