// Exposure MRs kept for reuse: see exposure_mrs.h for why, and why it is
// safe.  Our own small table rather than RegistrationCache: entries here
// hang off a parent registration and must go before it, which the
// registration cache (keyed by domain and range, with no parents) cannot
// express.
#include "transport/verbs/exposure_mrs.h"

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "base/logging.h"

namespace slotrpc::transport::verbs {

ExposureMrs& ExposureMrs::instance() {
  // Never destroyed: links may release MRs from loop threads that outlive
  // static destruction order.
  static auto* table = new ExposureMrs;
  return *table;
}

Result<ibv_mr*> ExposureMrs::acquire(ibv_pd* pd, ibv_mr* parent, uintptr_t addr, uint64_t length) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Entry& e : entries_) {
      if (e.parent != parent || e.addr != addr || e.length != length || e.orphan) continue;
      ++e.users;
      return e.mr;
    }
  }
  // Outside the lock: a large range takes a while to pin.  Two threads
  // registering the same range at once make two entries, which is harmless.
  // LOCAL_WRITE: a window granting remote write needs it on its MR.  No
  // REMOTE_* flag: the MR's own key reaches nothing.
  ibv_mr* mr = ibv_reg_mr(pd, reinterpret_cast<void*>(addr), length,
                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
  if (mr == nullptr)
    return Status(StatusCode::kResourceExhausted,
                  fmt::format("ibv_reg_mr of an exposure of {} bytes (this device checks windows only "
                              "against their MR, so each exposed range gets one): {}",
                              length, std::strerror(errno)));
  std::lock_guard<std::mutex> lock(mu_);
  ++registrations_;
  Entry& e = entries_.emplace_back();
  e.parent = parent;
  e.addr = addr;
  e.length = length;
  e.mr = mr;
  e.users = 1;
  return mr;
}

void ExposureMrs::release(ibv_mr* mr) {
  std::vector<ibv_mr*> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < entries_.size(); ++i) {
      Entry& e = entries_[i];
      if (e.mr != mr) continue;
      if (e.users > 0) --e.users;
      if (e.users > 0) break;
      if (e.orphan) {
        take(i, gone);
        break;
      }
      e.last_use = ++tick_;
      trim(e.parent, gone);
      break;
    }
  }
  deregister(gone);
}

void ExposureMrs::drop_parent(ibv_mr* parent) {
  std::vector<ibv_mr*> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < entries_.size();) {
      Entry& e = entries_[i];
      if (e.parent != parent) {
        ++i;
      } else if (e.users > 0) {
        e.orphan = true;  // still under a window: goes at its last release
        ++i;
      } else {
        take(i, gone);
      }
    }
  }
  deregister(gone);
}

void ExposureMrs::trim(const ibv_mr* parent, std::vector<ibv_mr*>& out) {
  // Evicts the least recently used idle entry (of `parent` when given)
  // while the count is over `limit`.
  const auto evict = [&](const ibv_mr* of, size_t limit) {
    for (;;) {
      size_t idle = 0, oldest = entries_.size();
      for (size_t i = 0; i < entries_.size(); ++i) {
        const Entry& e = entries_[i];
        if (e.users > 0 || e.orphan || (of != nullptr && e.parent != of)) continue;
        ++idle;
        if (oldest == entries_.size() || e.last_use < entries_[oldest].last_use) oldest = i;
      }
      if (idle <= limit) return;
      take(oldest, out);
    }
  };
  evict(parent, kIdlePerParent);
  evict(nullptr, kIdleTotal);
}

void ExposureMrs::take(size_t i, std::vector<ibv_mr*>& out) {
  out.push_back(entries_[i].mr);
  entries_[i] = entries_.back();  // order does not matter
  entries_.pop_back();
}

void ExposureMrs::deregister(const std::vector<ibv_mr*>& mrs) {
  for (ibv_mr* mr : mrs)
    if (const int rc = ibv_dereg_mr(mr); rc != 0)
      base::log().error("slotrpc: ibv_dereg_mr of an exposure's MR: {}", std::strerror(rc));
}

uint64_t ExposureMrs::registrations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return registrations_;
}

size_t ExposureMrs::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

size_t ExposureMrs::idle(const ibv_mr* parent) const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const Entry& e : entries_)
    if (e.users == 0 && !e.orphan && (parent == nullptr || e.parent == parent)) ++n;
  return n;
}

}  // namespace slotrpc::transport::verbs
