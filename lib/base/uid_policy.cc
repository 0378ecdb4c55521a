#include "base/uid_policy.h"

#include <unistd.h>

#include <charconv>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace slotrpc::base {

Result<UidPolicy> parse_uid_policy(std::string_view setting, std::string_view text) {
  UidPolicy p;
  p.text = std::string(text);
  auto bad = [&] {
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("invalid setting {}='{}': allowed {}", setting, text, kUidPolicyAllowed));
  };
  if (text.empty() || text == "self") {
    p.uids.push_back(::geteuid());
    return p;
  }
  if (text == "any") {
    p.any = true;
    return p;
  }
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string_view item = text.substr(pos, comma - pos);
    if (item == "self") {
      p.uids.push_back(::geteuid());
    } else {
      // A uid: digits only, below (uid_t)-1, which means "no uid".
      uint64_t v = 0;
      const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
      if (item.empty() || ec != std::errc() || end != item.data() + item.size() || v >= 0xffffffffull)
        return bad();
      p.uids.push_back(static_cast<uint32_t>(v));
    }
    pos = comma + 1;
  }
  return p;
}

bool allows(const UidPolicy& policy, uint32_t uid) {
  if (policy.any) return true;
  for (uint32_t u : policy.uids)
    if (u == uid) return true;
  return false;
}

std::string describe(const UidPolicy& policy) {
  if (policy.any) return "Config.shm_peer_uids (SLOTRPC_SHM_PEER_UIDS) = 'any'";
  return fmt::format("Config.shm_peer_uids (SLOTRPC_SHM_PEER_UIDS) = '{}' (uid{} {})",
                     policy.text.empty() ? "self" : policy.text, policy.uids.size() == 1 ? "" : "s",
                     fmt::join(policy.uids, ", "));
}

}  // namespace slotrpc::base
