#include "core/bulk/call_exposure.h"

#include <fmt/format.h>

#include "core/bulk/region.h"
#include "core/bulk/registration_cache.h"

namespace slotrpc::bulk {

Status check_segment(const BulkSegment& s, std::string_view what) {
  if (s.length == 0) return Status(StatusCode::kInvalidArgument, fmt::format("{} is empty", what));
  if (s.region.impl() != nullptr) {
    if (!s.region.valid())
      return Status(StatusCode::kInvalidArgument,
                    fmt::format("{} is in a released region (MemoryRegion::release was called)", what));
    if (s.offset > s.region.size() || s.length > s.region.size() - s.offset)
      return Status(StatusCode::kInvalidArgument,
                    fmt::format("{} ({} bytes at offset {}) lies beyond its region of {} bytes", what,
                                s.length, s.offset, s.region.size()));
    return {};
  }
  if (s.address == nullptr)
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("{} has neither a region nor an address", what));
  if (reinterpret_cast<uintptr_t>(s.address) + s.length < reinterpret_cast<uintptr_t>(s.address))
    return Status(StatusCode::kInvalidArgument, fmt::format("{} wraps around", what));
  return {};
}

Result<Resolved> resolve(transport::Link& link, const BulkSegment& s) {
  RegistrationCache& cache = RegistrationCache::instance();
  transport::BulkSource source{s.address, s.length};
  std::byte* first = s.address;
  if (s.region.impl() != nullptr) {
    // The region keeps its own lease (registered once per domain, until
    // released); the call takes one more, so that a release() during the
    // call keeps the registration until the call is done with it.
    auto in_domain = s.region.impl()->in_domain_of(link);
    if (!in_domain.ok()) return in_domain.status();
    source = s.region.impl()->source;
    first = s.region.data() + s.offset;
  }
  auto lease = cache.acquire(link, source);
  if (!lease.ok()) return lease.status();
  Resolved r;
  r.registration = lease.value().registration;
  r.lease = lease.value().entry;
  r.offset = static_cast<size_t>(first - r.registration.base);
  return r;
}

Status CallExposure::expose(transport::Link& link, const std::vector<BulkSegment>& send,
                            const std::vector<BulkSegment>& receive, uint64_t max_bytes,
                            RequestBlock& block) {
  if (Status st = check_counts(send.size(), receive.size()); !st.ok()) return st;
  if (!link.supports_bulk())
    return Status(StatusCode::kUnimplemented,
                  "bulk segments are not supported on " + link.describe());
  uint64_t total = 0;
  for (size_t i = 0; i < send.size() + receive.size(); ++i) {
    const bool is_send = i < send.size();
    const BulkSegment& s = is_send ? send[i] : receive[i - send.size()];
    // The segment's name is formatted only for the error (no allocation
    // per segment on a call's way out).
    if (!check_segment(s, {}).ok())
      return check_segment(s, fmt::format("{} bulk segment {}", is_send ? "send" : "receive",
                                          is_send ? i : i - send.size()));
    total = add_capped(total, s.length, max_bytes);
  }
  if (total > max_bytes)
    return Status(StatusCode::kResourceExhausted,
                  fmt::format("the call's bulk segments add up to more than max_bulk_bytes = {} "
                              "(SLOTRPC_MAX_BULK_BYTES)",
                              max_bytes));
  block.reads = static_cast<uint16_t>(send.size());
  block.writes = static_cast<uint16_t>(receive.size());
  receive_lengths_.clear();
  for (const BulkSegment& s : receive) receive_lengths_.push_back(s.length);
  for (size_t i = 0; i < send.size() + receive.size(); ++i) {
    const bool is_send = i < send.size();
    const BulkSegment& s = is_send ? send[i] : receive[i - send.size()];
    auto r = resolve(link, s);
    if (!r.ok()) return r.status();
    leases_.push_back(r.value().lease);
    auto seg = link.expose(r.value().registration, r.value().offset, s.length,
                           is_send ? transport::BulkAccess::kRemoteRead
                                   : transport::BulkAccess::kRemoteWrite);
    if (!seg.ok()) return seg.status();
    items_.push_back(Item{seg.value(), true});
    block.segments[i] = seg.value();
  }
  return {};
}

uint32_t CallExposure::revoke(transport::Link& link, uint64_t token) {
  uint32_t pending = 0;
  for (Item& it : items_) {
    if (!it.exposed) continue;
    it.exposed = false;
    if (!link.revoke(it.segment, token)) ++pending;
  }
  return pending;
}

void CallExposure::release() {
  for (uint64_t lease : leases_) RegistrationCache::instance().release(lease);
  leases_.clear();
  items_.clear();
}

}  // namespace slotrpc::bulk
