// The connection handshake: one Hello from the client, one HelloReply from
// the server, on the TCP connection before any slot message.  It fixes the
// ring geometry (both sides allocate S x B per direction) and, for
// transports that need it, carries an extension block (the verbs transport
// puts its QP number, GID and ring keys there).  docs/protocol.md describes
// the layout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "slotrpc/result.h"

namespace slotrpc::core {

inline constexpr size_t kHelloSize = 32;
inline constexpr uint32_t kHelloMagic = 0x48505253;       // "SRPH"
inline constexpr uint32_t kHelloReplyMagic = 0x41505253;  // "SRPA"
inline constexpr uint16_t kHandshakeVersion = 1;
inline constexpr uint32_t kMaxHandshakeExtension = 4096;
inline constexpr uint32_t kMaxHandshakeMessage = 1024;

// Protocol features a server announces in its HelloReply (offset 26).  A
// server predating the field sends 0 there; the client then does not use
// what the server lacks (docs/protocol.md, "Versions and features").
inline constexpr uint16_t kFeatureClientStreams = 0x0001;  // client and bidi streaming
inline constexpr uint16_t kFeatureBulk = 0x0002;           // bulk descriptors (kFlagBulk)
inline constexpr uint16_t kKnownFeatures = kFeatureClientStreams | kFeatureBulk;
// ATTACH: announced by a server whose tcp session's link wants a second
// connection attached to it (transport.h, "Attached connections"): the
// HelloReply then carries the link's attach token as its extension, and
// the client may present it on a new connection with a Hello of transport
// kAttach (docs/protocol.md, "Attached connections").
inline constexpr uint16_t kFeatureAttach = 0x0004;
// PACK (kind 12, lib/core/pack.h): the side that announces it accepts
// PACKs.  Both sides announce it: the server in its HelloReply, the client
// in its Hello's features (offset 20).  A side sends PACKs only to a peer
// that announced it; one that did not never receives a PACK.  Not on shm.
inline constexpr uint16_t kFeaturePack = 0x0008;
// TCP_PUSH: announced by a server whose tcp sessions accept PUSH_DATA
// (Config::tcp_bulk_push above 0): a client may then send a bulk range it
// offers right behind its request (docs/protocol.md, "TCP bulk frames").
inline constexpr uint16_t kFeatureTcpPush = 0x0010;
// STATUS_CODES: announced by a client in its Hello: it takes every one of
// gRPC's 17 status codes in an ERROR reply.  A client that predates it
// closed the session on a code outside the first version's eight (OK,
// CANCELLED, INVALID_ARGUMENT, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED,
// UNIMPLEMENTED, INTERNAL, UNAVAILABLE), so to such a client a server sends
// the others as INTERNAL, the code's name leading the message
// (docs/protocol.md, "Status codes").
inline constexpr uint16_t kFeatureStatusCodes = 0x0020;
// METADATA: announced by a server in its HelloReply (it takes call metadata
// on requests) and by a client in its Hello (it takes trailers on replies
// and errors): kFlagMetadata goes only to a peer that announced it
// (docs/protocol.md, "Call metadata").
inline constexpr uint16_t kFeatureMetadata = 0x0040;
// True for the codes every version of the protocol knows.
inline constexpr bool is_first_version_status(StatusCode c) {
  switch (c) {
    case StatusCode::kOk:
    case StatusCode::kCancelled:
    case StatusCode::kInvalidArgument:
    case StatusCode::kDeadlineExceeded:
    case StatusCode::kResourceExhausted:
    case StatusCode::kUnimplemented:
    case StatusCode::kInternal:
    case StatusCode::kUnavailable:
      return true;
    default:
      return false;
  }
}
// kShm: only on a Unix domain socket, where the client's shm offer follows
// its Hello and the server's follows its HelloReply (docs/protocol.md).
// kAttach: a connection to be attached to an existing session's link; the
// Hello's slot fields are 0 and its extension is the token the session's
// HelloReply carried.  The server answers with kAttach when it took it.
enum class WireTransport : uint16_t { kTcp = 1, kVerbs = 2, kShm = 3, kAttach = 4 };

struct Hello {
  WireTransport transport = WireTransport::kTcp;
  uint32_t slot_count = 0;
  uint32_t slot_size = 0;
  uint32_t extension_len = 0;
  // kFeature* bits the client accepts (kFeaturePack, kFeatureStatusCodes);
  // 0 from a client predating the field.
  uint16_t features = 0;
};

struct HelloReply {
  uint16_t status = 0;  // StatusCode; non-zero rejects, `message` says why
  uint32_t slot_count = 0;
  uint32_t slot_size = 0;
  uint32_t extension_len = 0;
  uint32_t message_len = 0;
  // The transport the server chose.  It may answer a verbs proposal with
  // tcp (no device, or tcp forced); `message` then says why.  On the wire 0
  // (a server predating the field) means tcp.
  WireTransport transport = WireTransport::kTcp;
  // kFeature* bits; 0 from a server predating the field.
  uint16_t features = kKnownFeatures;
};

void encode_hello(const Hello& h, std::byte* out);
Result<Hello> decode_hello(const std::byte* in);
void encode_hello_reply(const HelloReply& r, std::byte* out);
Result<HelloReply> decode_hello_reply(const std::byte* in);

}  // namespace slotrpc::core
