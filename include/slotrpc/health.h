// Health checking (the built-in slotrpc.Health service, in the shape of
// gRPC's grpc.health.v1): every Server answers whether it, or one of its
// services, should be sent work.  Server::set_serving() changes a status;
// Server::shutdown() drains (everything NOT_SERVING, then stops).
//
//   auto st = slotrpc::check_health(*channel, "demo.Echo");
//   if (st.ok() && *st == slotrpc::ServingStatus::kServing) ...
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "slotrpc/channel.h"
#include "slotrpc/export.h"
#include "slotrpc/result.h"

namespace slotrpc {

enum class ServingStatus : int8_t {
  kUnknown = 0,
  kServing = 1,
  kNotServing = 2,
  kServiceUnknown = 3,  // watch only: the server runs no such service
};

SLOTRPC_API std::string_view to_string(ServingStatus status);

// slotrpc.Health/Check: `service` is a fully qualified service name
// ("demo.Echo"), or empty for the server as a whole.  NOT_FOUND for a
// service the server does not run.
SLOTRPC_API Result<ServingStatus> check_health(Channel& channel, const std::string& service,
                                               CallOptions options = {});

// slotrpc.Health/Watch: `on_status` gets the status at once and then each
// change, on the channel's loop; `on_end` gets the final status (OK when the
// server drained).  Cancel with the handle.
SLOTRPC_API CallHandle watch_health(Channel& channel, const std::string& service,
                                    std::function<void(ServingStatus)> on_status,
                                    std::function<void(Status)> on_end, CallOptions options = {});

}  // namespace slotrpc
