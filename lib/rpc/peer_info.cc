#include "rpc/peer_info.h"

#include <fmt/format.h>

#include "base/peer_credentials.h"

namespace slotrpc {

std::string PeerInfo::describe() const {
  std::string out = transport.empty() ? address : transport + " " + address;
  if (pid) out += fmt::format(" pid {}", *pid);
  if (uid) out += fmt::format(" uid {}", *uid);
  if (gid) out += fmt::format(" gid {}", *gid);
  if (tls) out += tls_subject.empty() ? " tls" : " tls " + tls_subject;
  return out;
}

namespace rpc {

PeerInfo identify_peer(int fd, bool local, std::string address) {
  PeerInfo info;
  info.address = std::move(address);
  if (local) {
    info.same_host = true;
    if (auto c = base::unix_peer_credentials(fd)) {
      info.uid = c->uid;
      info.gid = c->gid;
      info.pid = c->pid;
    }
  } else {
    // Found in this host's socket table: the client runs here, whatever
    // address it used (loopback, or an interface of this host's own).
    info.uid = base::same_host_tcp_peer_uid(fd);
    info.same_host = info.uid.has_value() || base::tcp_peer_is_loopback(fd);
  }
  return info;
}

Status admin_allows(const PeerInfo& peer, AdminAccess access, uid_t server_uid) {
  switch (access) {
    case AdminAccess::kAny:
      return {};
    case AdminAccess::kOff:
      return Status(StatusCode::kPermissionDenied,
                    "slotrpc.Admin is off on this server (admin_access = off, SLOTRPC_ADMIN_ACCESS)");
    case AdminAccess::kSameUser:
      break;
  }
  if (!peer.same_host) {
    return Status(StatusCode::kPermissionDenied,
                  fmt::format("slotrpc.Admin answers only this host's user {} (admin_access = "
                              "same-user, SLOTRPC_ADMIN_ACCESS); {} is not on this host",
                              server_uid, peer.describe()));
  }
  if (!peer.uid) {
    return Status(StatusCode::kPermissionDenied,
                  fmt::format("slotrpc.Admin answers only this host's user {} (admin_access = "
                              "same-user, SLOTRPC_ADMIN_ACCESS); the uid of {} is unknown",
                              server_uid, peer.describe()));
  }
  if (*peer.uid != server_uid) {
    return Status(StatusCode::kPermissionDenied,
                  fmt::format("slotrpc.Admin answers only this host's user {} (admin_access = "
                              "same-user, SLOTRPC_ADMIN_ACCESS), not uid {} ({})",
                              server_uid, *peer.uid, peer.describe()));
  }
  return {};
}

}  // namespace rpc
}  // namespace slotrpc
