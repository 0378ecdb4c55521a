// The verbs transport in a TCP-only build (verbs_disabled.h): no
// libibverbs, no ibv_* symbol.  Compiled instead of the transport's other
// sources (lib/meson.build) when SLOTRPC_WITH_VERBS is 0; qp_info.cc (the
// handshake extension) is compiled in both builds.
#include "transport/verbs/verbs_transport.h"
#include "transport/verbs/device.h"
#include "transport/verbs/device_probe.h"

#if SLOTRPC_WITH_VERBS
#error "verbs_disabled.cc is for the TCP-only build (SLOTRPC_WITH_VERBS=0)"
#endif

#include <cstdio>
#include <cstdlib>

namespace slotrpc::transport::verbs {

namespace {

Status disabled() { return Status(StatusCode::kUnavailable, kVerbsDisabledMessage); }

// Member functions of objects that this build never creates (create()
// fails): reaching one is a bug in the caller, not a user error.
[[noreturn]] void never_created(const char* what) {
  std::fprintf(stderr, "slotrpc: internal error: %s called, but this build has no verbs transport\n", what);
  std::abort();
}

}  // namespace

uint32_t mtu_bytes(uint32_t mtu) {
  // The protocol's path MTU codes (docs/protocol.md, section 7), which are
  // enum ibv_mtu's values.
  switch (mtu) {
    case 1: return 256;
    case 2: return 512;
    case 3: return 1024;
    case 4: return 2048;
    case 5: return 4096;
    default: return 0;
  }
}

Result<std::string> probe(const Config&) { return disabled(); }

std::vector<std::string> list_devices() { return {}; }
std::string describe_devices() { return "not looked for (built without verbs)"; }

Result<std::unique_ptr<VerbsTransport>> VerbsTransport::create(const Config&) { return disabled(); }

Result<std::unique_ptr<VerbsLink>> VerbsTransport::create_link(std::string, uint32_t) {
  never_created("VerbsTransport::create_link");
}
const Device& VerbsTransport::device() const { never_created("VerbsTransport::device"); }
void VerbsTransport::receive_queues(std::vector<ReceiveQueueInfo>&) const {
  never_created("VerbsTransport::receive_queues");
}

QpInfo VerbsLink::local_info() const { never_created("VerbsLink::local_info"); }
Status VerbsLink::connect(const QpInfo&, int, const std::string&) { never_created("VerbsLink::connect"); }

const std::string& Device::name() const { never_created("Device::name"); }
uint8_t Device::port() const { never_created("Device::port"); }
std::string Device::describe() const { never_created("Device::describe"); }

}  // namespace slotrpc::transport::verbs
