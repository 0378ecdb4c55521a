// Bulk transfers on a verbs link: registration (host or dma-buf), exposure
// through type-2 memory windows, chunked RDMA READ / WRITE, and how all of
// it ends when the link goes down.  See bulk.h for the data path.  Not hot
// path: nothing here runs for a slot message.
#include "transport/verbs/verbs_transport.h"

#include "transport/verbs/exposure_mrs.h"
#include "transport/verbs/verbs_internal.h"

namespace slotrpc::transport::verbs {

namespace {

Status unavailable(const std::string& reason) {
  return Status(StatusCode::kUnavailable, "verbs link is down: " + reason);
}

}  // namespace

bool VerbsLink::supports_bulk() const {
  // Exposure is bounded by a window per call; without type-2 windows the
  // only remote key is the whole MR's, which would outlive the call.
  const ibv_device_attr& a = owner_.device().attr();
  return (a.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B) != 0 && a.max_mw > 0;
}

namespace {

// Soft-RoCE checks a type-2 window's key, queue pair, access and state, but
// the range of an access only against the MR under it (rxe_resp.c,
// check_rkey), not against the window as the IB spec requires (o10-37):
// there each exposure gets an MR of its own over exactly its range.
bool checks_window_bounds(const Device& dev) {
  return dev.name().rfind("rxe", 0) != 0 && dev.attr().vendor_id != 0xffffff;
}

void release_own_mr(BulkState::Window& w) {
  if (w.own_mr == nullptr) return;
  ExposureMrs::instance().release(w.own_mr);  // kept for the next exposure of the range
  w.own_mr = nullptr;
}

}  // namespace

bool VerbsLink::uses_exposure_mrs() const { return !checks_window_bounds(owner_.device()); }

uint64_t VerbsLink::chunk_bytes() const {
  const uint32_t port = owner_.device().max_msg_size();
  return port == 0 ? kBulkChunkBytes : std::min<uint64_t>(kBulkChunkBytes, port);
}

uint8_t VerbsLink::responder_resources() const {
  const int dev = owner_.device().attr().max_qp_rd_atom;
  return static_cast<uint8_t>(std::clamp<int>(dev, 1, kMaxReadsInFlight));
}

BulkState& VerbsLink::bulk_state() {
  if (!bulk_) bulk_ = std::make_unique<BulkState>();
  return *bulk_;
}

void VerbsLink::push_bulk_done(uint64_t token, uint16_t status) {
  Completion c;
  c.kind = Completion::Kind::kBulkDone;
  c.context = context_;
  c.link = this;
  c.bulk_token = token;
  c.bulk_status = status;
  owner_.push_completion(c);
}

// ------------------------------------------------------------ registration

Result<BulkRegistration> VerbsLink::register_bulk(const BulkSource& source) {
  if (pd_ == nullptr) return Status(StatusCode::kInternal, "verbs link has no protection domain");
  if (!supports_bulk())
    return Status(StatusCode::kUnimplemented,
                  fmt::format("bulk transfers on verbs need type-2 memory windows, which {} lacks",
                              owner_.device().name()));
  if (source.address == nullptr || source.length == 0)
    return Status(StatusCode::kInvalidArgument, "bulk registration of an empty range");
  // LOCAL_WRITE: READ chunks land here, and a window that grants remote
  // write needs it on its MR.  MW_BIND and no REMOTE_* flag: the MR's own
  // rkey reaches nothing; the peer only ever gets a window's, bound to one
  // queue pair over one call's range (expose()).
  int flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND;
  if (owner_.device().relaxed_ordering()) flags |= IBV_ACCESS_RELAXED_ORDERING;
  ibv_mr* mr = nullptr;
  if (source.dmabuf_fd >= 0) {
    // The MR's addresses are `address` onwards (the iova), so windows and
    // the peer use the same addresses as for host memory.
    mr = ibv_reg_dmabuf_mr(pd_, source.dmabuf_offset, source.length,
                           reinterpret_cast<uintptr_t>(source.address), source.dmabuf_fd, flags);
    if (mr == nullptr) {
      const int err = errno;
      const bool unsupported = err == EOPNOTSUPP || err == ENOTSUP || err == ENOSYS;
      return Status(unsupported ? StatusCode::kUnimplemented : StatusCode::kInvalidArgument,
                    fmt::format("ibv_reg_dmabuf_mr of {} bytes (dma-buf fd {}, offset {}) on {}: {}{}",
                                source.length, source.dmabuf_fd, source.dmabuf_offset,
                                owner_.device().name(), std::strerror(err),
                                unsupported ? " (this device or kernel cannot register dma-buf "
                                              "memory; pass host memory)"
                                            : ""));
    }
  } else {
    mr = ibv_reg_mr(pd_, source.address, source.length, flags);
    if (mr == nullptr) {
      const int err = errno;
      return Status(StatusCode::kResourceExhausted,
                    fmt::format("ibv_reg_mr of {} bytes for bulk transfers: {}{}", source.length,
                                std::strerror(err),
                                err == ENOMEM || err == EPERM || err == EFAULT
                                    ? " (locked-memory limit too low? see ulimit -l)"
                                    : ""));
    }
  }
  BulkRegistration r;
  r.base = source.address;
  r.length = source.length;
  r.lkey = mr->lkey;
  r.handle = mr;
  r.domain = pd_;
  return r;
}

void VerbsLink::deregister_bulk(BulkRegistration& registration) {
  if (auto* mr = static_cast<ibv_mr*>(registration.handle); mr != nullptr) {
    // The exposure MRs over it first: none may outlive it (exposure_mrs.h).
    ExposureMrs::instance().drop_parent(mr);
    // Fails while a window is still bound over the MR (an exposure not
    // revoked on a live link); a link that went down has released its
    // windows already (finish_bulk_on_down).
    if (const int rc = ibv_dereg_mr(mr); rc != 0)
      base::log().error("slotrpc: ibv_dereg_mr of a bulk registration ({} bytes): {} (an exposure "
                        "over it not revoked?)", registration.length, std::strerror(rc));
  }
  registration = BulkRegistration{};
}

// ---------------------------------------------------------------- exposure

Result<RemoteSegment> VerbsLink::expose(const BulkRegistration& registration, size_t offset,
                                        size_t length, BulkAccess access) {
  if (down_) return unavailable(down_reason_);
  if (!supports_bulk()) return Link::expose(registration, offset, length, access);
  if (registration.handle == nullptr || registration.domain != pd_)
    return Status(StatusCode::kInvalidArgument,
                  "expose: memory registered in another protection domain (register it through a "
                  "link of this one)");
  if (length == 0 || offset > registration.length || length > registration.length - offset)
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("expose: {} bytes at offset {} of a registration of {}", length, offset,
                              registration.length));
  unsigned flags = 0;
  switch (access) {
    case BulkAccess::kRemoteRead: flags = IBV_ACCESS_REMOTE_READ; break;
    case BulkAccess::kRemoteWrite: flags = IBV_ACCESS_REMOTE_WRITE; break;
    default:
      return Status(StatusCode::kInvalidArgument,
                    fmt::format("expose: unknown access {}", static_cast<int>(access)));
  }
  ibv_mr* own_mr = nullptr;
  // A window over the whole registration is bounded by it already.
  if (uses_exposure_mrs() && (offset != 0 || length != registration.length)) {
    auto mr = ExposureMrs::instance().acquire(pd_, static_cast<ibv_mr*>(registration.handle),
                                              reinterpret_cast<uintptr_t>(registration.base) + offset,
                                              length);
    if (!mr.ok()) return mr.status();
    own_mr = mr.value();
  }
  BulkState& b = bulk_state();
  uint32_t index = 0;
  if (!b.free_windows.empty()) {
    index = b.free_windows.back();
    b.free_windows.pop_back();
  } else {
    ibv_mw* mw = ibv_alloc_mw(pd_, IBV_MW_TYPE_2);
    if (mw == nullptr) {
      if (own_mr != nullptr) ExposureMrs::instance().release(own_mr);
      return Status(StatusCode::kResourceExhausted,
                    fmt::format("ibv_alloc_mw (type 2) for exposure {} of {}: {}", b.windows.size() + 1,
                                description_, std::strerror(errno)));
    }
    b.windows.push_back(BulkState::Window{mw});
    index = static_cast<uint32_t>(b.windows.size() - 1);
  }
  BulkState::Window& w = b.windows[index];
  // Every bind gives the window a new key (the low 8 bits, as verbs
  // defines it): a key a peer kept from an earlier call on this window
  // reaches nothing.  mw->rkey stays the key the device has now until the
  // invalidation completes (rxe checks it when the bind is posted).
  w.rkey = ibv_inc_rkey(w.mw->rkey);
  w.mr = own_mr != nullptr ? own_mr : static_cast<ibv_mr*>(registration.handle);
  w.own_mr = own_mr;
  w.addr = reinterpret_cast<uintptr_t>(registration.base) + offset;
  w.length = length;
  w.access = flags;
  w.state = BulkState::Window::State::kBound;
  b.by_rkey[w.rkey] = index;
  const RemoteSegment segment{w.addr, w.length, w.rkey};
  queue_bulk(Pending::Kind::kBind, index);
  return segment;
}

bool VerbsLink::revoke(const RemoteSegment& segment, uint64_t token) {
  // Down: the queue pair is in the error state and its windows are gone
  // (finish_bulk_on_down), so nothing is reachable.
  if (down_ || !bulk_) return true;
  const auto it = bulk_->by_rkey.find(segment.rkey);
  if (it == bulk_->by_rkey.end()) return true;  // never exposed here, or revoked already
  BulkState::Window& w = bulk_->windows[it->second];
  if (w.state != BulkState::Window::State::kBound) {
    base::log().warn("slotrpc: {}: revoke of a segment being revoked already (key 0x{:x})",
                     description_, segment.rkey);
    return true;
  }
  w.state = BulkState::Window::State::kRevoking;
  w.token = token;
  queue_bulk(Pending::Kind::kInvalidate, it->second);
  return false;
}

void VerbsLink::queue_bulk(Pending::Kind kind, uint32_t index) {
  // In the backlog, so it keeps its place among the messages (a bind before
  // the message that carries its key, a write before the reply).
  Pending& p = backlog_.emplace_back();
  p.kind = kind;
  p.bulk = index;
  ++backlog_bulk_;
  if (connected_) defer_flush();
}

void VerbsLink::prepare_window_wr(size_t i, const Pending& p) {
  BulkState::Window& win = bulk_->windows[p.bulk];
  ibv_send_wr& w = wr_[i];
  w = ibv_send_wr{};
  if (p.kind == Pending::Kind::kBind) {
    w.opcode = IBV_WR_BIND_MW;
    w.bind_mw.mw = win.mw;
    w.bind_mw.rkey = win.rkey;
    w.bind_mw.bind_info.mr = win.mr;
    w.bind_mw.bind_info.addr = win.addr;
    w.bind_mw.bind_info.length = win.length;
    w.bind_mw.bind_info.mw_access_flags = win.access;
    bulk_->in_flight.push_back({BulkState::Kind::kBind, p.bulk});
  } else {
    // No IBV_SEND_FENCE: a fence would hold the invalidation until this
    // side's earlier RDMA READs complete, but those write local memory
    // through the MR's lkey, never through a window; the window is used
    // only by the peer's requests at our responder.  The invalidation
    // completing is what makes the range unreachable, and the core only
    // revokes once the peer is done with it (or is cut off anyway).
    w.opcode = IBV_WR_LOCAL_INV;
    w.invalidate_rkey = win.rkey;
    bulk_->in_flight.push_back({BulkState::Kind::kInvalidate, p.bulk});
  }
  // Signaled: an invalidation's completion is the revoke's kBulkDone, and
  // a bind's keeps the in-flight FIFO complete.
  w.send_flags = IBV_SEND_SIGNALED;
  w.wr_id = make_wr_id(gen_, index_, false, kBulkBit | (unsignaled_ + 1));
  unsignaled_ = 0;
  ++send_seq_;
}

// --------------------------------------------------------------- transfers

Status VerbsLink::read(const BulkRegistration& local, size_t local_offset,
                       const RemoteSegment& remote, uint64_t remote_offset, size_t length,
                       uint64_t token) {
  return start_transfer(false, local, local_offset, remote, remote_offset, length, token);
}

Status VerbsLink::write(const BulkRegistration& local, size_t local_offset,
                        const RemoteSegment& remote, uint64_t remote_offset, size_t length,
                        uint64_t token) {
  return start_transfer(true, local, local_offset, remote, remote_offset, length, token);
}

Status VerbsLink::start_transfer(bool write, const BulkRegistration& local, size_t local_offset,
                                 const RemoteSegment& remote, uint64_t remote_offset,
                                 size_t length, uint64_t token) {
  const char* what = write ? "bulk write" : "bulk read";
  if (down_) return unavailable(down_reason_);
  if (!supports_bulk()) return Link::read(local, local_offset, remote, remote_offset, length, token);
  if (local.handle == nullptr || local.domain != pd_)
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("{}: local memory registered in another protection domain", what));
  if (local_offset > local.length || length > local.length - local_offset)
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("{}: {} bytes at offset {} of local memory of {}", what, length,
                              local_offset, local.length));
  if (remote_offset > remote.length || length > remote.length - remote_offset)
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("{}: {} bytes at offset {} of a remote segment of {}", what, length,
                              remote_offset, remote.length));
  if (length == 0) {
    push_bulk_done(token, static_cast<uint16_t>(StatusCode::kOk));
    return {};
  }
  BulkState& b = bulk_state();
  const uint32_t i = b.new_op();
  BulkState::Op& op = b.ops[i];
  op.active = true;
  op.write = write;
  op.token = token;
  op.local = reinterpret_cast<uintptr_t>(local.base) + local_offset;
  op.lkey = local.lkey;
  op.remote = remote.addr + remote_offset;
  op.rkey = remote.rkey;
  op.length = length;
  // Both wait in queues of their own, behind the backlog: a message posted
  // meanwhile (a PONG, another call's reply) never waits for a gigabyte.
  // The core posts a call's reply only after the write's kBulkDone, so the
  // reply still follows its data (transport.h).
  (write ? b.writes : b.reads).push_back(i);
  if (connected_) defer_flush();
  return {};
}

size_t VerbsLink::prepare_chunks(size_t j, size_t room, uint32_t index) {
  BulkState& b = *bulk_;
  BulkState::Op& op = b.ops[index];
  const uint64_t chunk = chunk_bytes();
  size_t n = 0;
  while (op.posted < op.length && j + n < room) {
    uint32_t& in_flight = op.write ? b.writes_in_flight : b.reads_in_flight;
    if (in_flight >= (op.write ? kWritesInFlight : uint32_t{max_rd_atomic_})) break;
    const auto len = static_cast<uint32_t>(std::min(chunk, op.length - op.posted));
    ibv_send_wr& w = wr_[j + n];
    ibv_sge& s = sge_[j + n];
    w = ibv_send_wr{};
    s.addr = op.local + op.posted;
    s.length = len;
    s.lkey = op.lkey;
    w.sg_list = &s;
    w.num_sge = 1;
    w.opcode = op.write ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
    w.wr.rdma.remote_addr = op.remote + op.posted;
    w.wr.rdma.rkey = op.rkey;
    w.send_flags = IBV_SEND_SIGNALED;
    w.wr_id = make_wr_id(gen_, index_, false, kBulkBit | (unsignaled_ + 1));
    unsignaled_ = 0;
    ++send_seq_;
    op.posted += len;
    ++stats_.bulk_requests;
    ++op.outstanding;
    ++in_flight;
    b.in_flight.push_back({BulkState::Kind::kChunk, index});
    ++n;
  }
  return n;
}

// ------------------------------------------------------------- completions

void VerbsLink::on_bulk_done() {
  if (!bulk_ || bulk_->in_flight.empty()) return fail("bulk completion without a bulk request");
  BulkState& b = *bulk_;
  const BulkState::InFlight f = b.in_flight.front();
  b.in_flight.pop_front();
  switch (f.kind) {
    case BulkState::Kind::kBind:
      break;
    case BulkState::Kind::kInvalidate: {
      BulkState::Window& w = b.windows[f.index];
      b.by_rkey.erase(w.rkey);
      w.mw->rkey = w.rkey;  // what the device holds now; the next bind increments it
      w.state = BulkState::Window::State::kFree;
      release_own_mr(w);  // unbound now
      b.free_windows.push_back(f.index);
      push_bulk_done(w.token, static_cast<uint16_t>(StatusCode::kOk));
      break;
    }
    case BulkState::Kind::kChunk: {
      BulkState::Op& op = b.ops[f.index];
      --op.outstanding;
      --(op.write ? b.writes_in_flight : b.reads_in_flight);
      if (op.posted == op.length && op.outstanding == 0) {
        push_bulk_done(op.token, static_cast<uint16_t>(StatusCode::kOk));
        b.release_op(f.index);
      }
      break;
    }
  }
}

void VerbsLink::fail_bulk_front(uint16_t code) {
  if (!bulk_ || bulk_->in_flight.empty()) return;
  const BulkState::InFlight f = bulk_->in_flight.front();
  if (f.kind == BulkState::Kind::kChunk) bulk_->ops[f.index].status = code;
}

void VerbsLink::finish_bulk_on_down() {
  if (!bulk_) return;
  BulkState& b = *bulk_;
  // Every transfer ends (with the error its failed request recorded, else
  // UNAVAILABLE), and every revoke in progress with OK: the queue pair is
  // in the error state, so no range is reachable any more.  All of these
  // come before the link's kLinkDown.
  for (BulkState::Op& op : b.ops) {
    if (!op.active) continue;
    push_bulk_done(op.token, op.status != 0 ? op.status
                                            : static_cast<uint16_t>(StatusCode::kUnavailable));
  }
  for (BulkState::Window& w : b.windows)
    if (w.state == BulkState::Window::State::kRevoking)
      push_bulk_done(w.token, static_cast<uint16_t>(StatusCode::kOk));
  // The registrations under the windows can then be deregistered while
  // this (dead) session object still exists.
  free_bulk_windows();
  bulk_.reset();
}

void VerbsLink::free_bulk_windows() {
  if (!bulk_) return;
  for (BulkState::Window& w : bulk_->windows) {
    // Deallocating a window unbinds it: nothing reaches its range after.
    if (w.mw != nullptr && ibv_dealloc_mw(w.mw) != 0)
      base::log().error("slotrpc: ibv_dealloc_mw ({}): {}", description_, std::strerror(errno));
    w.mw = nullptr;
    release_own_mr(w);
  }
}

}  // namespace slotrpc::transport::verbs
