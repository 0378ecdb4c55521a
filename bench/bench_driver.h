// The one interface slotrpc-bench drives every system through (slotrpc on
// each transport, gRPC, the socket ping-pong limit): the same loop, the same
// payloads, the same figures.  bench/grpc/grpc_echo.cc implements it for gRPC
// in its own translation unit, so the gRPC and FlatBuffers-gRPC headers never
// meet slotrpc's (both define slotrpc::examples::EchoRequest from echo.fbs).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "bench_common.h"
#include "slotrpc/histogram.h"

namespace bench {

// Every request payload byte (and every echoed byte the client checks at
// both ends of the payload).
inline constexpr uint8_t kFill = 0x5a;

// One measured point: `calls` echo calls of `size` payload bytes.
struct Point {
  slotrpc::Histogram latency_ns;  // issue to reply, per call
  double seconds = 0;             // first issue to last reply
  uint64_t calls = 0;
  uint64_t failed = 0;
  std::string first_error;
};

class EchoDriver {
 public:
  virtual ~EchoDriver() = default;
  // `outstanding` calls in flight, spread round-robin over `channels`
  // connections, until `calls` completed.  `done` counts completed calls
  // (read by the progress line from another thread).
  virtual Point run(uint64_t size, uint64_t calls, uint64_t outstanding, uint32_t channels,
                    std::atomic<uint64_t>& done) = 0;
};

// gRPC (bench/grpc/grpc_echo.cc); defined only when the build found grpc++.
bool grpc_available();
// Connects lazily, per run, to `target` (host:port).  `max_message`: the
// message-size limits of both directions.  `tls_ca` (a PEM file): TLS,
// the server's certificate verified against it (for the name localhost).
std::unique_ptr<EchoDriver> make_grpc_driver(const std::string& target, uint64_t max_message,
                                             const std::string& tls_ca = {});
// Serves the Echo service on `address` (port 0: a free one); writes the port
// to `port_file` once listening and serves until SIGTERM.  Returns the exit
// code.  `tls_cert` and `tls_key` (PEM files): TLS with that certificate.
int serve_grpc(const std::string& address, const std::string& port_file, uint64_t max_message,
               const std::string& tls_cert = {}, const std::string& tls_key = {});

}  // namespace bench
