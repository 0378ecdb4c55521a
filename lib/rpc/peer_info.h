// PeerInfo (slotrpc/peer.h) for an accepted connection, and the rule for
// who may call slotrpc.Admin (Config::admin_access).
#pragma once

#include <sys/types.h>

#include <string>

#include "slotrpc/config.h"
#include "slotrpc/peer.h"
#include "slotrpc/status.h"

namespace slotrpc::rpc {

// What the kernel says about the peer of `fd`, a connection accepted on the
// server's Unix socket (`local`) or its TCP port; `address` is what logs
// call it.  The transport is filled in once the handshake has chosen one.
PeerInfo identify_peer(int fd, bool local, std::string address);

// OK when `access` lets `peer` call slotrpc.Admin on a server running as
// `server_uid`; PERMISSION_DENIED saying why and naming the setting.
Status admin_allows(const PeerInfo& peer, AdminAccess access, uid_t server_uid);

}  // namespace slotrpc::rpc
