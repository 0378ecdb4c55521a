// "HOST:PORT/prefix", the part of an etcd:// target after the scheme, as
// both the resolver and a server's registration read it.
#pragma once

#include <string>
#include <string_view>

#include "base/address.h"
#include "slotrpc/result.h"

namespace slotrpc::rpc::discovery {

struct EtcdTarget {
  base::Endpoint endpoint;  // etcd's client port (its JSON gateway)
  // Where servers register: "/prefix/" (one leading and one trailing
  // slash whatever the target said); a server's key is this plus its address.
  std::string key_prefix;
};

// INVALID_ARGUMENT naming the target and what is wrong with it.
Result<EtcdTarget> parse_etcd_target(std::string_view rest);

}  // namespace slotrpc::rpc::discovery
