// Bulk descriptor blocks: what a slot carries of a call's bulk segments
// (docs/protocol.md, "Bulk descriptors").
//
// A kRequest with kFlagBulk starts its payload with a request block:
//   u16 reads    segments the server may read (the client's send_bulk)
//   u16 writes   segments the server may write (the client's receive_bulk)
//   u32 length   of the block in bytes: 8 + 24 * (reads + writes)
//   then reads + writes entries of 24 bytes:
//     u64 addr, u64 length, u32 rkey, u32 reserved (0)
// An OK kReply with kFlagBulk starts its payload with a reply block:
//   u16 count    = the request's writes
//   u16 reserved (0)
//   u32 length   8 + 8 * count
//   then count u64: bytes the handler wrote into each destination (the
//   end of its furthest write).
// The FlatBuffer follows the block.  Both lengths are multiples of 8, so
// the FlatBuffer keeps its alignment (it ends at the end of the slot).
//
// Decoding checks everything the block claims against the bytes received
// and the limits; a block that fails is refused with a status (the call
// fails, the session goes on), never trusted.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "slotrpc/call.h"
#include "slotrpc/result.h"
#include "transport/transport.h"

namespace slotrpc::bulk {

inline constexpr size_t kBlockHead = 8;
inline constexpr size_t kSegmentBytes = 24;

// The segments of one request, in a fixed array: decoding allocates nothing.
struct RequestBlock {
  uint16_t reads = 0;
  uint16_t writes = 0;
  std::array<transport::RemoteSegment, 2 * kMaxBulkSegments> segments{};  // reads first

  const transport::RemoteSegment& read(size_t i) const { return segments[i]; }
  const transport::RemoteSegment& write(size_t i) const { return segments[reads + i]; }
  size_t bytes() const { return kBlockHead + kSegmentBytes * (size_t{reads} + writes); }
};

// total + n, but at most max + 1 (the sum of 32 segment lengths could wrap
// 64 bits): adding lengths one by one, "> max" stays true once reached.
constexpr uint64_t add_capped(uint64_t total, uint64_t n, uint64_t max) {
  return n > max - (total < max ? total : max) ? max + 1 : total + n;
}

// INVALID_ARGUMENT when a call has more segments in one direction than a
// block carries (kMaxBulkSegments).
Status check_counts(size_t send, size_t receive);

constexpr size_t request_block_bytes(size_t reads, size_t writes) {
  return kBlockHead + kSegmentBytes * (reads + writes);
}
constexpr size_t reply_block_bytes(size_t count) { return kBlockHead + 8 * count; }

// Writes `block` at `out` (block.bytes() bytes).
void encode_request_block(const RequestBlock& block, std::byte* out);
// Reads a request block from the start of `payload`.  INVALID_ARGUMENT when
// it is malformed (says what); RESOURCE_EXHAUSTED when the segments add up
// to more than `max_bytes`.
Result<RequestBlock> decode_request_block(std::span<const std::byte> payload, uint64_t max_bytes);

void encode_reply_block(std::span<const uint64_t> written, std::byte* out);
// Reads a reply block of exactly `expected` entries, each at most the
// matching destination's length.  INVALID_ARGUMENT when malformed.
Status decode_reply_block(std::span<const std::byte> payload,
                          std::span<const uint64_t> destination_lengths,
                          std::array<uint64_t, kMaxBulkSegments>& written, size_t* block_bytes);

}  // namespace slotrpc::bulk
