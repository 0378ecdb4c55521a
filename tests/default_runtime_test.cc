// Servers and channels given no runtime (include/slotrpc/runtime.h): each
// side has a default runtime of its own, so a process that serves and
// calls runs the two ends of a call on different loops (one shared loop
// made in-process verbs echoes 1.4x slower at 64 B, docs/benchmarks.md),
// while a channel opened in a handler still stays on the handler's loop.
// A binary of its own: the default runtimes are process-wide.
#include <doctest/doctest.h>
#include <pthread.h>
#include <slotrpc/slotrpc.h>

#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <string>

#include "ping_payloads.h"
#include "test_messages_generated.h"

namespace {

using namespace slotrpc::test_payloads;  // ping
using slotrpc::Channel;
using slotrpc::RawReply;
using slotrpc::Runtime;
using slotrpc::Server;
using slotrpc::ServerCall;
using slotrpc::ServiceDefinition;
using slotrpc::Status;
using slotrpc::test::Ping;
using slotrpc::test::Pong;

constexpr uint32_t kEcho = slotrpc::method_id("slotrpc.test.Default.Echo");
constexpr uint32_t kRelay = slotrpc::method_id("slotrpc.test.Default.Relay");
constexpr auto kWait = std::chrono::seconds(10);

std::string thread_name() {
  char name[16] = {};
  pthread_getname_np(pthread_self(), name, sizeof name);
  return name;
}

void finish_pong(flatbuffers::FlatBufferBuilder& out, uint64_t seq, const std::string& text) {
  auto t = out.CreateString(text);
  out.Finish(slotrpc::test::CreatePong(out, seq, t));
}

// Echo answers with the name of the thread its handler ran on.  Relay opens
// a channel of default settings to `backend` from its handler, calls Echo
// there, and answers "<backend's handler thread>|<hand-offs of that
// channel>|<the nested channel's callback thread>".
ServiceDefinition make_service(std::string backend) {
  ServiceDefinition svc("slotrpc.test.Default");
  svc.add_unary<Ping>("Echo", [](const Ping& req, flatbuffers::FlatBufferBuilder& out, ServerCall&) -> Status {
    finish_pong(out, req.seq(), thread_name());
    return {};
  });
  svc.add_unary<Ping>("Relay", [backend](const Ping& req, flatbuffers::FlatBufferBuilder& out, ServerCall&) -> Status {
    auto ch = Channel::connect(backend);
    if (!ch.ok()) return ch.status();
    auto r = ch.value()->call_typed<Pong>(kEcho, ping(req.seq(), "x")).get();
    if (!r.ok()) return r.status();
    const std::string text = r->text()->str() + "|" + std::to_string(ch.value()->stats().cross_loop_handoffs) +
                             "|" + thread_name();
    finish_pong(out, req.seq(), text);
    return {};
  });
  return svc;
}

std::unique_ptr<Server> start_server(ServiceDefinition svc) {
  auto server = std::make_unique<Server>();
  REQUIRE(server->add_service(std::move(svc)).ok());
  const Status st = server->start("127.0.0.1:0");
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  return server;
}

std::string address_of(const Server& s) { return "127.0.0.1:" + std::to_string(s.port()); }

}  // namespace

TEST_CASE("a server and a channel given no runtime run on loops of their own") {
  auto server = start_server(make_service(""));
  auto ch = Channel::connect(address_of(*server));
  REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
  std::promise<std::pair<std::string, std::string>> done;  // handler's thread, callback's thread
  auto result = done.get_future();
  slotrpc::raw::call(*ch.value(), kEcho, ping(1, "x"), {}, [&done](RawReply&& r) {
    std::string handler = "call failed: " + r.status().to_string();
    if (r.ok()) {
      const auto* pong = flatbuffers::GetRoot<Pong>(r.data());
      handler = pong->text()->str();
    }
    done.set_value({handler, thread_name()});
  });
  REQUIRE(result.wait_for(kWait) == std::future_status::ready);
  const auto [handler, callback] = result.get();
  CHECK(handler == "slotrpc-serve0");
  CHECK(callback == "slotrpc-loop0");
  CHECK(Runtime::default_runtime().core() != Runtime::default_server_runtime().core());
  CHECK(Runtime::default_runtime().loop_count() == 1);
  CHECK(Runtime::default_server_runtime().loop_count() == 1);
}

TEST_CASE("a channel opened in the handler of a server given no runtime stays on the handler's loop") {
  auto backend = start_server(make_service(""));
  auto front = start_server(make_service(address_of(*backend)));
  auto ch = Channel::connect(address_of(*front));
  REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
  auto f = ch.value()->call_typed<Pong>(kRelay, ping(7, "r"));
  REQUIRE(f.wait_for(kWait));
  auto r = f.get();
  REQUIRE_MESSAGE(r.ok(), r.status().to_string());
  // The backend's handler runs on the servers' loop too (one loop); the
  // nested channel made no hand-off and its callback ran on that loop.
  CHECK(r->text()->str() == "slotrpc-serve0|0|slotrpc-serve0");
}
