// What runs between a call's arrival and its handler: the server's own rule
// for its Admin service and the user's interceptors (Server::add_interceptor).
// Kept in one object so that a session with nothing to check pays one null
// test per call, and a server without interceptors passes none.
#pragma once

#include <vector>

#include "slotrpc/service.h"

namespace slotrpc::core {

struct CallChecks {
  // Run in order before the handler of every method; the first non-OK
  // status is the call's answer and the handler does not run.
  std::vector<ServerInterceptor> interceptors;

  Status run(const ServerCall& call) const {
    for (const ServerInterceptor& check : interceptors) {
      Status st = check(call);
      if (!st.ok()) return st;
    }
    return {};
  }
};

}  // namespace slotrpc::core
