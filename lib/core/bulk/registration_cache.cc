#include "core/bulk/registration_cache.h"

#include <algorithm>

namespace slotrpc::bulk {

RegistrationCache& RegistrationCache::instance() {
  // Never destroyed: sessions may call link_down from loop threads that
  // outlive static destruction order.
  static auto* cache = new RegistrationCache;
  return *cache;
}

transport::Link* RegistrationCache::link_of(const void* domain) const {
  for (transport::Link* l : links_)
    if (l->bulk_domain() == domain) return l;
  return nullptr;
}

Result<RegistrationCache::Lease> RegistrationCache::acquire(transport::Link& link,
                                                             const transport::BulkSource& source) {
  const void* domain = link.bulk_domain();
  if (!link.supports_bulk() || domain == nullptr)
    return Status(StatusCode::kUnimplemented,
                  "bulk transfers are not supported on " + link.describe());
  if (source.address == nullptr || source.length == 0)
    return Status(StatusCode::kInvalidArgument, "bulk memory is empty");
  std::lock_guard<std::mutex> lock(mu_);
  const std::byte* lo = source.address;
  const std::byte* hi = source.address + source.length;
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    const transport::BulkRegistration& r = it->registration;
    if (it->domain != domain || it->dmabuf_fd != source.dmabuf_fd) continue;
    if (lo < r.base || hi > r.base + r.length) continue;
    ++it->users;
    entries_.splice(entries_.begin(), entries_, it);  // most recently used first
    return Lease{it->registration, it->id};
  }
  auto reg = link.register_bulk(source);
  if (!reg.ok()) return reg.status();
  Entry e;
  e.id = next_id_++;
  e.domain = domain;
  e.registration = reg.value();
  e.registration.domain = domain;
  e.dmabuf_fd = source.dmabuf_fd;
  e.dmabuf_offset = source.dmabuf_offset;
  e.users = 1;
  entries_.push_front(e);
  // The registering link may not be known yet (a test, or a session that
  // registers before link_up): remember it until it goes down.
  if (std::find(links_.begin(), links_.end(), &link) == links_.end()) links_.push_back(&link);
  trim_idle();
  return Lease{e.registration, e.id};
}

void RegistrationCache::release(uint64_t entry) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->id != entry) continue;
    if (it->users > 0) --it->users;
    trim_idle();
    return;
  }
  // Gone already: its domain's last link went down meanwhile.
}

void RegistrationCache::trim_idle() {
  size_t idle = 0;
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto next = std::next(it);
    if (it->users == 0 && ++idle > kMaxIdle) {
      if (transport::Link* via = link_of(it->domain)) drop(it, *via);
    }
    it = next;
  }
}

void RegistrationCache::drop(std::list<Entry>::iterator it, transport::Link& via) {
  via.deregister_bulk(it->registration);
  entries_.erase(it);
}

void RegistrationCache::link_up(transport::Link& link) {
  if (!link.supports_bulk()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (std::find(links_.begin(), links_.end(), &link) == links_.end()) links_.push_back(&link);
}

void RegistrationCache::link_down(transport::Link& link) {
  std::lock_guard<std::mutex> lock(mu_);
  auto pos = std::find(links_.begin(), links_.end(), &link);
  if (pos == links_.end()) return;
  links_.erase(pos);
  const void* domain = link.bulk_domain();
  if (link_of(domain) != nullptr) return;  // the domain lives on
  // The last link of the domain: nothing can deregister these later.
  // Leases still held become stale ids, which release() ignores.
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto next = std::next(it);
    if (it->domain == domain) drop(it, link);
    it = next;
  }
}

void RegistrationCache::drop_range(const std::byte* base, size_t length) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto next = std::next(it);
    const transport::BulkRegistration& r = it->registration;
    const bool overlaps = r.base < base + length && base < r.base + r.length;
    if (overlaps && it->users == 0)
      if (transport::Link* via = link_of(it->domain)) drop(it, *via);
    it = next;
  }
}

bool RegistrationCache::alive(uint64_t entry) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const Entry& e : entries_)
    if (e.id == entry) return true;
  return false;
}

size_t RegistrationCache::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

}  // namespace slotrpc::bulk
