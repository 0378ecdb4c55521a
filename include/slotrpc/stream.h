// Client and bidirectional streaming: the typed ends of the four call kinds
// that have a client-side stream (docs/protocol.md, section 5a).
//
//   server                                             client
//   Status Load(ServerReader<Change>&,                 ClientWriter<Change, Ack> w = ch.client_stream<...>(id);
//               ReplyBuilder<Ack>&, ServerCall&)       w.Write(build); ...; w.WritesDone(); Reply<Ack> r = w.Finish();
//   Status Sync(ServerReaderWriter<Change, Change>&,   ClientReaderWriter<Change, Change> s = ch.bidi_stream<...>(id);
//               ServerCall&)                           s.Write(build); s.Read(); s.WritesDone(); s.Finish();
//
// Readers read in place in the receive slot; writers build in place in the
// send slot.  Flow control is the slot credits: a writer that is a window
// ahead of what the peer has read waits (a plain thread blocks, a fiber
// suspends) instead of queueing, so memory stays bounded by the rings.
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "slotrpc/call.h"
#include "slotrpc/future.h"
#include "slotrpc/reply.h"
#include "slotrpc/status.h"
#include "slotrpc/typed.h"

namespace slotrpc {

namespace detail {

// The server's end of a client stream, implemented by the server session.
// A plain function pointer, not a virtual: read() runs once per message on
// the handler's fiber (the same reasoning as core/session_base.h).
struct InboundStream {
  // Releases the previous message (its slot goes back to the client), then
  // waits for the next one.  True with `msg` set; false at the end, with
  // `status` OK when the client half-closed, else why the stream ended.
  bool (*read)(InboundStream* self, std::span<const std::byte>* msg, Status* status) = nullptr;
  // Verifies each message before read() returns it; set by the typed reader.
  // A message that fails ends the stream with INVALID_ARGUMENT, which also
  // becomes the call's status unless the handler returns another error.
  bool (*verify)(const uint8_t* data, size_t size) = nullptr;
};

// The client's outgoing half of a client or bidi stream, shared between the
// writing application (any thread or fiber) and the channel's event loop.
//
// `outstanding` counts writes handed to the loop and not yet acknowledged by
// the server; the loop sets `capacity` (the slots reserved for the stream's
// messages) when the call reaches the wire.  The writer takes the lock only
// when it has to wait, and the loop only when a writer waits: the
// per-message path is two atomic operations on each side.
struct OutStreamState {
  std::atomic<uint32_t> capacity{0};
  std::atomic<uint32_t> outstanding{0};
  std::atomic<uint32_t> waiters{0};
  std::atomic<bool> ended{false};
  std::mutex mu;
  std::condition_variable cv;
  std::vector<FiberWaiter> fibers;
  Status end_status;  // under mu, once `ended`

  // Bound by the channel when the call is made.  `send` hands one message's
  // builder to the loop (posted: one task per message, the cross-thread
  // path), `half_close` the end of the writes, `cancel` cancels the call.
  std::function<void(RequestWriter)> send;
  std::function<void()> half_close;
  std::function<void()> cancel;
  bool writes_done = false;  // the writer's own flag

  // Loop-thread fields, owned by the client session.
  void* loop_call = nullptr;
  const void* loop_session = nullptr;

  // Writer: waits for a credit; false (and `why`) once the stream is over.
  bool acquire(Status* why) {
    for (;;) {
      if (ended.load()) break;
      if (outstanding.load() < capacity.load()) {
        outstanding.fetch_add(1);  // only the writer increments: no race past capacity
        return true;
      }
      FiberWaiter self;
      const bool fiber = current_fiber(&self);
      std::unique_lock<std::mutex> lock(mu);
      waiters.fetch_add(1);  // before re-checking: the loop reads it after it frees a credit
      auto ready = [&] { return ended.load() || outstanding.load() < capacity.load(); };
      if (!fiber) {
        cv.wait(lock, ready);
      } else if (!ready()) {
        fibers.push_back(self);
        lock.unlock();
        suspend_current_fiber();
        lock.lock();
      }
      waiters.fetch_sub(1);
    }
    std::lock_guard<std::mutex> lock(mu);
    *why = end_status;
    return false;
  }

  // Loop: wakes a waiting writer, if any (the lock only then).
  void wake() {
    if (waiters.load() == 0) return;
    std::vector<FiberWaiter> waking;
    {
      std::lock_guard<std::mutex> lock(mu);
      waking.swap(fibers);
    }
    cv.notify_all();
    for (const FiberWaiter& w : waking) wake_fiber(w);
  }
  // Loop: the call reached the wire with `slots` reserved for its messages.
  void start(uint32_t slots) {
    capacity.store(slots);
    wake();
  }
  // Loop: the server took one message and gave its slot back.
  void acked() {
    outstanding.fetch_sub(1);
    wake();
  }
  // Loop: no more writes (the call ended, was cancelled or failed).
  void end(const Status& status) {
    std::vector<FiberWaiter> waking;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (ended.load()) return;
      end_status = status;
      ended.store(true);
      waking.swap(fibers);
      send = nullptr;
      half_close = nullptr;
      cancel = nullptr;
    }
    cv.notify_all();
    for (const FiberWaiter& w : waking) wake_fiber(w);
  }
  // Writer side helpers; the functions are read under the lock because end()
  // clears them from the loop.
  bool post(RequestWriter writer) {
    std::function<void(RequestWriter)> fn;
    {
      std::lock_guard<std::mutex> lock(mu);
      fn = send;
    }
    if (!fn) return false;
    fn(std::move(writer));
    return true;
  }
  void post_half_close() {
    std::function<void()> fn;
    {
      std::lock_guard<std::mutex> lock(mu);
      fn = half_close;
    }
    if (fn) fn();
  }
  void post_cancel() {
    std::function<void()> fn;
    {
      std::lock_guard<std::mutex> lock(mu);
      fn = cancel;
    }
    if (fn) fn();
  }
};

// One Write() of a client or bidi stream: wait for a credit, then hand the
// builder to the loop, which builds in the send slot.
template <class W>
bool write_out(OutStreamState& out, Build<W> build, Status* status) {
  if (!out.acquire(status)) return false;
  if (out.post([build = std::move(build)](flatbuffers::FlatBufferBuilder& fbb) {
        fbb.Finish(build(fbb));
      })) {
    return true;
  }
  // The stream ended between the credit and the hand-over.
  std::lock_guard<std::mutex> lock(out.mu);
  *status = out.end_status;
  return false;
}

}  // namespace detail

// What a client-streaming handler reads.
template <class T>
class ServerReader {
 public:
  explicit ServerReader(detail::InboundStream& in) : in_(in) {
    in_.verify = [](const uint8_t* data, size_t size) {
      flatbuffers::Verifier v(data, size);
      return v.VerifyBuffer<T>(nullptr);
    };
  }
  // The next message, in place in its receive slot: valid until the next
  // Read() or until the handler returns.  nullptr at the end of the stream:
  // status() is OK when the client half-closed (WritesDone), else says why
  // (CANCELLED, DEADLINE_EXCEEDED, UNAVAILABLE, INVALID_ARGUMENT).
  const T* Read() {
    std::span<const std::byte> msg;
    if (!in_.read(&in_, &msg, &status_)) return nullptr;
    return flatbuffers::GetRoot<T>(msg.data());
  }
  const Status& status() const { return status_; }

 private:
  detail::InboundStream& in_;
  Status status_;
};

// A bidi handler's two halves: Read() as ServerReader, Write() as
// ServerWriter.  Returning from the handler ends the call (the server's
// half-close and the final status in one).
template <class R, class W>
class ServerReaderWriter {
 public:
  ServerReaderWriter(detail::InboundStream& in, detail::StreamWriterImpl& out)
      : reader_(in), writer_(out) {}
  const R* Read() { return reader_.Read(); }
  bool Write(const Build<W>& build) { return writer_.Write(build); }
  // Why Read() returned nullptr / Write() false.
  const Status& read_status() const { return reader_.status(); }
  const Status& write_error() const { return writer_.error(); }

 private:
  ServerReader<R> reader_;
  ServerWriter<W> writer_;
};

namespace detail {

// The writing half both client-side stream kinds share: Write, WritesDone,
// Cancel.  Write() from one thread (or fiber) at a time, not from the
// channel's own callbacks (it may wait for a credit, which that loop must
// deliver).
template <class W>
class OutHalf {
 public:
  // Builds one message in a send slot (on the channel's loop: capture by
  // value) and sends it.  Waits while the client is a window ahead of the
  // server's reads.  False once the stream is over: the server ended the
  // call, it was cancelled, its deadline passed or the session died; the
  // status says why.
  bool Write(Build<W> build) {
    if (out_->writes_done) {
      status_ = Status(StatusCode::kInvalidArgument, "Write() after WritesDone()");
      return false;
    }
    return write_out(*out_, std::move(build), &status_);
  }
  // Half-closes: the server's reader sees the end after the last message.
  void WritesDone() {
    if (out_->writes_done) return;
    out_->writes_done = true;
    out_->post_half_close();
  }
  void Cancel() { out_->post_cancel(); }

 protected:
  OutHalf() = default;
  explicit OutHalf(std::shared_ptr<OutStreamState> out) : out_(std::move(out)) {}

  std::shared_ptr<OutStreamState> out_;
  Status status_;  // why Write() returned false
};

}  // namespace detail

// The client's end of a client-streaming call (Write, WritesDone and
// Cancel: detail::OutHalf).
template <class W, class R>
class ClientWriter : public detail::OutHalf<W> {
 public:
  ClientWriter() = default;
  ClientWriter(std::shared_ptr<detail::OutStreamState> out, Future<Reply<R>> reply)
      : detail::OutHalf<W>(std::move(out)), reply_(std::move(reply)) {}

  // Half-closes if not done yet and waits for the server's reply (whose
  // status says why a Write() returned false).
  Reply<R> Finish() {
    this->WritesDone();
    return reply_.get();
  }
  // Why Write() returned false.
  const Status& status() const { return this->status_; }

 private:
  Future<Reply<R>> reply_;
};

// The client's end of a bidi call: Write/WritesDone as ClientWriter, Read as
// ClientReader, each half on its own.
template <class W, class R>
class ClientReaderWriter : public detail::OutHalf<W> {
 public:
  ClientReaderWriter() = default;
  ClientReaderWriter(std::shared_ptr<detail::OutStreamState> out,
                     std::shared_ptr<detail::StreamState> in)
      : detail::OutHalf<W>(std::move(out)), reader_(std::move(in)) {}

  // The next message from the server (held in its slot until dropped), or
  // nullopt once the server ended the call.
  std::optional<Reply<R>> Read() { return reader_.Read(); }
  // Half-closes if not done, drops what the server still sends and returns
  // the final status.
  Status Finish() {
    this->WritesDone();
    while (reader_.Read()) {
    }
    return reader_.status();
  }
  // Why Write() returned false.
  const Status& write_status() const { return this->status_; }

 private:
  ClientReader<R> reader_;
};

}  // namespace slotrpc
