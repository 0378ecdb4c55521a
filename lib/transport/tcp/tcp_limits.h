// What the two halves of the TCP transport's framing share (tcp_link.cc,
// tcp_transport.cc): limits and initial capacities.  Internal to
// lib/transport/tcp/.
#pragma once

#include <chrono>
#include <climits>
#include <cstddef>
#include <cstring>
#include <string>

#include <boost/asio/ip/tcp.hpp>

namespace slotrpc::transport::tcp_limits {


namespace asio = boost::asio;
using asio::ip::tcp;

#ifdef IOV_MAX
inline constexpr size_t kMaxIov = IOV_MAX;
#else
inline constexpr size_t kMaxIov = 1024;
#endif

// Reads per readable event before moving on to the next link, so one busy
// peer cannot starve the others; level-triggered epoll brings us back.
inline constexpr int kReadBudget = 4;
// Events taken per epoll_wait: TcpTransport::kMaxEvents.
using Clock = std::chrono::steady_clock;
// Initial capacities: reserved once so steady-state post()/poll() never
// allocate (vectors only grow past these under unusual bursts, then stay).
inline constexpr size_t kPendingReserve = 256;
inline constexpr size_t kReadyReserve = 1024;

inline std::string errno_text(const char* what, int err) {
  std::string s(what);
  s += ": ";
  s += std::strerror(err);
  return s;
}


}  // namespace slotrpc::transport::tcp_limits
