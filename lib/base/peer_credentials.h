// What the kernel says about the process at the other end of a connected
// socket.  Used to fill PeerInfo (slotrpc/peer.h) and to decide who may call
// the Admin service and read the metrics endpoint by default.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>

namespace slotrpc::base {

struct SocketCredentials {
  uint32_t uid = 0;
  uint32_t gid = 0;
  int32_t pid = 0;
};

// SO_PEERCRED of a connected Unix domain socket; empty on failure.
std::optional<SocketCredentials> unix_peer_credentials(int fd);

// True if the connected TCP socket's peer address is a loopback one
// (127.0.0.0/8, ::1, or ::ffff:127.x.y.z).
bool tcp_peer_is_loopback(int fd);

// For a TCP connection from this host, the uid that owns the client's
// socket, looked up in the kernel's socket table with one NETLINK_SOCK_DIAG
// request for the exact address pair (the source `ss -e` reads).  Empty
// when no socket of this host (network namespace) is the other end: the
// peer is elsewhere, or the lookup failed.  Works for loopback and for a
// connection to one of this host's own interface addresses alike.
// Where sock_diag cannot answer (no inet_diag module, as in a minimal VM),
// the same lookup in /proc/net/tcp and tcp6.
std::optional<uint32_t> same_host_tcp_peer_uid(int fd);
// The /proc lookup alone, for tests of the fallback.
std::optional<uint32_t> proc_tcp_peer_uid(int fd);

}  // namespace slotrpc::base
