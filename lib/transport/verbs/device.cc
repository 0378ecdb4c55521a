#include "transport/verbs/device.h"

#include <arpa/inet.h>
#include <sys/mman.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "base/logging.h"

namespace slotrpc::transport::verbs {
namespace {

const char* gid_type_name(uint32_t type) {
  switch (type) {
    case IBV_GID_TYPE_IB:
      return "IB";
    case IBV_GID_TYPE_ROCE_V1:
      return "RoCE v1";
    case IBV_GID_TYPE_ROCE_V2:
      return "RoCE v2";
  }
  return "unknown type";
}

bool gid_is_zero(const ibv_gid& gid) {
  for (uint8_t b : gid.raw)
    if (b != 0) return false;
  return true;
}

struct GidEntry {
  uint32_t index = 0;
  ibv_gid gid{};
  uint32_t type = IBV_GID_TYPE_IB;
};

// One entry of the port's GID table; false when the entry is empty.
bool query_gid(ibv_context* ctx, uint8_t port, uint32_t index, bool ethernet, GidEntry* out) {
  ibv_gid_entry e{};
  if (ibv_query_gid_ex(ctx, port, index, &e, 0) == 0) {
    if (gid_is_zero(e.gid)) return false;
    out->index = index;
    out->gid = e.gid;
    out->type = e.gid_type;
    return true;
  }
  if (errno == ENODATA) return false;
  // Kernels without the extended query: the GID without its type.
  ibv_gid gid{};
  if (ibv_query_gid(ctx, port, static_cast<int>(index), &gid) != 0 || gid_is_zero(gid)) return false;
  out->index = index;
  out->gid = gid;
  out->type = ethernet ? IBV_GID_TYPE_ROCE_V1 : IBV_GID_TYPE_IB;
  return true;
}

std::string describe_entries(const std::vector<GidEntry>& entries) {
  if (entries.empty()) return "none";
  std::string out;
  size_t shown = 0;
  for (const GidEntry& e : entries) {
    if (shown++ == 8) {
      out += fmt::format(", ... ({} in all)", entries.size());
      break;
    }
    if (!out.empty()) out += ", ";
    out += fmt::format("{} {} ({})", e.index, gid_text(e.gid), gid_type_name(e.type));
  }
  return out;
}

std::string port_state_text(ibv_port_state s) { return ibv_port_state_str(s); }

}  // namespace

uint32_t mtu_bytes(uint32_t mtu) {
  switch (mtu) {
    case IBV_MTU_256:
      return 256;
    case IBV_MTU_512:
      return 512;
    case IBV_MTU_1024:
      return 1024;
    case IBV_MTU_2048:
      return 2048;
    case IBV_MTU_4096:
      return 4096;
  }
  return 0;
}

std::string gid_text(const ibv_gid& gid) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (::inet_ntop(AF_INET6, gid.raw, buf, sizeof buf) == nullptr) return "?";
  return buf;
}

bool cached_per_device(const std::string& device, const std::function<bool()>& detect) {
  // One answer per device name, guarded by a mutex: two reactors opening
  // devices at once must neither detect twice nor read a half-written map.
  // Held across detect(), which runs once per device and process (a memory
  // registration), never on the hot path.
  static std::mutex mu;
  static std::map<std::string, bool, std::less<>> answers;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = answers.find(device); it != answers.end()) return it->second;
  const bool answer = detect();
  answers.emplace(device, answer);
  return answer;
}

bool relaxed_ordering_detected(ibv_context* context, const std::string& device) {
  return cached_per_device(device, [&] {
    // Relaxed ordering is a PCIe attribute: a device not on PCI (rxe, siw)
    // has nothing to relax.
    std::error_code ec;
    const auto subsystem = std::filesystem::canonical(
        std::filesystem::path("/sys/class/infiniband") / device / "device" / "subsystem", ec);
    const bool pci = !ec && subsystem.filename() == "pci";
    bool accepted = false;
    if (pci) {
      // The flag is in the optional range: libibverbs drops it when the
      // kernel does not know it, so a failure here means the device refuses.
      ibv_pd* pd = ibv_alloc_pd(context);
      void* page = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (pd != nullptr && page != MAP_FAILED) {
        const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_RELAXED_ORDERING;
        ibv_mr* mr = ibv_reg_mr(pd, page, 4096, access);
        accepted = mr != nullptr;
        if (mr != nullptr) ibv_dereg_mr(mr);
      }
      if (page != MAP_FAILED) ::munmap(page, 4096);
      if (pd != nullptr) ibv_dealloc_pd(pd);
    }
    base::log().info("slotrpc: relaxed ordering (auto) on {}: {}", device,
                 !pci       ? "off, the device is not on PCI"
                 : accepted ? "on"
                            : "off, the device refused IBV_ACCESS_RELAXED_ORDERING");
    return pci && accepted;
  });
}

Result<std::unique_ptr<Device>> Device::open(const Config& config) {
  const uint32_t port = config.device_port;
  int count = 0;
  ibv_device** list = ibv_get_device_list(&count);
  if (list == nullptr) {
    return Status(StatusCode::kUnavailable,
                  fmt::format("cannot list RDMA devices: {} (no RDMA support in this kernel?)",
                              std::strerror(errno)));
  }
  struct ListGuard {
    ibv_device** list;
    ~ListGuard() { ibv_free_device_list(list); }
  } guard{list};
  if (count == 0) {
    return Status(StatusCode::kUnavailable,
                  "no RDMA device found (libibverbs lists none: no RDMA NIC, driver not loaded, or "
                  "no rxe/siw link configured)");
  }

  std::vector<std::string> notes;  // what each device looked like
  bool named_found = false;
  for (int i = 0; i < count; ++i) {
    const std::string name = ibv_get_device_name(list[i]);
    if (!config.device.empty() && name != config.device) {
      notes.push_back(name);
      continue;
    }
    named_found = true;
    ibv_context* ctx = ibv_open_device(list[i]);
    if (ctx == nullptr) {
      notes.push_back(fmt::format("{} (cannot open: {})", name, std::strerror(errno)));
      continue;
    }
    std::unique_ptr<Device> d(new Device);
    d->context_ = ctx;  // closed by ~Device from here on
    d->name_ = name;
    if (ibv_query_device(ctx, &d->attr_) != 0) {
      notes.push_back(fmt::format("{} (ibv_query_device: {})", name, std::strerror(errno)));
      continue;
    }
    if (port < 1 || port > d->attr_.phys_port_cnt) {
      notes.push_back(fmt::format("{} (has {} port(s), no port {})", name,
                                  unsigned{d->attr_.phys_port_cnt}, port));
      continue;
    }
    ibv_port_attr pa{};
    if (ibv_query_port(ctx, static_cast<uint8_t>(port), &pa) != 0) {
      notes.push_back(fmt::format("{} (ibv_query_port {}: {})", name, port, std::strerror(errno)));
      continue;
    }
    if (pa.state != IBV_PORT_ACTIVE) {
      notes.push_back(fmt::format("{} (port {} is {})", name, port, port_state_text(pa.state)));
      continue;
    }
    d->port_ = static_cast<uint8_t>(port);
    d->link_layer_ = pa.link_layer;
    d->lid_ = pa.lid;
    d->active_mtu_ = pa.active_mtu;
    d->max_msg_sz_ = pa.max_msg_sz;
    const bool ethernet = pa.link_layer == IBV_LINK_LAYER_ETHERNET;

    std::vector<GidEntry> valid;
    for (int g = 0; g < pa.gid_tbl_len; ++g) {
      GidEntry e;
      if (query_gid(ctx, d->port_, static_cast<uint32_t>(g), ethernet, &e)) valid.push_back(e);
    }
    const GidEntry* chosen = nullptr;
    if (config.gid_index >= 0) {
      for (const GidEntry& e : valid)
        if (e.index == static_cast<uint32_t>(config.gid_index)) chosen = &e;
      if (chosen == nullptr) {
        const std::string why = fmt::format(
            "GID index {} (SLOTRPC_GID_INDEX) of {} port {} is {}; valid entries: {}",
            config.gid_index, name, port,
            config.gid_index >= pa.gid_tbl_len
                ? fmt::format("outside its table of {} entries", pa.gid_tbl_len)
                : std::string("empty"),
            describe_entries(valid));
        if (!config.device.empty()) return Status(StatusCode::kUnavailable, why);
        notes.push_back(fmt::format("{} ({})", name, why));
        continue;
      }
    } else {
      for (const GidEntry& e : valid) {
        if (e.type == IBV_GID_TYPE_ROCE_V2) {
          chosen = &e;
          break;
        }
      }
      if (chosen == nullptr && !valid.empty()) chosen = &valid.front();
      if (chosen == nullptr) {
        notes.push_back(fmt::format("{} (port {} has no valid GID)", name, port));
        continue;
      }
    }
    d->gid_index_ = static_cast<uint8_t>(chosen->index);
    d->gid_ = chosen->gid;
    d->gid_type_ = chosen->type;
    switch (config.relaxed_ordering) {
      case RelaxedOrdering::kOff:
        d->relaxed_ordering_ = false;
        break;
      case RelaxedOrdering::kOn:
        d->relaxed_ordering_ = true;
        break;
      case RelaxedOrdering::kAuto:
        d->relaxed_ordering_ = relaxed_ordering_detected(ctx, name);
        break;
    }
    return d;
  }

  std::string found;
  for (const auto& n : notes) {
    if (!found.empty()) found += ", ";
    found += n;
  }
  if (!config.device.empty() && !named_found) {
    return Status(StatusCode::kUnavailable,
                  fmt::format("RDMA device '{}' (SLOTRPC_DEVICE) not found; found: {}",
                              config.device, found));
  }
  return Status(StatusCode::kUnavailable,
                fmt::format("no usable RDMA device with an active port {}; found: {}", port, found));
}

Device::~Device() {
  if (context_ != nullptr) ibv_close_device(context_);
}

std::string Device::describe() const {
  return fmt::format("{} port {}, GID {} {} ({}), MTU {}{}", name_, unsigned{port_},
                     unsigned{gid_index_}, gid_text(gid_), gid_type_name(gid_type_),
                     mtu_bytes(active_mtu_), relaxed_ordering_ ? ", relaxed ordering" : "");
}

Result<std::string> probe(const Config& config) {
  auto d = Device::open(config);
  if (!d.ok()) return d.status();
  return d.value()->describe();
}

}  // namespace slotrpc::transport::verbs
