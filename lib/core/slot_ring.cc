#include "core/slot_ring.h"

#include <sys/mman.h>

#include <unistd.h>

#include <new>

namespace slotrpc::core {

SlotRing::SlotRing(uint32_t count, uint32_t size) : SlotRing(count, size, {}) {}

SlotRing::SlotRing(uint32_t count, uint32_t size, std::span<std::byte> placed)
    : count_(count), size_(size) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  if (!placed.empty() && placed.size() >= bytes() &&
      reinterpret_cast<uintptr_t>(placed.data()) % page == 0) {
    // The link's mapping of these pages ends with the link; this one ends
    // with the ring.  A shared mapping has room up to its page end.
    const size_t len = (bytes() + page - 1) / page * page;
    void* p = ::mremap(placed.data(), 0, len, MREMAP_MAYMOVE);
    if (p != MAP_FAILED) {
      base_ = static_cast<std::byte*>(p);
      mapped_ = len;
      placed_ = true;
    }
  }
  if (base_ == nullptr) {
    // mmap: page aligned, zero-filled, and returned to the OS on unmap
    // (rings can be large and are freed when a session ends).
    void* p = ::mmap(nullptr, bytes(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    base_ = static_cast<std::byte*>(p);
    mapped_ = bytes();
  }
  region_.base = base_;
  region_.length = bytes();
}

SlotRing::~SlotRing() {
  deregister();
  ::munmap(base_, mapped_);
}

void SlotRing::deregister() {
  if (registered_with_ == nullptr) return;
  registered_with_->deregister(region_);
  registered_with_ = nullptr;
  region_ = transport::MemoryRegion{base_, bytes()};
}

Status SlotRing::register_with(transport::Link& link, transport::Access access) {
  if (registered_with_ != nullptr) deregister();
  auto r = link.register_memory({base_, bytes()}, access);
  if (!r.ok()) return r.status();
  region_ = r.value();
  registered_with_ = &link;
  return {};
}

}  // namespace slotrpc::core
