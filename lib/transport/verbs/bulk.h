// Bulk transfers on a verbs link (transport.h, "Bulk transfers"): the
// link's pool of type-2 memory windows (one per exposure), its table of
// one-sided operations, and the queue of what waits to be posted.
//
// Data path (docs/protocol.md, "Bulk transfers on verbs"):
//   expose   an IBV_WR_BIND_MW of a free pool window over exactly the
//            exposed range, REMOTE_READ or REMOTE_WRITE, bound to this
//            link's queue pair.  Queued in the backlog, in send-queue
//            order, so the slot message carrying the key is behind the
//            bind; it leaves with that message, one chain (defer_flush).
//   revoke   an IBV_WR_LOCAL_INV of the window's key, signaled; its
//            completion is the kBulkDone, and the window goes back to the
//            pool (a type-2 window must be invalidated before it can be
//            bound again).
//   read     RDMA READs of at most chunk_bytes() each; at most the
//            negotiated max_rd_atomic of them in flight.  Reads wait in a
//            queue of their own and never hold up a slot message: what is
//            in the backlog goes first whenever room frees.
//   write    RDMA WRITEs of at most chunk_bytes() each, two in flight, from
//            a queue of their own like reads: a message posted meanwhile
//            (a PONG, another call's reply) passes between chunks instead
//            of waiting for the whole write (which on a slow link outlived
//            the peer timeout).  A reply follows its data because the core
//            posts it only after the write's kBulkDone (transport.h).
// Binds, invalidations and transfers queued in one turn of the loop leave
// in one chain at its end (VerbsLink::defer_flush): a doorbell is a system
// call on Soft-RoCE and an MMIO write on a NIC, once per turn, not per
// request.
// Every bulk work request is signaled (one completion per chunk of a
// megabyte costs nothing) and carries kBulkBit; completions of one send
// queue arrive in posting order, so `in_flight` (a FIFO) says which
// request each one is.
//
// None of this is on the small-call hot path: a link that never uses bulk
// transfers never allocates BulkState, and post() looks at none of it.
#pragma once

#include "slotrpc_verbs_config.h"
#if SLOTRPC_WITH_VERBS

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <unordered_map>
#include <vector>

namespace slotrpc::transport::verbs {

// The tuning constants of the bulk path, in one place.
//
// A chunk: one RDMA READ or WRITE work request (and never more than the
// port's max_msg_sz).  1 MiB keeps a work request's completion cheap
// relative to its bytes and bounds how long one chunk holds the wire.
inline constexpr uint64_t kBulkChunkBytes = uint64_t{1} << 20;
// RDMA READs in flight per link: the negotiated max_rd_atomic, and never
// more than this (the responder resources each side reserves per queue
// pair; QpInfo carries what the responder allows).
inline constexpr uint8_t kMaxReadsInFlight = 16;
// RDMA WRITE chunks in flight per link: two keep the wire busy while one
// completion travels back; more would only lengthen what reads and
// invalidations queued later wait behind in the send queue.
inline constexpr uint32_t kWritesInFlight = 2;

// A send value with this bit is a bulk work request (bind, invalidation or
// chunk); the low bits count the requests it retires, as for messages.
inline constexpr uint32_t kBulkBit = 1u << 29;

struct BulkState {
  struct Window {
    ibv_mw* mw = nullptr;
    enum class State : uint8_t { kFree, kBound, kRevoking } state = State::kFree;
    // The current (or queued) binding: the key the bind gives the window
    // and the range it covers.
    uint32_t rkey = 0;
    ibv_mr* mr = nullptr;
    uint64_t addr = 0;
    uint64_t length = 0;
    unsigned access = 0;
    uint64_t token = 0;  // kRevoking: the revoke's token
    // Devices that check a window's range only against its MR (rxe): an MR
    // over exactly the exposed range, registered for this exposure and
    // deregistered when its invalidation completes.
    ibv_mr* own_mr = nullptr;
  };
  std::vector<Window> windows;         // the pool, grown lazily
  std::vector<uint32_t> free_windows;  // indices into windows
  std::unordered_map<uint32_t, uint32_t> by_rkey;  // bound or revoking -> index

  struct Op {
    bool active = false;
    bool write = false;
    uint64_t token = 0;
    uintptr_t local = 0;  // address of the first byte
    uint32_t lkey = 0;
    uint64_t remote = 0;  // remote address of the first byte
    uint32_t rkey = 0;
    uint64_t length = 0;
    uint64_t posted = 0;       // bytes handed to the send queue
    uint32_t outstanding = 0;  // chunks posted, not complete
    uint16_t status = 0;       // a failure recorded before the link went down
  };
  std::vector<Op> ops;
  std::vector<uint32_t> free_ops;
  std::deque<uint32_t> reads;   // ops with READ chunks still to post, in order
  std::deque<uint32_t> writes;  // ops with WRITE chunks still to post, in order

  enum class Kind : uint8_t { kBind, kInvalidate, kChunk };
  struct InFlight {
    Kind kind;
    uint32_t index;  // window or op
  };
  std::deque<InFlight> in_flight;  // signaled bulk requests, in posting order

  uint32_t reads_in_flight = 0;
  uint32_t writes_in_flight = 0;

  uint32_t new_op() {
    if (!free_ops.empty()) {
      const uint32_t i = free_ops.back();
      free_ops.pop_back();
      return i;
    }
    ops.emplace_back();
    return static_cast<uint32_t>(ops.size() - 1);
  }
  void release_op(uint32_t i) {
    ops[i] = Op{};
    free_ops.push_back(i);
  }
};

}  // namespace slotrpc::transport::verbs

#endif  // SLOTRPC_WITH_VERBS
