// Ping/Pong payloads (tests/test_messages.fbs) the integration tests send
// and check; the byte pattern is the one in payloads.h.
#pragma once

#include <string>

#include "payloads.h"
#include "test_messages_generated.h"

namespace slotrpc::test_payloads {

// A Ping for call `seq`: `text`, an n-byte patterned payload, and the
// handler's sleep.  Captures by value: it may run after call() returned,
// on the channel's loop.
inline RequestWriter ping(uint64_t seq, std::string text, size_t payload_bytes = 0, uint32_t sleep_ms = 0) {
  return [seq, text = std::move(text), payload_bytes, sleep_ms](flatbuffers::FlatBufferBuilder& fbb) {
    auto t = fbb.CreateString(text);
    uint8_t* bytes = nullptr;
    auto p = fbb.CreateUninitializedVector(payload_bytes, &bytes);
    for (size_t i = 0; i < payload_bytes; ++i) bytes[i] = pattern(seq, i);
    fbb.Finish(slotrpc::test::CreatePing(fbb, seq, t, p, sleep_ms));
  };
}

// The same without the text field (its bytes count toward a slot's size).
inline RequestWriter ping_bytes(uint64_t seq, size_t payload_bytes = 0, uint32_t sleep_ms = 0) {
  return [seq, payload_bytes, sleep_ms](flatbuffers::FlatBufferBuilder& fbb) {
    uint8_t* bytes = nullptr;
    auto p = fbb.CreateUninitializedVector(payload_bytes, &bytes);
    for (size_t i = 0; i < payload_bytes; ++i) bytes[i] = pattern(seq, i);
    fbb.Finish(slotrpc::test::CreatePing(fbb, seq, 0, p, sleep_ms));
  };
}

// Empty string when `reply` is the Pong that answers ping_bytes(seq, n)
// (or ping(seq, any text, n)).
inline std::string pong_error(const Reply<slotrpc::test::Pong>& reply, uint64_t seq, size_t n) {
  if (!reply.ok()) return "status " + reply.status().to_string();
  if (reply->seq() != seq) return "seq " + std::to_string(reply->seq()) + ", expected " + std::to_string(seq);
  return payload_error(reply->payload(), seq, n);
}

// Empty string when `reply` is the Pong that answers ping(seq, text, n).
inline std::string pong_error(const Reply<slotrpc::test::Pong>& reply, uint64_t seq, const std::string& text,
                              size_t n) {
  if (!reply.ok()) return "status " + reply.status().to_string();
  if (reply->text() == nullptr || reply->text()->str() != text)
    return "text '" + (reply->text() ? reply->text()->str() : std::string("<null>")) + "', expected '" + text + "'";
  return pong_error(reply, seq, n);
}

}  // namespace slotrpc::test_payloads
