#include "core/metadata.h"

#include <fmt/format.h>

#include <cstring>

#include "core/wire_format.h"
#include "slotrpc/service.h"

namespace slotrpc::core {

bool is_valid_metadata_key(std::string_view key) {
  if (key.empty() || key.size() > 255) return false;
  for (char c : key) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
    if (!ok) return false;
  }
  return true;
}

Result<size_t> metadata_block_bytes(const MetadataList& list, std::string_view what) {
  size_t bytes = kMetadataBlockHead;
  for (const auto& [key, value] : list) {
    if (!is_valid_metadata_key(key)) {
      return Status(StatusCode::kInvalidArgument,
                    fmt::format("{} key '{}' is not 1 to 255 of a-z 0-9 - _ .", what, key));
    }
    bytes += kMetadataEntryHead + key.size() + value.size();
    if (bytes > kMaxMetadataBytes) break;
  }
  bytes = (bytes + 7) & ~size_t{7};
  if (bytes > kMaxMetadataBytes || list.size() > 0xffff) {
    return Status(StatusCode::kResourceExhausted,
                  fmt::format("{} of {} entries take more than the {} bytes a message may carry",
                              what, list.size(), kMaxMetadataBytes));
  }
  return bytes;
}

void encode_metadata(const MetadataList& list, std::byte* out, size_t bytes) {
  store_le<uint32_t>(out, static_cast<uint32_t>(bytes));
  store_le<uint16_t>(out + 4, static_cast<uint16_t>(list.size()));
  store_le<uint16_t>(out + 6, 0);
  std::byte* at = out + kMetadataBlockHead;
  for (const auto& [key, value] : list) {
    store_le<uint8_t>(at, static_cast<uint8_t>(key.size()));
    store_le<uint8_t>(at + 1, 0);
    store_le<uint16_t>(at + 2, static_cast<uint16_t>(value.size()));
    std::memcpy(at + kMetadataEntryHead, key.data(), key.size());
    std::memcpy(at + kMetadataEntryHead + key.size(), value.data(), value.size());
    at += kMetadataEntryHead + key.size() + value.size();
  }
  std::memset(at, 0, static_cast<size_t>(out + bytes - at));
}

Result<size_t> check_metadata_block(std::span<const std::byte> in) {
  auto bad = [](std::string why) {
    return Status(StatusCode::kInvalidArgument, "malformed metadata block: " + why);
  };
  if (in.size() < kMetadataBlockHead) return bad("shorter than its 8-byte head");
  const uint32_t len = load_le<uint32_t>(in.data());
  const uint16_t count = load_le<uint16_t>(in.data() + 4);
  if (len < kMetadataBlockHead || len % 8 != 0 || len > kMaxMetadataBytes || len > in.size()) {
    return bad(fmt::format("length {} (a multiple of 8 from 8 to {}, within the {}-byte message)", len,
                           kMaxMetadataBytes, in.size()));
  }
  size_t at = kMetadataBlockHead;
  for (uint16_t i = 0; i < count; ++i) {
    if (at + kMetadataEntryHead > len) return bad(fmt::format("entry {} runs past the block", i));
    const size_t klen = load_le<uint8_t>(in.data() + at);
    const size_t vlen = load_le<uint16_t>(in.data() + at + 2);
    if (at + kMetadataEntryHead + klen + vlen > len)
      return bad(fmt::format("entry {} runs past the block", i));
    const std::string_view key(reinterpret_cast<const char*>(in.data() + at + kMetadataEntryHead), klen);
    if (!is_valid_metadata_key(key)) return bad(fmt::format("entry {} has an invalid key", i));
    at += kMetadataEntryHead + klen + vlen;
  }
  return static_cast<size_t>(len);
}

size_t MetadataView::size() const {
  return block_.empty() ? 0 : load_le<uint16_t>(block_.data() + 4);
}

std::pair<std::string_view, std::string_view> MetadataView::at(size_t i) const {
  size_t at = kMetadataBlockHead;
  for (size_t n = 0;; ++n) {
    const size_t klen = load_le<uint8_t>(block_.data() + at);
    const size_t vlen = load_le<uint16_t>(block_.data() + at + 2);
    const char* key = reinterpret_cast<const char*>(block_.data() + at + kMetadataEntryHead);
    if (n == i) return {std::string_view(key, klen), std::string_view(key + klen, vlen)};
    at += kMetadataEntryHead + klen + vlen;
  }
}

std::optional<std::string_view> MetadataView::find(std::string_view key) const {
  const size_t n = size();
  size_t at = kMetadataBlockHead;
  for (size_t i = 0; i < n; ++i) {
    const size_t klen = load_le<uint8_t>(block_.data() + at);
    const size_t vlen = load_le<uint16_t>(block_.data() + at + 2);
    const char* k = reinterpret_cast<const char*>(block_.data() + at + kMetadataEntryHead);
    if (std::string_view(k, klen) == key) return std::string_view(k + klen, vlen);
    at += kMetadataEntryHead + klen + vlen;
  }
  return std::nullopt;
}

}  // namespace slotrpc::core

namespace slotrpc {

// ServerCall's view of its request's metadata block (checked on arrival).
std::optional<std::string_view> ServerCall::metadata(std::string_view key) const {
  return core::MetadataView(metadata_).find(key);
}

size_t ServerCall::metadata_count() const { return core::MetadataView(metadata_).size(); }

std::pair<std::string_view, std::string_view> ServerCall::metadata_at(size_t i) const {
  if (i >= metadata_count()) return {};
  return core::MetadataView(metadata_).at(i);
}

}  // namespace slotrpc
