#include "core/handshake.h"

#include <fmt/format.h>

#include <cstring>

namespace slotrpc::core {
namespace {

void put32(std::byte* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
void put16(std::byte* p, uint16_t v) {
  p[0] = static_cast<std::byte>(v);
  p[1] = static_cast<std::byte>(v >> 8);
}
uint32_t get32(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(p[i]) << (8 * i);
  return v;
}
uint16_t get16(const std::byte* p) { return static_cast<uint16_t>(uint16_t(p[0]) | uint16_t(p[1]) << 8); }

Status bad(std::string what) {
  return Status(StatusCode::kUnavailable, "handshake failed: " + std::move(what));
}

}  // namespace

void encode_hello(const Hello& h, std::byte* out) {
  std::memset(out, 0, kHelloSize);
  put32(out + 0, kHelloMagic);
  put16(out + 4, kHandshakeVersion);
  put16(out + 6, static_cast<uint16_t>(h.transport));
  put32(out + 8, h.slot_count);
  put32(out + 12, h.slot_size);
  put32(out + 16, h.extension_len);
  put16(out + 20, h.features);
}

Result<Hello> decode_hello(const std::byte* in) {
  if (get32(in) != kHelloMagic) return bad("peer is not a slotrpc client (bad hello magic)");
  if (get16(in + 4) != kHandshakeVersion)
    return bad(fmt::format("client speaks handshake version {}, this server {}", get16(in + 4),
                           kHandshakeVersion));
  Hello h;
  const uint16_t t = get16(in + 6);
  if (t != uint16_t(WireTransport::kTcp) && t != uint16_t(WireTransport::kVerbs) &&
      t != uint16_t(WireTransport::kShm) && t != uint16_t(WireTransport::kAttach))
    return bad(fmt::format("unknown transport {}", t));
  h.transport = static_cast<WireTransport>(t);
  h.slot_count = get32(in + 8);
  h.slot_size = get32(in + 12);
  h.extension_len = get32(in + 16);
  // Bits this server does not know are ignored: a newer client's features.
  h.features = get16(in + 20);
  if (h.extension_len > kMaxHandshakeExtension)
    return bad(fmt::format("extension of {} bytes (max {})", h.extension_len, kMaxHandshakeExtension));
  return h;
}

void encode_hello_reply(const HelloReply& r, std::byte* out) {
  std::memset(out, 0, kHelloSize);
  put32(out + 0, kHelloReplyMagic);
  put16(out + 4, kHandshakeVersion);
  put16(out + 6, r.status);
  put32(out + 8, r.slot_count);
  put32(out + 12, r.slot_size);
  put32(out + 16, r.extension_len);
  put32(out + 20, r.message_len);
  put16(out + 24, static_cast<uint16_t>(r.transport));
  put16(out + 26, r.features);
}

Result<HelloReply> decode_hello_reply(const std::byte* in) {
  if (get32(in) != kHelloReplyMagic) return bad("peer is not a slotrpc server (bad reply magic)");
  if (get16(in + 4) != kHandshakeVersion)
    return bad(fmt::format("server speaks handshake version {}, this client {}", get16(in + 4),
                           kHandshakeVersion));
  HelloReply r;
  r.status = get16(in + 6);
  r.slot_count = get32(in + 8);
  r.slot_size = get32(in + 12);
  r.extension_len = get32(in + 16);
  r.message_len = get32(in + 20);
  const uint16_t t = get16(in + 24);
  if (t == 0 || t == uint16_t(WireTransport::kTcp)) {
    r.transport = WireTransport::kTcp;
  } else if (t == uint16_t(WireTransport::kVerbs)) {
    r.transport = WireTransport::kVerbs;
  } else if (t == uint16_t(WireTransport::kShm)) {
    r.transport = WireTransport::kShm;
  } else if (t == uint16_t(WireTransport::kAttach)) {
    r.transport = WireTransport::kAttach;
  } else {
    return bad(fmt::format("server chose unknown transport {}", t));
  }
  // Bits this client does not know are ignored: a newer server's features.
  r.features = get16(in + 26);
  if (r.extension_len > kMaxHandshakeExtension || r.message_len > kMaxHandshakeMessage)
    return bad("oversized handshake reply");
  return r;
}

}  // namespace slotrpc::core
