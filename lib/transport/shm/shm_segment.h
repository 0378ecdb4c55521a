// Shared-memory transport, part 1: the segments and how two processes on
// one host exchange them.
//
// Each side of a link creates its OWN segment (memfd_create) holding
// everything it writes and the peer reads:
//
//   page 0   ControlBlock: five words, each on its own cache line
//              head      descriptors this side has published (read by the
//                        peer only before it sleeps; its busy poller reads
//                        each descriptor's own sequence word instead)
//              tail      descriptors of the PEER's ring this side consumed
//                        (the peer's flow control)
//              sleeping  non-zero while this side's event loop sleeps, a
//                        new number for each sleep: the peer then sends
//                        one wake-up byte on the link's socket after
//                        publishing (one per number)
//              bulk_head, bulk_tail   the same two for the bulk rings
//   descs    desc_count x 64-byte Descriptor (power of two), a ring; each
//            carries its sequence word and up to kInlineMax payload bytes
//   bulk     kBulkDescCount x Descriptor: the bulk ring (shm_bulk.cc).  Bulk
//            descriptors have a ring of their own so that a slot message
//            never waits behind staged chunks: the receiver takes slot
//            messages first, then about one chunk's copy time per poll.
//   data     slot_count x slot_size: this side's outgoing slots.  The
//            sender builds a message here and the receiver reads it here:
//            no copy on the sending side.
//   staging  kStagingBytes: bulk bytes on their way to the peer (a ring of
//            chunks, each named by one bulk descriptor; shm_bulk.cc).
//            memfd pages cost nothing until touched, so a session that
//            never moves bulk data pays address space only.
//
// The owner maps its segment read-write, then seals it (F_SEAL_FUTURE_WRITE,
// SHRINK, GROW, SEAL) and passes the memfd to the peer with SCM_RIGHTS over
// a Unix domain socket.  Nothing else is shared: the same socket carries
// the wake-ups (ShmLink), so no descriptor the peer also holds is ever
// written by a loop (docs/design.md, "Trust and security").
// The seal means the kernel refuses the peer any writable mapping or
// write(): a peer can scribble on its own segment only, never on ours.  So
// what we read from the peer's segment is untrusted (see ShmLink), but what
// we build in our own segment is ours (a FlatBufferBuilder reads its own
// scratch back, which must not be peer-writable).  The receiver checks that
// the peer's segment carries F_SEAL_SHRINK before mapping it: an unsealed
// memfd could be truncated under our mapping and a read would SIGBUS.
//
// The layout is computed by each side from the geometry it agreed on in the
// session handshake, never from numbers read out of the peer's offer or
// segment (those are only compared with it).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "transport/frame.h"
#include "slotrpc/result.h"
#include "slotrpc/status.h"

namespace slotrpc::transport::shm {

// "WHAT: strerror(err)", for the errors of both shm files.
std::string errno_text(const char* what, int err);

// Words of a segment, read or written as atomics.  The peer's segment is
// mapped read-only: loads only (an 8-byte load is a plain mov on x86-64 and
// a plain ldr on aarch64, it never writes).
template <typename T>
T load_peer(const T& word, std::memory_order order) {
  return std::atomic_ref<T>(const_cast<T&>(word)).load(order);
}
template <typename T>
void store_own(T& word, T value, std::memory_order order) {
  std::atomic_ref<T>(word).store(value, order);
}

inline constexpr size_t kCacheLine = 64;
inline constexpr size_t kPage = 4096;
inline constexpr uint32_t kOfferMagic = 0x314d4853;  // "SHM1"
// 2: seq and inline payload in the descriptor; 3: the bulk staging area;
// 4: 16 KiB bulk chunks and a bulk ring of 512 (was 128 KiB and 128);
// 5: the memfd alone, no wake eventfd (wake-ups are bytes on the socket)
inline constexpr uint32_t kOfferVersion = 5;

// Bulk transfers (shm_bulk.cc): bytes move through the sender's staging
// area in chunks of at most kBulkChunkBytes, at most kStagingBytes of them
// unconsumed at a time (256 chunks, enough to keep both sides copying while
// the other does).
//
// The event loops do the copying, so what a loop copies in one poll is how
// long a small call on the same loop waits behind a transfer.  The
// receiving loop copies one chunk per poll (more below, in the same time,
// into touched pages: kBulkReceiveBudget): it often writes memory never
// touched before (a fresh destination), at ~1.6 us a first-touch fault on
// the development VM, so a 16 KiB chunk costs it ~7 us where the old
// 128 KiB chunk cost ~50 us.  The sending loop copies from the caller's
// memory, which it has usually just written, into staging it has used
// before, and stages up to kBulkPumpBytes per poll (~4 us).  Measured
// beside a 1 GiB echo: 64 B calls went from 3.4-7.7 x their idle p99 to
// 0.6-3.0 x (within 2 x in 15 of 19 rounds); a receiver allowed 32 or
// 64 KiB a poll went back to 2-4 x, even when it stopped between chunks
// for a waiting message.  The price: large echoes move ~7-13 % less, a
// turn per 16 KiB on the receiving loop (a sender limited to one chunk a
// poll cost another ~10 %).  docs/design.md, "Chunk size and pacing";
// docs/benchmarks.md.
inline constexpr uint32_t kBulkChunkBytes = 16 * 1024;
inline constexpr size_t kStagingBytes = size_t{4} << 20;
inline constexpr uint64_t kBulkPumpBytes = 4 * uint64_t{kBulkChunkBytes};
static_assert(kStagingBytes % kBulkChunkBytes == 0 && kBulkPumpBytes <= kStagingBytes);
// The receiver's bound is time, not bytes: a poll copies one chunk, then
// goes on while the next is likely to end within kBulkReceiveBudget of the
// first's start (at the pace of those before it), up to
// kBulkReceiveMaxBytes.  Into fresh pages that is one chunk, as before;
// into a destination touched before (a buffer reused call after call),
// where a chunk takes ~1 us, up to four, so the turn per 16 KiB that cost
// large echoes 7-13 % is paid per 64 KiB there.
inline constexpr std::chrono::nanoseconds kBulkReceiveBudget{8000};
inline constexpr uint64_t kBulkReceiveMaxBytes = 4 * uint64_t{kBulkChunkBytes};
// After bulk bytes moved, a loop keeps polling this long before it may
// sleep (ShmLink::announce_sleep): the next chunk, or the next step of the
// call (a read request, the reply), is usually a poll of the peer away,
// and a loop that slept in between paid an eventfd wake-up for it.  With
// SLOTRPC_POLL_MODE=blocking, 1 MiB bulk echoes took 164-180 us (p50)
// without it and 86-90 us with it (docs/benchmarks.md).  TCP's lane
// threads spin for the same reason (SLOTRPC_TCP_LANE_SPIN_US, also 200 us).
inline constexpr std::chrono::microseconds kBulkSpin{200};
// The bulk ring: room for every chunk staging holds (256), the reads a side
// may have requested (16, ShmLink::kMaxBulkReads, which checks this) and
// their failures, with room to spare.
inline constexpr uint32_t kBulkDescCount = 512;
static_assert((kBulkDescCount & (kBulkDescCount - 1)) == 0, "indexed with a mask");

struct Geometry {
  uint32_t slot_count = 0;
  uint32_t slot_size = 0;
};

// Written by the segment's owner only; accessed with std::atomic_ref.
struct ControlBlock {
  alignas(kCacheLine) uint64_t head;
  alignas(kCacheLine) uint64_t tail;
  alignas(kCacheLine) uint32_t sleeping;
  alignas(kCacheLine) uint64_t bulk_head;
  alignas(kCacheLine) uint64_t bulk_tail;
};
static_assert(sizeof(ControlBlock) <= kPage);

enum class DescLane : uint32_t {
  kSlot = 1,
  kControl = 2,
  kInline = 3,
  // Bulk (shm_bulk.cc; payload layouts there and in docs/protocol.md).
  kBulkReadRequest = 4,  // "send me `length` bytes at `addr` of your exposure `rkey`"
  kBulkReadData = 5,     // a chunk of a read in our staging area, or its failure
  kBulkWriteData = 6,    // a chunk for the peer's exposure `rkey`, in our staging area
};

// Payloads up to this size travel inside the descriptor (kInline).
inline constexpr uint32_t kInlineMax = 40;

// One published message, one cache line.  `seq` is written last (release)
// and is the descriptor's index in the ring's sequence plus one, so the
// busy poller polls the next descriptor itself: one cache line per hop
// instead of a separate head word, descriptor and slot.  A descriptor not
// yet written holds its previous lap's value (or 0 on the first lap).
// Slot lane: `length` bytes at `offset` inside the sender's data slot
// imm_slot(imm).  Inline lane: `length` (1..kInlineMax) bytes of a slot
// message in `payload`, for the receiver's slot imm_slot(imm).  Control
// lane: the 32-byte header in `payload` (it needs no slot).
struct Descriptor {
  uint64_t seq;
  uint32_t lane;
  uint32_t length;
  uint32_t imm;
  uint32_t offset;
  std::byte payload[kInlineMax];
};
static_assert(kInlineMax >= transport::kHeaderSize);
static_assert(sizeof(Descriptor) == 64);

struct Layout {
  Geometry geometry;
  uint32_t desc_count = 0;  // power of two
  size_t desc_offset = 0;
  size_t bulk_desc_offset = 0;  // kBulkDescCount descriptors
  size_t data_offset = 0;
  size_t staging_offset = 0;  // kStagingBytes of bulk chunks
  size_t total = 0;
};

// Refuses geometries the transport cannot carry (slot index in 16 bits,
// a segment that would not fit in memory).
Result<Layout> compute_layout(Geometry g);

// What travels with the fds (the fds are the SCM_RIGHTS payload).
struct Offer {
  uint32_t magic = kOfferMagic;
  uint32_t version = kOfferVersion;
  uint32_t slot_count = 0;
  uint32_t slot_size = 0;
  uint32_t desc_count = 0;
  uint32_t reserved = 0;
  uint64_t segment_bytes = 0;
};

// A mapping plus the fd behind it; unmaps and closes on destruction.
class Mapping {
 public:
  Mapping() = default;
  Mapping(std::byte* base, size_t length) : base_(base), length_(length) {}
  ~Mapping();
  Mapping(Mapping&& o) noexcept;
  Mapping& operator=(Mapping&& o) noexcept;
  std::byte* base() const { return base_; }
  size_t length() const { return length_; }

 private:
  std::byte* base_ = nullptr;
  size_t length_ = 0;
};

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = o.release();
    }
    return *this;
  }
  int get() const { return fd_; }
  int release() {
    const int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset();

 private:
  int fd_ = -1;
};

// This side's segment, created and sealed.
struct OwnSegment {
  Layout layout;
  Fd memfd;
  Mapping map;  // read-write
};
Result<OwnSegment> create_own_segment(Geometry g);

// The peer's segment, mapped read-only.
struct PeerSegment {
  Layout layout;
  Mapping map;  // read-only: PROT_READ, and sealed by its owner
};

// Sends our offer: the Offer struct plus [memfd], without waiting
// (MSG_DONTWAIT): a short or refused send is an error (the offer is tiny,
// the socket is fresh).
Status send_offer(int sock, const OwnSegment& own);

// Receives the peer's offer (waiting at most `timeout`), checks it against
// the geometry WE agreed on, checks the memfd (regular file, exactly the
// size of our layout, sealed against shrinking), and maps the segment
// read-only.  Any extra or missing fd is an error; fds received
// are closed on every error path.
Result<PeerSegment> receive_offer(int sock, Geometry g, std::chrono::milliseconds timeout);

}  // namespace slotrpc::transport::shm
