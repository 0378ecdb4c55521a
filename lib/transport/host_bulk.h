// Bulk transfers between host memories moved by software (TCP and shared
// memory): the parts the two transports share.  Both reach any host memory
// without registration, both keep a table of the ranges this side exposed,
// keyed by an rkey that counts up, and both check every access the peer
// asks for against it before a byte moves (verbs leaves these checks to
// the NIC).  One copy of the checks, so the two transports refuse the same
// mistakes with the same words.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>

#include "slotrpc/result.h"
#include "slotrpc/status.h"
#include "transport/transport.h"

namespace slotrpc::transport {

// A range this side exposed to its peer.
struct HostExposure {
  std::byte* base = nullptr;
  uint64_t length = 0;
  BulkAccess access = BulkAccess::kRemoteRead;
};

// The ranges a link exposed to its peer, by rkey.  Keys count up through
// a range (first, last] and are never reused: a key the peer kept after a
// revoke can never name another exposure, and the table can tell the peer
// whether a key it does not know was revoked or never handed out.  The
// range lets two tables of one connection split the key space (a TCP
// session's link and its bulk lane, which the peer tells apart by a bit).
// Not thread-safe: each table belongs to one link.
class HostExposureTable {
 public:
  // Keys from first + 1 to last; (0, UINT32_MAX] unless said otherwise.
  // Before the first add only.
  void set_keys(uint32_t first, uint32_t last);

  // The key of a new exposure, or RESOURCE_EXHAUSTED once every key of
  // the range was handed out (2^31 or 2^32 exposures: a link that old
  // ends its bulk use rather than wrap).
  Result<uint32_t> add(std::byte* base, uint64_t length, BulkAccess access);
  // Revokes `rkey`: false if it was not exposed (revoked already, or
  // never handed out).
  bool erase(uint32_t rkey) { return by_key_.erase(rkey) != 0; }
  // The exposure, or nullptr.
  const HostExposure* find(uint32_t rkey) const;

  // A peer's access ("read", "wrote", ...) through `rkey` to [addr, addr +
  // length), wanting `want`.  The exposure, or nullptr with *why saying
  // what was wrong: a key revoked or never exposed, an exposure for the
  // other access, a range outside it.  The caller fails the link with
  // *why (verbs: a remote access error).
  const HostExposure* check_peer_access(uint32_t rkey, BulkAccess want, uint64_t addr,
                                        uint64_t length, std::string_view what,
                                        std::string* why) const;

  size_t size() const { return by_key_.size(); }
  bool empty() const { return by_key_.empty(); }
  // The link went down: nothing is exposed any more (keys stay used).
  void clear() { by_key_.clear(); }

 private:
  std::unordered_map<uint32_t, HostExposure> by_key_;
  uint32_t first_ = 0;      // keys handed out: first_ + 1 .. last_used_
  uint32_t last_used_ = 0;
  uint32_t last_ = UINT32_MAX;
};

// Link::register_bulk for a transport that reaches any host memory:
// nothing to pin, so the registration only records the range and
// `domain`.  Device memory (a dma-buf) is refused with UNIMPLEMENTED and
// `dmabuf_refusal` as the message.
Result<BulkRegistration> register_host_memory(const BulkSource& source, const void* domain,
                                              std::string_view dmabuf_refusal);

// Link::expose's argument checks: a registration of this `domain`, a
// non-empty range inside it, a known access.  INVALID_ARGUMENT naming
// the problem ("expose: not a tcp bulk registration").
Status check_expose(const BulkRegistration& registration, const void* domain,
                    std::string_view transport, size_t offset, size_t length, BulkAccess access);

// Link::read / write's argument checks, the link's state included:
// INVALID_ARGUMENT ("read: ...") for a registration of another domain, a
// range outside the local registration or the remote segment, a link not
// attached yet; UNAVAILABLE when the link is down.
Status check_transfer_args(std::string_view what, std::string_view transport,
                           const BulkRegistration& local, const void* domain, size_t local_offset,
                           const RemoteSegment& remote, uint64_t remote_offset, size_t length,
                           bool attached, bool down, const std::string& down_reason);

// The status a peer put on a failed transfer (a read it ended because the
// range was revoked): its code, or UNAVAILABLE for 0 or a code we do not
// know.
StatusCode peer_failure_status(uint32_t status);

}  // namespace slotrpc::transport
