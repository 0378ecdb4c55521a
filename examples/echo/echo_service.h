// The echo service: replies with the request's sequence number and payload.
#pragma once

#include "echo.slotrpc.h"  // generated from echo.fbs by slotrpc-gen

namespace echo {

class EchoHandler final : public slotrpc::examples::EchoService {
 public:
  slotrpc::Status Echo(const slotrpc::examples::EchoRequest& request,
                       slotrpc::ReplyBuilder<slotrpc::examples::EchoReply>& reply,
                       slotrpc::ServerCall&) override {
    // The request is read in place in the receive slot; the reply is built
    // in place in the send slot.  The one copy is the payload itself, which
    // is what an echo is.
    flatbuffers::FlatBufferBuilder& fbb = reply.fbb();
    const auto* p = request.payload();
    auto payload = p != nullptr ? fbb.CreateVector(p->data(), p->size())
                                : fbb.CreateVector(static_cast<const uint8_t*>(nullptr), 0);
    reply.Finish(slotrpc::examples::CreateEchoReply(fbb, request.seq(), payload));
    return {};
  }
};

// The payload byte at `i` of call `seq`: the client checks every byte.
inline uint8_t pattern(uint64_t seq, size_t i) { return static_cast<uint8_t>((seq * 131 + i * 7) & 0xff); }

}  // namespace echo
