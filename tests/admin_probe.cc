// Calls slotrpc.Admin/Metrics on a server, for authz_test to run as another
// user: `admin_probe ADDRESS tcp|shm`.  Prints the call's status and exits
// 0 when it succeeded, 3 on PERMISSION_DENIED, 1 on anything else.
#include <slotrpc/slotrpc.h>

#include <cstdio>
#include <string>

#include "rpc/admin/admin.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: admin_probe ADDRESS tcp|shm\n");
    return 2;
  }
  slotrpc::set_environment_overlay(false);
  slotrpc::Config config;
  config.transport = std::string(argv[2]) == "shm" ? slotrpc::TransportKind::kShm
                                                   : slotrpc::TransportKind::kTcp;
  config.log_level = "off";
  auto ch = slotrpc::Channel::connect(argv[1], config);
  if (!ch.ok()) {
    // A server that checks credentials at the handshake refuses here.
    std::printf("connect: %s\n", ch.status().to_string().c_str());
    return ch.status().code() == slotrpc::StatusCode::kPermissionDenied ? 3 : 1;
  }
  auto m = slotrpc::admin::fetch_metrics(*ch.value());
  std::printf("%s\n", m.ok() ? "OK" : m.status().to_string().c_str());
  if (m.ok()) return 0;
  return m.status().code() == slotrpc::StatusCode::kPermissionDenied ? 3 : 1;
}
