// Page-aligned, zeroed memory registered in a protection domain, for the
// transport's own small buffers (receive buffers, control headers that
// cannot go inline).  Session rings are not these: the core owns them and
// registers them through Link::register_memory.
//
// Created at setup, never on the hot path.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "slotrpc/result.h"

namespace slotrpc::transport::verbs {

class RegisteredBuffer {
 public:
  RegisteredBuffer() = default;
  // At least `bytes` (rounded up to a page), registered with `access`;
  // `what` names it in errors ("receive buffers").
  static Result<RegisteredBuffer> create(ibv_pd* pd, size_t bytes, int access, const char* what);
  ~RegisteredBuffer();  // deregisters, then unmaps
  RegisteredBuffer(RegisteredBuffer&& other) noexcept { *this = std::move(other); }
  RegisteredBuffer& operator=(RegisteredBuffer&& other) noexcept;
  RegisteredBuffer(const RegisteredBuffer&) = delete;
  RegisteredBuffer& operator=(const RegisteredBuffer&) = delete;

  std::byte* data() const { return data_; }
  uint32_t lkey() const { return mr_ != nullptr ? mr_->lkey : 0; }
  explicit operator bool() const { return mr_ != nullptr; }

 private:
  void release();

  std::byte* data_ = nullptr;
  size_t bytes_ = 0;
  ibv_mr* mr_ = nullptr;
};

}  // namespace slotrpc::transport::verbs
