// The table of every SLOTRPC_* setting: name, field, allowed range.
//
// Config parsing, validation and docs/tuning.md are all written from this
// one table, so a new setting is added here and nowhere else (eRPC keeps its
// tuning constants in one place for the same reason).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "slotrpc/config.h"

namespace slotrpc::base {

struct UintSetting {
  std::string_view env;         // "SLOTRPC_SLOT_COUNT"
  std::string_view field;       // "slot_count"
  uint32_t Config::*member;
  uint64_t min;
  uint64_t max;
  std::string_view meaning;
};

// Whole-number settings.  Named ones (poll mode, transport, log level,
// device, GID index, relaxed ordering) are parsed in config.cc and listed by
// named_settings().
std::span<const UintSetting> uint_settings();

// The SLOTRPC_* variables that are not whole numbers, in the order
// docs/tuning.md lists them.
std::span<const std::string_view> named_settings();

// SLOTRPC_GID_INDEX: "auto" (stored as -1) or 0..kMaxGidIndex.
inline constexpr int32_t kMaxGidIndex = 255;

// Largest ring geometry: a slot index travels in 16 bits of the immediate,
// and slot_count * slot_size is one registered region per direction.
inline constexpr uint32_t kMaxSlotCount = 4096;
inline constexpr uint32_t kMinSlotSize = 256;
inline constexpr uint32_t kMaxSlotSize = 64u << 20;
inline constexpr uint64_t kMaxRingBytes = 4ull << 30;
inline constexpr uint32_t kSlotSizeAlign = 64;

// SLOTRPC_MAX_RING_MEMORY: at least the smallest session (2 rings of one
// 256-byte slot would be 512; a page per ring is what mmap really takes).
inline constexpr uint64_t kMinRingMemory = 8192;
inline constexpr uint64_t kMaxRingMemory = 1ull << 50;

// SLOTRPC_MAX_BULK_BYTES: bulk bytes one call may carry, both directions.
inline constexpr uint64_t kMaxBulkBytesLimit = 1ull << 48;

}  // namespace slotrpc::base
