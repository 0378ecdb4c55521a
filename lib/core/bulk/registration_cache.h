// The bulk registration cache: one per process, keyed by
// (Link::bulk_domain(), address range), like UCX's rcache.
//
// A registration (BulkRegistration, transport.h) is valid on every link of
// the domain that made it, so a region used by many sessions of one
// protection domain is pinned once.  Entries are reference counted by
// their users (MemoryRegion handles, calls carrying an unregistered span)
// and dropped when the last one lets go (see "Why no idle entries").
//
// Lifetime: transport.h has deregister_bulk on Link, and a registration can
// outlive the link that made it.  The cache therefore tracks the live links
// of each domain (link_up / link_down, called by the session that owns the
// link): an entry is deregistered through any live link of its domain, and
// when the last link of a domain goes down every entry of that domain is
// deregistered through it, before it is destroyed.  A later use registers
// again.
//
// Thread safety: every member takes one mutex; register_bulk (which may take
// milliseconds on verbs for large ranges) runs under it, so two threads
// registering the same range never pin it twice.  Not hot path: small calls
// never come here.
//
// Why no idle entries are kept (kMaxIdle = 0): an rcache that keeps a
// registration after its last user needs memory hooks (UCX intercepts
// munmap and friends) to learn when the memory is freed.  Without them, a
// buffer freed and allocated again at the same address (a handler's
// scratch vector, the next call's) would hit the old entry, whose pinned
// pages are no longer the ones mapped there: on verbs the NIC would read
// and write the old pages, and data would be lost silently.  So an entry
// lives exactly as long as someone uses it: a MemoryRegion until it is
// released, a call for its duration.  Buffers used again and again should
// be registered once with register_memory; a plain span costs one
// registration per call that uses it (shared by concurrent calls).
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <vector>

#include "slotrpc/result.h"
#include "transport/transport.h"

namespace slotrpc::bulk {

class RegistrationCache {
 public:
  // Entries kept after their last user: none (see the file comment).
  static constexpr size_t kMaxIdle = 0;

  static RegistrationCache& instance();

  // A registration covering `source` in `link`'s domain: an entry that
  // covers the range, or a new one made through `link`.  Counted: every
  // successful acquire needs one release(entry_id).
  struct Lease {
    transport::BulkRegistration registration;
    uint64_t entry = 0;
  };
  Result<Lease> acquire(transport::Link& link, const transport::BulkSource& source);
  void release(uint64_t entry);

  // The session owning `link` calls these around its life.
  void link_up(transport::Link& link);
  void link_down(transport::Link& link);

  // Drops idle entries that overlap [base, base + length) in every domain.
  void drop_range(const std::byte* base, size_t length);

  // False once the entry is gone (its domain's last link went down): a
  // holder must acquire again.
  bool alive(uint64_t entry) const;

  // For tests.
  size_t entries() const;

 private:
  struct Entry {
    uint64_t id = 0;
    const void* domain = nullptr;
    transport::BulkRegistration registration;
    int dmabuf_fd = -1;
    uint64_t dmabuf_offset = 0;
    size_t users = 0;
  };
  transport::Link* link_of(const void* domain) const;
  void drop(std::list<Entry>::iterator it, transport::Link& via);
  void trim_idle();

  mutable std::mutex mu_;
  std::list<Entry> entries_;  // most recently used first
  std::vector<transport::Link*> links_;
  uint64_t next_id_ = 1;
};

}  // namespace slotrpc::bulk
