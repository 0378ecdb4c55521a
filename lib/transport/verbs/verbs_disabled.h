// The verbs transport's interface in a TCP-only build (-Dverbs=disabled, or
// -Dverbs=auto on a machine without libibverbs): the names the rest of the
// library uses (lib/rpc/, lib/reactor/, lib/transport/verbs/monitor.h), declared without
// <infiniband/verbs.h>, so those files compile unchanged in both builds.
//
// verbs_transport.h and device.h include this instead of their own
// declarations when SLOTRPC_WITH_VERBS is 0.  Their implementation is
// verbs_disabled.cc: probe() and VerbsTransport::create() fail with
// kVerbsDisabledMessage, so transport=auto settles on TCP (a Server or
// Channel asks probe() before it proposes verbs) and transport=verbs fails
// saying why.  No VerbsTransport, VerbsLink or Device is ever created, so
// their member functions are declared for the compiler only and abort if
// reached.
//
// The handshake extension (QpInfo, encode/decode, qp_info.cc) is compiled
// in both builds: it is the wire protocol, and a TCP-only peer still has to
// read a verbs proposal (to answer it with tcp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "slotrpc/config.h"
#include "slotrpc/result.h"
#include "transport/transport.h"
#include "transport/verbs/qp_info.h"

namespace slotrpc::transport::verbs {

// What probe() and VerbsTransport::create() answer in this build.
inline constexpr const char* kVerbsDisabledMessage =
    "slotrpc was built without verbs (-Dverbs=disabled or libibverbs not found); "
    "use SLOTRPC_TRANSPORT=tcp";

// The handshake extension (QpInfo) is real in this build too: qp_info.h.

// Bytes of a path MTU code of the extension (enum ibv_mtu: 1 = 256 ..
// 5 = 4096); 0 for an unknown one.
uint32_t mtu_bytes(uint32_t mtu);

// ------------------------------------------------------------ stubs
// Fails with kVerbsDisabledMessage.
Result<std::string> probe(const Config& config);

class Device {
 public:
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  const std::string& name() const;
  uint8_t port() const;
  std::string describe() const;

 private:
  Device() = default;
};

class VerbsLink : public Link {
 public:
  QpInfo local_info() const;
  Status connect(const QpInfo& peer, int control_fd, const std::string& peer_name);

 private:
  VerbsLink() = default;
};

class VerbsTransport : public Transport {
 public:
  // Fails with kVerbsDisabledMessage.
  static Result<std::unique_ptr<VerbsTransport>> create(const Config& config);

  Result<std::unique_ptr<VerbsLink>> create_link(std::string description, uint32_t slot_count);
  const Device& device() const;

  struct ReceiveQueueInfo {
    std::string queue;
    uint32_t capacity = 0;
    uint32_t posted = 0;
    uint32_t low_water = 0;
  };
  void receive_queues(std::vector<ReceiveQueueInfo>& out) const;

 private:
  VerbsTransport() = default;
};

}  // namespace slotrpc::transport::verbs
