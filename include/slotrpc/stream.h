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

// The client's outgoing half of a client or bidi stream.  Its state lives in
// the library (lib/core/out_stream.h); the typed writers below reach it only
// through these functions, so its layout is not part of the ABI.
//
// How a Write() travels (the hot path: no allocation, no lock, no task, no
// virtual call; docs/design.md, "Client and bidi streaming"):
//   1. out_begin() takes a slot of the stream's window from a lock-free
//      single-producer ring that the channel's loop fills (the window at the
//      start, then each slot the server acknowledges), and returns that send
//      slot's own FlatBufferBuilder.  With the ring empty the writer waits:
//      a plain thread blocks, a fiber suspends (a mutex and a condition
//      variable only then).
//   2. The caller builds the message in place, on its own thread.
//   3. out_commit() pushes the slot's index onto a second single-producer
//      ring towards the loop and rings the loop's doorbell (an intrusive
//      lock-free stack; the loop is woken only if it sleeps).  The loop
//      writes the 32-byte header in front of the message and sends it.
// Memory stays bounded by the rings: both hold at most the window.
struct SLOTRPC_API OutStreamState {
  // Cancels the call (any thread; a no-op once it ended).
  void post_cancel();

 protected:
  OutStreamState() = default;
  ~OutStreamState() = default;
};

// Writer side: one writer (thread or fiber) at a time, never the channel's
// own loop thread while it must wait.  out_begin: the builder of a free slot
// of the window, Clear()ed, or nullptr (and `why`) once the stream is over.
SLOTRPC_API flatbuffers::FlatBufferBuilder* out_begin(OutStreamState& out, Status* why);
// The builder from out_begin() is finished: send it.  Always true today
// (a stream that ended meanwhile drops the message; the next out_begin()
// reports why).
SLOTRPC_API bool out_commit(OutStreamState& out, Status* why);
// The build threw `error` (a message larger than the slot:
// RESOURCE_EXHAUSTED): the slot goes back and the stream fails with it,
// which `why` gets too.
SLOTRPC_API void out_abandon(OutStreamState& out, std::exception_ptr error, Status* why);
// Half-closes (ordered after every committed message).
SLOTRPC_API void out_writes_done(OutStreamState& out);

// One Write() of a client or bidi stream: build in the send slot on the
// calling thread.
template <class F>
bool write_out(OutStreamState& out, F& build, Status* status) {
  flatbuffers::FlatBufferBuilder* fbb = out_begin(out, status);
  if (fbb == nullptr) return false;
  try {
    fbb->Finish(build(*fbb));
  } catch (...) {
    out_abandon(out, std::current_exception(), status);
    return false;
  }
  return out_commit(out, status);
}

}  // namespace detail

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
