// Helpers of the admission tests (tests/admission_test.cc,
// tests/admission_oom_test.cc): an echo_server child under resource limits,
// its CPU time, and checked calls of the echo example's method.
#pragma once

#include <doctest/doctest.h>
#include <slotrpc/slotrpc.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "process_util.h"

namespace admission_test {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// The echo example's method and messages (examples/echo/echo.fbs: seq =
// field 0, payload = field 1), written without its generated header.
inline constexpr uint32_t kExampleEcho = slotrpc::method_id("slotrpc.examples.Echo.Echo");

inline slotrpc::RequestWriter echo_request(uint64_t seq, size_t n) {
  return [seq, n](flatbuffers::FlatBufferBuilder& fbb) {
    uint8_t* bytes = nullptr;
    auto payload = fbb.CreateUninitializedVector(n, &bytes);
    for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(seq + i);
    const auto start = fbb.StartTable();
    fbb.AddElement<uint64_t>(4, seq, 0);
    fbb.AddOffset(6, payload);
    fbb.Finish(flatbuffers::Offset<void>(fbb.EndTable(start)));
  };
}

struct EchoReplyView : private flatbuffers::Table {
  uint64_t seq() const { return GetField<uint64_t>(4, 0); }
  bool Verify(flatbuffers::Verifier& v) const {
    return VerifyTableStart(v) && VerifyField<uint64_t>(v, 4, 8) && VerifyOffset(v, 6) &&
           v.EndTable();
  }
};

// One echo call on `ch`; "" when it came back right, else what went wrong.
inline std::string echo_once(slotrpc::Channel& ch, uint64_t seq, std::chrono::milliseconds limit = 10s) {
  auto f = ch.call_typed<EchoReplyView>(kExampleEcho, echo_request(seq, 32));
  if (!f.wait_for(limit)) return "no reply within the limit";
  auto r = f.get();
  if (!r.ok()) return "status " + r.status().to_string();
  if (r->seq() != seq) return "wrong seq";
  return "";
}

using test_process::cpu_seconds;
using test_process::read_file;

// An echo_server child with one resource limit set before exec; killed and
// reaped on destruction.
struct LimitedEchoServer {
  test_process::TempDir dir{"slotrpc-admission"};
  std::unique_ptr<test_process::Child> child;
  pid_t pid = -1;
  uint16_t port = 0;

  LimitedEchoServer(int resource, rlim_t limit, std::vector<std::string> env_extra = {}) {
    test_process::SpawnOptions o = test_process::SpawnOptions::to_file(dir.path / "stderr");  // spdlog writes to stdout
    o.env = std::move(env_extra);
    o.rlimit_resource = resource;
    o.rlimit_value = limit;
    auto up = test_process::start_echo_server(dir.path, o);
    child = std::move(up.child);
    REQUIRE_MESSAGE(up.port != 0, up.error);
    pid = child->pid;
    port = up.port;
  }
  bool alive() const { return child->running(); }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
  std::string log() const { return read_file(dir.path / "stderr"); }  // stdout and stderr
};

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace admission_test
