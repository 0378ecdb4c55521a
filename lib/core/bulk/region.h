// What a slotrpc::MemoryRegion handle shares (include/slotrpc/memory.h):
// the user's range and its leases in the registration cache, one per
// domain it has been used in.
#pragma once

#include <atomic>
#include <mutex>
#include <vector>

#include "core/bulk/registration_cache.h"
#include "slotrpc/memory.h"

namespace slotrpc::bulk {

struct Region {
  transport::BulkSource source;
  std::atomic<bool> released{false};

  ~Region();

  // The registration of this region in `link`'s domain, registering it
  // there on first use.  INVALID_ARGUMENT once released.  Any thread.
  Result<transport::BulkRegistration> in_domain_of(transport::Link& link);
  void release();

 private:
  std::mutex mu_;
  struct Held {
    const void* domain;
    RegistrationCache::Lease lease;
  };
  std::vector<Held> held_;
};

// Checks a user range and makes a region of it.
Result<MemoryRegion> make_region(const transport::BulkSource& source);

}  // namespace slotrpc::bulk
