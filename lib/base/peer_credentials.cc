// Why a netlink query and not SO_PEERCRED for TCP: SO_PEERCRED exists only
// for Unix domain sockets.  For a TCP connection from this host the
// client's socket is in this host's socket table, and sock_diag returns the uid that
// created it for an exact 4-tuple lookup, unprivileged (as `ss -e` shows).
// No Debian library wraps sock_diag in a form smaller than these lines
// (libmnl would only replace the send/recv), so they are written here.
#include "base/peer_credentials.h"

#include <arpa/inet.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

namespace slotrpc::base {

std::optional<SocketCredentials> unix_peer_credentials(int fd) {
  ucred c{};
  socklen_t len = sizeof c;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c, &len) != 0) return std::nullopt;
  return SocketCredentials{c.uid, c.gid, c.pid};
}

namespace {

// An address as sock_diag wants it: the family, and IPv4 in the first word.
// IPv4-mapped IPv6 addresses (a dual-stack listener's view of an IPv4
// client) become plain IPv4, as the client's own socket is AF_INET.
struct DiagAddress {
  int family = AF_UNSPEC;
  uint32_t words[4] = {0, 0, 0, 0};
  uint16_t port = 0;  // network order
  bool loopback = false;
};

DiagAddress to_diag(const sockaddr_storage& ss) {
  DiagAddress d;
  if (ss.ss_family == AF_INET) {
    const auto& a = reinterpret_cast<const sockaddr_in&>(ss);
    d.family = AF_INET;
    std::memcpy(&d.words[0], &a.sin_addr, 4);
    d.port = a.sin_port;
    d.loopback = (ntohl(a.sin_addr.s_addr) >> 24) == 127;
  } else if (ss.ss_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(ss);
    d.port = a.sin6_port;
    if (IN6_IS_ADDR_V4MAPPED(&a.sin6_addr)) {
      d.family = AF_INET;
      std::memcpy(&d.words[0], &a.sin6_addr.s6_addr[12], 4);
      d.loopback = a.sin6_addr.s6_addr[12] == 127;
    } else {
      d.family = AF_INET6;
      std::memcpy(d.words, &a.sin6_addr, 16);
      d.loopback = IN6_IS_ADDR_LOOPBACK(&a.sin6_addr);
    }
  }
  return d;
}

bool endpoints(int fd, DiagAddress& local, DiagAddress& peer) {
  sockaddr_storage l{}, p{};
  socklen_t ll = sizeof l, pl = sizeof p;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&l), &ll) != 0) return false;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&p), &pl) != 0) return false;
  local = to_diag(l);
  peer = to_diag(p);
  return local.family != AF_UNSPEC && local.family == peer.family;
}

}  // namespace

bool tcp_peer_is_loopback(int fd) {
  DiagAddress local, peer;
  return endpoints(fd, local, peer) && peer.loopback;
}

namespace {

std::optional<uint32_t> netlink_tcp_uid(const DiagAddress& local, const DiagAddress& peer);

// The same lookup in /proc/net/tcp or tcp6, for kernels whose sock_diag
// has no inet module loaded (a minimal VM): one line per socket, addresses
// as the kernel's 32-bit words in hex, the uid in the eighth column.
std::optional<uint32_t> proc_net_tcp_uid(const DiagAddress& local, const DiagAddress& peer) {
  const bool v4 = peer.family == AF_INET;
  std::FILE* f = std::fopen(v4 ? "/proc/net/tcp" : "/proc/net/tcp6", "re");
  if (f == nullptr) return std::nullopt;
  auto hex_address = [v4](const DiagAddress& a) {
    char out[40];
    if (v4) {
      std::snprintf(out, sizeof out, "%08X:%04X", a.words[0], ntohs(a.port));
    } else {
      std::snprintf(out, sizeof out, "%08X%08X%08X%08X:%04X", a.words[0], a.words[1], a.words[2],
                    a.words[3], ntohs(a.port));
    }
    return std::string(out);
  };
  // The client's socket: its local address is our peer, its remote is us.
  const std::string want_local = hex_address(peer);
  const std::string want_remote = hex_address(local);
  std::optional<uint32_t> uid;
  char line[512];
  while (!uid && std::fgets(line, sizeof line, f) != nullptr) {
    char l[64], r[64];
    unsigned st = 0, u = 0;
    unsigned long tx = 0, rx = 0, tm = 0, retr = 0;
    int sl = 0;
    if (std::sscanf(line, " %d: %63s %63s %x %lx:%lx %lx:%lx %lx %u", &sl, l, r, &st, &tx, &rx, &tm,
                    &retr, &retr, &u) == 10 &&
        want_local == l && want_remote == r) {
      uid = u;
    }
  }
  std::fclose(f);
  return uid;
}

}  // namespace

std::optional<uint32_t> same_host_tcp_peer_uid(int fd) {
  DiagAddress local, peer;
  if (!endpoints(fd, local, peer)) return std::nullopt;
  if (auto uid = netlink_tcp_uid(local, peer)) return uid;
  return proc_net_tcp_uid(local, peer);
}

std::optional<uint32_t> proc_tcp_peer_uid(int fd) {
  DiagAddress local, peer;
  if (!endpoints(fd, local, peer)) return std::nullopt;
  return proc_net_tcp_uid(local, peer);
}

namespace {

std::optional<uint32_t> netlink_tcp_uid(const DiagAddress& local, const DiagAddress& peer) {
  const int nl = ::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (nl < 0) return std::nullopt;
  struct {
    nlmsghdr header;
    inet_diag_req_v2 request;
  } req{};
  req.header.nlmsg_len = sizeof req;
  req.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  req.header.nlmsg_flags = NLM_F_REQUEST;
  req.request.sdiag_family = static_cast<uint8_t>(peer.family);
  req.request.sdiag_protocol = IPPROTO_TCP;
  req.request.idiag_states = ~0u;
  // The client's socket: its source is our peer, its destination is us.
  req.request.id.idiag_sport = peer.port;
  req.request.id.idiag_dport = local.port;
  std::memcpy(req.request.id.idiag_src, peer.words, sizeof peer.words);
  std::memcpy(req.request.id.idiag_dst, local.words, sizeof local.words);
  req.request.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
  req.request.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  std::optional<uint32_t> uid;
  ssize_t n;
  do {
    n = ::send(nl, &req, sizeof req, 0);
  } while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof req)) {
    alignas(nlmsghdr) char buf[8192];
    do {
      n = ::recv(nl, buf, sizeof buf, 0);
    } while (n < 0 && errno == EINTR);
    // One answer: the socket (SOCK_DIAG_BY_FAMILY) or an error (NLMSG_ERROR).
    if (n >= static_cast<ssize_t>(sizeof(nlmsghdr))) {
      const auto* h = reinterpret_cast<const nlmsghdr*>(buf);
      if (NLMSG_OK(h, static_cast<uint32_t>(n)) && h->nlmsg_type == SOCK_DIAG_BY_FAMILY &&
          h->nlmsg_len >= NLMSG_LENGTH(sizeof(inet_diag_msg))) {
        const auto* msg = static_cast<const inet_diag_msg*>(NLMSG_DATA(h));
        uid = msg->idiag_uid;
      }
    }
  }
  ::close(nl);
  return uid;
}

}  // namespace

}  // namespace slotrpc::base
