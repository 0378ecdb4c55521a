// The kernel's byte counters of a TCP socket (TCP_INFO), in a file of their
// own: <linux/tcp.h> has them but clashes with <netinet/tcp.h>, which
// Boost.Asio includes.
#pragma once

#include <cstdint>

namespace slotrpc::fuzz {

// Bytes this socket has received and sent over its life; false on error.
bool tcp_byte_counters(int fd, uint64_t* received, uint64_t* sent);

}  // namespace slotrpc::fuzz
