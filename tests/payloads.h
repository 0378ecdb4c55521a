// Payloads the integration tests send and check, in one place so that
// every suite (and every transport it runs over) checks bytes the same way.
//
// `pattern(seq, i)` is the byte at offset i of call seq's payload: it
// differs per call and per offset, so a reply carrying another call's
// bytes, or bytes shifted by one, is caught, not just a wrong length.
//
// The echo example's messages (examples/echo/echo.fbs: EchoRequest and
// EchoReply { seq: ulong (field 0); payload: [ubyte] (field 1) }) are
// written and read here without its generated header, the way generated
// code would, so tests can talk to the echo_server binary.
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "slotrpc/call.h"
#include "slotrpc/reply.h"

namespace slotrpc::test_payloads {

inline uint8_t pattern(uint64_t seq, size_t i) { return static_cast<uint8_t>((seq * 131 + i * 7 + 3) & 0xff); }

// Empty string when `v` holds exactly pattern(seq, 0..n-1), else what differs.
template <class Vec>
std::string payload_error(const Vec* v, uint64_t seq, size_t n) {
  if (v == nullptr || v->size() != n)
    return "payload size " + std::to_string(v ? v->size() : 0) + ", expected " + std::to_string(n);
  for (size_t i = 0; i < n; ++i)
    if (v->Get(static_cast<flatbuffers::uoffset_t>(i)) != pattern(seq, i))
      return "payload differs at byte " + std::to_string(i);
  return "";
}

// slotrpc.examples.EchoRequest for call `seq` with an n-byte payload.
inline RequestWriter echo_request(uint64_t seq, size_t n) {
  return [seq, n](flatbuffers::FlatBufferBuilder& fbb) {
    uint8_t* bytes = nullptr;
    auto payload = fbb.CreateUninitializedVector(n, &bytes);
    for (size_t i = 0; i < n; ++i) bytes[i] = pattern(seq, i);
    const auto start = fbb.StartTable();
    fbb.AddElement<uint64_t>(4, seq, 0);
    fbb.AddOffset(6, payload);
    fbb.Finish(flatbuffers::Offset<void>(fbb.EndTable(start)));
  };
}

// slotrpc.examples.EchoReply, read the way generated code would.
struct EchoReplyView : private flatbuffers::Table {
  uint64_t seq() const { return GetField<uint64_t>(4, 0); }
  const flatbuffers::Vector<uint8_t>* payload() const {
    return GetPointer<const flatbuffers::Vector<uint8_t>*>(6);
  }
  bool Verify(flatbuffers::Verifier& v) const {
    return VerifyTableStart(v) && VerifyField<uint64_t>(v, 4, 8) && VerifyOffset(v, 6) &&
           v.VerifyVector(payload()) && v.EndTable();
  }
};

// Empty string when `r` is the echo of echo_request(seq, n).
inline std::string echo_error(const Reply<EchoReplyView>& r, uint64_t seq, size_t n) {
  if (!r.ok()) return "status " + r.status().to_string();
  if (r->seq() != seq) return "seq " + std::to_string(r->seq()) + ", expected " + std::to_string(seq);
  return payload_error(r->payload(), seq, n);
}

}  // namespace slotrpc::test_payloads
