// A handler's bulk attachments, as the server session serves them.
// Included by slotrpc/service.h; no program needs to include it or use its
// names, which may change between versions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "slotrpc/call.h"
#include "slotrpc/status.h"

namespace slotrpc {

namespace detail {
// A call's bulk attachments, as the server session serves them
// (lib/core/bulk/server_bulk.h).  Not hot path: only calls with bulk segments
// reach it, and each operation moves at least a slot's worth of bytes.
class ServerBulk {
 public:
  virtual size_t count(bool incoming) const = 0;
  virtual uint64_t length(bool incoming, size_t i) const = 0;
  // Moves the bytes of `pieces`, in order and back to back, between them
  // and segment i from `offset`: pulls request data (incoming) or pushes
  // reply data (outgoing), on the handler's fiber, which waits until every
  // byte has moved.  Pieces adjacent in one registration move as one
  // transfer.
  virtual Status transfer(bool incoming, size_t i, std::span<const BulkSegment> pieces,
                          uint64_t offset) = 0;

 protected:
  ~ServerBulk() = default;
};
}  // namespace detail


}  // namespace slotrpc
