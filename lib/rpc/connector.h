// Connection setup over TCP (Boost.Asio): address parsing, connect with a
// timeout, and deadline-bounded blocking I/O for the handshake.  Runs on the
// caller's thread (Channel::connect) or the server's accept thread, never on
// a reactor.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "slotrpc/result.h"

namespace slotrpc::rpc {

using Deadline = std::chrono::steady_clock::time_point;

struct Endpoint {
  std::string host;
  uint16_t port = 0;
};

// "host:port" or "[v6 address]:port"; port 0 is allowed for listening.
Result<Endpoint> parse_address(std::string_view address);

// Connected, blocking socket fd, or UNAVAILABLE naming the address and why.
Result<int> connect_tcp(const Endpoint& to, Deadline deadline);

Status write_all(int fd, std::span<const std::byte> data, Deadline deadline);
Status read_exact(int fd, std::span<std::byte> data, Deadline deadline);

// "127.0.0.1:5000" for the peer (or local end) of a connected socket.
std::string peer_name(int fd);
std::string local_name(int fd);

}  // namespace slotrpc::rpc
