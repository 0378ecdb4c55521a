// Registered memory for bulk payloads (docs/design.md, "Bulk
// payloads").
//
//   std::vector<float> tensor(1 << 28);
//   slotrpc::MemoryRegion mr =
//       channel->register_memory(std::as_writable_bytes(std::span(tensor))).value();
//   // ... attach [offset, offset + length) of mr to calls ...
//   mr.release();  // or let the last copy go
//
// A MemoryRegion is a handle on memory the user owns: the library never
// frees it, and reads or writes it only while a call that carries it runs.
// The memory must stay allocated until the region is released (release(),
// or the last copy of the handle destroyed) and no call uses it any more.
//
// Registration is lazy and cached: a region is registered (pinned, on
// verbs) in each transport domain it is used in (a verbs protection
// domain; all TCP connections share one), once, at its first use there,
// and deregistered when it is released.  Memory passed to a call without
// a region (CallOptions::send_bulk(span)) is registered for that call only
// (no idle caching: a freed and reused address could otherwise hit stale
// pinned pages), so register buffers that many calls use.
// Channel::register_memory and
// Server::register_memory check the range and that the transport can carry
// bulk data at all; neither blocks on the network.
//
// Device memory (GPU): pass a dma-buf.  CUDA:
//   int fd; cuMemGetHandleForAddressRange(&fd, dptr, size,
//                                         CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
//   channel->register_memory(slotrpc::DmaBuf{fd, 0, (std::byte*)dptr, size});
// ROCm: hsa_amd_portable_export_dmabuf(dptr, size, &fd, &offset) gives the
// fd and the offset of dptr inside it.  Verbs registers it with
// ibv_reg_dmabuf_mr (rdma-core 44+), so the NIC reads and writes GPU memory
// directly; TCP and shared memory cannot reach device memory and refuse a
// dma-buf region with UNIMPLEMENTED (copy to host memory first).  The fd must stay open
// until the region is released.
//
// Thread safety: a MemoryRegion may be created, copied, used and released
// on any thread; the registrations behind it are guarded by one mutex in
// the process-wide registration cache (lib/core/bulk/registration_cache.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "slotrpc/export.h"

namespace slotrpc {

namespace bulk {
struct Region;
}

// Device memory exported as a dma-buf: `length` bytes at device address
// `address`, which start at `offset` inside the dma-buf `fd`.
struct DmaBuf {
  int fd = -1;
  uint64_t offset = 0;
  std::byte* address = nullptr;
  size_t length = 0;
};

class SLOTRPC_API MemoryRegion {
 public:
  MemoryRegion();  // empty: valid() is false
  ~MemoryRegion();
  MemoryRegion(const MemoryRegion&);
  MemoryRegion& operator=(const MemoryRegion&);
  MemoryRegion(MemoryRegion&&) noexcept;
  MemoryRegion& operator=(MemoryRegion&&) noexcept;

  // Registered and not released.
  bool valid() const;
  // The range (for a dma-buf region: the device addresses).
  std::byte* data() const;
  size_t size() const;
  bool device() const;  // from a DmaBuf

  // Ends the registration for every copy of the handle: calls that carry
  // the region afterwards fail with INVALID_ARGUMENT ("released region");
  // each domain's registration is dropped once no running call uses it.
  void release();

  // Internal (lib/bulk): the shared state behind the handle.
  const std::shared_ptr<bulk::Region>& impl() const { return impl_; }
  explicit MemoryRegion(std::shared_ptr<bulk::Region> impl);

 private:
  std::shared_ptr<bulk::Region> impl_;
};

}  // namespace slotrpc
