#include "transport/verbs/registered_buffer.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include <fmt/format.h>

namespace slotrpc::transport::verbs {

Result<RegisteredBuffer> RegisteredBuffer::create(ibv_pd* pd, size_t bytes, int access,
                                                  const char* what) {
  RegisteredBuffer b;
  b.bytes_ = std::max<size_t>(bytes, 4096);
  void* p = ::mmap(nullptr, b.bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    b.bytes_ = 0;
    return Status(StatusCode::kResourceExhausted, fmt::format("out of memory ({})", what));
  }
  b.data_ = static_cast<std::byte*>(p);
  b.mr_ = ibv_reg_mr(pd, b.data_, b.bytes_, access);
  if (b.mr_ == nullptr)
    return Status(StatusCode::kUnavailable, fmt::format("ibv_reg_mr ({}): {}", what, std::strerror(errno)));
  return b;
}

RegisteredBuffer& RegisteredBuffer::operator=(RegisteredBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    mr_ = std::exchange(other.mr_, nullptr);
  }
  return *this;
}

RegisteredBuffer::~RegisteredBuffer() { release(); }

void RegisteredBuffer::release() {
  if (mr_ != nullptr) ibv_dereg_mr(mr_);
  if (data_ != nullptr) ::munmap(data_, bytes_);
  mr_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

}  // namespace slotrpc::transport::verbs
