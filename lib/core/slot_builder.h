// Building FlatBuffers in place: a FlatBuffers allocator over one slot of a
// registered send ring.
//
// The builder writes back to front, so a finished buffer ends at the end of
// the slot; the 32-byte header is then written just in front of it and the
// two go out as one contiguous message.  The allocator hands out the slot
// once and refuses to grow: a message that outgrows its slot throws
// SlotOverflow, which the sessions turn into RESOURCE_EXHAUSTED before
// anything is sent.
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <cstddef>
#include <exception>
#include <span>

#include "core/wire_format.h"

namespace slotrpc::core {

class SlotOverflow : public std::exception {
 public:
  const char* what() const noexcept override { return "message does not fit its slot"; }
};

class SlotAllocator final : public flatbuffers::Allocator {
 public:
  SlotAllocator(std::byte* base, size_t capacity) : base_(base), capacity_(capacity) {}
  uint8_t* allocate(size_t size) override {
    if (size > capacity_) throw SlotOverflow();
    return reinterpret_cast<uint8_t*>(base_);
  }
  void deallocate(uint8_t*, size_t) override {}
  uint8_t* reallocate_downward(uint8_t*, size_t, size_t, size_t, size_t) override {
    throw SlotOverflow();
  }

 private:
  std::byte* base_;
  size_t capacity_;
};

namespace detail {
// Base-from-member: the allocator must exist before the builder's base.
struct SlotAllocatorHolder {
  SlotAllocator allocator;
};
}  // namespace detail

// One per send slot, created at session setup and reused for every message
// sent from that slot (Clear() keeps the memory).
class SlotBuilder : private detail::SlotAllocatorHolder, public flatbuffers::FlatBufferBuilder {
 public:
  // `slot` is the whole slot; the builder may use all of it after the header.
  SlotBuilder(std::byte* slot, size_t slot_size)
      : detail::SlotAllocatorHolder{SlotAllocator(slot + kHeaderSize, slot_size - kHeaderSize)},
        flatbuffers::FlatBufferBuilder(slot_size - kHeaderSize, &allocator, false),
        slot_(slot),
        capacity_(slot_size - kHeaderSize) {}

  bool is_finished() const { return finished; }

  // After a SlotOverflow (or any exception mid-build): the builder grew its
  // bookkeeping before the allocator refused, so Clear() would keep a size
  // larger than the slot.  Reset() forgets the memory; the next build gets
  // the slot afresh from the allocator.
  void recover() { Reset(); }
  size_t payload_capacity() const { return capacity_; }

  // After Finish(): header goes at message_begin(), payload follows it.
  std::byte* message_begin() {
    return reinterpret_cast<std::byte*>(GetBufferPointer()) - kHeaderSize;
  }
  std::byte* slot() { return slot_; }

 private:
  std::byte* slot_;
  size_t capacity_;
};

}  // namespace slotrpc::core
