// Link and transport lifecycle: creating the transport and its links,
// failure (completion errors, the control connection, async events),
// teardown, and stats.
#include "transport/verbs/verbs_transport.h"

#include "transport/verbs/verbs_internal.h"

namespace slotrpc::transport::verbs {

void VerbsLink::on_control_fd(uint32_t events) {
  if (down_ || fd_ < 0) return;
  char buf[64];
  const ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
  if (n == 0) return fail("peer closed the connection");
  if (n > 0) {
    return fail(fmt::format("peer sent {} unexpected byte(s) on the control connection", n));
  }
  const int err = errno;
  if (err != EAGAIN && err != EWOULDBLOCK && err != EINTR) return fail(errno_text("control connection", err));
  if ((events & (EPOLLHUP | EPOLLERR | EPOLLRDHUP)) != 0) fail("control connection hung up");
}

void VerbsLink::fail_from_wc(const ibv_wc& wc) {
  const bool recv = (wc.wr_id & kRecvBit) != 0;
  // A bulk request the peer refused (a revoked or foreign window, a range
  // or access it does not grant): its transfer ends with INVALID_ARGUMENT,
  // the others with UNAVAILABLE (finish_bulk_on_down).
  if (!recv && (wc.wr_id & kBulkBit) != 0)
    fail_bulk_front(static_cast<uint16_t>(wc.status == IBV_WC_REM_ACCESS_ERR
                                              ? StatusCode::kInvalidArgument
                                              : StatusCode::kUnavailable));
  fail(fmt::format("{} completion failed: {} (status {}, vendor error 0x{:x}){}",
                   recv ? "receive" : "send", ibv_wc_status_str(wc.status),
                   static_cast<int>(wc.status), wc.vendor_err,
                   wc.status == IBV_WC_WR_FLUSH_ERR ? "; the queue pair is in the error state" : ""));
}

void VerbsLink::close(std::string reason) { fail(std::move(reason)); }

void VerbsLink::fail(std::string reason) {
  if (down_) return;
  down_ = true;
  down_reason_ = std::move(reason);
  base::log().debug("slotrpc: {} down: {}", description_, down_reason_);
  if (qp_ != nullptr) {
    // Outstanding work flushes (those completions are ignored); the peer
    // learns from the control connection closing.
    ibv_qp_attr at{};
    at.qp_state = IBV_QPS_ERR;
    ibv_modify_qp(qp_, &at, IBV_QP_STATE);
  }
  // Bulk transfers and revokes in progress end first: their kBulkDone
  // completions come before the kLinkDown.
  finish_bulk_on_down();
  if (fd_ >= 0) {
    if (in_epoll_) ::epoll_ctl(owner_.epoll_fd_, EPOLL_CTL_DEL, fd_, nullptr);
    in_epoll_ = false;
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    fd_ = -1;
  }
  backlog_.clear();
  backlog_head_ = 0;
  backlog_bulk_ = 0;
  Completion c;
  c.kind = Completion::Kind::kLinkDown;
  c.context = context_;
  c.link = this;
  owner_.push_completion(c);
}

LinkStats VerbsLink::stats() const {
  LinkStats s = stats_;
  s.max_inline = max_inline_;
  s.shared_receive_queue = shared_receive_queue();
  s.memory_window = memory_window();
  return s;
}

// ---------------------------------------------------------- VerbsTransport

Result<std::unique_ptr<VerbsTransport>> VerbsTransport::create(const Config& config) {
  auto dev = Device::open(config);
  if (!dev.ok()) return dev.status();
  std::unique_ptr<VerbsTransport> t(new VerbsTransport);
  t->config_ = config;
  t->device_ = std::move(dev.value());
  ibv_context* ctx = t->device_->context();

  t->channel_ = ibv_create_comp_channel(ctx);
  if (t->channel_ == nullptr)
    return Status(StatusCode::kUnavailable, errno_text("ibv_create_comp_channel", errno));
  if (!set_nonblocking(t->channel_->fd) || !set_nonblocking(ctx->async_fd))
    return Status(StatusCode::kUnavailable, errno_text("fcntl(O_NONBLOCK)", errno));
  const int cqe = std::min(kInitialCq, std::max(t->device_->attr().max_cqe, 1));
  t->cq_ = ibv_create_cq(ctx, cqe, nullptr, t->channel_, 0);
  if (t->cq_ == nullptr) return Status(StatusCode::kUnavailable, errno_text("ibv_create_cq", errno));
  t->cq_capacity_ = t->cq_->cqe;

  t->epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (t->epoll_fd_ < 0) return Status(StatusCode::kInternal, errno_text("epoll_create1", errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kTagChannel;
  if (::epoll_ctl(t->epoll_fd_, EPOLL_CTL_ADD, t->channel_->fd, &ev) != 0)
    return Status(StatusCode::kInternal, errno_text("epoll_ctl", errno));
  ev.data.u64 = kTagAsync;
  if (::epoll_ctl(t->epoll_fd_, EPOLL_CTL_ADD, ctx->async_fd, &ev) != 0)
    return Status(StatusCode::kInternal, errno_text("epoll_ctl", errno));

  // Receive queues and ring protection (see verbs_transport.h).
  const ibv_device_attr& a = t->device_->attr();
  const bool has_windows = (a.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B) != 0 && a.max_mw > 0;
  const bool has_srq = a.max_srq > 0 && a.max_srq_wr > 0;
  bool shared = false;
  switch (config.srq) {
    case SharedReceiveQueue::kOff:
      break;
    case SharedReceiveQueue::kAuto:
      shared = has_windows && has_srq;
      break;
    case SharedReceiveQueue::kOn:
      if (!has_windows || !has_srq) {
        return Status(StatusCode::kUnavailable,
                      fmt::format("SLOTRPC_SRQ=on: {} has {}{}{}; use auto or off", t->device_->name(),
                                  has_srq ? "" : "no shared receive queues",
                                  !has_srq && !has_windows ? " and " : "",
                                  has_windows ? "" : "no type-2 memory windows"));
      }
      shared = true;
      break;
  }
  if (shared) {
    t->pd_ = ibv_alloc_pd(ctx);
    if (t->pd_ == nullptr) return Status(StatusCode::kUnavailable, errno_text("ibv_alloc_pd", errno));
    const uint32_t depth = std::min<uint32_t>(config.srq_depth, static_cast<uint32_t>(a.max_srq_wr));
    auto q = ReceiveQueue::create_shared(t->pd_, depth);
    if (!q.ok()) return q.status();
    t->srq_ = std::move(q.value());
    t->srq_->set_tag(make_wr_id(0, kSrqIndex, true, 0));
    if (const int rc = t->srq_->post_all(); rc != 0)
      return Status(StatusCode::kUnavailable, errno_text("ibv_post_srq_recv", rc));
  }

  t->wc_.resize(std::max<uint32_t>(config.poll_batch, 1));
  t->scratch_.resize(t->wc_.size());
  t->ready_.reserve(kReadyReserve);
  t->repost_list_.reserve(64);
  t->flush_list_.reserve(64);
  base::log().debug("slotrpc: verbs transport on {} (CQ of {} entries; {})", t->device_->describe(),
                t->cq_capacity_,
                shared ? fmt::format("shared receive queue of {}, rings behind type-2 memory windows",
                                     t->srq_->depth())
                       : std::string("a protection domain and receive queue per session"));
  return t;
}

VerbsTransport::~VerbsTransport() {
  assert(live_links_ == 0 && "destroy every VerbsLink before its VerbsTransport");
  srq_.reset();  // after every queue pair, before the PD and the CQ
  if (pd_ != nullptr && ibv_dealloc_pd(pd_) != 0)
    base::log().error("slotrpc: ibv_dealloc_pd: {}", std::strerror(errno));
  if (cq_ != nullptr && ibv_destroy_cq(cq_) != 0)
    base::log().error("slotrpc: ibv_destroy_cq: {}", std::strerror(errno));
  if (channel_ != nullptr) ibv_destroy_comp_channel(channel_);
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
  device_.reset();
}

Result<std::unique_ptr<VerbsLink>> VerbsTransport::create_link(std::string description,
                                                               uint32_t slot_count) {
  if (slot_count == 0 || slot_count > 0x10000u)
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("slot count {} outside 1..65536", slot_count));
  uint16_t index;
  if (!free_entries_.empty()) {
    index = free_entries_.back();
    free_entries_.pop_back();
  } else if (table_.size() < kMaxLinks) {
    index = static_cast<uint16_t>(table_.size());
    table_.emplace_back();
  } else {
    return Status(StatusCode::kResourceExhausted, "too many verbs links on one event loop");
  }
  std::unique_ptr<VerbsLink> link(new VerbsLink(*this, std::move(description)));
  link->index_ = index;
  link->gen_ = table_[index].gen;
  table_[index].link = link.get();
  Status st = link->setup(slot_count);
  if (!st.ok()) return st;  // ~VerbsLink releases what was made
  return link;
}

VerbsLink* VerbsTransport::lookup(uint64_t wr_id) const {
  const auto index = static_cast<uint16_t>(wr_id >> 32);
  const auto gen = static_cast<uint16_t>(wr_id >> 48);
  if (index >= table_.size()) return nullptr;
  const Entry& e = table_[index];
  return e.gen == gen ? e.link : nullptr;
}

VerbsLink* VerbsTransport::lookup_qp(uint32_t qp_num) const {
  const auto it = by_qpn_.find(qp_num);
  return it == by_qpn_.end() ? nullptr : table_[it->second].link;
}

void VerbsTransport::receive_queues(std::vector<ReceiveQueueInfo>& out) const {
  if (srq_) out.push_back({"srq", srq_->depth(), srq_->posted(), srq_->low_water()});
  for (const Entry& e : table_) {
    if (e.link == nullptr || e.link->own_rq_ == nullptr) continue;
    const ReceiveQueue& q = *e.link->own_rq_;
    out.push_back({e.link->describe(), q.depth(), q.posted(), q.low_water()});
  }
}

void VerbsTransport::forget(VerbsLink* link) {
  if (link->qp_ != nullptr) {
    const auto it = by_qpn_.find(link->qp_->qp_num);
    if (it != by_qpn_.end() && it->second == link->index_) by_qpn_.erase(it);
  }
  Entry& e = table_[link->index_];
  if (e.link == link) {
    e.link = nullptr;
    ++e.gen;  // completions still in the CQ for this entry are now stale
    free_entries_.push_back(link->index_);
  }
  std::erase(repost_list_, link);  // its own receive queue goes with it
  std::erase(flush_list_, link);
  auto first = ready_.begin() + static_cast<ptrdiff_t>(ready_head_);
  ready_.erase(std::remove_if(first, ready_.end(),
                              [link](const Completion& c) { return c.link == link; }),
               ready_.end());
  if (ready_head_ == ready_.size()) {
    ready_.clear();
    ready_head_ = 0;
  }
}

void VerbsTransport::check_fds() {
  epoll_event events[32];
  const int n = ::epoll_wait(epoll_fd_, events, 32, 0);
  for (int i = 0; i < n; ++i) {
    const uint64_t tag = events[i].data.u64;
    if (tag == kTagChannel) {
      unsigned got = 0;
      for (;;) {
        ibv_cq* cq = nullptr;
        void* ctx = nullptr;
        if (ibv_get_cq_event(channel_, &cq, &ctx) != 0) break;
        ++got;
      }
      if (got != 0) {
        ibv_ack_cq_events(cq_, got);
        armed_ = false;  // an event disarms the CQ
      }
    } else if (tag == kTagAsync) {
      for (;;) {
        ibv_async_event e{};
        if (ibv_get_async_event(device_->context(), &e) != 0) break;
        on_async_event(e);
        ibv_ack_async_event(&e);
      }
    } else if ((tag & kTagLink) != 0) {
      const auto index = static_cast<uint16_t>(tag);
      const auto gen = static_cast<uint16_t>(tag >> 16);
      if (index < table_.size() && table_[index].gen == gen && table_[index].link != nullptr)
        table_[index].link->on_control_fd(events[i].events);
    }
  }
}

void VerbsTransport::on_async_event(const ibv_async_event& e) {
  const char* what = ibv_event_type_str(e.event_type);
  switch (e.event_type) {
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_PATH_MIG_ERR: {
      for (const Entry& entry : table_) {
        if (entry.link != nullptr && entry.link->qp_ == e.element.qp) {
          base::log().warn("slotrpc: {}: async event: {}", entry.link->description_, what);
          entry.link->fail(fmt::format("async event: {}", what));
          return;
        }
      }
      base::log().warn("slotrpc: {}: async event for an unknown queue pair: {}", device_->name(), what);
      return;
    }
    case IBV_EVENT_CQ_ERR:  // the loop's one CQ, SRQ or device: every link is affected
    case IBV_EVENT_SRQ_ERR:
    case IBV_EVENT_DEVICE_FATAL:
      base::log().error("slotrpc: {}: async event: {}", device_->name(), what);
      return fail_all(fmt::format("async event: {}", what));
    case IBV_EVENT_QP_LAST_WQE_REACHED:  // an SRQ queue pair that failed: expected
      base::log().debug("slotrpc: {}: async event: {}", device_->name(), what);
      return;
    case IBV_EVENT_PORT_ERR:
      base::log().warn("slotrpc: {} port {}: async event: {}", device_->name(), e.element.port_num, what);
      return;
    default:
      base::log().info("slotrpc: {}: async event: {}", device_->name(), what);
      return;
  }
}

void VerbsTransport::fail_all(const std::string& reason) {
  for (const Entry& entry : table_)
    if (entry.link != nullptr) entry.link->fail(reason);
}

}  // namespace slotrpc::transport::verbs
