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

// Thrown by a slot's builder when the message outgrows the slot.
// `at_least`: the bytes the message needed when the builder asked for more
// room (what it had built plus what it asked for, when that is known): a
// lower bound, for the error message.
class SlotOverflow : public std::exception {
 public:
  explicit SlotOverflow(size_t at_least = 0) : at_least_(at_least) {}
  const char* what() const noexcept override { return "message does not fit its slot"; }
  size_t at_least() const { return at_least_; }

 private:
  size_t at_least_;
};

class SlotAllocator final : public flatbuffers::Allocator {
 public:
  SlotAllocator(std::byte* base, size_t capacity) : base_(base), capacity_(capacity) {}
  uint8_t* allocate(size_t size) override {
    if (size > capacity_) throw SlotOverflow(size);
    return reinterpret_cast<uint8_t*>(base_);
  }
  void deallocate(uint8_t*, size_t) override {}
  // FlatBuffers grows by max(what it needs, half of what it has): a growth
  // above half is exactly the need, one below says only "more".
  uint8_t* reallocate_downward(uint8_t*, size_t old_size, size_t new_size, size_t in_use_back,
                               size_t in_use_front) override {
    const size_t grow = new_size > old_size ? new_size - old_size : 0;
    throw SlotOverflow(in_use_back + in_use_front + (grow > old_size / 2 ? grow : 1));
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
