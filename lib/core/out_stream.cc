#include "core/out_stream.h"

#include <fmt/format.h>

#include <cassert>

#include "core/client_session.h"
#include "core/slot_builder.h"

namespace slotrpc::core {

using ::slotrpc::detail::current_fiber;
using ::slotrpc::detail::FiberWaiter;
using ::slotrpc::detail::suspend_current_fiber;
using ::slotrpc::detail::wake_fiber;

void OutStream::ring() {
  // Already queued: the loop clears `rung` before it drains, so it will see
  // what was pushed before this exchange.
  if (rung.exchange(true, std::memory_order_acq_rel)) return;
  std::shared_ptr<core::Loop> l = loop.lock();
  if (!l) {  // the channel is gone: nobody will drain
    rung.store(false, std::memory_order_release);
    return;
  }
  bell_ref = shared_from_this();  // released by on_bell
  l->ring(&bell);
}

void OutStream::hand_over(uint32_t entry) {
  const bool pushed = ready.push(entry);
  assert(pushed && "a client stream's ready ring overflowed");
  (void)pushed;
  ring();
}

void OutStream::leave() {
  busy.store(false, std::memory_order_seq_cst);
  // Pairs with end(): the loop either saw us idle and reclaimed the
  // window, or we see `ended` here and ask it to.
  if (ended.load(std::memory_order_seq_cst) && !reclaimed.load(std::memory_order_acquire)) ring();
}

void OutStream::wait_for_slot() {
  FiberWaiter self;
  const bool fiber = current_fiber(&self);
  std::unique_lock<std::mutex> lock(mu);
  waiters.fetch_add(1, std::memory_order_seq_cst);  // before re-checking: give() reads it after a push
  auto ready_to_go = [&] {
    return ended.load(std::memory_order_seq_cst) || free.read_available() > 0;
  };
  if (!fiber) {
    cv.wait(lock, ready_to_go);
  } else if (!ready_to_go()) {
    fibers.push_back(self);
    lock.unlock();
    suspend_current_fiber();
    lock.lock();
  }
  waiters.fetch_sub(1, std::memory_order_seq_cst);
}

void OutStream::give(uint16_t slot) {
  const bool pushed = free.push(slot);
  assert(pushed && "a client stream's free ring overflowed");
  (void)pushed;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (waiters.load(std::memory_order_seq_cst) == 0) return;
  // Every slot of the window comes back (each message in flight is acked,
  // a reader's Read() acks the one it held before it waits), so the writer
  // is always woken in the end; end() wakes it too.
  if (free_capacity - free.write_available() < wake_at) return;
  std::vector<FiberWaiter> waking;  // the waiting path: allocation is fine here
  {
    std::lock_guard<std::mutex> lock(mu);
    waking.swap(fibers);
  }
  cv.notify_all();
  for (const FiberWaiter& w : waking) wake_fiber(w);
}

void OutStream::end(const Status& status) {
  std::vector<FiberWaiter> waking;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (ended.load()) return;
    end_status = status;
    ended.store(true, std::memory_order_seq_cst);
    waking.swap(fibers);
    cancel = nullptr;
  }
  cv.notify_all();
  for (const FiberWaiter& w : waking) wake_fiber(w);
}

void OutStream::on_bell(core::Loop::Doorbell* d) {
  OutStream* o = static_cast<Bell*>(d)->owner;
  std::shared_ptr<OutStream> keep = std::move(o->bell_ref);
  o->rung.exchange(false, std::memory_order_acq_rel);  // acquire: what the writer pushed
  if (o->session) o->session->drain_out(*o);
}

}  // namespace slotrpc::core

namespace slotrpc::detail {

using core::OutStream;

void OutStreamState::post_cancel() {
  OutStream& o = OutStream::of(*this);
  std::function<void()> fn;
  {
    std::lock_guard<std::mutex> lock(o.mu);
    fn = o.cancel;
  }
  if (fn) fn();
}

// Hot path (one per message): atomics only, unless the window is in flight.
flatbuffers::FlatBufferBuilder* out_begin(OutStreamState& s, Status* why) {
  OutStream& o = OutStream::of(s);
  o.busy.store(true, std::memory_order_seq_cst);
  for (;;) {
    if (o.ended.load(std::memory_order_seq_cst)) {
      {
        std::lock_guard<std::mutex> lock(o.mu);
        *why = o.end_status;
      }
      o.leave();
      return nullptr;
    }
    uint32_t slot = 0;
    if (o.free.pop(slot)) {
      o.building = static_cast<int32_t>(slot);
      core::SlotBuilder* b = o.builders[slot];
      b->Clear();
      return b;
    }
    o.wait_for_slot();
  }
}

bool out_commit(OutStreamState& s, Status* /*why*/) {
  OutStream& o = OutStream::of(s);
  assert(o.building >= 0);
  o.hand_over(OutStream::kMessage | static_cast<uint32_t>(o.building));
  o.building = -1;
  o.leave();
  return true;
}

void out_abandon(OutStreamState& s, std::exception_ptr error, Status* why) {
  OutStream& o = OutStream::of(s);
  assert(o.building >= 0);
  core::SlotBuilder* b = o.builders[o.building];
  Status st;
  try {
    std::rethrow_exception(error);
  } catch (const core::SlotOverflow& overflow) {
    st = Status(StatusCode::kResourceExhausted,
                fmt::format("stream message of at least {} bytes does not fit a slot: payload capacity is "
                            "{} bytes (slot_size minus the {}-byte header); raise slot_size (SLOTRPC_SLOT_SIZE)",
                            overflow.at_least(), b->payload_capacity(), core::kHeaderSize));
  } catch (const std::exception& e) {
    st = Status(StatusCode::kInternal, fmt::format("stream message writer threw: {}", e.what()));
  } catch (...) {
    st = Status(StatusCode::kInternal, "stream message writer threw a non-standard exception");
  }
  b->recover();
  {
    std::lock_guard<std::mutex> lock(o.mu);
    o.abandon_status = st;
  }
  // The loop fails the stream with it (and tells the server); the slot goes
  // back with the rest of the window.
  o.hand_over(OutStream::kAbandoned | static_cast<uint32_t>(o.building));
  o.building = -1;
  o.leave();
  *why = std::move(st);
}

void out_writes_done(OutStreamState& s) {
  // Through the ready ring, so the HALF_CLOSE leaves after every message.
  OutStream::of(s).hand_over(OutStream::kHalfClose);
}

}  // namespace slotrpc::detail
