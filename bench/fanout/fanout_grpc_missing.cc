// Built instead of grpc/fanout_grpc.cc where grpc++ is missing: the fan-out
// benchmark then runs slotrpc alone and says why.
#include "fanout.h"

namespace bench::fanout {

bool grpc_available() { return false; }

std::unique_ptr<LoadTarget> grpc_target(const std::string&, std::string& error) {
  error = "this build has no gRPC (Debian: libgrpc++-dev libprotobuf-dev, then reconfigure)";
  return nullptr;
}

int serve_grpc(const std::string&, const std::vector<std::string>&, const std::string&) { return 2; }

}  // namespace bench::fanout
