// The client's side of a call's bulk attachments: its segments
// registered (through the registration cache) and exposed to the session's
// peer for the duration of one call, and revoked when the call ends.
//
// Why the call waits for the revoke: memory the user gets back must never
// still be reachable by the peer (a handler that outlives its call, a
// hostile server).  On verbs a revoke is a LOCAL_INV of the call's memory
// window, which completes asynchronously; the client session completes the
// call only after every revoke has reported (kBulkDone), or after the link
// is down (a queue pair in the error state reaches nothing).
//
// Loop thread only.  Cold path: only calls with bulk segments come here.
#pragma once

#include <cstdint>
#include <vector>

#include "core/bulk/descriptors.h"
#include "slotrpc/call.h"
#include "transport/transport.h"

namespace slotrpc::bulk {

class CallExposure {
 public:
  // Checks every segment first (count, range, released region, the total
  // against `max_bytes`), so that nothing is exposed for a call that is
  // refused: INVALID_ARGUMENT / RESOURCE_EXHAUSTED / UNIMPLEMENTED saying
  // which segment and why.  Then registers and exposes each (send
  // segments readable, receive segments writable) and fills `block`.  On a
  // failure after the first exposure, what was exposed must still be
  // revoked (revoke()) before the call completes.
  Status expose(transport::Link& link, const std::vector<BulkSegment>& send,
                const std::vector<BulkSegment>& receive, uint64_t max_bytes, RequestBlock& block);

  // Starts revoking every exposure; returns how many kBulkDone completions
  // carrying `token` will follow (0: all unreachable already).
  uint32_t revoke(transport::Link& link, uint64_t token);

  // Gives the registrations back to the cache: after the revokes completed
  // or the link went down.
  void release();

  // The receive segments' lengths, for the reply's block.
  const std::vector<uint64_t>& receive_lengths() const { return receive_lengths_; }

  ~CallExposure() { release(); }

 private:
  struct Item {
    transport::RemoteSegment segment;
    bool exposed = false;
  };
  std::vector<Item> items_;
  std::vector<uint64_t> leases_;
  std::vector<uint64_t> receive_lengths_;
};

// Checks one segment and resolves it to a registration in `link`'s domain
// (leased from the cache: release the lease with
// RegistrationCache::instance().release(lease)); `offset` is where the
// segment's first byte sits in the registration.  Shared with the server's
// local buffers (read_bulk / write_bulk).
struct Resolved {
  transport::BulkRegistration registration;
  size_t offset = 0;
  uint64_t lease = 0;
};
Status check_segment(const BulkSegment& segment, std::string_view what);
Result<Resolved> resolve(transport::Link& link, const BulkSegment& segment);

}  // namespace slotrpc::bulk
