// etcd://HOST:PORT/prefix: the servers registered under a prefix in etcd
// (Server::register_with, lib/rpc/discovery/registration.h), for a
// channel's resolver (slotrpc/resolver.h).
//
// It lists the keys under the prefix (each value is a server's "HOST:PORT"),
// then watches the prefix and reports the full list on every change: a
// server that registers, stops (its key deleted) or dies (its lease
// expires, which deletes its key).  When etcd cannot be reached it reports
// the error once and tries again with backoff (100 ms doubling to 5 s);
// when it is back it lists afresh.
#pragma once

#include <memory>
#include <string_view>

#include "slotrpc/resolver.h"
#include "slotrpc/result.h"

namespace slotrpc::rpc::discovery {

// The factory of the "etcd" scheme: REST is "HOST:PORT/prefix".
Result<std::unique_ptr<Resolver>> make_etcd_resolver(std::string_view rest);

}  // namespace slotrpc::rpc::discovery
