#include "transport/memory/memory_transport.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace slotrpc::transport::memory {

// ---------------------------------------------------------------- MemoryLink

MemoryLink::MemoryLink(MemoryTransport& owner, std::string description)
    : owner_(owner), description_(std::move(description)) {
  // Room for a session's usual working set from the start; emplace() doubles it.
  queue_.resize(64);
}

MemoryLink::~MemoryLink() {
  // The peer learns of it as of a closed socket.
  if (peer_ != nullptr) {
    MemoryLink* peer = peer_;
    peer_ = nullptr;
    peer->peer_ = nullptr;
    peer->go_down("peer's link was destroyed");
  }
  owner_.forget(this);
}

Result<MemoryRegion> MemoryLink::register_memory(std::span<std::byte> memory, Access) {
  MemoryRegion r;
  r.base = memory.data();
  r.length = memory.size();
  return r;
}

void MemoryLink::deregister(MemoryRegion& region) { region = MemoryRegion{}; }

Status MemoryLink::attach(const MemoryRegion& receive_ring, const MemoryRegion& /*send_ring*/,
                          uint32_t slot_count, uint32_t slot_size, void* context) {
  if (attached_) return Status(StatusCode::kInvalidArgument, "memory link already attached");
  if (slot_count == 0 || slot_count > 0x10000 || slot_size < kHeaderSize)
    return Status(StatusCode::kInvalidArgument,
                  "memory link: " + std::to_string(slot_count) + " slots of " +
                      std::to_string(slot_size) + " bytes (allowed 1..65536 slots of at least " +
                      std::to_string(kHeaderSize) + " bytes)");
  if (receive_ring.base == nullptr || uint64_t{slot_count} * slot_size > receive_ring.length)
    return Status(StatusCode::kInvalidArgument,
                  "receive ring of " + std::to_string(receive_ring.length) + " bytes cannot hold " +
                      std::to_string(slot_count) + " slots of " + std::to_string(slot_size));
  ring_ = receive_ring;
  slot_count_ = slot_count;
  slot_size_ = slot_size;
  context_ = context;
  size_arming(slot_count);
  attached_ = true;
  return Status::ok_status();
}

Completion& MemoryLink::emplace() {
  if (count_ == queue_.size()) {
    // Full: unroll into a ring twice the size (the order is kept).
    std::vector<Completion> bigger(queue_.size() * 2);
    for (size_t i = 0; i < count_; ++i) bigger[i] = queue_[(head_ + i) & (queue_.size() - 1)];
    queue_.swap(bigger);
    head_ = 0;
  }
  Completion& c = queue_[(head_ + count_) & (queue_.size() - 1)];
  ++count_;
  return c;
}

void MemoryLink::push(const Completion& c) { emplace() = c; }

size_t MemoryLink::drain(std::span<Completion> out) {
  const size_t n = std::min(out.size(), count_);
  const size_t mask = queue_.size() - 1;
  for (size_t i = 0; i < n; ++i) out[i] = queue_[(head_ + i) & mask];
  head_ = (head_ + n) & mask;
  count_ -= n;
  return n;
}

bool MemoryLink::deliver(const Outgoing& o) {
  MemoryLink* const peer = peer_;
  // A bad Outgoing is a bug in the caller: refused, as shm and TCP do.
  if (o.length == 0 || o.data == nullptr) {
    fail("post: invalid message of " + std::to_string(o.length) + " bytes");
    return false;
  }
  if (!peer->attached_) {
    fail("post: the peer's session has not attached its link yet");
    return false;
  }
  if (o.delivery == Delivery::kControl) {
    if (o.length != kHeaderSize) {
      fail("post: control message of " + std::to_string(o.length) + " bytes, expected " +
           std::to_string(kHeaderSize));
      return false;
    }
    // Written in place in the peer's queue: no Completion is built and
    // copied per message.
    Completion& c = peer->emplace();
    c.kind = Completion::Kind::kControl;
    c.slot = 0;
    c.length = o.length;
    c.imm = o.imm;
    c.context = peer->context_;
    c.link = peer;
    std::memcpy(c.control.data(), o.data, kHeaderSize);
    ++stats_.control_sends;
  } else {
    const uint16_t slot = imm_slot(o.imm);
    if (slot >= peer->slot_count_ || o.length > peer->slot_size_) {
      fail("post: message of " + std::to_string(o.length) + " bytes for slot " +
           std::to_string(slot) + " does not fit the peer's ring of " +
           std::to_string(peer->slot_count_) + " slots of " + std::to_string(peer->slot_size_));
      return false;
    }
    // Checked before a byte moves, as TCP checks a frame on arrival: a slot
    // the peer has not armed may still be read by its handler.
    if (!peer->take_armed(slot)) {
      fail("post: slot " + std::to_string(slot) + " is not armed by the peer");
      return false;
    }
    std::memcpy(peer->ring_.base + size_t{slot} * peer->slot_size_, o.data, o.length);
    Completion& c = peer->emplace();
    c.kind = Completion::Kind::kMessage;
    c.slot = slot;
    c.length = o.length;
    c.imm = o.imm;
    c.context = peer->context_;
    c.link = peer;
    ++stats_.slot_sends;
    ++stats_.noninline_sends;
    if (o.messages > 1) ++stats_.packs;
  }
  stats_.messages += o.messages;
  return true;
}

void MemoryLink::post(std::span<const Outgoing> batch) {
  for (const Outgoing& o : batch) {
    if (down_ || peer_ == nullptr) return;
    if (!deliver(o)) return;
  }
}

void MemoryLink::go_down(std::string reason) {
  if (down_) return;
  down_ = true;
  down_reason_ = std::move(reason);
  Completion c;
  c.kind = Completion::Kind::kLinkDown;
  c.context = context_;
  c.link = this;
  push(c);
}

void MemoryLink::fail(std::string reason) {
  if (down_) return;
  if (peer_ != nullptr) {
    MemoryLink* peer = peer_;
    peer_ = nullptr;
    peer->peer_ = nullptr;
    peer->go_down("peer closed: " + reason);
  }
  go_down(std::move(reason));
}

void MemoryLink::close(std::string reason) { fail(std::move(reason)); }

// ----------------------------------------------------------- MemoryTransport

MemoryTransport::MemoryTransport() {
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0)
    throw std::runtime_error(std::string("slotrpc memory transport: eventfd: ") + std::strerror(errno));
}

// Its links are gone by now (they name the transport in their destructors).
MemoryTransport::~MemoryTransport() { ::close(wake_fd_); }

std::pair<std::unique_ptr<MemoryLink>, std::unique_ptr<MemoryLink>> MemoryTransport::pair(
    const std::string& name) {
  std::unique_ptr<MemoryLink> a(new MemoryLink(*this, "memory " + name + " a->b"));
  std::unique_ptr<MemoryLink> b(new MemoryLink(*this, "memory " + name + " b->a"));
  a->peer_ = b.get();
  b->peer_ = a.get();
  links_.push_back(a.get());
  links_.push_back(b.get());
  return {std::move(a), std::move(b)};
}

void MemoryTransport::forget(MemoryLink* link) {
  auto it = std::find(links_.begin(), links_.end(), link);
  if (it != links_.end()) links_.erase(it);
  if (next_link_ >= links_.size()) next_link_ = 0;
}

size_t MemoryTransport::poll(std::span<Completion> out) {
  const size_t n_links = links_.size();
  size_t got = 0;
  for (size_t i = 0; i < n_links && got < out.size(); ++i) {
    MemoryLink* l = links_[(next_link_ + i) % n_links];
    if (l->count_ != 0) got += l->drain(out.subspan(got));
  }
  if (n_links != 0) next_link_ = (next_link_ + 1) % n_links;
  return got;
}

bool MemoryTransport::prepare_sleep() {
  for (const MemoryLink* l : links_)
    if (l->count_ != 0) return false;
  return true;
}

}  // namespace slotrpc::transport::memory
