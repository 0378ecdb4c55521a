// Client and bidi streams: the library's side of the typed readers and
// writers (slotrpc/stream.h).
// Included by slotrpc/stream.h; no program needs to include it or use its
// names, which may change between versions.
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>

#include "slotrpc/export.h"
#include "slotrpc/status.h"

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


}  // namespace slotrpc
