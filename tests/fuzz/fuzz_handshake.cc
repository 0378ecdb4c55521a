// Fuzz target: the handshake decoders, core::decode_hello,
// core::decode_hello_reply and the verbs extension,
// transport::verbs::decode_qp_info.
//
// Input: any bytes.  The first 32 (zero-padded) are read as a Hello and as a
// HelloReply; the whole input is read as a verbs extension (which must be
// exactly 64 bytes), and so are its first 64 bytes (zero-padded), so both
// the length check and the field checks get inputs.
//
// Oracles (a violation aborts):
//  * each decoder accepts exactly what docs/protocol.md section 7 allows
//    (an independent reading of the tables, written below), and refuses
//    with UNAVAILABLE "handshake failed: ..." otherwise;
//  * what a decoder accepts, the encoder writes back byte for byte (the
//    "zero" fields aside, which the decoders ignore), and decodes again to
//    the same values.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string_view>

#include "core/handshake.h"
#include "transport/verbs/verbs_transport.h"
#include "fuzz_check.h"

namespace {

using namespace slotrpc;
using namespace slotrpc::core;

uint64_t le(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

void check_refusal(const Status& s) {
  FUZZ_CHECK(s.code() == StatusCode::kUnavailable);
  FUZZ_CHECK(std::string_view(s.message()).starts_with("handshake failed: "));
  FUZZ_CHECK(s.message().size() > std::string_view("handshake failed: ").size());
}

void fuzz_hello(const uint8_t* b) {
  const uint64_t transport = le(b + 6, 2);
  const bool valid = le(b, 4) == 0x48505253 && le(b + 4, 2) == 1 &&
                     (transport >= 1 && transport <= 4) && le(b + 16, 4) <= 4096;  // 4: a tcp session's bulk lane
  auto r = decode_hello(reinterpret_cast<const std::byte*>(b));
  FUZZ_CHECK(r.ok() == valid);
  if (!r.ok()) return check_refusal(r.status());
  const Hello h = r.value();
  FUZZ_CHECK(static_cast<uint16_t>(h.transport) == transport);
  FUZZ_CHECK(h.slot_count == le(b + 8, 4) && h.slot_size == le(b + 12, 4) &&
             h.extension_len == le(b + 16, 4));
  uint8_t out[kHelloSize];
  encode_hello(h, reinterpret_cast<std::byte*>(out));
  FUZZ_CHECK(std::memcmp(out, b, 20) == 0);
  // The client's feature bits (offset 20, PACK) round-trip, unknown ones
  // included; the rest is zero.
  FUZZ_CHECK(h.features == le(b + 20, 2) && le(out + 20, 2) == h.features);
  for (size_t i = 22; i < kHelloSize; ++i) FUZZ_CHECK(out[i] == 0);
  auto again = decode_hello(reinterpret_cast<const std::byte*>(out));
  FUZZ_CHECK(again.ok() && again->transport == h.transport && again->slot_count == h.slot_count &&
             again->slot_size == h.slot_size && again->extension_len == h.extension_len &&
             again->features == h.features);
}

void fuzz_hello_reply(const uint8_t* b) {
  const uint64_t transport = le(b + 24, 2);
  const bool valid = le(b, 4) == 0x41505253 && le(b + 4, 2) == 1 && transport <= 4 &&
                     le(b + 16, 4) <= 4096 && le(b + 20, 4) <= 1024;
  auto r = decode_hello_reply(reinterpret_cast<const std::byte*>(b));
  FUZZ_CHECK(r.ok() == valid);
  if (!r.ok()) return check_refusal(r.status());
  const HelloReply h = r.value();
  // 0 is a server predating the field: tcp.
  FUZZ_CHECK(static_cast<uint16_t>(h.transport) == (transport == 0 ? 1 : transport));
  FUZZ_CHECK(h.status == le(b + 6, 2) && h.slot_count == le(b + 8, 4) &&
             h.slot_size == le(b + 12, 4) && h.extension_len == le(b + 16, 4) &&
             h.message_len == le(b + 20, 4));
  uint8_t out[kHelloSize];
  encode_hello_reply(h, reinterpret_cast<std::byte*>(out));
  FUZZ_CHECK(std::memcmp(out, b, 24) == 0);
  FUZZ_CHECK(le(out + 24, 2) == static_cast<uint16_t>(h.transport));
  // Feature bits (offset 26) round-trip, unknown ones included.
  FUZZ_CHECK(h.features == le(b + 26, 2) && le(out + 26, 2) == h.features);
  for (size_t i = 28; i < kHelloSize; ++i) FUZZ_CHECK(out[i] == 0);
  auto again = decode_hello_reply(reinterpret_cast<const std::byte*>(out));
  FUZZ_CHECK(again.ok() && again->status == h.status && again->slot_count == h.slot_count &&
             again->slot_size == h.slot_size && again->extension_len == h.extension_len &&
             again->message_len == h.message_len && again->transport == h.transport &&
             again->features == h.features);
}

void fuzz_qp_info(std::span<const uint8_t> in) {
  namespace v = transport::verbs;
  const uint8_t* b = in.data();
  const bool valid = in.size() == 64 && le(b, 4) == 0x56505253 && le(b + 4, 2) == 1 &&
                     b[6] >= 1 && b[6] <= 5 &&                         // enum ibv_mtu 256..4096
                     le(b + 8, 4) != 0 && le(b + 8, 4) <= 0xffffff &&  // QP number, 24 bits
                     le(b + 12, 4) <= 0xffffff &&                      // PSN, 24 bits
                     le(b + 40, 8) != 0;                               // ring address
  auto r = v::decode_qp_info(std::as_bytes(in));
  FUZZ_CHECK(r.ok() == valid);
  if (!r.ok()) {
    check_refusal(r.status());
    FUZZ_CHECK(r.status().message().find("verbs extension") != std::string::npos);
    return;
  }
  const v::QpInfo q = r.value();
  uint8_t out[v::kQpInfoSize];
  v::encode_qp_info(q, reinterpret_cast<std::byte*>(out));
  // Everything but the "zero" fields (35 and 56..64) comes back; byte 34 is
  // max_dest_rd_atomic (bulk transfers, docs/protocol.md section 7).
  uint8_t masked[v::kQpInfoSize];
  std::memcpy(masked, b, sizeof masked);
  std::memset(masked + 35, 0, 1);
  std::memset(masked + 56, 0, 8);
  FUZZ_CHECK(std::memcmp(out, masked, sizeof out) == 0);
  auto again = v::decode_qp_info(std::as_bytes(std::span<const uint8_t>(out)));
  FUZZ_CHECK(again.ok() && again->qpn == q.qpn && again->psn == q.psn &&
             std::memcmp(again->gid.raw, q.gid.raw, 16) == 0 && again->lid == q.lid &&
             again->mtu == q.mtu && again->link_layer == q.link_layer &&
             again->ring_addr == q.ring_addr && again->ring_rkey == q.ring_rkey &&
             again->slot_count == q.slot_count && again->slot_size == q.slot_size);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uint8_t padded[64] = {};
  std::memcpy(padded, data, size < sizeof padded ? size : sizeof padded);
  fuzz_hello(padded);
  fuzz_hello_reply(padded);
  fuzz_qp_info({data, size});
  fuzz_qp_info({padded, sizeof padded});
  return 0;
}
