// Call metadata on the wire: a client's headers on a request, a server's
// trailers on its final reply (docs/protocol.md, "Call metadata").
//
// A block sits right after the 32-byte header when the message has
// kFlagMetadata, before any bulk block and the FlatBuffer (or an error's
// text), and keeps their 8-byte alignment:
//
//   u32 block_len   bytes of the whole block, this word included; a
//                   multiple of 8, at most kMaxMetadataBytes
//   u16 count       entries
//   u16 reserved    0
//   count x { u8 key_len, u8 reserved (0), u16 value_len, key, value }
//   zero padding up to block_len
//
// Keys are 1..255 bytes of lower-case letters, digits, '-', '_' and '.'
// (HTTP/2 header names, as gRPC metadata); values are any bytes.  Entries
// are read in place in the receive slot, never copied on the server.
// Encoding and checking never allocate.  A call without metadata never gets
// here: its PendingCall has no extras (one null test, shared with bulk
// segments), a reply without trailers constructs nothing for them, and the
// server reads the flag with the bulk flag in one test.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "slotrpc/metadata.h"
#include "slotrpc/result.h"
#include "slotrpc/status.h"

namespace slotrpc::core {

inline constexpr size_t kMaxMetadataBytes = 8192;
inline constexpr size_t kMetadataBlockHead = 8;
inline constexpr size_t kMetadataEntryHead = 4;

using MetadataList = ::slotrpc::Metadata;

// The encoded block's size, or why `list` cannot be sent: a bad key, or
// over kMaxMetadataBytes (RESOURCE_EXHAUSTED naming the limit).  `what` is
// "call metadata" or "trailers", for the message.
Result<size_t> metadata_block_bytes(const MetadataList& list, std::string_view what);
// Writes the block (`bytes` from metadata_block_bytes) at `out`.
void encode_metadata(const MetadataList& list, std::byte* out, size_t bytes);

// Checks the block at the start of `in` (all of its entries, keys included)
// and returns its length; INVALID_ARGUMENT saying what is wrong otherwise.
Result<size_t> check_metadata_block(std::span<const std::byte> in);

// Over a block check_metadata_block accepted.
class MetadataView {
 public:
  MetadataView() = default;
  explicit MetadataView(std::span<const std::byte> block) : block_(block) {}
  size_t size() const;
  // Entry i (0 <= i < size()): key and value.
  std::pair<std::string_view, std::string_view> at(size_t i) const;
  // The first entry with `key`.
  std::optional<std::string_view> find(std::string_view key) const;

 private:
  std::span<const std::byte> block_;
};

bool is_valid_metadata_key(std::string_view key);

}  // namespace slotrpc::core
