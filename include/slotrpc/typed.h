// Typed building blocks that generated code (slotrpc-gen) is written
// against: request builders, reply builders, server-stream writers and
// client-stream readers.
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>

#include "slotrpc/future.h"
#include "slotrpc/reply.h"
#include "slotrpc/status.h"

namespace slotrpc {

// Builds a T in the given builder and returns its offset; the runtime calls
// Finish().  Runs on the channel's event loop, in the send slot (zero copy),
// possibly after the call returned: capture by value.
template <class T>
using Build = std::function<flatbuffers::Offset<T>(flatbuffers::FlatBufferBuilder&)>;

// A handler's reply: build in fbb(), then Finish() with the root.
template <class T>
class ReplyBuilder {
 public:
  explicit ReplyBuilder(flatbuffers::FlatBufferBuilder& fbb) : fbb_(fbb) {}
  flatbuffers::FlatBufferBuilder& fbb() { return fbb_; }
  void Finish(flatbuffers::Offset<T> root) { fbb_.Finish(root); }

 private:
  flatbuffers::FlatBufferBuilder& fbb_;
};

namespace detail {
// Implemented by the server session: one server-streaming call.
class StreamWriterImpl {
 public:
  virtual ~StreamWriterImpl() = default;
  // Waits (suspending the handler's fiber) for a credit from the client,
  // builds one message with `build` in a send slot and sends it.  False when
  // the call was cancelled or the session closed; `error` then says why.
  virtual bool write(const std::function<void(flatbuffers::FlatBufferBuilder&)>& build,
                     Status* error) = 0;
};
}  // namespace detail

// What a server-streaming handler writes to.  Each Write() waits until the
// client has a free slot for the message: the server is never more than the
// client's credit window ahead.
template <class T>
class ServerWriter {
 public:
  explicit ServerWriter(detail::StreamWriterImpl& impl) : impl_(impl) {}
  // False once the stream is over (client cancelled, deadline, session
  // closed); the handler should then return.
  bool Write(const Build<T>& build) {
    return impl_.write([&](flatbuffers::FlatBufferBuilder& fbb) { fbb.Finish(build(fbb)); },
                       &error_);
  }
  const Status& error() const { return error_; }

 private:
  detail::StreamWriterImpl& impl_;
  Status error_;
};

}  // namespace slotrpc

#include "slotrpc/detail/stream_state.h"

namespace slotrpc {

// The client's end of a server-streaming call.
template <class T>
class ClientReader {
 public:
  ClientReader() = default;
  explicit ClientReader(std::shared_ptr<detail::StreamState> state) : state_(std::move(state)) {}

  // The next message (verified as T), or nullopt once the stream ended; then
  // status() tells how.  Blocks a thread; suspends only a handler fiber.
  // Each message holds its slot until dropped: drop it to let the server
  // send more.
  std::optional<Reply<T>> Read() {
    std::optional<RawReply> raw = state_->pop();
    if (!raw) return std::nullopt;
    return Reply<T>(std::move(*raw));
  }
  // Final status; meaningful after Read() returned nullopt.
  Status status() const {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->end.value_or(Status(StatusCode::kInternal, "stream still open"));
  }
  void Cancel() {
    std::function<void()> fn;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      fn = state_->cancel;
    }
    if (fn) fn();
  }

 private:
  std::shared_ptr<detail::StreamState> state_;
};

}  // namespace slotrpc
