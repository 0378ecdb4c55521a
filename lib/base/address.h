// "host:port" addresses, as every listening or connecting part of the
// library takes them (servers, channels, the metrics port).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "slotrpc/result.h"

namespace slotrpc::base {

struct Endpoint {
  std::string host;
  uint16_t port = 0;
};

// "host:port" or "[v6 address]:port"; port 0 is allowed for listening.
Result<Endpoint> parse_address(std::string_view address);

}  // namespace slotrpc::base
