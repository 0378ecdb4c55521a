#include "bulk/descriptors.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace slotrpc::bulk {
namespace {

// Little-endian like the message header (core/wire_format.cc).
template <class T>
void put(std::byte* p, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}
template <class T>
T get(const std::byte* p) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(static_cast<T>(p[i]) << (8 * i));
  return v;
}

Status malformed(std::string what) {
  return Status(StatusCode::kInvalidArgument, "malformed bulk descriptor block: " + what);
}

}  // namespace

void encode_request_block(const RequestBlock& block, std::byte* out) {
  put<uint16_t>(out, block.reads);
  put<uint16_t>(out + 2, block.writes);
  put<uint32_t>(out + 4, static_cast<uint32_t>(block.bytes()));
  std::byte* p = out + kBlockHead;
  for (size_t i = 0; i < size_t{block.reads} + block.writes; ++i, p += kSegmentBytes) {
    put<uint64_t>(p, block.segments[i].addr);
    put<uint64_t>(p + 8, block.segments[i].length);
    put<uint32_t>(p + 16, block.segments[i].rkey);
    put<uint32_t>(p + 20, 0);
  }
}

Result<RequestBlock> decode_request_block(std::span<const std::byte> payload, uint64_t max_bytes) {
  if (payload.size() < kBlockHead)
    return malformed(fmt::format("{} bytes of payload, the block head alone is {}", payload.size(),
                                 kBlockHead));
  RequestBlock b;
  b.reads = get<uint16_t>(payload.data());
  b.writes = get<uint16_t>(payload.data() + 2);
  const uint32_t length = get<uint32_t>(payload.data() + 4);
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
    s.addr = get<uint64_t>(p);
    s.length = get<uint64_t>(p + 8);
    s.rkey = get<uint32_t>(p + 16);
    if (get<uint32_t>(p + 20) != 0) return malformed(fmt::format("segment {}: reserved bits set", i));
    if (s.length == 0) return malformed(fmt::format("segment {} is empty", i));
    if (s.addr + s.length < s.addr) return malformed(fmt::format("segment {} wraps around", i));
    // Saturating: the sum of 32 lengths could wrap 64 bits.
    total = s.length > max_bytes - std::min(total, max_bytes) ? max_bytes + 1 : total + s.length;
  }
  if (total > max_bytes)
    return Status(StatusCode::kResourceExhausted,
                  fmt::format("the call offers more bulk bytes than this server accepts "
                              "(max_bulk_bytes = {}, SLOTRPC_MAX_BULK_BYTES)",
                              max_bytes));
  return b;
}

void encode_reply_block(std::span<const uint64_t> written, std::byte* out) {
  put<uint16_t>(out, static_cast<uint16_t>(written.size()));
  put<uint16_t>(out + 2, 0);
  put<uint32_t>(out + 4, static_cast<uint32_t>(reply_block_bytes(written.size())));
  for (size_t i = 0; i < written.size(); ++i) put<uint64_t>(out + kBlockHead + 8 * i, written[i]);
}

Status decode_reply_block(std::span<const std::byte> payload,
                          std::span<const uint64_t> destination_lengths,
                          std::array<uint64_t, kMaxBulkSegments>& written, size_t* block_bytes) {
  const size_t n = destination_lengths.size();
  if (payload.size() < kBlockHead) return malformed("reply shorter than its block head");
  const uint16_t count = get<uint16_t>(payload.data());
  const uint32_t length = get<uint32_t>(payload.data() + 4);
  if (count != n || get<uint16_t>(payload.data() + 2) != 0 || length != reply_block_bytes(n) ||
      length > payload.size())
    return malformed(fmt::format("reply block of {} entries ({} bytes) for {} destinations", count,
                                 length, n));
  for (size_t i = 0; i < n; ++i) {
    written[i] = get<uint64_t>(payload.data() + kBlockHead + 8 * i);
    if (written[i] > destination_lengths[i])
      return malformed(fmt::format("the server claims {} bytes written into destination {} of {}",
                                   written[i], i, destination_lengths[i]));
  }
  *block_bytes = length;
  return {};
}

}  // namespace slotrpc::bulk
