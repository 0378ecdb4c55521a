// The echo service: replies with the request's sequence number and payload.
#pragma once

#include <slotrpc/slotrpc.h>

#include "echo_generated.h"

namespace echo {

inline constexpr const char* kServiceName = "slotrpc.examples.Echo";
inline constexpr uint32_t kEchoMethod = slotrpc::method_id("slotrpc.examples.Echo.Echo");

inline slotrpc::ServiceDefinition make_service() {
  using namespace slotrpc::examples;
  slotrpc::ServiceDefinition svc(kServiceName);
  svc.add_unary<EchoRequest>(
      "Echo", [](const EchoRequest& req, flatbuffers::FlatBufferBuilder& out,
                 slotrpc::ServerCall&) -> slotrpc::Status {
        // The request is read in place in the receive slot; the reply is
        // built in place in the send slot.  The one copy is the payload
        // itself, which is what an echo is.
        const auto* p = req.payload();
        auto payload = p != nullptr ? out.CreateVector(p->data(), p->size())
                                    : out.CreateVector(static_cast<const uint8_t*>(nullptr), 0);
        out.Finish(CreateEchoReply(out, req.seq(), payload));
        return {};
      });
  return svc;
}

// The payload byte at `i` of call `seq`: the client checks every byte.
inline uint8_t pattern(uint64_t seq, size_t i) { return static_cast<uint8_t>((seq * 131 + i * 7) & 0xff); }

}  // namespace echo
