// Services: the method table a Server dispatches on.
//
// This table is what the IDL compiler's generated code targets; until then
// it is also how services are registered by hand:
//
//   slotrpc::ServiceDefinition svc("demo.Echo");
//   svc.add_unary<demo::EchoRequest>("Echo",
//       [](const demo::EchoRequest& req, flatbuffers::FlatBufferBuilder& out,
//          slotrpc::ServerCall& call) -> slotrpc::Status {
//         out.Finish(demo::CreateEchoReply(out, out.CreateVector(...)));
//         return {};
//       });
//   server.add_service(std::move(svc));
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "slotrpc/call.h"
#include "slotrpc/metadata.h"
#include "slotrpc/peer.h"
#include "slotrpc/status.h"
#include "slotrpc/stream.h"
#include "slotrpc/typed.h"

namespace slotrpc {

namespace core {
class ServerSession;
}

}  // namespace slotrpc

#include "slotrpc/detail/server_bulk.h"

namespace slotrpc {

// Method ids: FNV-1a (32 bit) of the fully qualified method name,
// "<namespace>.<Service>.<Method>", so separately built binaries agree
// without coordination.  0 is reserved.  See docs/protocol.md.
constexpr uint32_t method_id(std::string_view full_name) {
  uint32_t h = 2166136261u;
  for (char c : full_name) {
    h ^= static_cast<uint8_t>(c);
    h *= 16777619u;
  }
  return h == 0 ? 1 : h;
}

// What a handler sees of its call.  Valid only during the handler.
class ServerCall {
 public:
  // The request FlatBuffer, in place in the receive slot (verified when the
  // method has a verifier).
  std::span<const std::byte> request() const { return request_; }
  template <class T>
  const T& request_as() const {
    return *flatbuffers::GetRoot<T>(request_.data());
  }
  // Builder over the registered send slot; call Finish() before returning OK.
  flatbuffers::FlatBufferBuilder& reply() { return *reply_; }

  // True once the client cancelled the call or its deadline passed.
  bool cancelled() const;
  // The caller's deadline, if it sent one.
  std::optional<std::chrono::steady_clock::time_point> deadline() const { return deadline_; }
  const std::string& method_name() const { return *method_name_; }
  uint32_t method_id() const { return method_id_; }
  // The client's address, as the server's logs name it.
  const std::string& peer() const { return *peer_; }
  // Who the client is: transport, address, and what the kernel or TLS
  // vouches for (uid/gid/pid, certificate subject and names): slotrpc/peer.h.
  const PeerInfo& peer_info() const { return *peer_info_; }
  // The client's call metadata (CallOptions::add_metadata), read in place:
  // the views last as long as the call.  metadata(key): the first entry
  // with that key.
  SLOTRPC_API std::optional<std::string_view> metadata(std::string_view key) const;
  SLOTRPC_API size_t metadata_count() const;
  SLOTRPC_API std::pair<std::string_view, std::string_view> metadata_at(size_t i) const;
  // A trailer for the call's final reply, OK or not (RawReply::trailers):
  // a handler's or an interceptor's.  Sent only to clients that take them
  // (all but those predating call metadata); past the 8 KiB of
  // slotrpc/metadata.h the call fails with RESOURCE_EXHAUSTED instead.
  void add_trailer(std::string key, std::string value) const {
    trailers_->emplace_back(std::move(key), std::move(value));
  }

  // Server-streaming and bidi calls only: where the handler's messages go.
  detail::StreamWriterImpl* stream() const { return stream_; }
  // Client-streaming and bidi calls only: where the client's messages come from.
  detail::InboundStream* inbound() const { return inbound_; }

  // Bulk attachments (CallOptions::send_bulk / receive_bulk).
  // Incoming segment i holds bulk_in(i) bytes of request data; outgoing
  // segment i is a client buffer of bulk_out(i) bytes for reply data.
  size_t bulk_in_count() const { return bulk_ ? bulk_->count(true) : 0; }
  uint64_t bulk_in(size_t i) const { return bulk_ ? bulk_->length(true, i) : 0; }
  size_t bulk_out_count() const { return bulk_ ? bulk_->count(false) : 0; }
  uint64_t bulk_out(size_t i) const { return bulk_ ? bulk_->length(false, i) : 0; }

  // Pulls dest.size() bytes of incoming segment i, from `offset`, into
  // `dest` (RDMA READ on verbs, straight into `dest`; recv into it on TCP).
  // Suspends only this handler's fiber.  INVALID_ARGUMENT for a range
  // beyond the segment or an index out of range; UNAVAILABLE if the
  // session is lost meanwhile; DEADLINE_EXCEEDED if the client has not
  // completed the transfer by the call's deadline (plus 1 s) or, for a call
  // without one, within Config::bulk_timeout_ms (the session is then
  // closed); a memory region form avoids the registration cache lookup.
  Status read_bulk(size_t i, std::span<std::byte> dest, uint64_t offset = 0) {
    return bulk_op(true, i, BulkSegment::of(dest), offset);
  }
  Status read_bulk(size_t i, const MemoryRegion& dest, size_t dest_offset, size_t length,
                   uint64_t offset = 0) {
    return bulk_op(true, i, BulkSegment::of(dest, dest_offset, length), offset);
  }
  // Pushes `src` into outgoing segment i at `offset` (RDMA WRITE on
  // verbs), before the reply: the reply never overtakes its data.  Returns
  // once `src` may be reused.  INVALID_ARGUMENT when the client's
  // destination is too small (it says how large it is).
  Status write_bulk(size_t i, std::span<const std::byte> src, uint64_t offset = 0) {
    return bulk_op(false, i,
                   BulkSegment::of(std::span<std::byte>(const_cast<std::byte*>(src.data()), src.size())),
                   offset);
  }
  Status write_bulk(size_t i, const MemoryRegion& src, size_t src_offset, size_t length,
                    uint64_t offset = 0) {
    return bulk_op(false, i, BulkSegment::of(src, src_offset, length), offset);
  }

  // Scatter and gather: incoming segment i, from `offset`, into
  // `pieces` one after the other (piece k gets the bytes after piece
  // k - 1's), or `pieces` one after the other into outgoing segment i.
  // Pieces that are adjacent in memory and in one registration (pages of
  // one pool, say) move as ONE transfer, split only at the path's largest
  // message: 16384 adjacent 4 KiB pages cost what one 64 MiB range costs.
  // Pieces that are not adjacent each start a new transfer, one after the
  // other.  Errors as above; the pieces' total must fit the segment.
  Status read_bulk(size_t i, std::span<const BulkSegment> pieces, uint64_t offset = 0) {
    return bulk_op(true, i, pieces, offset);
  }
  Status write_bulk(size_t i, std::span<const BulkSegment> pieces, uint64_t offset = 0) {
    return bulk_op(false, i, pieces, offset);
  }

 private:
  friend class core::ServerSession;
  ServerCall() = default;
  Status bulk_op(bool incoming, size_t i, const BulkSegment& local, uint64_t offset) {
    return bulk_op(incoming, i, std::span<const BulkSegment>(&local, 1), offset);
  }
  Status bulk_op(bool incoming, size_t i, std::span<const BulkSegment> pieces, uint64_t offset) {
    if (bulk_ == nullptr)
      return Status(StatusCode::kInvalidArgument, "this call carries no bulk segments");
    return bulk_->transfer(incoming, i, pieces, offset);
  }
  detail::ServerBulk* bulk_ = nullptr;
  detail::StreamWriterImpl* stream_ = nullptr;
  detail::InboundStream* inbound_ = nullptr;
  std::span<const std::byte> request_;
  flatbuffers::FlatBufferBuilder* reply_ = nullptr;
  const bool* cancelled_ = nullptr;
  std::optional<std::chrono::steady_clock::time_point> deadline_;
  const std::string* method_name_ = nullptr;
  uint32_t method_id_ = 0;
  const std::string* peer_ = nullptr;
  const PeerInfo* peer_info_ = nullptr;
  std::span<const std::byte> metadata_;  // the block, empty without metadata
  Metadata* trailers_ = nullptr;
};

inline bool ServerCall::cancelled() const {
  return *cancelled_ ||
         (deadline_.has_value() && std::chrono::steady_clock::now() >= *deadline_);
}

// A check that runs before a method's handler on every call of a server
// (Server::add_interceptor): it reads the method, the peer and the deadline
// and returns OK to let the call through, or the status the client gets
// instead (PERMISSION_DENIED, UNAUTHENTICATED, ...); the handler does not
// run then.  It runs on the handler's fiber: it may wait like a handler.
using ServerInterceptor = std::function<Status(const ServerCall&)>;

// A handler runs on a fiber of the server's event loop: it may wait for
// other RPCs (Future::get suspends only the fiber) but should not block the
// thread.  A thrown exception becomes an INTERNAL reply.
using Handler = std::function<Status(ServerCall&)>;
// True if `data` holds a valid request FlatBuffer.
using Verifier = bool (*)(const uint8_t* data, size_t size);

enum class MethodKind : uint8_t {
  kUnary,         // one request, one reply
  kServerStream,  // one request, a stream of replies, then a final status
  kClientStream,  // a stream of requests, half-closed, then one reply
  kBidiStream,    // both sides stream independently, then a final status
};

struct MethodDescriptor {
  std::string full_name;  // "demo.Echo.Echo"
  uint32_t id = 0;
  MethodKind kind = MethodKind::kUnary;
  Handler handler;
  Verifier verify = nullptr;
};

class ServiceDefinition {
 public:
  explicit ServiceDefinition(std::string full_name) : name_(std::move(full_name)) {}

  const std::string& name() const { return name_; }
  const std::vector<MethodDescriptor>& methods() const { return methods_; }

  // The binary FlatBuffers schema (.bfbs) of the service's .fbs file, its
  // includes' types too: slotrpc.Reflection serves it (slotrpc-cli reads
  // it).  slotrpc-gen's code sets it from data it embeds; a service built
  // by hand has none unless given.  The bytes must outlive the definition.
  ServiceDefinition& set_schema(std::span<const uint8_t> bfbs) {
    schema_ = bfbs;
    return *this;
  }
  std::span<const uint8_t> schema() const { return schema_; }

  // Raw form: the handler gets the request bytes unverified unless
  // `verify` is given.
  ServiceDefinition& add_method(std::string_view method, Handler handler,
                                Verifier verify = nullptr,
                                MethodKind kind = MethodKind::kUnary) {
    MethodDescriptor m;
    m.full_name = name_ + "." + std::string(method);
    m.id = method_id(m.full_name);
    m.kind = kind;
    m.handler = std::move(handler);
    m.verify = verify;
    methods_.push_back(std::move(m));
    return *this;
  }

  // Typed form: the request is verified as Req before the handler runs;
  // one that fails is answered with INVALID_ARGUMENT.
  template <class Req, class Fn>
  ServiceDefinition& add_unary(std::string_view method, Fn fn) {
    return add_method(
        method,
        [fn = std::move(fn)](ServerCall& call) -> Status {
          return fn(call.request_as<Req>(), call.reply(), call);
        },
        &verify_as<Req>);
  }

  // Typed reply: fn(const Req&, ReplyBuilder<Resp>&, ServerCall&) -> Status.
  template <class Req, class Resp, class Fn>
  ServiceDefinition& add_typed_unary(std::string_view method, Fn fn) {
    return add_method(
        method,
        [fn = std::move(fn)](ServerCall& call) -> Status {
          ReplyBuilder<Resp> reply(call.reply());
          return fn(call.request_as<Req>(), reply, call);
        },
        &verify_as<Req>);
  }

  // Server streaming: fn(const Req&, ServerWriter<Resp>&, ServerCall&) ->
  // Status; the returned status ends the stream.
  template <class Req, class Resp, class Fn>
  ServiceDefinition& add_server_stream(std::string_view method, Fn fn) {
    return add_method(
        method,
        [fn = std::move(fn)](ServerCall& call) -> Status {
          ServerWriter<Resp> writer(*call.stream());
          return fn(call.request_as<Req>(), writer, call);
        },
        &verify_as<Req>, MethodKind::kServerStream);
  }

  // Client streaming: fn(ServerReader<Req>&, ReplyBuilder<Resp>&, ServerCall&)
  // -> Status; the reply (with an OK status) or the error ends the call,
  // whether or not the client has finished writing.
  template <class Req, class Resp, class Fn>
  ServiceDefinition& add_client_stream(std::string_view method, Fn fn) {
    return add_method(
        method,
        [fn = std::move(fn)](ServerCall& call) -> Status {
          ServerReader<Req> reader(*call.inbound());
          ReplyBuilder<Resp> reply(call.reply());
          return fn(reader, reply, call);
        },
        nullptr, MethodKind::kClientStream);
  }

  // Bidi streaming: fn(ServerReaderWriter<Req, Resp>&, ServerCall&) ->
  // Status; the returned status ends the call.
  template <class Req, class Resp, class Fn>
  ServiceDefinition& add_bidi_stream(std::string_view method, Fn fn) {
    return add_method(
        method,
        [fn = std::move(fn)](ServerCall& call) -> Status {
          ServerReaderWriter<Req, Resp> stream(*call.inbound(), *call.stream());
          return fn(stream, call);
        },
        nullptr, MethodKind::kBidiStream);
  }

  template <class T>
  static bool verify_as(const uint8_t* data, size_t size) {
    flatbuffers::Verifier v(data, size);
    return v.VerifyBuffer<T>(nullptr);
  }

 private:
  std::string name_;
  std::vector<MethodDescriptor> methods_;
  std::span<const uint8_t> schema_;
};

}  // namespace slotrpc
