// Raw, untyped calls: the request as a builder callback, the reply as
// bytes read in place in its receive slot.  The typed layer (Reply<T> in
// reply.h, typed.h, the stubs slotrpc-gen writes) is built on these.  For
// proxies, generic clients and tests that name methods by id:
//
//   auto reply = slotrpc::raw::call(*channel, kMethodId, [](auto& fbb) {
//     fbb.Finish(demo::CreateEchoRequest(fbb, fbb.CreateString("hi")));
//   }).get();
//   if (reply.ok()) use(reply.payload());
//
// A RawReply points into the Channel's receive ring: no copy is made.
// While it lives, its slot stays reserved, which costs the Channel one
// credit; destroy it (or call release()) once you are done.  Holding every
// reply of a channel therefore stalls new calls, which then wait in the
// channel's queue.
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "slotrpc/metadata.h"
#include "slotrpc/status.h"

namespace slotrpc {

namespace detail {
// Implemented by the client session; returns a slot when a reply is dropped.
class ReplyOwner;
// The client session's access to what it fills in (lib/core/).
struct ReplyAccess;
SLOTRPC_API void release_reply(const std::shared_ptr<ReplyOwner>& owner, uint16_t slot, uint32_t generation);

// What few replies carry: the bytes a handler wrote into the call's receive
// segments, and the server's trailers.  Out of line, so that a reply
// without either moves and dies as one null pointer for both.
struct ReplyExtras {
  std::vector<uint64_t> bulk_received;
  Metadata trailers;
};
// The trailers of a reply that has none.
SLOTRPC_API const Metadata& no_trailers();
}  // namespace detail

class RawReply {
 public:
  RawReply() = default;
  explicit RawReply(Status status) : status_(std::move(status)) {}
  // An OK reply: no Status to move in (a std::string move is an out-of-line
  // call into libstdc++, the largest part of a reply's moves).
  RawReply(std::span<const std::byte> payload, std::shared_ptr<detail::ReplyOwner> owner, uint16_t slot,
           uint32_t generation)
      : payload_(payload), owner_(std::move(owner)), slot_(slot), generation_(generation) {}
  RawReply(Status status, std::span<const std::byte> payload,
           std::shared_ptr<detail::ReplyOwner> owner, uint16_t slot, uint32_t generation)
      : status_(std::move(status)),
        payload_(payload),
        owner_(std::move(owner)),
        slot_(slot),
        generation_(generation) {}
  // Member by member: a reply moves several times on its way to the
  // caller, and constructing empty, then releasing nothing, then assigning
  // cost more than the move itself.  An OK status without a message (every
  // reply that succeeded) is not moved: the default one is the same.
  RawReply(RawReply&& o) noexcept
      : payload_(std::exchange(o.payload_, {})),
        owner_(std::move(o.owner_)),
        slot_(o.slot_),
        generation_(o.generation_),
        extras_(std::move(o.extras_)) {
    if (!o.status_.ok() || !o.status_.message().empty()) status_ = std::move(o.status_);
  }
  RawReply& operator=(RawReply&& o) noexcept {
    if (this != &o) {
      release();
      status_ = std::move(o.status_);
      payload_ = o.payload_;
      owner_ = std::move(o.owner_);
      slot_ = o.slot_;
      generation_ = o.generation_;
      extras_ = std::move(o.extras_);
      o.payload_ = {};
    }
    return *this;
  }
  RawReply(const RawReply&) = delete;
  RawReply& operator=(const RawReply&) = delete;
  ~RawReply() { release(); }

  const Status& status() const { return status_; }
  bool ok() const { return status_.ok(); }
  // The reply FlatBuffer (empty unless ok()).
  std::span<const std::byte> payload() const { return payload_; }
  const uint8_t* data() const { return reinterpret_cast<const uint8_t*>(payload_.data()); }
  size_t size() const { return payload_.size(); }

  // Bulk calls (CallOptions::receive_bulk): how many bytes the handler
  // wrote into receive segment i (the end of the furthest write_bulk), 0
  // for a segment it did not write.  Kept after release().
  uint64_t bulk_received(size_t i) const {
    return extras_ && i < extras_->bulk_received.size() ? extras_->bulk_received[i] : 0;
  }

  // The server's trailers (ServerCall::add_trailer), on success and on
  // failure alike; kept after release().
  const Metadata& trailers() const { return extras_ ? extras_->trailers : detail::no_trailers(); }
  // The first trailer named `key`, or null.
  const std::string* trailer(std::string_view key) const {
    for (const auto& [k, v] : trailers())
      if (k == key) return &v;
    return nullptr;
  }

  // Gives the slot back now; payload() is empty afterwards.
  void release() {
    if (owner_) {
      detail::release_reply(owner_, slot_, generation_);
      owner_.reset();
    }
    payload_ = {};
  }

 private:
  friend struct detail::ReplyAccess;
  // The client session fills them in from the reply's descriptor block and
  // trailers (null: neither).
  void set_extras(std::unique_ptr<detail::ReplyExtras> extras) { extras_ = std::move(extras); }

  Status status_;
  std::span<const std::byte> payload_;
  std::shared_ptr<detail::ReplyOwner> owner_;
  uint16_t slot_ = 0;
  uint32_t generation_ = 0;
  std::unique_ptr<detail::ReplyExtras> extras_;  // null unless the reply has bulk lengths or trailers
};


// Builds the request FlatBuffer and calls Finish().  It runs on the
// channel's event loop as soon as a slot is free, writing straight into the
// registered send slot (zero copy) - possibly after call() returned, so
// capture by value what it needs.  A request larger than the slot throws
// inside the builder; the call then fails with RESOURCE_EXHAUSTED and
// nothing is sent.
using RequestWriter = std::function<void(flatbuffers::FlatBufferBuilder&)>;

// Receives the outcome of a call on the channel's event loop.  Keep the
// RawReply (move it) to read it later; drop it to free its slot at once.
using ReplySink = std::function<void(RawReply&&)>;

class Channel;
struct CallOptions;
class CallHandle;
template <class T>
class Future;
namespace detail {
struct OutStreamState;
}

// The untyped entry points of a Channel (slotrpc/channel.h).  Each behaves
// as the typed call of its kind does: the same interceptors, deadlines,
// retries of idempotent calls, and callbacks on the channel's loop.
namespace raw {

// Unary, future form.
SLOTRPC_API Future<RawReply> call(Channel& channel, uint32_t method_id, RequestWriter writer,
                                  CallOptions options);
SLOTRPC_API Future<RawReply> call(Channel& channel, uint32_t method_id, RequestWriter writer);
// Unary, callback form: `sink` runs on the channel's event loop.
SLOTRPC_API CallHandle call(Channel& channel, uint32_t method_id, RequestWriter writer,
                            CallOptions options, ReplySink sink);
// Server-streaming: `on_message` runs for each message (keep the RawReply
// to hold its slot; drop it to let the server send more), then `on_end`
// once with the final status.  Both run on the channel's loop.
SLOTRPC_API CallHandle call_stream(Channel& channel, uint32_t method_id, RequestWriter writer,
                                   CallOptions options, ReplySink on_message,
                                   std::function<void(Status)> on_end);
// Client-streaming (`bidi` false) or bidi.  Messages go through the
// returned state (OutStreamState::send / half_close, slotrpc/stream.h); a
// client stream's reply reaches `on_reply`, a bidi call's messages
// `on_reply` and its final status `on_end`.  All callbacks run on the
// channel's loop.
SLOTRPC_API std::shared_ptr<detail::OutStreamState> open_stream(Channel& channel, uint32_t method_id,
                                                                bool bidi, CallOptions options,
                                                                ReplySink on_reply,
                                                                std::function<void(Status)> on_end);

}  // namespace raw
}  // namespace slotrpc
