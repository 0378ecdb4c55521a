// The data path: post (chains, inline, doorbells, backlog), receives, and
// the transport's completion-queue polling.  Hot path: no allocation, no
// locks.
#include "transport/verbs/verbs_transport.h"

#include "transport/verbs/verbs_internal.h"

namespace slotrpc::transport::verbs {

void VerbsLink::post(std::span<const Outgoing> batch) {
  if (down_ || batch.empty()) return;
  size_t i = 0;
  if (connected_ && backlog_head_ == backlog_.size()) {
    // The common case: everything fits the send queue, one doorbell.
    const size_t n = std::min<size_t>(sq_depth_ - sq_outstanding_, batch.size());
    for (size_t j = 0; j < n; ++j)
      if (!prepare(j, batch[j])) return;
    if (n != 0 && !ring_doorbell(n)) return;
    i = n;
  }
  // The rest waits for completions (or for connect()), in order.
  for (; i < batch.size(); ++i) {
    const Outgoing& o = batch[i];
    if (backlog_.size() - backlog_head_ - backlog_bulk_ >= backlog_limit_) {
      return fail(fmt::format(
          "send backlog over budget: {} messages wait and the peer acknowledges none of them "
          "(budget {} for {} slots; it is not reposting receives)",
          backlog_.size() - backlog_head_ - backlog_bulk_, backlog_limit_, created_slots_));
    }
    Pending& p = backlog_.emplace_back();
    p.out = o;
    if (o.delivery == Delivery::kControl) {
      if (o.data == nullptr || o.length != transport::kHeaderSize) {
        backlog_.pop_back();
        return fail(fmt::format("post: control message of {} bytes, expected {}", o.length,
                                transport::kHeaderSize));
      }
      // The caller may reuse its 32 bytes once post() returns.
      std::memcpy(p.control.data(), o.data, transport::kHeaderSize);
    }
    ++stats_.backlogged;
  }
  // Bulk work requests queued this turn (defer_flush: a bind ahead of the
  // request that carries its key) leave with these messages, one chain.
  if (connected_ && flush_queued_) flush_backlog();
}

void VerbsLink::defer_flush() {
  if (flush_queued_) return;
  flush_queued_ = true;
  owner_.flush_list_.push_back(this);
}

bool VerbsLink::prepare(size_t i, const Outgoing& o) {
  ibv_send_wr& w = wr_[i];
  ibv_sge& s = sge_[i];
  if (o.data == nullptr || o.length == 0) {
    fail(fmt::format("post: invalid message of {} bytes", o.length));
    return false;
  }
  w.next = nullptr;
  w.sg_list = &s;
  w.num_sge = 1;
  w.send_flags = 0;
  s.addr = reinterpret_cast<uintptr_t>(o.data);
  s.length = o.length;
  const uint64_t seq = send_seq_++;
  if (o.delivery == Delivery::kControl) {
    if (o.length != transport::kHeaderSize) {
      fail(fmt::format("post: control message of {} bytes, expected {}", o.length,
                       transport::kHeaderSize));
      return false;
    }
    w.opcode = IBV_WR_SEND;
    if (transport::kHeaderSize <= max_inline_) {
      w.send_flags = IBV_SEND_INLINE;
      s.lkey = 0;
      ++stats_.inline_sends;
    } else {
      // Buffer seq % depth is free: request seq - depth has completed, or
      // the send queue could not have taken this one.
      std::byte* buf = ctrl_bufs_.data() + (seq % sq_depth_) * transport::kHeaderSize;
      std::memcpy(buf, o.data, transport::kHeaderSize);
      s.addr = reinterpret_cast<uintptr_t>(buf);
      s.lkey = ctrl_bufs_.lkey();
      ++stats_.noninline_sends;
    }
    ++stats_.control_sends;
    ++stats_.messages;
    ++stats_.packets;
  } else {
    const uint16_t slot = transport::imm_slot(o.imm);
    if (slot >= slot_count_ || o.length > slot_size_) {
      fail(fmt::format("post: {} bytes into slot {} of a ring of {} slots of {}", o.length, slot,
                       slot_count_, slot_size_));
      return false;
    }
    w.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    w.imm_data = htobe32(o.imm);
    w.wr.rdma.remote_addr = peer_ring_ + uint64_t{slot} * slot_size_;
    w.wr.rdma.rkey = peer_rkey_;
    if (o.length <= max_inline_) {
      w.send_flags = IBV_SEND_INLINE;
      s.lkey = 0;
      ++stats_.inline_sends;
    } else {
      if (o.data < send_base_ || o.data + o.length > send_base_ + send_len_) {
        fail("post: message outside the registered send ring");
        return false;
      }
      s.lkey = send_lkey_;
      ++stats_.noninline_sends;
    }
    ++stats_.slot_sends;
    stats_.messages += o.messages;
    stats_.packets += o.length <= path_mtu_ ? 1 : (o.length + path_mtu_ - 1) / path_mtu_;
    if (o.messages > 1) ++stats_.packs;
  }
  // Selective signaling: every signal_every_-th request reports, and
  // retires itself and the unsignaled ones before it.
  if (++unsignaled_ >= signal_every_) {
    w.send_flags |= IBV_SEND_SIGNALED;
    w.wr_id = make_wr_id(gen_, index_, false, unsignaled_);
    unsignaled_ = 0;
    ++stats_.signaled;
  } else {
    w.wr_id = make_wr_id(gen_, index_, false, 0);
  }
  return true;
}

bool VerbsLink::ring_doorbell(size_t n) {
  for (size_t j = 0; j + 1 < n; ++j) wr_[j].next = &wr_[j + 1];
  wr_[n - 1].next = nullptr;
  ibv_send_wr* bad = nullptr;
  if (const int rc = ibv_post_send(qp_, wr_.data(), &bad); rc != 0) {
    fail(errno_text("ibv_post_send", rc));
    return false;
  }
  sq_outstanding_ += static_cast<uint32_t>(n);
  ++stats_.doorbells;
  return true;
}

void VerbsLink::flush_backlog() {
  flush_queued_ = false;
  if (down_ || !connected_) return;
  const size_t room = sq_depth_ - sq_outstanding_;
  size_t j = 0;
  // The backlog in order: messages, and the bulk items among them (bulk.h).
  while (backlog_head_ < backlog_.size() && j < room) {
    Pending& p = backlog_[backlog_head_];
    if (p.kind == Pending::Kind::kMessage) {
      if (p.out.delivery == Delivery::kControl) p.out.data = p.control.data();
      if (!prepare(j, p.out)) return;
      ++j;
    } else {
      prepare_window_wr(j, p);
      ++j;
      --backlog_bulk_;
    }
    ++backlog_head_;
  }
  // RDMA READs and WRITEs take the room left: they never hold up a
  // message (each kind also stops at its own in-flight limit).
  if (bulk_ != nullptr) {
    for (std::deque<uint32_t>* q : {&bulk_->reads, &bulk_->writes}) {
      while (!q->empty() && j < room) {
        const uint32_t op = q->front();
        j += prepare_chunks(j, room, op);
        if (bulk_->ops[op].posted < bulk_->ops[op].length) break;
        q->pop_front();
      }
    }
  }
  if (j != 0 && !ring_doorbell(j)) return;
  if (backlog_head_ == backlog_.size()) {
    backlog_.clear();  // keeps capacity
    backlog_head_ = 0;
  }
}

void VerbsLink::on_send_done(uint32_t retired) {
  sq_outstanding_ -= std::min(retired, sq_outstanding_);
  if (backlog_head_ < backlog_.size() || bulk_waiting()) defer_flush();
}

void VerbsLink::repost() {
  if (down_ || own_rq_ == nullptr) return;
  if (const int rc = own_rq_->post_consumed(); rc != 0) fail(errno_text("ibv_post_recv", rc));
}

bool VerbsLink::on_receive(const ibv_wc& wc, const std::byte* buffer, Completion* out) {
  switch (wc.opcode) {
    case IBV_WC_RECV_RDMA_WITH_IMM: {
      const uint32_t imm = be32toh(wc.imm_data);
      const uint16_t slot = transport::imm_slot(imm);
      // The bytes are already in the ring; these checks keep a misbehaving
      // peer's message from reaching the core.
      if (slot >= slot_count_) {
        fail(fmt::format("peer wrote slot {} outside the ring of {}", slot, slot_count_));
        return false;
      }
      if (wc.byte_len == 0 || wc.byte_len > slot_size_) {
        fail(fmt::format("peer wrote {} bytes into a slot of {}", wc.byte_len, slot_size_));
        return false;
      }
      if (!take_armed(slot)) {
        fail(fmt::format("peer wrote slot {} which was not armed", slot));
        return false;
      }
      out->kind = Completion::Kind::kMessage;
      out->slot = slot;
      out->length = wc.byte_len;
      out->imm = imm;
      out->context = context_;
      out->link = this;
      return true;
    }
    case IBV_WC_RECV: {
      if (wc.byte_len != transport::kHeaderSize) {
        fail(fmt::format("control message of {} bytes, expected {}", wc.byte_len,
                         transport::kHeaderSize));
        return false;
      }
      out->kind = Completion::Kind::kControl;
      out->slot = 0;
      out->length = wc.byte_len;
      out->imm = (wc.wc_flags & IBV_WC_WITH_IMM) != 0 ? be32toh(wc.imm_data) : 0;
      out->context = context_;
      out->link = this;
      std::memcpy(out->control.data(), buffer, transport::kHeaderSize);
      return true;
    }
    default:
      fail(fmt::format("unexpected receive completion (opcode {})", static_cast<int>(wc.opcode)));
      return false;
  }
}

Status VerbsLink::post_raw_write(const std::byte* local, uint32_t length, uint64_t remote_addr,
                                 uint32_t rkey, uint32_t imm) {
  if (down_ || !connected_) return Status(StatusCode::kUnavailable, "link not connected");
  if (sq_outstanding_ >= sq_depth_) return Status(StatusCode::kResourceExhausted, "send queue full");
  if (local < send_base_ || local + length > send_base_ + send_len_)
    return Status(StatusCode::kInvalidArgument, "local bytes outside the send ring");
  ibv_send_wr& w = wr_[0];
  ibv_sge& s = sge_[0];
  s.addr = reinterpret_cast<uintptr_t>(local);
  s.length = length;
  s.lkey = send_lkey_;
  w = ibv_send_wr{};
  w.sg_list = &s;
  w.num_sge = 1;
  w.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  w.imm_data = htobe32(imm);
  w.wr.rdma.remote_addr = remote_addr;
  w.wr.rdma.rkey = rkey;
  ++send_seq_;
  w.send_flags = IBV_SEND_SIGNALED;
  w.wr_id = make_wr_id(gen_, index_, false, unsignaled_ + 1);
  unsignaled_ = 0;
  if (!ring_doorbell(1)) return Status(StatusCode::kUnavailable, down_reason_);
  return {};
}

size_t VerbsTransport::drain_ready(std::span<Completion> out) {
  const size_t n = std::min(out.size(), ready_.size() - ready_head_);
  std::copy_n(ready_.begin() + static_cast<ptrdiff_t>(ready_head_), n, out.begin());
  ready_head_ += n;
  if (ready_head_ == ready_.size()) {
    ready_.clear();  // keeps capacity
    ready_head_ = 0;
  }
  return n;
}

size_t VerbsTransport::process(const ibv_wc* wc, int n, Completion* out) {
  size_t k = 0;
  for (int i = 0; i < n; ++i) {
    const ibv_wc& w = wc[i];
    const auto index = static_cast<uint16_t>(w.wr_id >> 32);
    const auto value = static_cast<uint32_t>(w.wr_id & kValueMask);
    VerbsLink* link = nullptr;
    const std::byte* buffer = nullptr;
    if (index == kSrqIndex && (w.wr_id & kRecvBit) != 0 && srq_ != nullptr) {
      // An SRQ buffer always goes back, whatever became of its queue pair.
      srq_->consumed(value);
      buffer = srq_->buffer(value);
      link = lookup_qp(w.qp_num);
    } else {
      link = lookup(w.wr_id);
      if (link != nullptr && !link->down_ && (w.wr_id & kRecvBit) != 0 && link->own_rq_ != nullptr) {
        if (link->own_rq_->consumed(value)) repost_list_.push_back(link);
        buffer = link->own_rq_->buffer(value);
      }
    }
    // Stale (the link is gone) or already failed: flush errors and the
    // like after a link is down carry no news.
    if (link == nullptr || link->down_) continue;
    if (w.status != IBV_WC_SUCCESS) {
      link->fail_from_wc(w);
      continue;
    }
    if ((w.wr_id & kRecvBit) != 0) {
      if (buffer != nullptr && link->on_receive(w, buffer, out + k)) ++k;
    } else {
      if ((value & kBindBit) != 0) link->bound_ = true;
      if ((value & kBulkBit) != 0) link->on_bulk_done();
      link->on_send_done(value & ~(kBindBit | kBulkBit));
    }
  }
  // Receive buffers go back (one chain per queue) and waiting sends go out
  // before the core sees these completions.
  if (srq_ != nullptr) {
    if (const int rc = srq_->post_consumed(); rc != 0) {
      base::log().error("slotrpc: {}: ibv_post_srq_recv: {}", device_->name(), std::strerror(rc));
      fail_all(errno_text("ibv_post_srq_recv", rc));
    }
  }
  for (VerbsLink* l : repost_list_) l->repost();
  repost_list_.clear();
  flush_deferred();
  return k;
}

void VerbsTransport::flush_deferred() {
  // Index loop: flushing never queues another flush, but keep it safe if
  // it ever does.
  for (size_t i = 0; i < flush_list_.size(); ++i) flush_list_[i]->flush_backlog();
  flush_list_.clear();
}

int VerbsTransport::poll_into_ready() {
  const int n = ibv_poll_cq(cq_, static_cast<int>(wc_.size()), wc_.data());
  if (n < 0) {
    fail_all(fmt::format("ibv_poll_cq failed ({})", n));
    return 0;
  }
  if (n > 0) {
    ++poll_stats_.polls;
    poll_stats_.completions += static_cast<uint64_t>(n);
    const size_t k = process(wc_.data(), n, scratch_.data());
    ready_.insert(ready_.end(), scratch_.begin(), scratch_.begin() + static_cast<ptrdiff_t>(k));
  }
  return n;
}

void VerbsTransport::drain_cq() {
  while (poll_into_ready() > 0) {
  }
}

size_t VerbsTransport::poll(std::span<Completion> out) {
  // What the last turn queued (VerbsLink::defer_flush) goes out first.
  if (!flush_list_.empty()) flush_deferred();
  size_t got = drain_ready(out);
  if (got == out.size()) return got;
  if (check_fds_ || --countdown_ == 0) {
    check_fds_ = false;
    countdown_ = kFdCheckInterval;
    check_fds();
    got += drain_ready(out.subspan(got));
    if (got == out.size()) return got;
  }
  const int want = static_cast<int>(std::min(out.size() - got, wc_.size()));
  const int n = ibv_poll_cq(cq_, want, wc_.data());
  if (n < 0) {
    fail_all(fmt::format("ibv_poll_cq failed ({})", n));
  } else if (n > 0) {
    ++poll_stats_.polls;
    poll_stats_.completions += static_cast<uint64_t>(n);
    got += process(wc_.data(), n, out.data() + got);
  }
  // Link failures found in this batch follow its messages.
  got += drain_ready(out.subspan(got));
  return got;
}

bool VerbsTransport::prepare_sleep() {
  // Never sleep on work requests not yet posted: the completions they would
  // bring are what the loop waits for.
  if (!flush_list_.empty()) flush_deferred();
  if (ready_head_ < ready_.size()) return false;
  if (!armed_) {
    if (const int rc = ibv_req_notify_cq(cq_, 0); rc != 0) {
      base::log().warn("slotrpc: ibv_req_notify_cq: {}; not sleeping", std::strerror(rc));
      return false;
    }
    armed_ = true;
  }
  // A completion that arrived before the arm raises no event: look again.
  const int n = ibv_poll_cq(cq_, static_cast<int>(wc_.size()), wc_.data());
  check_fds_ = true;  // whatever wakes the loop, look at the fds next time
  if (n > 0) {
    ++poll_stats_.polls;
    poll_stats_.completions += static_cast<uint64_t>(n);
    const size_t k = process(wc_.data(), n, scratch_.data());
    ready_.insert(ready_.end(), scratch_.begin(), scratch_.begin() + static_cast<ptrdiff_t>(k));
    return false;
  }
  return ready_head_ == ready_.size();
}

}  // namespace slotrpc::transport::verbs
