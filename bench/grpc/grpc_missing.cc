// Stand-ins when the build did not find grpc++ (bench/meson.build says so):
// slotrpc-bench then rejects --transports grpc with a clear error.
#include "bench_driver.h"

namespace bench {

bool grpc_available() { return false; }
std::unique_ptr<EchoDriver> make_grpc_driver(const std::string&, uint64_t, const std::string&) { return nullptr; }
int serve_grpc(const std::string&, const std::string&, uint64_t, const std::string&, const std::string&) {
  return 2;
}

}  // namespace bench
