// Who is on the other end of a session: what a handler or an interceptor
// reads (ServerCall::peer_info()) to decide whether to serve a call.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "slotrpc/export.h"

namespace slotrpc {

struct SLOTRPC_API PeerInfo {
  // "tcp", "verbs" or "shm": the transport the session runs on.
  std::string transport;
  // "10.0.0.2:40000", or "unix:@slotrpc-7000" for a session that arrived on
  // the server's Unix socket (shm).
  std::string address;
  // On this host: the server's Unix socket, or a TCP connection whose
  // client socket is in this host's socket table (or from loopback).
  bool same_host = false;
  // The peer process's credentials, when the kernel vouches for them: from
  // SO_PEERCRED on the Unix socket (uid, gid, pid), or for a TCP connection
  // from this host the uid owning the client's socket (the kernel's socket
  // table, sock_diag).  Empty for remote peers: an address is no identity.
  std::optional<uint32_t> uid;
  std::optional<uint32_t> gid;
  std::optional<int32_t> pid;
  // TLS sessions: the client certificate's subject and subject alternative
  // names, once verified against the server's CA bundle; empty without a
  // client certificate.
  bool tls = false;
  std::string tls_subject;
  std::vector<std::string> tls_sans;

  // "tcp 127.0.0.1:40000 uid 1000" and the like, for logs and messages.
  std::string describe() const;
};

}  // namespace slotrpc
