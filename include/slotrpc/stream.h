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

#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <vector>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <type_traits>
#include <span>
#include <utility>
#include <vector>

#include "slotrpc/export.h"
#include "slotrpc/call.h"
#include "slotrpc/future.h"
#include "slotrpc/reply.h"
#include "slotrpc/status.h"
#include "slotrpc/typed.h"

namespace slotrpc {

}  // namespace slotrpc

#include "slotrpc/detail/stream.h"

namespace slotrpc {

// A fiber-aware wake-up, for a bidi handler that must wait for either a
// client message or something else (kv's Watch: a store update).  Why this
// shape: a handler has one fiber, and Read() waits for the client only.
// Rather than a Read() with a deadline (which would make the handler poll,
// trading latency against wake-ups), the handler spawns a reader fiber
// (this_fiber::spawn) that Read()s and records what it read, and both it
// and the other event sources notify() one Notifier that the handler's own
// fiber wait()s on, then Write()s.  Read() and Write() of one stream may
// wait at the same time on two fibers of the handler's loop (the session
// keeps a reader and a writer waiter); they never run at once, since a
// loop runs one fiber at a time.
//
// notify(): any thread or fiber.  wait(): one waiter (a thread blocks, a
// fiber suspends) until notify() was called since the last wait()
// returned; many notify()s before a wait() count once.
class Notifier {
 public:
  void notify() {
    std::vector<detail::FiberWaiter> waking;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++count_;
      waking.swap(fibers_);
    }
    cv_.notify_all();
    for (const detail::FiberWaiter& w : waking) detail::wake_fiber(w);
  }
  void wait() {
    for (;;) {
      detail::FiberWaiter self;
      const bool fiber = detail::current_fiber(&self);
      std::unique_lock<std::mutex> lock(mu_);
      if (count_ != seen_) {
        seen_ = count_;
        return;
      }
      if (!fiber) {
        cv_.wait(lock, [&] { return count_ != seen_; });
        seen_ = count_;
        return;
      }
      fibers_.push_back(self);
      lock.unlock();
      detail::suspend_current_fiber();  // a wake before the suspend is not lost
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<detail::FiberWaiter> fibers_;
  uint64_t count_ = 0;
  uint64_t seen_ = 0;
};

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
  // Builds one message in place in a send slot of the stream's window, on
  // the calling thread, before it returns, and sends it.  Waits while the
  // client is a window ahead of the server's reads.  False once the stream
  // is over: the server ended the call, it was cancelled, its deadline
  // passed or the session died; the status says why.  A message larger
  // than the slot fails here with RESOURCE_EXHAUSTED, and fails the stream.
  // `build` is any callable taking the builder and returning the root's
  // Offset<W> (a lambda avoids a std::function; a Build<W> works too).
  template <class F>
    requires std::is_invocable_r_v<flatbuffers::Offset<W>, F&, flatbuffers::FlatBufferBuilder&>
  bool Write(F&& build) {
    if (writes_done_) {
      status_ = Status(StatusCode::kInvalidArgument, "Write() after WritesDone()");
      return false;
    }
    return write_out(*out_, build, &status_);
  }
  // Half-closes: the server's reader sees the end after the last message.
  void WritesDone() {
    if (writes_done_) return;
    writes_done_ = true;
    out_writes_done(*out_);
  }
  void Cancel() { out_->post_cancel(); }

 protected:
  OutHalf() = default;
  explicit OutHalf(std::shared_ptr<OutStreamState> out) : out_(std::move(out)) {}

  std::shared_ptr<OutStreamState> out_;
  bool writes_done_ = false;
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
