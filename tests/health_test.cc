// slotrpc.Health (slotrpc/health.h): Check and Watch per service name,
// Server::set_serving, and a draining Server::shutdown that lets calls in
// flight finish while watchers hear NOT_SERVING.
#include <doctest/doctest.h>
#include <slotrpc/slotrpc.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ping_payloads.h"
#include "test_messages_generated.h"

namespace {

using namespace slotrpc::test_payloads;  // ping
using slotrpc::Channel;
using slotrpc::Config;
using slotrpc::Server;
using slotrpc::ServerCall;
using slotrpc::ServiceDefinition;
using slotrpc::ServingStatus;
using slotrpc::Status;
using slotrpc::StatusCode;
using slotrpc::test::Ping;
using slotrpc::test::Pong;

constexpr uint32_t kSlow = slotrpc::method_id("slotrpc.test.Healthy.Slow");
constexpr auto kWait = std::chrono::seconds(10);

// Slow: sleeps `seq` ms on its fiber, counts how many have started.
ServiceDefinition make_service(std::atomic<int>* started) {
  ServiceDefinition svc("slotrpc.test.Healthy");
  svc.add_unary<Ping>("Slow", [started](const Ping& req, flatbuffers::FlatBufferBuilder& out,
                                        ServerCall&) -> Status {
    ++*started;
    slotrpc::this_fiber::sleep_for(std::chrono::milliseconds(req.seq()));
    out.Finish(slotrpc::test::CreatePong(out, req.seq(), out.CreateString("done")));
    return {};
  });
  return svc;
}

std::unique_ptr<Channel> connect(const Server& s) {
  Config c;
  c.transport = slotrpc::TransportKind::kTcp;
  auto ch = Channel::connect("127.0.0.1:" + std::to_string(s.port()), c);
  REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
  return std::move(ch.value());
}

// What a watch saw, for the test thread to wait on.
struct Seen {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<ServingStatus> statuses;
  bool ended = false;
  Status end;
  bool wait_for(size_t n) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, kWait, [&] { return statuses.size() >= n; });
  }
  bool wait_end() {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, kWait, [&] { return ended; });
  }
};

slotrpc::CallHandle watch(Channel& ch, const std::string& service, Seen& seen) {
  return slotrpc::watch_health(
      ch, service,
      [&seen](ServingStatus s) {
        std::lock_guard<std::mutex> lock(seen.mu);
        seen.statuses.push_back(s);
        seen.cv.notify_all();
      },
      [&seen](Status st) {
        std::lock_guard<std::mutex> lock(seen.mu);
        seen.ended = true;
        seen.end = std::move(st);
        seen.cv.notify_all();
      });
}

}  // namespace

TEST_CASE("Check answers per service; set_serving changes it; unknown services are NOT_FOUND") {
  std::atomic<int> started{0};
  Server server;
  REQUIRE(server.add_service(make_service(&started)).ok());
  REQUIRE(server.start("127.0.0.1:0").ok());
  auto ch = connect(server);
  auto whole = slotrpc::check_health(*ch, "");
  REQUIRE_MESSAGE(whole.ok(), whole.status().to_string());
  CHECK(*whole == ServingStatus::kServing);
  CHECK(*slotrpc::check_health(*ch, "slotrpc.test.Healthy") == ServingStatus::kServing);
  auto none = slotrpc::check_health(*ch, "no.Such");
  CHECK(none.status().code() == StatusCode::kNotFound);
  CHECK(none.status().message().find("no.Such") != std::string::npos);

  REQUIRE(server.set_serving("slotrpc.test.Healthy", false).ok());
  CHECK(*slotrpc::check_health(*ch, "slotrpc.test.Healthy") == ServingStatus::kNotServing);
  CHECK(*slotrpc::check_health(*ch, "") == ServingStatus::kServing);
  CHECK(server.set_serving("no.Such", false).code() == StatusCode::kNotFound);
}

TEST_CASE("Watch sees each change, and ends when cancelled") {
  std::atomic<int> started{0};
  Server server;
  REQUIRE(server.add_service(make_service(&started)).ok());
  REQUIRE(server.start("127.0.0.1:0").ok());
  auto ch = connect(server);
  Seen seen;
  auto handle = watch(*ch, "slotrpc.test.Healthy", seen);
  REQUIRE(seen.wait_for(1));
  REQUIRE(server.set_serving("slotrpc.test.Healthy", false).ok());
  REQUIRE(seen.wait_for(2));
  REQUIRE(server.set_serving("slotrpc.test.Healthy", true).ok());
  REQUIRE(seen.wait_for(3));
  {
    std::lock_guard<std::mutex> lock(seen.mu);
    CHECK(seen.statuses == std::vector<ServingStatus>{ServingStatus::kServing, ServingStatus::kNotServing,
                                                      ServingStatus::kServing});
  }
  Seen unknown;
  auto h2 = watch(*ch, "not.Yet", unknown);
  REQUIRE(unknown.wait_for(1));
  CHECK(unknown.statuses.front() == ServingStatus::kServiceUnknown);
  handle.cancel();
  h2.cancel();
  REQUIRE(seen.wait_end());
  CHECK(seen.end.code() == StatusCode::kCancelled);
  REQUIRE(unknown.wait_end());
}

TEST_CASE("shutdown drains: watchers hear NOT_SERVING, calls in flight finish, none fails") {
  std::atomic<int> started{0};
  Server server;
  REQUIRE(server.add_service(make_service(&started)).ok());
  REQUIRE(server.start("127.0.0.1:0").ok());
  auto ch = connect(server);
  Seen seen;
  auto handle = watch(*ch, "", seen);
  REQUIRE(seen.wait_for(1));

  // Eight calls of 300 ms in flight when the drain starts.
  std::vector<slotrpc::Future<slotrpc::Reply<Pong>>> calls;
  for (int i = 0; i < 8; ++i) calls.push_back(ch->call_typed<Pong>(kSlow, ping(300, "x")));
  while (started.load() < 8) std::this_thread::yield();
  std::thread drain([&server] { server.shutdown(std::chrono::seconds(5)); });
  REQUIRE(seen.wait_for(2));
  CHECK(seen.statuses.back() == ServingStatus::kNotServing);
  for (auto& f : calls) {
    auto r = f.get();
    CHECK_MESSAGE(r.ok(), r.status().to_string());
  }
  drain.join();
  REQUIRE(seen.wait_end());
  CHECK_MESSAGE(seen.end.ok(), seen.end.to_string());
  CHECK(server.session_count() == 0);
}
