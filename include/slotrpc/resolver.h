// Resolvers: how a channel target names a set of servers.
//
// Channel::connect(target) takes "HOST:PORT", or "SCHEME://REST".  A
// resolver turns REST into the current list of "HOST:PORT" endpoints and
// reports each change; the channel keeps one session per endpoint and picks
// one per call (Config::lb_policy, SLOTRPC_LB_POLICY).  An endpoint whose
// session dies is ejected and probed back with backoff, and the resolver
// is asked to refresh().
//
// Built in: list://h1:p1,h2:p2, dns:///name:port and etcd://host:port/prefix.
// A program adds its own scheme with register_resolver() before it connects:
//
//   slotrpc::register_resolver("static", [](std::string_view rest) {
//     return std::unique_ptr<slotrpc::Resolver>(new MyResolver(rest));
//   });
//   auto ch = slotrpc::Channel::connect("static://my-fleet").value();
//
// The interface is small on purpose (like gRPC's resolver and brpc's naming
// service): a resolver knows nothing of sessions, transports or balancing.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "slotrpc/export.h"
#include "slotrpc/result.h"
#include "slotrpc/status.h"

namespace slotrpc {

// A resolver's answer: the full current endpoint list ("HOST:PORT" each,
// IPv6 hosts in brackets), or why it could not resolve.  An empty list is a
// valid answer (no server is registered yet): calls wait for an endpoint
// until their deadline, or fail with UNAVAILABLE.
using ResolverUpdate = std::function<void(Result<std::vector<std::string>>)>;

class SLOTRPC_API Resolver {
 public:
  virtual ~Resolver();
  // Starts resolving.  `update` is called with the first answer and then
  // with every change, from any thread (a resolver's own, or the caller's),
  // never after stop() returned.  Called once.
  virtual void start(ResolverUpdate update) = 0;
  // A hint that an endpoint failed: a resolver that polls (dns) resolves
  // again now rather than at its next period.  Any thread; may be ignored.
  virtual void refresh() {}
  // Stops resolving; waits for an update in progress.  Called once.
  virtual void stop() = 0;
};

// Makes a resolver for REST, the part of the target after "SCHEME://".
// INVALID_ARGUMENT for a REST it cannot parse, saying why.
using ResolverFactory = std::function<Result<std::unique_ptr<Resolver>>(std::string_view rest)>;

// Adds or replaces the factory for `scheme` (letters, digits, '+', '-',
// '.'; INVALID_ARGUMENT otherwise).  Thread-safe; affects later connects.
SLOTRPC_API Status register_resolver(const std::string& scheme, ResolverFactory factory);

}  // namespace slotrpc
