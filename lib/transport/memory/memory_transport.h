// In-memory transport: the two ends of a session in one process, on one
// event loop, with no system call per message.
//
// What it is for: measuring and testing the protocol core by itself
// (bench/core_bench), where a real transport's system calls, copies across
// processes and wake-ups would hide the core's own cost per call.  It is not
// a transport the RPC layer picks: no Channel or Server ever names it.
//
// Sending (post): a slot message is copied once, straight into the peer's
// receive slot (the slot the peer armed, checked before a byte moves, as
// TCP checks it on arrival), and a kMessage completion is queued for the
// peer; a control message is queued inside its completion.  Each end has a
// completion queue of its own, which the transport's poll() drains.  The
// sender's slot is free again as soon as post() returns, so LinkStats counts
// every slot message as read from the send slot (noninline_sends) and
// nothing is ever "sending".
//
// Threads: both ends and their transport belong to one loop; nothing here is
// atomic or locked.  A peer on another thread needs a real transport (shm).
//
// Ends: pair() makes two connected links.  close() on one end, or its
// destruction, takes both down: each side gets one kLinkDown with the
// reason.  Links must go before their transport, as with every transport.
//
// Hot path: post() and poll() are one virtual call per batch; per message a
// copy and a queue entry, no allocation once the queues have grown to the
// session's working set (they double when full, never shrink).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "transport/transport.h"

namespace slotrpc::transport::memory {

class MemoryTransport;

class MemoryLink final : public Link {
 public:
  ~MemoryLink() override;

  // No registration is needed (no NIC, one address space); keys are 0.
  Result<MemoryRegion> register_memory(std::span<std::byte> memory, Access access) override;
  void deregister(MemoryRegion& region) override;
  Status attach(const MemoryRegion& receive_ring, const MemoryRegion& send_ring,
                uint32_t slot_count, uint32_t slot_size, void* context) override;
  void post(std::span<const Outgoing> batch) override;
  void close(std::string reason) override;
  std::string describe() const override { return description_; }
  LinkStats stats() const override { return stats_; }

  bool down() const { return down_; }
  // Completions queued for this end and not yet polled (tests).
  size_t queued() const { return count_; }

 private:
  friend class MemoryTransport;
  MemoryLink(MemoryTransport& owner, std::string description);

  // The next entry of this end's queue, to be filled in (the ring doubles
  // when full); push() queues a whole completion.
  Completion& emplace();
  void push(const Completion& c);
  // Moves up to out.size() queued completions into `out`; returns how many.
  size_t drain(std::span<Completion> out);
  // Takes this end down with `reason` (one kLinkDown), and its peer with
  // "peer closed: <reason>"; both forget each other.
  void fail(std::string reason);
  void go_down(std::string reason);
  bool deliver(const Outgoing& o);

  MemoryTransport& owner_;
  std::string description_;
  MemoryLink* peer_ = nullptr;
  void* context_ = nullptr;
  MemoryRegion ring_{};  // the session's receive ring, written by the peer's post()
  uint32_t slot_count_ = 0;
  uint32_t slot_size_ = 0;
  bool attached_ = false;
  bool down_ = false;
  LinkStats stats_;
  // The completion queue: a ring of a power-of-two size, `head_` the next
  // to poll.
  std::vector<Completion> queue_;
  size_t head_ = 0;
  size_t count_ = 0;
};

class MemoryTransport final : public Transport {
 public:
  MemoryTransport();
  ~MemoryTransport() override;
  MemoryTransport(const MemoryTransport&) = delete;
  MemoryTransport& operator=(const MemoryTransport&) = delete;

  // Two connected ends.  `name` goes into both descriptions
  // ("memory <name> a->b", "memory <name> b->a").
  std::pair<std::unique_ptr<MemoryLink>, std::unique_ptr<MemoryLink>> pair(const std::string& name);

  std::string_view name() const override { return "memory"; }
  // Round robin over the ends with queued completions, so none starves.
  size_t poll(std::span<Completion> out) override;
  // An eventfd that is never written: every completion is queued by this
  // loop's own thread, so a loop about to sleep learns of pending work from
  // prepare_sleep() and no wake-up is ever needed.
  int wait_fd() const override { return wake_fd_; }
  bool prepare_sleep() override;

 private:
  friend class MemoryLink;
  void forget(MemoryLink* link);

  int wake_fd_ = -1;
  std::vector<MemoryLink*> links_;
  size_t next_link_ = 0;
};

}  // namespace slotrpc::transport::memory
