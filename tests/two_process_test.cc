// Integration across processes: the echo example's server (ECHO_SERVER)
// runs as a child process; its client (ECHO_CLIENT) runs as another child,
// and this test process talks to the server over its own Channel.
//
// The echo messages are written and read here without the example's
// generated header (same layout as examples/echo/echo.fbs).  Every wait is
// bounded, and children are killed and reaped even when a check fails.
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <signal.h>
#include <slotrpc/slotrpc.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "payloads.h"
#include "process_util.h"

namespace {

using namespace slotrpc::test_payloads;  // ping, pong_error, echo_request, pattern

using namespace std::chrono_literals;
using slotrpc::Channel;
using slotrpc::Future;
using slotrpc::RawReply;
using slotrpc::Reply;
using slotrpc::RequestWriter;
using slotrpc::StatusCode;
using Clock = std::chrono::steady_clock;

constexpr uint32_t kEcho = slotrpc::method_id("slotrpc.examples.Echo.Echo");
constexpr auto kWait = 10s;

template <class T>
T get_within(Future<T>& f, std::chrono::milliseconds limit = std::chrono::duration_cast<std::chrono::milliseconds>(kWait)) {
  REQUIRE(f.valid());
  REQUIRE_MESSAGE(f.wait_for(limit), "call did not complete within " << limit.count() << " ms");
  return f.get();
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

using test_process::read_file;
using test_process::SpawnOptions;

struct TempDir : test_process::TempDir {
  TempDir() : test_process::TempDir("slotrpc-2proc") {}
};

const char* binary(const char* env) {
  std::string error;
  const char* exe = test_process::binary_from_env(env, &error);
  REQUIRE_MESSAGE(exe != nullptr, error);
  return exe;
}

using test_process::Child;

// echo_server --listen 127.0.0.1:0 --port-file <dir>/port, up and listening.
struct EchoServer {
  TempDir dir;
  std::unique_ptr<Child> child;
  uint16_t port = 0;

  EchoServer() {
    auto up = test_process::start_echo_server(dir.path, SpawnOptions::to_files(dir.path, "echo_server"));
    child = std::move(up.child);
    REQUIRE_MESSAGE(up.port != 0, up.error);
    port = up.port;
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }

  // SIGTERM: the server stops cleanly and exits 0.
  void terminate_and_check() {
    REQUIRE(child->pid > 0);
    REQUIRE(child->signal(SIGTERM));
    int status = 0;
    REQUIRE_MESSAGE(child->wait(10000ms, &status), "echo_server did not exit after SIGTERM");
    CHECK(WIFEXITED(status));
    if (WIFEXITED(status)) CHECK(WEXITSTATUS(status) == 0);
    const std::string out = child->stdout_text();
    CHECK_MESSAGE(contains(out, "listening on port " + std::to_string(port)), out);
    CHECK_MESSAGE(contains(out, "stopping"), out);
  }
};

// The suite runs over tcp and, registered again with SLOTRPC_TRANSPORT=shm
// (tests/meson.build), over shared memory: the channels and echo_client
// must really use the transport of the run.
std::string transport_of_run() {
  const char* t = std::getenv("SLOTRPC_TRANSPORT");
  return t != nullptr && std::string(t) == "shm" ? "shm" : "tcp";
}

std::unique_ptr<Channel> connect(const std::string& address) {
  auto ch = Channel::connect(address);
  REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
  REQUIRE(slotrpc::to_string((*ch)->transport()) == transport_of_run());
  return std::move(ch).value();
}

}  // namespace

TEST_CASE("echo_client process: 100000 verified calls of 64 B with 32 outstanding against an echo_server process") {
  EchoServer server;
  Child client({binary("ECHO_CLIENT"), "--connect", server.address(), "--count", "100000", "--size", "64",
                "--outstanding", "32"},
               SpawnOptions::to_files(server.dir.path, "echo_client"));
  int status = 0;
  REQUIRE_MESSAGE(client.wait(180000ms, &status), "echo_client did not finish");
  const std::string out = client.stdout_text();
  INFO("echo_client stdout:\n" << out << "\nstderr:\n" << client.stderr_text());
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(contains(out, "100000 ok, 0 failed"));
  CHECK(contains(out, "over " + transport_of_run() + " to"));
  CHECK(contains(out, "p50"));
  CHECK(contains(out, "p99"));
  CHECK(contains(out, "every reply payload verified"));
  server.terminate_and_check();
}

TEST_CASE("echo_client's exit status means something: no server, exit 1") {
  TempDir dir;
  // A bound socket that never listens: connecting to it is refused.
  int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(s >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(::getsockname(s, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  const std::string address = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  int status = 0;
  bool exited = false;
  std::string err;
  {
    Child client({binary("ECHO_CLIENT"), "--connect", address, "--count", "10"},
                 SpawnOptions::to_files(dir.path, "echo_client"));
    exited = client.wait(30000ms, &status);
    err = client.stderr_text();
  }
  ::close(s);
  REQUIRE(exited);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 1);
  CHECK_MESSAGE(contains(err, "UNAVAILABLE"), err);
}

TEST_CASE("a Channel in this process: 1000 checked calls to the echo_server process") {
  EchoServer server;
  {
    auto ch = connect(server.address());
    constexpr uint64_t kCalls = 1000;
    constexpr size_t kWindow = 32;
    int bad = 0;
    std::vector<Future<Reply<EchoReplyView>>> window;
    std::vector<uint64_t> seqs;
    for (uint64_t seq = 0; seq < kCalls; ++seq) {
      window.push_back(ch->call_typed<EchoReplyView>(kEcho, echo_request(seq, seq % 1500)));
      seqs.push_back(seq);
      if (window.size() == kWindow || seq + 1 == kCalls) {
        for (size_t k = 0; k < window.size(); ++k) {
          const std::string e = echo_error(get_within(window[k]), seqs[k], seqs[k] % 1500);
          if (!e.empty() && bad++ < 3) FAIL_CHECK("call " << seqs[k] << ": " << e);
        }
        window.clear();
        seqs.clear();
      }
    }
    CHECK(bad == 0);
    const auto st = ch->stats();
    CHECK(st.messages_sent >= kCalls);
    CHECK(st.free_slots == ch->slot_count());
    CHECK_FALSE(st.closed);
  }
  server.terminate_and_check();
}

TEST_CASE("error replies cross the process boundary") {
  EchoServer server;
  auto ch = connect(server.address());

  // An unknown method id, raw form.
  const uint32_t unknown = slotrpc::method_id("slotrpc.examples.Echo.NoSuchMethod");
  auto f = slotrpc::raw::call(*ch, unknown, echo_request(1, 8));
  RawReply r = get_within(f);
  CHECK(r.status().code() == StatusCode::kUnimplemented);
  char hex[16];
  std::snprintf(hex, sizeof hex, "%08x", unknown);
  CHECK_MESSAGE(contains(r.status().message(), hex), r.status().to_string());
  CHECK(r.size() == 0);

  // Bytes that are not an EchoRequest, to the real method.
  auto g = slotrpc::raw::call(*ch, kEcho, [](flatbuffers::FlatBufferBuilder& fbb) {
    const uint8_t junk[12] = {0xff, 0xff, 0xff, 0x7f, 1, 2, 3, 4, 5, 6, 7, 8};
    fbb.PushFlatBuffer(junk, sizeof junk);
  });
  RawReply bad = get_within(g);
  CHECK(bad.status().code() == StatusCode::kInvalidArgument);
  CHECK_MESSAGE(contains(bad.status().message(), "slotrpc.examples.Echo.Echo"), bad.status().to_string());

  // The session survives both.
  auto h = ch->call_typed<EchoReplyView>(kEcho, echo_request(2, 100));
  CHECK(echo_error(get_within(h), 2, 100) == "");

  // SIGTERM: the server exits 0, and this channel sees the peer go.
  server.terminate_and_check();
  auto after = ch->call_typed<EchoReplyView>(kEcho, echo_request(3, 10));
  auto a = get_within(after);
  CHECK_MESSAGE(a.status().code() == StatusCode::kUnavailable, a.status().to_string());
}
