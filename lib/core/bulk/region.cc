#include "core/bulk/region.h"

#include <utility>

namespace slotrpc::bulk {

Region::~Region() { release(); }

Result<transport::BulkRegistration> Region::in_domain_of(transport::Link& link) {
  if (released.load(std::memory_order_acquire))
    return Status(StatusCode::kInvalidArgument, "bulk memory: released region");
  std::lock_guard<std::mutex> lock(mu_);
  const void* domain = link.bulk_domain();
  for (auto it = held_.begin(); it != held_.end(); ++it) {
    if (it->domain != domain) continue;
    // The domain may have lost its last link since (its registrations
    // were dropped then; a new domain can even reuse the address).
    if (RegistrationCache::instance().alive(it->lease.entry)) return it->lease.registration;
    held_.erase(it);
    break;
  }
  auto lease = RegistrationCache::instance().acquire(link, source);
  if (!lease.ok()) return lease.status();
  held_.push_back(Held{domain, lease.value()});
  return lease.value().registration;
}

void Region::release() {
  released.store(true, std::memory_order_release);
  std::vector<Held> held;
  {
    std::lock_guard<std::mutex> lock(mu_);
    held.swap(held_);
  }
  for (const Held& h : held) RegistrationCache::instance().release(h.lease.entry);
}

Result<MemoryRegion> make_region(const transport::BulkSource& source) {
  if (source.address == nullptr || source.length == 0)
    return Status(StatusCode::kInvalidArgument, "register_memory: the range is empty");
  if (reinterpret_cast<uintptr_t>(source.address) + source.length <
      reinterpret_cast<uintptr_t>(source.address))
    return Status(StatusCode::kInvalidArgument, "register_memory: the range wraps around");
  auto r = std::make_shared<Region>();
  r->source = source;
  return MemoryRegion(std::move(r));
}

}  // namespace slotrpc

namespace slotrpc {

MemoryRegion::MemoryRegion() = default;
MemoryRegion::~MemoryRegion() = default;
MemoryRegion::MemoryRegion(const MemoryRegion&) = default;
MemoryRegion& MemoryRegion::operator=(const MemoryRegion&) = default;
MemoryRegion::MemoryRegion(MemoryRegion&&) noexcept = default;
MemoryRegion& MemoryRegion::operator=(MemoryRegion&&) noexcept = default;
MemoryRegion::MemoryRegion(std::shared_ptr<bulk::Region> impl) : impl_(std::move(impl)) {}

bool MemoryRegion::valid() const {
  return impl_ != nullptr && !impl_->released.load(std::memory_order_acquire);
}
std::byte* MemoryRegion::data() const { return impl_ ? impl_->source.address : nullptr; }
size_t MemoryRegion::size() const { return impl_ ? impl_->source.length : 0; }
bool MemoryRegion::device() const { return impl_ && impl_->source.dmabuf_fd >= 0; }
void MemoryRegion::release() {
  if (impl_) impl_->release();
}

}  // namespace slotrpc
