// A ring of `count` slots of `size` bytes: one registered memory region.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "transport/transport.h"

namespace slotrpc::core {

class SlotRing {
 public:
  // Page-aligned, zeroed memory.  Registration with the session's link is
  // separate (register_with), done once at session setup; the ring must be
  // deregistered before that link is destroyed.
  SlotRing(uint32_t count, uint32_t size);
  // A send ring the link's peer reads in place (Link::send_slots(), the
  // shared-memory transport): the ring becomes a second mapping of those
  // shared pages (mremap with old_size 0), so a message is built where the
  // receiver reads it and the link sends it without a copy.  Being its own
  // mapping, it stays valid after the link is gone (a client stream's
  // writer may still build in it on its own thread after the session
  // closed).  The core never reads back what it wrote here for a decision;
  // the shm transport also seals the pages against the peer's writes.
  // Empty, too small or not page aligned: private memory as above.
  SlotRing(uint32_t count, uint32_t size, std::span<std::byte> placed);
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
  // True when the ring maps the link's send_slots() (see the constructor).
  bool placed() const { return placed_; }
  const transport::MemoryRegion& region() const { return region_; }

 private:
  uint32_t count_;
  uint32_t size_;
  std::byte* base_ = nullptr;
  size_t mapped_ = 0;  // bytes mapped at base_ (a placed ring rounds up to pages)
  bool placed_ = false;
  transport::MemoryRegion region_{};
  transport::Link* registered_with_ = nullptr;
};

}  // namespace slotrpc::core
