#include "transport/host_bulk.h"

namespace slotrpc::transport {

Result<BulkRegistration> register_host_memory(const BulkSource& source, const void* domain,
                                              std::string_view dmabuf_refusal) {
  if (source.dmabuf_fd >= 0) return Status(StatusCode::kUnimplemented, std::string(dmabuf_refusal));
  if (source.address == nullptr || source.length == 0)
    return Status(StatusCode::kInvalidArgument, "bulk memory is empty");
  BulkRegistration r;
  r.base = source.address;
  r.length = source.length;
  r.domain = domain;
  return r;
}

Status check_expose(const BulkRegistration& registration, const void* domain,
                    std::string_view transport, size_t offset, size_t length, BulkAccess access) {
  if (registration.domain != domain || registration.base == nullptr)
    return Status(StatusCode::kInvalidArgument,
                  "expose: not a " + std::string(transport) + " bulk registration");
  if (length == 0 || offset > registration.length || length > registration.length - offset)
    return Status(StatusCode::kInvalidArgument,
                  "expose: " + std::to_string(length) + " bytes at offset " +
                      std::to_string(offset) + " are outside a registration of " +
                      std::to_string(registration.length));
  if (access != BulkAccess::kRemoteRead && access != BulkAccess::kRemoteWrite)
    return Status(StatusCode::kInvalidArgument, "expose: unknown access");
  return Status::ok_status();
}

void HostExposureTable::set_keys(uint32_t first, uint32_t last) {
  first_ = first;
  last_used_ = first;
  last_ = last;
}

Result<uint32_t> HostExposureTable::add(std::byte* base, uint64_t length, BulkAccess access) {
  if (last_used_ == last_)
    return Status(StatusCode::kResourceExhausted, "expose: the link has used every rkey");
  const uint32_t rkey = ++last_used_;
  by_key_.emplace(rkey, HostExposure{base, length, access});
  return rkey;
}

const HostExposure* HostExposureTable::find(uint32_t rkey) const {
  auto it = by_key_.find(rkey);
  return it == by_key_.end() ? nullptr : &it->second;
}

const HostExposure* HostExposureTable::check_peer_access(uint32_t rkey, BulkAccess want,
                                                         uint64_t addr, uint64_t length,
                                                         std::string_view what,
                                                         std::string* why) const {
  const std::string peer = "peer " + std::string(what);
  const HostExposure* e = find(rkey);
  if (e == nullptr) {
    *why = peer + " through rkey " + std::to_string(rkey) +
           (rkey > first_ && rkey <= last_used_ ? ", which was revoked" : ", which was never exposed");
    return nullptr;
  }
  if (e->access != want) {
    *why = peer + " through rkey " + std::to_string(rkey) + ", exposed for " +
           (e->access == BulkAccess::kRemoteRead ? "reading" : "writing") + " only";
    return nullptr;
  }
  // Written so that no sum can wrap: addr and length are the peer's.
  if (length == 0 || addr > e->length || length > e->length - addr) {
    *why = peer + " " + std::to_string(length) + " bytes at " + std::to_string(addr) + " of rkey " +
           std::to_string(rkey) + ", which exposes " + std::to_string(e->length);
    return nullptr;
  }
  return e;
}

Status check_transfer_args(std::string_view what, std::string_view transport,
                           const BulkRegistration& local, const void* domain, size_t local_offset,
                           const RemoteSegment& remote, uint64_t remote_offset, size_t length,
                           bool attached, bool down, const std::string& down_reason) {
  auto invalid = [what](const std::string& why) {
    return Status(StatusCode::kInvalidArgument, std::string(what) + ": " + why);
  };
  if (local.domain != domain || local.base == nullptr)
    return invalid("not a " + std::string(transport) + " bulk registration");
  if (length == 0 || local_offset > local.length || length > local.length - local_offset ||
      remote_offset > remote.length || length > remote.length - remote_offset)
    return invalid(std::to_string(length) + " bytes outside the local or remote range");
  if (!attached) return invalid("link not attached");
  if (down) return Status(StatusCode::kUnavailable, std::string(what) + ": link down: " + down_reason);
  return Status::ok_status();
}

StatusCode peer_failure_status(uint32_t status) {
  return status != 0 && is_known_status_code(static_cast<uint16_t>(status))
             ? static_cast<StatusCode>(status)
             : StatusCode::kUnavailable;
}

}  // namespace slotrpc::transport
