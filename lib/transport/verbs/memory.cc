// Memory a link registers: regions, type-2 windows, deregistration.
#include "transport/verbs/verbs_transport.h"

#include "transport/verbs/verbs_internal.h"

namespace slotrpc::transport::verbs {

Result<MemoryRegion> VerbsLink::register_memory(std::span<std::byte> memory, Access access) {
  if (pd_ == nullptr) return Status(StatusCode::kInternal, "verbs link has no protection domain");
  // Remote write only for the receive ring, never remote read or atomics;
  // send rings are read by the NIC only.  In its own PD the ring is
  // registered REMOTE_WRITE; in the shared PD the MR allows no remote
  // access at all and a type-2 window bound to this link's queue pair
  // grants the write (bind_ring_window).
  const bool window = access == Access::kRemoteWrite && !owns_pd_;
  int flags = 0;
  if (access == Access::kRemoteWrite)
    flags = IBV_ACCESS_LOCAL_WRITE | (window ? IBV_ACCESS_MW_BIND : IBV_ACCESS_REMOTE_WRITE);
  if (owner_.device().relaxed_ordering()) flags |= IBV_ACCESS_RELAXED_ORDERING;
  ibv_mr* mr = ibv_reg_mr(pd_, memory.data(), memory.size(), flags);
  if (mr == nullptr) {
    const int err = errno;
    return Status(StatusCode::kResourceExhausted,
                  fmt::format("ibv_reg_mr of {} bytes: {}{}", memory.size(), std::strerror(err),
                              err == ENOMEM || err == EPERM || err == EFAULT
                                  ? " (locked-memory limit too low? see ulimit -l)"
                                  : ""));
  }
  MemoryRegion r;
  r.base = memory.data();
  r.length = memory.size();
  r.lkey = mr->lkey;
  r.rkey = mr->rkey;
  r.handle = mr;
  if (window) {
    ibv_mw* mw = ibv_alloc_mw(pd_, IBV_MW_TYPE_2);
    if (mw == nullptr) {
      const int err = errno;
      ibv_dereg_mr(mr);
      return Status(StatusCode::kUnavailable,
                    fmt::format("ibv_alloc_mw (type 2): {} (SLOTRPC_SRQ=off uses a protection "
                                "domain per session instead)", std::strerror(err)));
    }
    // The peer learns this key now; the bind in connect() gives it to the
    // window.
    const uint32_t rkey = ibv_inc_rkey(mw->rkey);
    windows_.push_back(Window{mr, mw, rkey});
    r.rkey = rkey;
  }
  mrs_.push_back(mr);
  return r;
}

void VerbsLink::deregister(MemoryRegion& region) {
  auto* mr = static_cast<ibv_mr*>(region.handle);
  auto it = std::find(mrs_.begin(), mrs_.end(), mr);
  if (mr == nullptr || it == mrs_.end()) {
    region = MemoryRegion{};
    return;
  }
  // Memory must not vanish under work the NIC may still do: a live link
  // stops first (sessions close their link before this anyway).
  if (!down_ && connected_) fail("memory deregistered while the link was up");
  // A window goes before its MR (an MR with a bound window cannot go).
  for (auto w = windows_.begin(); w != windows_.end(); ++w) {
    if (w->mr != mr) continue;
    if (w->mw == ring_window_.mw) ring_window_ = Window{};
    if (ibv_dealloc_mw(w->mw) != 0)
      base::log().error("slotrpc: ibv_dealloc_mw ({}): {}", description_, std::strerror(errno));
    windows_.erase(w);
    break;
  }
  mrs_.erase(it);
  if (ibv_dereg_mr(mr) != 0)
    base::log().error("slotrpc: ibv_dereg_mr ({}): {}", description_, std::strerror(errno));
  region = MemoryRegion{};
}

bool VerbsLink::owns_region(const MemoryRegion& r) const {
  return r.handle != nullptr &&
         std::find(mrs_.begin(), mrs_.end(), static_cast<ibv_mr*>(r.handle)) != mrs_.end();
}

}  // namespace slotrpc::transport::verbs
