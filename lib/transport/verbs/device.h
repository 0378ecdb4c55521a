// Which RDMA device, port and GID the verbs transport uses, chosen from
// Config (device, device_port, gid_index, relaxed_ordering):
//
//   device      by name, or (empty) the first device whose port
//               `device_port` is ACTIVE
//   GID         by index, or "auto": the first valid RoCE v2 entry of the
//               port, else the first valid entry of any type
//
// A choice that cannot be satisfied is an error that says what was found
// (devices, port states, the GID table), so a misconfigured host is
// diagnosed from one log line.
//
// Not on the hot path: runs when a reactor opens its verbs transport and
// when a Server or Channel decides whether verbs is available.
#pragma once

// A TCP-only build (-Dverbs=disabled, or auto without libibverbs) declares
// the names the library uses without <infiniband/verbs.h>: verbs_disabled.h.
#include "slotrpc_verbs_config.h"  // SLOTRPC_WITH_VERBS 0 or 1 (lib/meson.build)
#if !SLOTRPC_WITH_VERBS
#include "transport/verbs/verbs_disabled.h"
#else

#include <infiniband/verbs.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "slotrpc/config.h"
#include "slotrpc/result.h"

namespace slotrpc::transport::verbs {

class Device {
 public:
  // Opens the device `config` selects and checks port and GID.
  static Result<std::unique_ptr<Device>> open(const Config& config);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  ibv_context* context() const { return context_; }
  const std::string& name() const { return name_; }
  uint8_t port() const { return port_; }
  uint8_t gid_index() const { return gid_index_; }
  const ibv_gid& gid() const { return gid_; }
  bool roce_v2() const { return gid_type_ == IBV_GID_TYPE_ROCE_V2; }
  bool ethernet() const { return link_layer_ == IBV_LINK_LAYER_ETHERNET; }
  uint8_t link_layer() const { return link_layer_; }
  uint16_t lid() const { return lid_; }
  ibv_mtu active_mtu() const { return active_mtu_; }
  // The port's largest message (one work request), bytes.
  uint32_t max_msg_size() const { return max_msg_sz_; }
  const ibv_device_attr& attr() const { return attr_; }
  // Config::relaxed_ordering resolved for this device (auto: detected once
  // per device and process).
  bool relaxed_ordering() const { return relaxed_ordering_; }

  // "rxe0 port 1, GID 0 fe80::... (RoCE v2), MTU 1024"
  std::string describe() const;

 private:
  Device() = default;

  ibv_context* context_ = nullptr;
  std::string name_;
  uint8_t port_ = 1;
  uint8_t gid_index_ = 0;
  ibv_gid gid_{};
  uint32_t gid_type_ = IBV_GID_TYPE_IB;
  uint8_t link_layer_ = IBV_LINK_LAYER_UNSPECIFIED;
  uint16_t lid_ = 0;
  ibv_mtu active_mtu_ = IBV_MTU_1024;
  uint32_t max_msg_sz_ = 0;
  ibv_device_attr attr_{};
  bool relaxed_ordering_ = false;
};

// Whether this host can use verbs under `config`: OK with a description of
// the choice ("rxe0 port 1, ..."), or why not.  Opens and closes the device.
Result<std::string> probe(const Config& config);

// Bytes of an ibv_mtu value (IBV_MTU_1024 -> 1024); 0 for an unknown one.
uint32_t mtu_bytes(uint32_t mtu);
// "fe80::7422:ddff:fe0f:78bd"
std::string gid_text(const ibv_gid& gid);

// Relaxed-ordering detection for RelaxedOrdering::kAuto, run once per
// device and process (cached_per_device): true when `device` sits on PCI
// (the attribute is a PCIe one; software devices such as rxe have none) and
// a registration with IBV_ACCESS_RELAXED_ORDERING succeeds on it.  Each
// device gets its own answer: a host with a PCI NIC and rxe must not hand
// one's answer to the other.
bool relaxed_ordering_detected(ibv_context* context, const std::string& device);

// detect() the first time `device` is asked about, its cached answer after
// that; thread-safe (a mutex-guarded map).  Exposed for tests.
bool cached_per_device(const std::string& device, const std::function<bool()>& detect);

}  // namespace slotrpc::transport::verbs

#endif  // SLOTRPC_WITH_VERBS
