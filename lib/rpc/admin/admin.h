// slotrpc.Admin: the built-in service every Server registers (admin.fbs).
// Metrics returns the server's MetricsSnapshot; slotrpc-stat --address and
// tests fetch it with fetch_metrics().  Calls are rationed server-wide (64
// at once, then 200 a second; beyond, RESOURCE_EXHAUSTED) and so are fresh
// snapshots (8, then 20 a second; beyond, the latest again), so Admin calls
// cannot take the server from its other calls (admin.cc says why).
#pragma once

#include <functional>
#include <memory>

#include "slotrpc/channel.h"
#include "slotrpc/metrics.h"
#include "slotrpc/result.h"
#include "slotrpc/service.h"

namespace slotrpc::admin {

// The service, answering with what `snapshot` returns (Server::metrics()).
// The returned object owns the handlers' state; keep it alive as long as
// the definition is registered.
class AdminServiceImpl;
std::shared_ptr<AdminServiceImpl> make_service(std::function<MetricsSnapshot()> snapshot);
ServiceDefinition definition(AdminServiceImpl& impl);

// Calls slotrpc.Admin/Metrics over `channel`.
Result<MetricsSnapshot> fetch_metrics(Channel& channel, CallOptions options = {});

}  // namespace slotrpc::admin
