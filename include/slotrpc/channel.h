// Channel: a client's session with one server, or with each server of a
// fleet named by a resolver target (slotrpc/resolver.h).
//
//   auto ch = slotrpc::Channel::connect("10.0.0.2:7000").value();
//   demo::EchoClient echo(*ch);  // written by slotrpc-gen
//   auto reply = echo.Echo([](auto& fbb) {
//     return demo::CreateEchoRequest(fbb, fbb.CreateString("hi"));
//   }).get();
//   if (reply.ok()) use(reply->text());
//
// A Channel is one slot-ring session on one event loop of a Runtime
// (slotrpc/runtime.h): the default runtime unless one is given.  Calls may
// be made from any thread, from handlers, and from reply callbacks; a call
// made on the channel's own loop (a handler of a server on the same
// runtime, which a channel opened from that handler shares) is not handed
// to another thread.
//
// A callback never runs inside the call that issued it: a call that fails
// before it reaches the wire (the session is dead, the deadline has passed,
// the queue is full, the request writer failed) completes later, from the
// channel's loop.  So a callback may issue the next call without recursing.
// Once the session is dead, calls fail fast with its status (UNAVAILABLE,
// saying why); only idempotent calls with max_retries reconnect, under a
// backoff policy (docs/design.md, "When the server dies").
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "slotrpc/call.h"
#include "slotrpc/config.h"
#include "slotrpc/memory.h"
#include "slotrpc/future.h"
#include "slotrpc/metrics.h"
#include "slotrpc/reply.h"
#include "slotrpc/result.h"
#include "slotrpc/runtime.h"
#include "slotrpc/stream.h"
#include "slotrpc/typed.h"

namespace slotrpc {

namespace core {
struct PendingCall;
}

// What a client interceptor (Channel::add_interceptor) sees of a call
// before it is sent.
struct ClientCallInfo {
  uint32_t method_id = 0;
  // The method's full name ("pkg.Service.Method") for generated clients
  // (CallOptions::method_name), else null.
  const char* method_name = nullptr;
  std::string_view target;  // the channel's address, as given to connect()
  // The call's deadline: an interceptor may set or tighten it.
  std::optional<Clock::time_point> deadline;
  // The call's metadata (CallOptions::metadata), never null: an
  // interceptor may add to it (an auth token, a trace id).
  Metadata* metadata = nullptr;
};
// Returns OK to let the call go, or the status the call completes with
// instead (delivered as any failure is: to the future, callback or stream).
using ClientInterceptor = std::function<Status(ClientCallInfo&)>;

// Cancels a callback-form call.  Cheap to copy; harmless after completion.
class CallHandle {
 public:
  CallHandle() = default;
  explicit CallHandle(std::function<void()> cancel) : cancel_(std::move(cancel)) {}
  void cancel() const {
    if (cancel_) cancel_();
  }

 private:
  std::function<void()> cancel_;
};

class SLOTRPC_API Channel {
 public:
  // Connects, agrees on the ring geometry with the server and starts the
  // channel's event loop.  `config` (after SLOTRPC_* overrides) is validated.
  // `address` is HOST:PORT, unix:PATH, or a resolver target
  // (list://h1:p1,h2:p2, dns:///name:port, or a registered scheme): then
  // the channel holds one session per endpoint and picks one per call by
  // Config::lb_policy (docs/guide.md, "Running a fleet"); stats() and
  // metrics() sum over the endpoints, peer() is the target.
  // On the default runtime, or on a loop of its own when `config`'s loop
  // settings differ from the default runtime's (slotrpc/runtime.h).
  static Result<std::unique_ptr<Channel>> connect(const std::string& address, Config config = {});
  // On `runtime`, whose loop settings replace `config`'s.  From a handler
  // on one of its loops: on that loop (the handler's fiber waits for the
  // connect); on one of its loops outside a handler: INVALID_ARGUMENT.
  static Result<std::unique_ptr<Channel>> connect(const std::string& address, const Runtime& runtime,
                                                  Config config = {});
  // Fails every outstanding call with CANCELLED and closes the session.
  // Any thread, the channel's loop included; the loop's other sessions run on.
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  // Before the channel's first call: `check` runs on the calling thread at
  // the start of every call of the channel (all four kinds), in the order
  // added: for credentials, default deadlines, client-side policy.  After
  // the first call: INVALID_ARGUMENT (the list is read without a lock).
  // A channel with none pays nothing per call.
  Status add_interceptor(ClientInterceptor check);

  // Untyped calls (a RequestWriter, RawReply) are in slotrpc/raw.h.
  //
  // Idempotent calls with CallOptions::max_retries > 0 are retried on
  // UNAVAILABLE; the channel reconnects to its address first, unless a
  // failed reconnect makes it back off: then the call fails with
  // UNAVAILABLE saying when the next attempt may be made.
  //
  // Future form with the reply verified as Resp.
  template <class Resp>
  Future<Reply<Resp>> call_typed(uint32_t method_id, RequestWriter writer, CallOptions options = {}) {
    auto state = std::make_shared<detail::SharedState<Reply<Resp>>>();
    CallHandle handle = call(method_id, std::move(writer), std::move(options),
                             [state](RawReply&& raw) { state->set(Reply<Resp>(std::move(raw))); });
    std::lock_guard<std::mutex> lock(state->mu);
    if (!state->value) state->cancel = [handle] { handle.cancel(); };
    return Future<Reply<Resp>>(state);
  }

  // Typed unary call: `build` returns the request's root, the runtime
  // finishes the buffer.  What generated clients call.
  template <class Req, class Resp>
  Future<Reply<Resp>> unary(uint32_t method_id, Build<Req> build, CallOptions options = {}) {
    return call_typed<Resp>(method_id, finish_with(std::move(build)), std::move(options));
  }
  template <class Req, class Resp>
  CallHandle unary(uint32_t method_id, Build<Req> build, CallOptions options,
                   std::function<void(Reply<Resp>&&)> done) {
    return call(method_id, finish_with(std::move(build)), std::move(options),
                [done = std::move(done)](RawReply&& raw) { done(Reply<Resp>(std::move(raw))); });
  }

  // Typed server-streaming call.
  template <class Req, class Resp>
  ClientReader<Resp> server_stream(uint32_t method_id, Build<Req> build, CallOptions options = {}) {
    auto state = std::make_shared<detail::StreamState>();
    CallHandle handle = call_stream(
        method_id, finish_with(std::move(build)), std::move(options),
        [state](RawReply&& m) { state->push(std::move(m)); },
        [state](Status s) { state->finish(std::move(s)); });
    std::lock_guard<std::mutex> lock(state->mu);
    if (!state->end) state->cancel = [handle] { handle.cancel(); };
    return ClientReader<Resp>(state);
  }

  // Typed client-streaming call (see slotrpc/stream.h).
  template <class Req, class Resp>
  ClientWriter<Req, Resp> client_stream(uint32_t method_id, CallOptions options = {}) {
    auto reply = std::make_shared<detail::SharedState<Reply<Resp>>>();
    auto out = open_stream(method_id, false, std::move(options),
                           [reply](RawReply&& raw) { reply->set(Reply<Resp>(std::move(raw))); },
                           nullptr);
    {
      std::lock_guard<std::mutex> lock(reply->mu);
      if (!reply->value) reply->cancel = [out] { out->post_cancel(); };
    }
    return ClientWriter<Req, Resp>(out, Future<Reply<Resp>>(reply));
  }

  // Typed bidi call (see slotrpc/stream.h).
  template <class Req, class Resp>
  ClientReaderWriter<Req, Resp> bidi_stream(uint32_t method_id, CallOptions options = {}) {
    auto in = std::make_shared<detail::StreamState>();
    auto out = open_stream(method_id, true, std::move(options),
                           [in](RawReply&& m) { in->push(std::move(m)); },
                           [in](Status s) { in->finish(std::move(s)); });
    {
      std::lock_guard<std::mutex> lock(in->mu);
      if (!in->end) in->cancel = [out] { out->post_cancel(); };
    }
    return ClientReaderWriter<Req, Resp>(out, in);
  }

  TransportKind transport() const;

  // Bulk payloads (slotrpc/memory.h): a handle on memory the user
  // owns, for bulk attachments of calls.  Checks the range, registers
  // lazily in each transport domain the region is used in.  Any thread.
  // A dma-buf region is device (GPU) memory: verbs only.  TCP refuses it at
  // use, and a shared-memory channel at once (UNIMPLEMENTED), since both
  // copy with the CPU; host memory works on every transport.
  Result<MemoryRegion> register_memory(std::span<std::byte> memory);
  Result<MemoryRegion> register_memory(const DmaBuf& device_memory);
  const std::string& peer() const;
  const Config& config() const;  // after environment overrides
  uint32_t slot_count() const;
  uint32_t slot_size() const;

  // A snapshot taken on the event loop (for tests and monitoring).
  struct Stats {
    uint32_t free_slots = 0;
    uint32_t in_flight = 0;
    uint32_t zombies = 0;       // abandoned calls whose reply has not come yet
    uint32_t held_replies = 0;  // replies the application still holds
    uint32_t queued = 0;        // calls waiting for a credit
    uint32_t lent = 0;          // slots lent to server streams
    uint64_t late_replies_dropped = 0;
    uint64_t messages_sent = 0;
    bool closed = false;
    // Reconnects started (by idempotent retries) and those that succeeded,
    // over the channel's life.
    uint64_t reconnect_attempts = 0;
    uint64_t reconnects = 0;
    // Calls handed from another thread to the channel's loop (a post and a
    // wakeup each), over the channel's life; 0 while every call is made on
    // the loop itself, e.g. by handlers sharing it.
    uint64_t cross_loop_handoffs = 0;
    uint32_t loop_index = 0;  // which of its runtime's loops
    // Packing (Config::pack_small; docs/design.md, "Packing"): PACKs of
    // requests sent and the requests inside them; PACKs of replies
    // received.  The link's work requests (verbs) or frames (tcp, shm) and
    // the messages they carried: messages / work_requests is the messages
    // per work request.
    uint64_t packs_sent = 0;
    uint64_t packed_requests = 0;
    uint64_t packs_received = 0;
    uint64_t work_requests = 0;
    uint64_t link_messages = 0;
    // What only one transport counts (verbs inline sends, doorbells and
    // packets, max_inline, SRQ and memory windows; a TCP bulk lane's
    // bytes) is in metrics(): its entry of MetricsSnapshot::transports.
  };
  Stats stats() const;

  // The channel loop's counters and histograms (client side, per method),
  // with the monitor's hardware counters (slotrpc/metrics.h).  Taken on the
  // loop like stats(); from any thread, the channel's own loop included.
  MetricsSnapshot metrics() const;
  // Called after every sample of the monitor (while the channel uses verbs,
  // every SLOTRPC_MONITOR_INTERVAL_MS), on the channel's event loop, with
  // the snapshot's monitor fields filled: the device port's hardware
  // counters and the loop's receive pools.  Any thread, any time; an empty
  // function removes it.  Keep it short: it runs on the event loop.  It
  // never runs after ~Channel returned (which waits for a call in progress;
  // the callback may destroy the channel itself).
  void on_monitor_sample(std::function<void(const MetricsSnapshot&)> callback);

  struct SLOTRPC_LOCAL Impl;

 private:
  // The untyped calls, public as slotrpc::raw::call, call_stream and
  // open_stream (slotrpc/raw.h), which forward here.
  friend Future<RawReply> raw::call(Channel&, uint32_t, RequestWriter, CallOptions);
  friend CallHandle raw::call(Channel&, uint32_t, RequestWriter, CallOptions, ReplySink);
  friend CallHandle raw::call_stream(Channel&, uint32_t, RequestWriter, CallOptions, ReplySink,
                                     std::function<void(Status)>);
  friend std::shared_ptr<detail::OutStreamState> raw::open_stream(Channel&, uint32_t, bool,
                                                                   CallOptions, ReplySink,
                                                                   std::function<void(Status)>);
  Future<RawReply> call(uint32_t method_id, RequestWriter writer, CallOptions options = {});
  CallHandle call(uint32_t method_id, RequestWriter writer, CallOptions options, ReplySink sink);
  CallHandle call_stream(uint32_t method_id, RequestWriter writer, CallOptions options,
                         ReplySink on_message, std::function<void(Status)> on_end);
  std::shared_ptr<detail::OutStreamState> open_stream(uint32_t method_id, bool bidi,
                                                      CallOptions options, ReplySink on_reply,
                                                      std::function<void(Status)> on_end);
  template <class Req>
  static RequestWriter finish_with(Build<Req> build) {
    return [build = std::move(build)](flatbuffers::FlatBufferBuilder& fbb) { fbb.Finish(build(fbb)); };
  }
  explicit Channel(std::shared_ptr<Impl> impl);
  static Result<std::unique_ptr<Channel>> connect_on(const std::string& address,
                                                     std::shared_ptr<detail::RuntimeCore> runtime,
                                                     Config validated);
  // A target with a resolver (slotrpc/resolver.h): one channel per endpoint.
  static Result<std::unique_ptr<Channel>> connect_fleet(std::shared_ptr<Impl> impl,
                                                        std::shared_ptr<detail::RuntimeCore> runtime);
  CallHandle submit(core::PendingCall* call);
  // Completes `call` with `why` on the loop, unsent (a refusing interceptor).
  CallHandle refuse(core::PendingCall* call, const Status& why);
  // Shared with CallHandles and retries, which may outlive the Channel.
  std::shared_ptr<Impl> impl_;
};

}  // namespace slotrpc
