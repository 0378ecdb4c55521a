#include "core/slot_ring.h"

#include <sys/mman.h>

#include <new>

namespace slotrpc::core {

SlotRing::SlotRing(uint32_t count, uint32_t size) : count_(count), size_(size) {
  // mmap: page aligned, zero-filled, and returned to the OS on unmap (rings
  // can be large and are freed when a session ends).
  void* p = ::mmap(nullptr, bytes(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  base_ = static_cast<std::byte*>(p);
  region_.base = base_;
  region_.length = bytes();
}

SlotRing::~SlotRing() {
  deregister();
  ::munmap(base_, bytes());
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
