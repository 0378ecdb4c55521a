// Memory regions over exactly one exposed range, kept for reuse, on devices
// that bound a type-2 window's accesses only by the MR under it (Soft-RoCE;
// bulk.cc, checks_window_bounds).
//
// Why such MRs exist: there a window bound over a whole registration would
// let the peer reach all of it, not just the call's range, so each exposure
// binds its window over an MR of its own covering exactly that range.
//
// Why they are kept: registering one per exposure and deregistering it
// after the revoke cost two system calls and a page walk per call (in the
// Soft-RoCE VM the 64 KiB bulk figures moved within their noise without
// them: docs/benchmarks.md).  Calls that expose the
// same range again (a tensor buffer, a registered staging area) now bind
// over the MR they had.
//
// Why keeping them keeps the exposure rules (docs/protocol.md): these MRs
// carry no REMOTE_* access, so their own keys reach nothing; the peer only
// ever gets a window's key, and windows are still bound per call and
// invalidated when it ends.  What an idle MR keeps is its pages pinned, and
// the registration it lies in (its parent) pins them already: the parent's
// deregistration drops every idle MR over it first (drop_parent, from
// VerbsLink::deregister_bulk), so none outlives the memory the application
// vouched for.  One still bound when that happens is orphaned and goes when
// its window's invalidation completes.
//
// Bounds: kIdlePerParent idle MRs per parent and kIdleTotal in all, the
// least recently used going first.
//
// Thread safety: one mutex.  Exposures and revokes run on loop threads, but
// a parent is deregistered wherever its last user lets go (an application
// thread releasing a MemoryRegion).  Not hot path: only exposures on such
// devices come here; ibv_reg_mr and ibv_dereg_mr run outside the lock.
#pragma once

#include "slotrpc_verbs_config.h"
#if SLOTRPC_WITH_VERBS

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "slotrpc/result.h"

namespace slotrpc::transport::verbs {

class ExposureMrs {
 public:
  static constexpr size_t kIdlePerParent = 16;
  static constexpr size_t kIdleTotal = 256;

  static ExposureMrs& instance();

  // An MR in `pd` over exactly [addr, addr + length) of `parent`: an idle
  // one kept from an earlier exposure, or a new registration.  Every
  // successful acquire needs one release().
  Result<ibv_mr*> acquire(ibv_pd* pd, ibv_mr* parent, uintptr_t addr, uint64_t length);
  // Its window is unbound (invalidated or deallocated): kept idle, or
  // deregistered when over a bound or orphaned.
  void release(ibv_mr* mr);
  // Before `parent` is deregistered: its idle MRs go, bound ones are
  // orphaned.
  void drop_parent(ibv_mr* parent);

  // For tests.
  size_t idle(const ibv_mr* parent) const;  // nullptr: all parents
  size_t entries() const;                    // idle, bound and orphaned
  uint64_t registrations() const;  // ibv_reg_mr calls so far

 private:
  struct Entry {
    ibv_mr* parent = nullptr;
    uintptr_t addr = 0;
    uint64_t length = 0;
    ibv_mr* mr = nullptr;
    uint32_t users = 0;
    bool orphan = false;   // its parent is gone: deregistered at the last release
    uint64_t last_use = 0;  // for least-recently-used eviction
  };
  // Evicts least recently used idle entries above the bounds into `out`
  // (deregistered by the caller, outside the lock).
  void trim(const ibv_mr* parent, std::vector<ibv_mr*>& out);
  // Removes entry i, its MR into `out` (deregistered outside the lock).
  void take(size_t i, std::vector<ibv_mr*>& out);
  static void deregister(const std::vector<ibv_mr*>& mrs);

  mutable std::mutex mu_;
  std::vector<Entry> entries_;  // bounded: idle ones by the limits, bound ones by windows
  uint64_t tick_ = 0;
  uint64_t registrations_ = 0;
};

}  // namespace slotrpc::transport::verbs

#endif  // SLOTRPC_WITH_VERBS
