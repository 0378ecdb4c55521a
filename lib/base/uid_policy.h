// Which local users may be at the other end of an shm session's Unix
// socket (Config::shm_peer_uids, SLOTRPC_SHM_PEER_UIDS).
//
// Why: a server's default shm rendezvous is the abstract name
// @slotrpc-<port>, which any local process can bind first.  Both ends
// check the uid the kernel recorded for the peer (SO_PEERCRED) against
// this policy before they trust a byte or send one, so a process of a user
// the policy leaves out can neither pose as the server nor reach it
// (docs/design.md, "Trust and security" -> "Shared memory").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "slotrpc/result.h"

namespace slotrpc::base {

struct UidPolicy {
  bool any = false;
  std::vector<uint32_t> uids;  // "self" resolved to this process's effective uid
  std::string text;            // as written ("" shows as "self")
};

inline constexpr std::string_view kUidPolicyAllowed =
    "empty or self (this process's uid), any, or a comma-separated list of uids and self "
    "(e.g. self,1001)";

// Parses `text`; the error names `setting`, the text and kUidPolicyAllowed.
Result<UidPolicy> parse_uid_policy(std::string_view setting, std::string_view text);

bool allows(const UidPolicy& policy, uint32_t uid);

// "Config.shm_peer_uids (SLOTRPC_SHM_PEER_UIDS) = 'self' (uid 1000)": the
// policy as a refusal names it.
std::string describe(const UidPolicy& policy);

}  // namespace slotrpc::base
