// ShmLink's bulk transfers: Link::read / write / expose / revoke
// between two processes of one host, through the staging areas of the two
// segments (shm_segment.h).  The slot path is in shm_transport.cc.
//
// Why staging and not one copy straight between the address spaces
// (process_vm_readv): that system call needs ptrace rights over the peer,
// which Yama's ptrace_scope 1 (Ubuntu's default) and container seccomp
// profiles refuse, and where it is allowed it reaches the peer's whole
// address space, not one call's range.  Through staging, a peer reads only
// what we copied into our own sealed segment for it, and writes only into
// its own: every access to our memory is made by our loop, after a check
// against an exposure of this link.  The price is a second copy; memcpy
// moves several GB/s per core, and the two copies of a transfer run at the
// same time on the two sides' loops, one chunk apart.
//
// Bulk descriptors travel in a ring of their own (the segment's bulk ring,
// with its own head and consumed count), so a slot message never waits
// behind staged chunks: a poll takes the slot ring first, then stages at
// most kBulkPumpBytes and copies out one chunk, or up to
// kBulkReceiveMaxBytes while they fit kBulkReceiveBudget.
//
// Descriptors (docs/protocol.md, "Shared memory: bulk"), payload bytes in
// the host's byte order (both ends run on one host):
//   READ_REQ   payload: u64 tag, u32 rkey, u32 0, u64 addr, u64 length
//   READ_DATA  payload: u64 tag, u32 status, u32 0, u64 addr (position in
//              the read); offset/length: the chunk in our staging area
//              (length 0 and status != 0: the read failed, e.g. revoked)
//   WRITE_DATA payload: u32 rkey, u32 0, u64 addr (in the exposure);
//              offset/length: the chunk in our staging area
// A chunk is at most kBulkChunkBytes and lies wholly inside the staging
// area; it stays there, untouched, until the peer's bulk consumed count
// passes its descriptor (the consumer copies it out before it counts it).
// A write completes only then, too: its reply goes in the slot ring, which
// the peer reads first.
//
// Off the slot hot path: a poll of a link without bulk work costs one load
// of the bulk ring's next sequence word (receive_bulk).  Per chunk, the
// work is the copy; the job queues are deques, which allocate a block now
// and then as they advance.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "base/logging.h"
#include "transport/host_bulk.h"
#include "transport/shm/shm_transport.h"

namespace slotrpc::transport::shm {
namespace {

// One object for every shm link of the process: registration is a no-op
// (memcpy reaches any host memory), so registrations are interchangeable.
const char shm_bulk_domain = 0;

template <typename T>
void put_field(std::byte* p, T v) {
  std::memcpy(p, &v, sizeof v);
}
template <typename T>
T get_field(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}


}  // namespace

const void* ShmLink::bulk_domain() const { return &shm_bulk_domain; }

Result<BulkRegistration> ShmLink::register_bulk(const BulkSource& source) {
  // Nothing to pin: memcpy reaches any host memory.
  return register_host_memory(source, bulk_domain(),
                              "shm copies bulk data with the CPU and cannot reach dma-buf (device) "
                              "memory: copy it to host memory first, or use verbs");
}

void ShmLink::deregister_bulk(BulkRegistration& registration) { registration = {}; }

Result<RemoteSegment> ShmLink::expose(const BulkRegistration& registration, size_t offset,
                                      size_t length, BulkAccess access) {
  if (Status st = check_expose(registration, bulk_domain(), "shm", offset, length, access); !st.ok())
    return st;
  if (down_) return Status(StatusCode::kUnavailable, "expose: link down: " + down_reason_);
  auto rkey = exposures_.add(registration.base + offset, length, access);
  if (!rkey.ok()) return rkey.status();
  // addr is opaque: the peer addresses the range from 0.
  return RemoteSegment{0, length, rkey.value()};
}

bool ShmLink::revoke(const RemoteSegment& segment, uint64_t /*token*/) {
  if (!exposures_.erase(segment.rkey) || down_) return true;
  // Reads served from the range end now with a failed READ_DATA.  Nothing
  // of the range is in flight: a chunk is copied into staging within one
  // poll, so once the exposure is gone no later access reaches the memory,
  // and a WRITE_DATA that names the key fails the link.
  for (auto it = serves_.begin(); it != serves_.end();) {
    if (it->rkey != segment.rkey) {
      ++it;
      continue;
    }
    Descriptor d{};
    d.lane = static_cast<uint32_t>(DescLane::kBulkReadData);
    put_field<uint64_t>(d.payload, it->tag);
    put_field<uint32_t>(d.payload + 8, static_cast<uint32_t>(StatusCode::kUnavailable));
    put_field<uint64_t>(d.payload + 16, it->sent);
    bulk_small_.push_back(d);
    it = serves_.erase(it);
  }
  return true;
}

Status ShmLink::read(const BulkRegistration& local, size_t local_offset, const RemoteSegment& remote,
                     uint64_t remote_offset, size_t length, uint64_t token) {
  if (Status st = check_transfer_args("read", "shm", local, bulk_domain(), local_offset, remote,
                                      remote_offset, length, attached_, down_, down_reason_);
      !st.ok())
    return st;
  ReadOp op;
  op.token = token;
  op.tag = next_tag_++;
  op.dest = local.base + local_offset;
  op.length = length;
  op.rkey = remote.rkey;
  op.addr = remote.addr + remote_offset;
  reads_.push_back(op);
  request_reads();
  return Status::ok_status();
}

Status ShmLink::write(const BulkRegistration& local, size_t local_offset,
                      const RemoteSegment& remote, uint64_t remote_offset, size_t length,
                      uint64_t token) {
  if (Status st = check_transfer_args("write", "shm", local, bulk_domain(), local_offset, remote,
                                      remote_offset, length, attached_, down_, down_reason_);
      !st.ok())
    return st;
  WriteJob j;
  j.token = token;
  j.rkey = remote.rkey;
  j.addr = remote.addr + remote_offset;
  j.src = local.base + local_offset;
  j.length = length;
  writes_.push_back(j);
  return Status::ok_status();
}

void ShmLink::request_reads() {
  for (size_t i = reads_requested_; i < reads_.size() && reads_requested_ < kMaxBulkReads; ++i) {
    const ReadOp& r = reads_[i];
    Descriptor d{};
    d.lane = static_cast<uint32_t>(DescLane::kBulkReadRequest);
    put_field<uint64_t>(d.payload, r.tag);
    put_field<uint32_t>(d.payload + 8, r.rkey);
    put_field<uint64_t>(d.payload + 16, r.addr);
    put_field<uint64_t>(d.payload + 24, r.length);
    bulk_small_.push_back(d);
    ++reads_requested_;
    ++stats_.bulk_requests;
  }
}

void ShmLink::bulk_done(uint64_t token, StatusCode code) {
  Completion c;
  c.kind = Completion::Kind::kBulkDone;
  c.context = context_;
  c.link = this;
  c.bulk_token = token;
  c.bulk_status = static_cast<uint16_t>(code);
  owner_.push(c);
}

void ShmLink::reclaim_staging() {
  if (!refresh_peer_count(peer_ctl()->bulk_tail, &peer_bulk_tail_, bulk_published_, "bulk ")) return;
  while (!stage_uses_.empty() && stage_uses_.front().desc < peer_bulk_tail_) {
    stage_tail_ = stage_uses_.front().end;
    stage_uses_.pop_front();
  }
  while (!write_confirms_.empty() && write_confirms_.front().desc < peer_bulk_tail_) {
    bulk_done(write_confirms_.front().token, StatusCode::kOk);
    write_confirms_.pop_front();
  }
}

std::byte* ShmLink::stage(uint32_t length) {
  // A chunk never wraps: one that would run past the end starts at the
  // beginning, and the bytes skipped are freed with it.
  const uint64_t pos = stage_head_ % kStagingBytes;
  const uint64_t skip = pos + length > kStagingBytes ? kStagingBytes - pos : 0;
  if (kStagingBytes - (stage_head_ - stage_tail_) < skip + length) {
    reclaim_staging();
    if (down_ || kStagingBytes - (stage_head_ - stage_tail_) < skip + length) return nullptr;
  }
  stage_head_ += skip;
  std::byte* const p = own_.map.base() + own_.layout.staging_offset + stage_head_ % kStagingBytes;
  stage_head_ += length;
  stage_uses_.push_back(StageUse{bulk_published_, stage_head_});
  return p;
}

bool ShmLink::ring_has_room() {
  if (bulk_published_ - peer_bulk_tail_ < kBulkDescCount) return true;
  reclaim_staging();  // reads the peer's consumed count (whatever filled the ring)
  return !down_ && bulk_published_ - peer_bulk_tail_ < kBulkDescCount;
}

bool ShmLink::put_descriptor(const Descriptor& d) {
  if (!ring_has_room()) return false;
  auto* const slot_desc = reinterpret_cast<Descriptor*>(own_.map.base() + own_.layout.bulk_desc_offset) +
                          (bulk_published_ & (kBulkDescCount - 1));
  store_descriptor(slot_desc, d, ++bulk_published_);
  return true;
}

void ShmLink::publish_bulk() {
  // As publish() for the slot ring: the Dekker pair with the peer's
  // announce_sleep() is on bulk_head here.
  store_own(own_ctl()->bulk_head, bulk_published_, std::memory_order_seq_cst);
  wake_peer_if_sleeping();
}

void ShmLink::pump_bulk() {
  if (down_ || !attached_) return;
  const uint64_t tail_before = peer_bulk_tail_;
  bool published = false;
  while (!bulk_small_.empty() && put_descriptor(bulk_small_.front())) {
    bulk_small_.pop_front();
    published = true;
  }
  if (down_) return;
  // Up to kBulkPumpBytes per poll (shm_segment.h says why that much), in
  // chunks: serving the peer's reads and our own writes take turns.
  bool moved = false;
  for (uint64_t budget = kBulkPumpBytes; budget != 0 && bulk_small_.empty() &&
                                         (!serves_.empty() || !writes_.empty());) {
    const bool serve = !serves_.empty() && (serve_turn_ || writes_.empty());
    const uint64_t left = serve ? serves_.front().length - serves_.front().sent
                                : writes_.front().length - writes_.front().sent;
    const auto n = static_cast<uint32_t>(std::min<uint64_t>(left, kBulkChunkBytes));
    std::byte* dst = ring_has_room() ? stage(n) : nullptr;
    if (dst == nullptr) break;
    serve_turn_ = !serve;
    budget -= std::min<uint64_t>(budget, n);
    Descriptor d{};
    d.length = n;
    d.offset = static_cast<uint32_t>(dst - (own_.map.base() + own_.layout.staging_offset));
    if (serve) {
      ServeJob& j = serves_.front();
      std::memcpy(dst, j.src + j.sent, n);
      d.lane = static_cast<uint32_t>(DescLane::kBulkReadData);
      put_field<uint64_t>(d.payload, j.tag);
      put_field<uint64_t>(d.payload + 16, j.sent);
      j.sent += n;
      if (j.sent == j.length) {
        serves_.pop_front();
      } else if (serves_.size() > 1) {
        serves_.push_back(j);  // round robin between the peer's reads
        serves_.pop_front();
      }
    } else {
      WriteJob& j = writes_.front();
      std::memcpy(dst, j.src + j.sent, n);
      d.lane = static_cast<uint32_t>(DescLane::kBulkWriteData);
      put_field<uint32_t>(d.payload, j.rkey);
      put_field<uint64_t>(d.payload + 8, j.addr + j.sent);
      j.sent += n;
      ++stats_.bulk_requests;
      if (j.sent == j.length) {
        // Every byte is in staging and the source may be reused; the
        // write completes once the peer has copied its last chunk out
        // (reclaim_staging), so a reply posted after the completion,
        // though in the slot ring, never arrives before the data.
        write_confirms_.push_back(WriteConfirm{bulk_published_, j.token});
        writes_.pop_front();
      } else if (writes_.size() > 1) {
        writes_.push_back(j);  // round robin between this side's writes
        writes_.pop_front();
      }
    }
    // stage() recorded bulk_published_ as this chunk's descriptor index.
    put_descriptor(d);  // cannot fail: ring_has_room() said so above
    published = moved = true;
    ++shm_stats_.bulk_chunks_sent;
    shm_stats_.bulk_bytes_sent += n;
    owner_.bulk_bytes_moved_ += n;
  }
  if (!write_confirms_.empty()) reclaim_staging();
  if (down_) return;
  if (published) {
    bulk_active_ = true;
    publish_bulk();
  }
  // The drain rule of the backlog (check_drain), for bulk data: a peer
  // that consumes no staged chunk for peer_timeout_ms while more waits is
  // failed.  The clock is read only while stalled.
  const bool waiting = !bulk_small_.empty() || ((!serves_.empty() || !writes_.empty()) && !moved) ||
                       (!write_confirms_.empty() && !moved);
  if (!waiting) {
    bulk_stalled_ = false;
    return;
  }
  if (!bulk_small_.empty() || ((!serves_.empty() || !writes_.empty()) && !moved)) ++shm_stats_.bulk_stalls;
  const auto now = std::chrono::steady_clock::now();
  if (!bulk_stalled_ || published || peer_bulk_tail_ != tail_before) {
    bulk_stalled_ = true;
    bulk_progress_ = now;
    return;
  }
  const auto idle = now - bulk_progress_;
  if (idle < std::chrono::milliseconds(owner_.peer_timeout_ms_)) return;
  std::string reason =
      "peer has consumed no bulk data for " +
      std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(idle).count()) +
      " ms with more to send (peer_timeout_ms = " + std::to_string(owner_.peer_timeout_ms_) + ")";
  base::log().warn("slotrpc: closing {}: {}", description_, reason);
  fail(std::move(reason));
}

bool ShmLink::on_bulk_descriptor(const Descriptor& d, Completion& c, bool* done, uint64_t* moved) {
  *done = false;
  const std::byte* const staging = peer_.map.base() + peer_.layout.staging_offset;
  // A chunk of the peer's staging area: its place and size against our
  // own constants, before a byte is copied.
  auto chunk_ok = [&](const char* what) {
    if (d.length == 0 || d.length > kBulkChunkBytes || d.offset > kStagingBytes - d.length) {
      fail(std::string("peer sent ") + what + " of " + std::to_string(d.length) +
           " bytes at staging offset " + std::to_string(d.offset) + " (chunks are 1.." +
           std::to_string(kBulkChunkBytes) + " bytes inside " + std::to_string(kStagingBytes) + ")");
      return false;
    }
    return true;
  };
  // The peer's access against our exposure; every failure fails the link
  // before a byte moves (verbs: a remote access error).
  auto exposure = [&](uint32_t rkey, BulkAccess want, uint64_t addr, uint64_t length,
                      const char* what) -> const Exposure* {
    std::string why;
    const Exposure* e = exposures_.check_peer_access(rkey, want, addr, length, what, &why);
    if (e == nullptr) fail(std::move(why));
    return e;
  };
  switch (static_cast<DescLane>(d.lane)) {
    case DescLane::kBulkReadRequest: {
      const uint64_t tag = get_field<uint64_t>(d.payload);
      const uint32_t rkey = get_field<uint32_t>(d.payload + 8);
      const uint64_t addr = get_field<uint64_t>(d.payload + 16);
      const uint64_t length = get_field<uint64_t>(d.payload + 24);
      const Exposure* e = exposure(rkey, BulkAccess::kRemoteRead, addr, length, "read");
      if (e == nullptr) return false;
      if (serves_.size() >= kMaxBulkReads) {
        fail("peer has more than " + std::to_string(kMaxBulkReads) + " bulk reads outstanding");
        return false;
      }
      serves_.push_back(ServeJob{tag, rkey, e->base + addr, length, 0});
      return true;
    }
    case DescLane::kBulkReadData: {
      const uint64_t tag = get_field<uint64_t>(d.payload);
      const uint32_t status = get_field<uint32_t>(d.payload + 8);
      const uint64_t addr = get_field<uint64_t>(d.payload + 16);
      auto it = std::find_if(reads_.begin(), reads_.begin() + static_cast<ptrdiff_t>(reads_requested_),
                             [tag](const ReadOp& r) { return r.tag == tag; });
      if (it == reads_.begin() + static_cast<ptrdiff_t>(reads_requested_)) {
        fail("peer sent read data for unknown read " + std::to_string(tag));
        return false;
      }
      if (status != 0 || d.length == 0) {
        // The peer revoked the range while serving it (its call ended).
        if (status == 0 || d.length != 0) {
          fail("peer sent a failed read with data, or an empty one without a status");
          return false;
        }
        c.kind = Completion::Kind::kBulkDone;
        c.bulk_token = it->token;
        c.bulk_status = static_cast<uint16_t>(peer_failure_status(status));
        reads_.erase(it);
        --reads_requested_;
        *done = true;
        request_reads();
        return true;
      }
      if (!chunk_ok("read data")) return false;
      if (addr != it->got || d.length > it->length - it->got) {
        fail("peer sent read data " + std::to_string(addr) + "+" + std::to_string(d.length) +
             " out of order or beyond read " + std::to_string(tag) + " of " +
             std::to_string(it->length) + " bytes");
        return false;
      }
      std::memcpy(it->dest + it->got, staging + d.offset, d.length);
      it->got += d.length;
      *moved += d.length;
      if (it->got == it->length) {
        c.kind = Completion::Kind::kBulkDone;
        c.bulk_token = it->token;
        c.bulk_status = static_cast<uint16_t>(StatusCode::kOk);
        reads_.erase(it);
        --reads_requested_;
        *done = true;
        request_reads();
      }
      return true;
    }
    case DescLane::kBulkWriteData: {
      const uint32_t rkey = get_field<uint32_t>(d.payload);
      const uint64_t addr = get_field<uint64_t>(d.payload + 8);
      if (!chunk_ok("write data")) return false;
      const Exposure* e = exposure(rkey, BulkAccess::kRemoteWrite, addr, d.length, "wrote");
      if (e == nullptr) return false;
      std::memcpy(e->base + addr, staging + d.offset, d.length);
      *moved += d.length;
      return true;
    }
    default:
      fail("descriptor with unknown lane " + std::to_string(d.lane));
      return false;
  }
}

size_t ShmLink::receive_bulk(std::span<Completion> out, bool* took) {
  if (down_ || !attached_ || out.empty()) return 0;
  const auto* const descs = reinterpret_cast<const Descriptor*>(peer_.map.base() +
                                                                peer_.layout.bulk_desc_offset);
  size_t n = 0;  // descriptors consumed
  size_t k = 0;  // completions made (reads done)
  uint64_t moved = 0;
  uint64_t chunks = 0;
  // One chunk per call, and more only while they fit receive_budget_ at the
  // pace of those before (shm_segment.h, kBulkReceiveBudget): what slot
  // messages that arrive meanwhile wait for is bounded in time, whether the
  // destination's pages are fresh (~7 us a chunk) or touched (~1 us).  The
  // clock is read only on a call that has bulk descriptors to take.
  std::chrono::steady_clock::time_point start{};
  while (k < out.size() && !down_ && moved < kBulkReceiveMaxBytes) {
    if (chunks != 0) {
      const auto spent = std::chrono::steady_clock::now() - start;
      if (spent + spent / chunks > receive_budget_) break;
    }
    Descriptor d;
    if (take_descriptor(descs, kBulkDescCount, bulk_consumed_ + n, &d, "bulk ") != Take::kGot) break;
    if (n == 0) start = std::chrono::steady_clock::now();
    Completion& c = out[k];
    c.context = context_;
    c.link = this;
    bool done = false;
    const uint64_t before = moved;
    if (!on_bulk_descriptor(d, c, &done, &moved)) break;
    ++n;
    if (moved != before) ++chunks;
    if (done) ++k;
  }
  if (moved != 0) {
    shm_stats_.bulk_bytes_received += moved;
    owner_.bulk_bytes_moved_ += moved;
  }
  if (n != 0) {
    *took = true;
    bulk_active_ = true;
    bulk_consumed_ += n;
    // The chunks are copied out: their staging bytes may be reused.
    store_own(own_ctl()->bulk_tail, bulk_consumed_, std::memory_order_release);
  }
  return k;
}

void ShmLink::fail_bulk() {
  // Every bulk operation ends before kLinkDown (transport.h): reads and
  // writes failed (down_reason() says why); nothing reaches an exposure
  // any more.
  for (const ReadOp& r : reads_) bulk_done(r.token, StatusCode::kUnavailable);
  reads_.clear();
  reads_requested_ = 0;
  for (const WriteJob& j : writes_) bulk_done(j.token, StatusCode::kUnavailable);
  writes_.clear();
  for (const WriteConfirm& w : write_confirms_) bulk_done(w.token, StatusCode::kUnavailable);
  write_confirms_.clear();
  serves_.clear();
  bulk_small_.clear();
  exposures_.clear();
  stage_uses_.clear();
}

}  // namespace slotrpc::transport::shm
