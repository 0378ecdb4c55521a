// What the fleet tests share: a service that answers with its server's tag
// (so a reply says which endpoint served it), and server processes of this
// test binary that serve it ("helper: fleet server", started by
// start_fleet_server), each until SIGKILL, or SIGTERM, which drains it with
// Server::shutdown(grace).  SIGUSR1 makes its slotrpc.test.Fleet service
// NOT_SERVING (its slotrpc.test.Other goes on serving), SIGUSR2 SERVING again.
#pragma once

#include <doctest/doctest.h>
#include <signal.h>
#include <slotrpc/slotrpc.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "ping_payloads.h"
#include "process_util.h"
#include "test_messages_generated.h"

namespace fleet_test {

using namespace std::chrono_literals;

constexpr uint32_t kWho = slotrpc::method_id("slotrpc.test.Fleet.Who");
constexpr uint32_t kTags = slotrpc::method_id("slotrpc.test.Fleet.Tags");
constexpr uint32_t kChat = slotrpc::method_id("slotrpc.test.Fleet.Chat");
constexpr const char* kWhoName = "slotrpc.test.Fleet.Who";
// The same Who, in a second service of the same server.
constexpr const char* kOtherWhoName = "slotrpc.test.Other.Who";
constexpr uint32_t kOtherWho = slotrpc::method_id(kOtherWhoName);

// Who: answers Pong{seq, text = the server's tag}, after sleep_ms.
inline slotrpc::ServiceDefinition who_service(std::string tag, const char* name = "slotrpc.test.Fleet") {
  slotrpc::ServiceDefinition svc(name);
  svc.add_unary<slotrpc::test::Ping>(
      "Who", [tag](const slotrpc::test::Ping& req, flatbuffers::FlatBufferBuilder& out, slotrpc::ServerCall&) {
        if (req.sleep_ms() != 0) slotrpc::this_fiber::sleep_for(std::chrono::milliseconds(req.sleep_ms()));
        out.Finish(slotrpc::test::CreatePong(out, req.seq(), out.CreateString(tag)));
        return slotrpc::Status();
      });
  // Tags: a server stream of `seq` Pongs carrying the tag.
  svc.add_server_stream<slotrpc::test::Ping, slotrpc::test::Pong>(
      "Tags", [tag](const slotrpc::test::Ping& req, slotrpc::ServerWriter<slotrpc::test::Pong>& out,
                    slotrpc::ServerCall&) {
        for (uint64_t i = 0; i < req.seq(); ++i) {
          const bool ok = out.Write([&](flatbuffers::FlatBufferBuilder& fbb) {
            return slotrpc::test::CreatePong(fbb, i, fbb.CreateString(tag));
          });
          if (!ok) return out.error();
        }
        return slotrpc::Status();
      });
  // Chat: a bidi stream that answers each Ping with Pong{seq, tag}.
  svc.add_bidi_stream<slotrpc::test::Ping, slotrpc::test::Pong>(
      "Chat", [tag](slotrpc::ServerReaderWriter<slotrpc::test::Ping, slotrpc::test::Pong>& stream,
                    slotrpc::ServerCall&) {
        while (const slotrpc::test::Ping* p = stream.Read()) {
          const uint64_t seq = p->seq();
          const bool ok = stream.Write([&](flatbuffers::FlatBufferBuilder& fbb) {
            return slotrpc::test::CreatePong(fbb, seq, fbb.CreateString(tag));
          });
          if (!ok) return stream.write_error();
        }
        return slotrpc::Status();
      });
  return svc;
}

inline std::unique_ptr<slotrpc::Server> start_who(const std::string& tag, const std::string& listen = "127.0.0.1:0") {
  auto s = std::make_unique<slotrpc::Server>();
  REQUIRE(s->add_service(who_service(tag)).ok());
  REQUIRE(s->add_service(who_service(tag, "slotrpc.test.Other")).ok());
  const slotrpc::Status st = s->start(listen);
  if (!st.ok()) return nullptr;
  return s;
}

inline slotrpc::RequestWriter who(uint64_t seq, uint32_t sleep_ms = 0) {
  return slotrpc::test_payloads::ping(seq, "", 0, sleep_ms);
}

// The body of "helper: fleet server": FLEET_TAG, FLEET_PORT_FILE.
inline void run_fleet_server() {
  const char* tag = std::getenv("FLEET_TAG");
  const char* port_file = std::getenv("FLEET_PORT_FILE");
  REQUIRE(tag != nullptr);
  REQUIRE(port_file != nullptr);
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGUSR1);
  sigaddset(&signals, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  auto server = start_who(tag);
  REQUIRE(server != nullptr);
  const std::string tmp = std::string(port_file) + ".tmp";
  {
    std::ofstream out(tmp);
    out << server->port() << "\n";
  }
  std::filesystem::rename(tmp, port_file);
  int sig = 0;
  while (sigwait(&signals, &sig) == 0 && sig != SIGTERM)
    REQUIRE(server->set_serving("slotrpc.test.Fleet", sig == SIGUSR2).ok());
  server->shutdown(5s);  // a drain: NOT_SERVING, calls in flight finish
}

struct FleetServer {
  std::unique_ptr<test_process::Child> child;
  uint16_t port = 0;
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
};

inline FleetServer start_fleet_server(const std::filesystem::path& dir, const std::string& tag) {
  auto o = test_process::SpawnOptions::to_file(dir / (tag + ".log"));
  const auto port_file = dir / (tag + ".port");
  o.env = {"FLEET_TAG=" + tag, "FLEET_PORT_FILE=" + port_file.string()};
  FleetServer s;
  s.child = std::make_unique<test_process::Child>(
      std::vector<std::string>{test_process::self_exe(), "--no-skip", "--test-case=helper: fleet server"}, o);
  const auto up = test_process::wait_for_port_file(port_file, *s.child, 20000ms);
  REQUIRE_MESSAGE(up.port != 0, "fleet server " << tag << " did not start: "
                                                << test_process::read_file(dir / (tag + ".log")));
  s.port = up.port;
  return s;
}

inline std::string list_target(const std::vector<FleetServer>& servers) {
  std::string t = "list://";
  for (size_t i = 0; i < servers.size(); ++i) t += (i ? "," : "") + servers[i].address();
  return t;
}

}  // namespace fleet_test
