#include "transport/verbs/receive_queue.h"

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "base/logging.h"

namespace slotrpc::transport::verbs {

Status ReceiveQueue::allocate(ibv_pd* pd, uint32_t depth) {
  depth_ = depth;
  auto b = RegisteredBuffer::create(pd, size_t{depth} * kBufferSize, IBV_ACCESS_LOCAL_WRITE,
                                    "receive buffers");
  if (!b.ok()) return b.status();
  buffers_ = std::move(b.value());
  consumed_.resize(depth);
  wr_.resize(depth);
  sge_.resize(depth);
  return {};
}

Result<std::unique_ptr<ReceiveQueue>> ReceiveQueue::create_shared(ibv_pd* pd, uint32_t depth) {
  std::unique_ptr<ReceiveQueue> q(new ReceiveQueue);
  if (Status st = q->allocate(pd, depth); !st.ok()) return st;
  ibv_srq_init_attr a{};
  a.attr.max_wr = depth;
  a.attr.max_sge = 1;
  q->srq_ = ibv_create_srq(pd, &a);
  if (q->srq_ == nullptr)
    return Status(StatusCode::kUnavailable,
                  fmt::format("ibv_create_srq ({} requests): {}", depth, std::strerror(errno)));
  return q;
}

Result<std::unique_ptr<ReceiveQueue>> ReceiveQueue::create_private(ibv_pd* pd, uint32_t depth) {
  std::unique_ptr<ReceiveQueue> q(new ReceiveQueue);
  if (Status st = q->allocate(pd, depth); !st.ok()) return st;
  return q;
}

ReceiveQueue::~ReceiveQueue() {
  if (srq_ != nullptr && ibv_destroy_srq(srq_) != 0)
    base::log().error("slotrpc: ibv_destroy_srq: {}", std::strerror(errno));
}

int ReceiveQueue::post_consumed() {
  queued_ = false;
  const size_t n = n_consumed_;
  n_consumed_ = 0;
  if (posted_ < low_water_) low_water_ = posted_;  // once per batch (the monitor's)
  return post_chain(n);
}

int ReceiveQueue::post_chain(size_t n) {
  if (n == 0) return 0;
  for (size_t j = 0; j < n; ++j) {
    const uint32_t idx = consumed_[j];
    sge_[j].addr = reinterpret_cast<uintptr_t>(buffer(idx));
    sge_[j].length = kBufferSize;
    sge_[j].lkey = buffers_.lkey();
    wr_[j].wr_id = tag_ | idx;
    wr_[j].sg_list = &sge_[j];
    wr_[j].num_sge = 1;
    wr_[j].next = j + 1 < n ? &wr_[j + 1] : nullptr;
  }
  ibv_recv_wr* bad = nullptr;
  int rc = EINVAL;
  if (srq_ != nullptr) {
    rc = ibv_post_srq_recv(srq_, wr_.data(), &bad);
  } else if (qp_ != nullptr) {
    rc = ibv_post_recv(qp_, wr_.data(), &bad);
  }
  // On failure the requests before `bad` were posted (the link or the
  // transport fails anyway; the count only has to stay plausible).
  if (rc == 0) {
    posted_ += static_cast<uint32_t>(n);
  } else if (bad != nullptr) {
    posted_ += static_cast<uint32_t>(bad - wr_.data());
  }
  return rc;
}

int ReceiveQueue::post_all() {
  for (uint32_t i = 0; i < depth_; ++i) consumed_[i] = i;
  n_consumed_ = 0;
  queued_ = false;
  const int rc = post_chain(depth_);
  low_water_ = posted_;
  return rc;
}

}  // namespace slotrpc::transport::verbs
