#include "rpc/discovery/etcd_target.h"

#include <fmt/format.h>

namespace slotrpc::rpc::discovery {

Result<EtcdTarget> parse_etcd_target(std::string_view rest) {
  const auto bad = [&](std::string_view why) {
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("etcd target 'etcd://{}': {} (expected etcd://HOST:PORT/prefix, e.g. "
                              "etcd://127.0.0.1:2379/services/kv)",
                              rest, why));
  };
  const size_t slash = rest.find('/');
  if (slash == std::string_view::npos) return bad("no /prefix after etcd's address");
  auto endpoint = base::parse_address(rest.substr(0, slash));
  if (!endpoint.ok()) return bad(endpoint.status().message());
  if (endpoint->port == 0) return bad("etcd's port is 0");
  std::string_view prefix = rest.substr(slash);
  while (!prefix.empty() && prefix.front() == '/') prefix.remove_prefix(1);
  while (!prefix.empty() && prefix.back() == '/') prefix.remove_suffix(1);
  if (prefix.empty()) return bad("the prefix is empty");
  EtcdTarget t;
  t.endpoint = std::move(endpoint).value();
  t.key_prefix = "/" + std::string(prefix) + "/";
  return t;
}

}  // namespace slotrpc::rpc::discovery
