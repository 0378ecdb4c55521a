// The client's outgoing half of a client or bidi stream (docs/protocol.md,
// section 5a; the typed API is slotrpc/stream.h).
//
// Two threads share it: the application's writer (one thread or fiber at a
// time) and the channel's event loop, which owns the session and its slots.
// Per message they exchange one slot index each way through two bounded
// single-producer/single-consumer rings (boost::lockfree::spsc_queue, sized
// once when the call is made):
//
//   free   loop -> writer   slots of the stream's window the writer may build
//                           in: the window when the call reaches the wire,
//                           then each slot whose message the server acked.
//   ready  writer -> loop   built slots to send, in order, and the
//                           half-close (kHalfClose), and a slot whose build
//                           threw (kAbandoned).
//
// The writer builds in place in the send slot, on its own thread (the
// session's SlotBuilder for that slot: nothing else touches a slot while it
// is in the writer's hands), then pushes its index and rings the loop's
// doorbell (reactor.h), which wakes the loop only if it sleeps.  The loop
// writes the header and sends.  Hot path, both sides: no allocation, no
// lock, no task, no virtual call; atomics only.  The mutex and condition
// variable are for a writer that must wait (its window is in flight), and
// the ring's weak_ptr::lock and shared_from_this are reference counts.
//
// Ending.  The loop ends the stream (the call finished, failed, was
// cancelled) by setting `ended`.  Slots that are in the writer's hands then
// (in `free`, being built, or in `ready`) can go back to the session only
// when the writer cannot touch them any more: `busy` is set by the writer
// around each Write, and ended/busy are a Dekker pair (both seq_cst).  The
// loop reclaims at once if the writer is not busy; otherwise the writer,
// leaving, sees `ended` and rings the doorbell, and the loop reclaims then.
// Slots with a message in flight come back with their STREAM_ACK, as ever.
#pragma once

#include <boost/lockfree/spsc_queue.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "core/loop.h"
#include "slotrpc/stream.h"

namespace slotrpc::core {

class ClientSession;
class SlotBuilder;
struct PendingCall;

struct OutStream final : ::slotrpc::detail::OutStreamState, std::enable_shared_from_this<OutStream> {
  // Ready-ring entries: the slot index, and a kind in the high bits.
  static constexpr uint32_t kMessage = 0;
  static constexpr uint32_t kHalfClose = 1u << 16;
  static constexpr uint32_t kAbandoned = 2u << 16;

  // `window`: the most slots the stream may reserve (the ready ring also
  // carries the half-close).
  OutStream(std::weak_ptr<core::Loop> loop, uint32_t window)
      : free(window + 1), ready(window + 2), free_capacity(window + 1), loop(std::move(loop)) {
    bell.run = &OutStream::on_bell;
    bell.owner = this;
  }
  static OutStream& of(::slotrpc::detail::OutStreamState& s) { return static_cast<OutStream&>(s); }

  boost::lockfree::spsc_queue<uint32_t> free;
  boost::lockfree::spsc_queue<uint32_t> ready;
  const size_t free_capacity;

  // The doorbell: `rung` while it sits in the loop's stack, which `bell_ref`
  // keeps this state alive for.
  struct Bell : core::Loop::Doorbell {
    OutStream* owner = nullptr;
  } bell;
  std::atomic<bool> rung{false};
  std::shared_ptr<OutStream> bell_ref;
  const std::weak_ptr<core::Loop> loop;

  std::atomic<bool> ended{false};
  std::atomic<bool> busy{false};
  std::atomic<bool> reclaimed{false};
  std::atomic<uint32_t> waiters{0};

  // Waiting writers and the final status.
  std::mutex mu;
  std::condition_variable cv;
  std::vector<::slotrpc::detail::FiberWaiter> fibers;
  Status end_status;              // under mu, once `ended`
  Status abandon_status;          // under mu: why a kAbandoned build failed
  std::function<void()> cancel;   // under mu: the call's CallHandle

  // Set by the loop before the first slot enters `free` (the ring orders
  // them before the writer's first pop): the session, kept alive while the
  // writer may build in its send ring, and its builders.
  std::shared_ptr<ClientSession> session;
  SlotBuilder* const* builders = nullptr;

  // Writer only.
  int32_t building = -1;

  // Loop only.
  PendingCall* call = nullptr;
  uint64_t request_id = 0;
  // A waiting writer is woken once this many slots are free again (half
  // the window), not for every ack: it then builds a burst, which the loop
  // sends as one batch, instead of a futex wake and a send per message.
  size_t wake_at = 1;

  // Writer: pushes an entry (the rings never fill: see ClientSession) and
  // rings the doorbell unless it is already queued.
  void hand_over(uint32_t entry);
  void ring();
  // Writer: waits until `free` has a slot or the stream ended.
  void wait_for_slot();
  // Writer: leaves a Write; rings for the reclaim if the stream ended.
  void leave();
  // Loop: the call ended with `status`.
  void end(const Status& status);
  // Loop: a slot for the writer (the window at the start, then each ack).
  void give(uint16_t slot);

  static void on_bell(core::Loop::Doorbell* d);
};

}  // namespace slotrpc::core
