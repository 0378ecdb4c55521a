#include "base/address.h"

#include <charconv>

#include <fmt/format.h>

namespace slotrpc::base {

Result<Endpoint> parse_address(std::string_view address) {
  auto invalid = [&](std::string_view why) {
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("invalid address '{}': {} (expected host:port or [v6]:port)", address, why));
  };
  Endpoint ep;
  std::string_view port_text;
  if (!address.empty() && address.front() == '[') {
    const size_t close = address.find(']');
    if (close == std::string_view::npos || close + 1 >= address.size() || address[close + 1] != ':')
      return invalid("unterminated [v6] address");
    ep.host = std::string(address.substr(1, close - 1));
    port_text = address.substr(close + 2);
  } else {
    const size_t colon = address.rfind(':');
    if (colon == std::string_view::npos) return invalid("no port");
    ep.host = std::string(address.substr(0, colon));
    port_text = address.substr(colon + 1);
  }
  if (ep.host.empty()) return invalid("empty host");
  unsigned port = 0;
  auto [p, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port_text.empty() || ec != std::errc() || p != port_text.data() + port_text.size() || port > 65535)
    return invalid("port must be a number from 0 to 65535");
  ep.port = static_cast<uint16_t>(port);
  return ep;
}

}  // namespace slotrpc::base
