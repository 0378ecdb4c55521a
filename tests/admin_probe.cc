// Calls slotrpc.Admin/Metrics on a server, for authz_test to run as another
// user: `admin_probe ADDRESS tcp|shm`.  Prints the call's status and exits
// 0 when it succeeded, 3 on PERMISSION_DENIED, 1 on anything else.
// `admin_probe HOST:PORT http` GETs /metrics instead: 0 on 200, 3 on 403.
#include <slotrpc/slotrpc.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "rpc/admin/admin.h"

namespace {

int http_probe(const std::string& address) {
  const size_t colon = address.rfind(':');
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
  if (::inet_pton(AF_INET, address.substr(0, colon).c_str(), &sa.sin_addr) != 1) return 2;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || ::connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0) return 1;
  const std::string req = "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) return 1;
  std::string reply;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) reply.append(buf, static_cast<size_t>(n));
  ::close(fd);
  std::printf("%s\n", reply.substr(0, reply.find('\r')).c_str());
  if (reply.rfind("HTTP/1.1 200", 0) == 0) return 0;
  if (reply.rfind("HTTP/1.1 403", 0) == 0) return 3;
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[2]) == "http") return http_probe(argv[1]);
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
