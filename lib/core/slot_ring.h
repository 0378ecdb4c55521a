// A ring of `count` slots of `size` bytes: one registered memory region.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "transport/transport.h"

namespace slotrpc::core {

class SlotRing {
 public:
  // Page-aligned, zeroed memory.  Registration with the session's link is
  // separate (register_with), done once at session setup; the ring must be
  // deregistered before that link is destroyed.
  SlotRing(uint32_t count, uint32_t size);
  ~SlotRing();
  SlotRing(const SlotRing&) = delete;
  SlotRing& operator=(const SlotRing&) = delete;

  Status register_with(transport::Link& link, transport::Access access);
  // Idempotent; the memory stays mapped until destruction.
  void deregister();

  std::byte* slot(uint32_t i) { return base_ + size_t{i} * size_; }
  const std::byte* slot(uint32_t i) const { return base_ + size_t{i} * size_; }
  uint32_t count() const { return count_; }
  uint32_t slot_size() const { return size_; }
  size_t bytes() const { return size_t{count_} * size_; }
  const transport::MemoryRegion& region() const { return region_; }

 private:
  uint32_t count_;
  uint32_t size_;
  std::byte* base_ = nullptr;
  transport::MemoryRegion region_{};
  transport::Link* registered_with_ = nullptr;
};

}  // namespace slotrpc::core
