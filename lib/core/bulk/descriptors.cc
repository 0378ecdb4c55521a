#include "core/bulk/descriptors.h"

#include <fmt/format.h>

#include "core/wire_format.h"

namespace slotrpc::bulk {
namespace {

Status malformed(std::string what) {
  return Status(StatusCode::kInvalidArgument, "malformed bulk descriptor block: " + what);
}

}  // namespace

Status check_counts(size_t send, size_t receive) {
  if (send <= kMaxBulkSegments && receive <= kMaxBulkSegments) return {};
  return Status(StatusCode::kInvalidArgument,
                fmt::format("{} send and {} receive bulk segments: at most {} each", send, receive,
                            kMaxBulkSegments));
}

void encode_request_block(const RequestBlock& block, std::byte* out) {
  core::store_le<uint16_t>(out, block.reads);
  core::store_le<uint16_t>(out + 2, block.writes);
  core::store_le<uint32_t>(out + 4, static_cast<uint32_t>(block.bytes()));
  std::byte* p = out + kBlockHead;
  for (size_t i = 0; i < size_t{block.reads} + block.writes; ++i, p += kSegmentBytes) {
    core::store_le<uint64_t>(p, block.segments[i].addr);
    core::store_le<uint64_t>(p + 8, block.segments[i].length);
    core::store_le<uint32_t>(p + 16, block.segments[i].rkey);
    core::store_le<uint32_t>(p + 20, 0);
  }
}

Result<RequestBlock> decode_request_block(std::span<const std::byte> payload, uint64_t max_bytes) {
  if (payload.size() < kBlockHead)
    return malformed(fmt::format("{} bytes of payload, the block head alone is {}", payload.size(),
                                 kBlockHead));
  RequestBlock b;
  b.reads = core::load_le<uint16_t>(payload.data());
  b.writes = core::load_le<uint16_t>(payload.data() + 2);
  const uint32_t length = core::load_le<uint32_t>(payload.data() + 4);
  if (b.reads > kMaxBulkSegments || b.writes > kMaxBulkSegments)
    return malformed(fmt::format("{} read and {} write segments (at most {} each)", b.reads,
                                 b.writes, kMaxBulkSegments));
  if (size_t{b.reads} + b.writes == 0) return malformed("no segments");
  if (length != b.bytes() || length > payload.size())
    return malformed(fmt::format("block length {} for {} segments in a payload of {} bytes", length,
                                 b.reads + b.writes, payload.size()));
  uint64_t total = 0;
  const std::byte* p = payload.data() + kBlockHead;
  for (size_t i = 0; i < size_t{b.reads} + b.writes; ++i, p += kSegmentBytes) {
    transport::RemoteSegment& s = b.segments[i];
    s.addr = core::load_le<uint64_t>(p);
    s.length = core::load_le<uint64_t>(p + 8);
    s.rkey = core::load_le<uint32_t>(p + 16);
    if (core::load_le<uint32_t>(p + 20) != 0) return malformed(fmt::format("segment {}: reserved bits set", i));
    if (s.length == 0) return malformed(fmt::format("segment {} is empty", i));
    if (s.addr + s.length < s.addr) return malformed(fmt::format("segment {} wraps around", i));
    total = add_capped(total, s.length, max_bytes);
  }
  if (total > max_bytes)
    return Status(StatusCode::kResourceExhausted,
                  fmt::format("the call offers more bulk bytes than this server accepts "
                              "(max_bulk_bytes = {}, SLOTRPC_MAX_BULK_BYTES)",
                              max_bytes));
  return b;
}

void encode_reply_block(std::span<const uint64_t> written, std::byte* out) {
  core::store_le<uint16_t>(out, static_cast<uint16_t>(written.size()));
  core::store_le<uint16_t>(out + 2, 0);
  core::store_le<uint32_t>(out + 4, static_cast<uint32_t>(reply_block_bytes(written.size())));
  for (size_t i = 0; i < written.size(); ++i) core::store_le<uint64_t>(out + kBlockHead + 8 * i, written[i]);
}

Status decode_reply_block(std::span<const std::byte> payload,
                          std::span<const uint64_t> destination_lengths,
                          std::array<uint64_t, kMaxBulkSegments>& written, size_t* block_bytes) {
  const size_t n = destination_lengths.size();
  if (payload.size() < kBlockHead) return malformed("reply shorter than its block head");
  const uint16_t count = core::load_le<uint16_t>(payload.data());
  const uint32_t length = core::load_le<uint32_t>(payload.data() + 4);
  if (count != n || core::load_le<uint16_t>(payload.data() + 2) != 0 || length != reply_block_bytes(n) ||
      length > payload.size())
    return malformed(fmt::format("reply block of {} entries ({} bytes) for {} destinations", count,
                                 length, n));
  for (size_t i = 0; i < n; ++i) {
    written[i] = core::load_le<uint64_t>(payload.data() + kBlockHead + 8 * i);
    if (written[i] > destination_lengths[i])
      return malformed(fmt::format("the server claims {} bytes written into destination {} of {}",
                                   written[i], i, destination_lengths[i]));
  }
  *block_bytes = length;
  return {};
}

}  // namespace slotrpc::bulk
