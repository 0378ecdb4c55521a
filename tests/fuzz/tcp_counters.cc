#include "tcp_counters.h"

#include <linux/tcp.h>  // struct tcp_info with tcpi_bytes_received (Linux 4.1+), tcpi_bytes_sent (4.19+)
#include <netinet/in.h>
#include <sys/socket.h>

namespace slotrpc::fuzz {

bool tcp_byte_counters(int fd, uint64_t* received, uint64_t* sent) {
  tcp_info info{};
  socklen_t len = sizeof info;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return false;
  *received = info.tcpi_bytes_received;
  *sent = info.tcpi_bytes_sent;
  return true;
}

}  // namespace slotrpc::fuzz
