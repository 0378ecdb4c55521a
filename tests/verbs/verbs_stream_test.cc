// Client, bidi and server streaming over verbs: the cases of
// tests/stream_cases.h (the TCP test runs the same ones), with the channel and
// the server on the verbs transport: every message checked in order, messages
// near the slot size, half-close in both orders, the server ending early,
// cancellation and deadlines mid-stream, a peer process killed mid-stream
// (UNAVAILABLE within the peer timeout: a vanished verbs peer says nothing,
// so the keepalive finds it), and more concurrent streams than credits.
//
// Needs an RDMA device: run by the `rxe` suite (see tests/rxe/README.md).
#include "verbs_test_util.h"

#include <cstdint>
#include <cstdlib>

namespace {

// Messages per kind of the long runs: VERBS_STREAM_MESSAGES, set by
// tests/verbs/meson.build (the VM is emulated: see the count and its cost
// there).  Run by hand without it: 10,000.
uint64_t stream_message_count() {
  const char* v = std::getenv("VERBS_STREAM_MESSAGES");
  return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 10) : 10'000;
}

// The other cases send a twentieth of their TCP counts (e.g. 100 messages
// near the slot size instead of 2,000; 12 client streams of 100 messages
// against 8 slots): inside the emulated VM a 4 KiB message costs about 5 ms
// and the credit-starved concurrent cases about 3.5 ms a message, so the
// TCP counts alone would take over two minutes.
uint64_t stream_case_divisor() { return 20; }

// The device the suite selected (SLOTRPC_DEVICE/PORT), verbs on both ends,
// a short peer timeout so a killed peer is found in about a second, and a
// long connect timeout.
slotrpc::Config stream_base_config() {
  auto cfg = slotrpc::Config{}.with_environment();
  REQUIRE_MESSAGE(cfg.ok(), cfg.status().to_string());
  slotrpc::Config c = cfg.value();
  c.transport = slotrpc::TransportKind::kVerbs;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // Sanitized, the emulated VM stalls a loop for over a second at times
  // (a first connection was declared dead after 1057 ms of silence).
  c.keepalive_ms = 1000;
  c.peer_timeout_ms = 5000;
#else
  c.keepalive_ms = 200;
  c.peer_timeout_ms = 1000;
#endif
  // The first verbs connection of a sanitized process in the emulated VM
  // took over the default 5 s (device, rings, registration).
  c.connect_timeout_ms = 30000;
  return c;
}

}  // namespace

#define STREAM_CASE_PREFIX "verbs: "
#include "../stream_cases.h"

TEST_CASE("verbs: the stream fixture's channel runs over verbs") {
  Fixture f;
  CHECK(f.channel->transport() == slotrpc::TransportKind::kVerbs);
}

int main(int argc, char** argv) { return verbs_test::main(argc, argv); }
