// Pre-posted receive requests and the small buffers behind them: either a
// shared receive queue (SRQ) that every queue pair of an event loop draws
// from, or the receive queue of one queue pair.
//
// Each request owns one kBufferSize buffer.  A control message (a 32-byte
// SEND) lands in it; a slot write (WRITE_WITH_IMM) consumes the request but
// leaves the buffer untouched, its bytes are already in the ring.  Buffers
// that completions hand back are collected with consumed() and go back in
// one chain (one ibv_post_recv / ibv_post_srq_recv) by post_consumed(),
// which the transport calls once per polled batch, before the core sees the
// batch: the queue is never short of more than one batch.
//
// Hot path (consumed, post_consumed): no allocation, no locks.  For the
// monitor (lib/transport/verbs/monitor.h), consumed() also decrements the count of posted
// requests and post_consumed() compares it with the low-water mark, once
// per batch: nothing more.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "slotrpc/result.h"
#include "transport/verbs/registered_buffer.h"

namespace slotrpc::transport::verbs {

class ReceiveQueue {
 public:
  static constexpr size_t kBufferSize = 64;  // a control message is 32; more is an error

  // An SRQ of `depth` requests in `pd`, every request posted.
  static Result<std::unique_ptr<ReceiveQueue>> create_shared(ibv_pd* pd, uint32_t depth);
  // Buffers for the receive queue of one queue pair; post_all() once the
  // queue pair exists (any state from INIT on).
  static Result<std::unique_ptr<ReceiveQueue>> create_private(ibv_pd* pd, uint32_t depth);
  ~ReceiveQueue();  // the SRQ must outlive no queue pair: destroy them first
  ReceiveQueue(const ReceiveQueue&) = delete;
  ReceiveQueue& operator=(const ReceiveQueue&) = delete;

  ibv_srq* srq() const { return srq_; }
  bool shared() const { return srq_ != nullptr; }
  uint32_t depth() const { return depth_; }

  // Every wr_id is `tag | index` (index < depth < 2^31).
  void set_tag(uint64_t tag) { tag_ = tag; }
  // The queue pair a private queue posts to.
  void set_queue_pair(ibv_qp* qp) { qp_ = qp; }

  const std::byte* buffer(uint32_t index) const { return buffers_.data() + size_t{index} * kBufferSize; }

  // Buffer `index` came back in a completion.  True when it is the first
  // since the last post_consumed() (the caller then queues this queue for
  // one).  An index out of range or beyond the queue's capacity is ignored.
  bool consumed(uint32_t index) {
    if (index >= depth_ || n_consumed_ == consumed_.size()) return false;
    consumed_[n_consumed_++] = index;
    --posted_;
    const bool first = !queued_;
    queued_ = true;
    return first;
  }

  // Posts every consumed buffer back as one chain.  0 or the errno of the
  // failed post.
  int post_consumed();
  // Posts every buffer (at creation).
  int post_all();

  // For the monitor (loop thread).  Requests posted now, as far as this
  // side knows (the NIC may have consumed some whose completions are not
  // polled yet); and the fewest that were posted when a batch of consumed
  // ones went back, since creation: how close the queue came to running
  // dry (an empty queue means RNR NAKs).
  uint32_t posted() const { return posted_; }
  uint32_t low_water() const { return low_water_; }

 private:
  ReceiveQueue() = default;
  Status allocate(ibv_pd* pd, uint32_t depth);
  int post_chain(size_t n);  // consumed_[0..n) as one chain

  ibv_srq* srq_ = nullptr;
  ibv_qp* qp_ = nullptr;
  uint64_t tag_ = 0;
  uint32_t depth_ = 0;
  RegisteredBuffer buffers_;  // depth_ * kBufferSize
  std::vector<uint32_t> consumed_;  // depth_ entries
  size_t n_consumed_ = 0;
  bool queued_ = false;
  uint32_t posted_ = 0;
  uint32_t low_water_ = 0;
  std::vector<ibv_recv_wr> wr_;  // depth_ entries, reused for every chain
  std::vector<ibv_sge> sge_;
};

}  // namespace slotrpc::transport::verbs
