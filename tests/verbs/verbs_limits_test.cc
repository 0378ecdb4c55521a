// Verbs (rxe suite): a server whose locked memory runs out refuses the
// session beyond it with RESOURCE_EXHAUSTED naming RLIMIT_MEMLOCK, and its
// earlier verbs sessions keep working.
//
// The server is this binary run as a child (`--child-memlock PORT_FILE`)
// with a small RLIMIT_MEMLOCK.  The VM runs everything as root, and
// CAP_IPC_LOCK exempts a process from RLIMIT_MEMLOCK (ib_umem_get checks
// it), so the child drops that capability first: then ibv_reg_mr fails
// with ENOMEM exactly as for an unprivileged server under `ulimit -l`.
// SLOTRPC_MAX_RING_MEMORY is set high in the child so that the kernel's
// limit, not the server's own budget, is what runs out.
#include <doctest/doctest.h>
#include <linux/capability.h>
#include <signal.h>
#include <slotrpc/slotrpc.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "test_messages_generated.h"
#include "verbs_test_util.h"

namespace {

using namespace std::chrono_literals;
using slotrpc::Channel;
using slotrpc::Config;
using slotrpc::Server;
using slotrpc::ServerCall;
using slotrpc::ServiceDefinition;
using slotrpc::Status;
using slotrpc::StatusCode;
using slotrpc::TransportKind;

constexpr uint32_t kEcho = slotrpc::method_id("slotrpc.test.Limits.Echo");
constexpr rlim_t kMemlock = 8u << 20;

Config session_config() {
  Config c;
  c.slot_count = 16;
  c.slot_size = 65536;  // 1 MiB per ring: the server pins 2 MiB per session
  c.transport = TransportKind::kVerbs;
  return c;
}

int run_child(int argc, char** argv) {
  if (argc < 3) return 2;
  // Drop CAP_IPC_LOCK (effective and permitted) so RLIMIT_MEMLOCK applies.
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  if (::syscall(SYS_capget, &hdr, data) != 0) return 3;
  data[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
  data[CAP_IPC_LOCK / 32].permitted &= ~(1u << (CAP_IPC_LOCK % 32));
  data[CAP_IPC_LOCK / 32].inheritable &= ~(1u << (CAP_IPC_LOCK % 32));
  if (::syscall(SYS_capset, &hdr, data) != 0) return 4;
  rlimit rl{kMemlock, kMemlock};
  if (::setrlimit(RLIMIT_MEMLOCK, &rl) != 0) return 5;
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  Config c = session_config();
  c.max_ring_memory = 1ull << 40;
  Server server(c);
  ServiceDefinition svc("slotrpc.test.Limits");
  svc.add_unary<slotrpc::test::Ping>("Echo", [](const slotrpc::test::Ping& req,
                                                flatbuffers::FlatBufferBuilder& out,
                                                ServerCall&) -> Status {
    out.Finish(slotrpc::test::CreatePong(out, req.seq()));
    return {};
  });
  if (!server.add_service(std::move(svc)).ok()) return 1;
  if (auto st = server.start("127.0.0.1:0"); !st.ok()) {
    std::fprintf(stderr, "child: %s\n", st.to_string().c_str());
    return 1;
  }
  const std::string file = argv[2];
  { std::ofstream(file + ".tmp") << server.port() << "\n"; }
  std::rename((file + ".tmp").c_str(), file.c_str());
  int sig = 0;
  sigwait(&signals, &sig);
  server.stop();
  return 0;
}

std::string call_once(Channel& ch, uint64_t seq) {
  auto f = ch.call_typed<slotrpc::test::Pong>(kEcho, [seq](flatbuffers::FlatBufferBuilder& fbb) {
    fbb.Finish(slotrpc::test::CreatePing(fbb, seq));
  });
  if (!f.wait_for(10s)) return "no reply";
  auto r = f.get();
  if (!r.ok()) return r.status().to_string();
  return r->seq() == seq ? "" : "wrong seq";
}

}  // namespace

TEST_CASE("verbs: a server out of locked memory refuses naming RLIMIT_MEMLOCK and keeps serving") {
  test_process::TempDir dir("slotrpc-limits");
  const std::string port_file = (dir.path / "port").string();
  test_process::Child child({test_process::self_exe(), "--child-memlock", port_file},
                            test_process::SpawnOptions::to_file(dir.path / "stderr"));
  const auto up = test_process::wait_for_port_file(port_file, child, 20000ms);
  REQUIRE_MESSAGE((up.port != 0 || up.exited), "child server did not start");
  REQUIRE_MESSAGE(up.port != 0, "child server exited early");
  const uint16_t port = up.port;
  const std::string address = "127.0.0.1:" + std::to_string(port);

  std::vector<std::unique_ptr<Channel>> open;
  Status refused;
  for (int i = 0; i < 20 && refused.ok(); ++i) {
    auto ch = Channel::connect(address, session_config());
    if (ch.ok()) {
      REQUIRE((*ch)->transport() == TransportKind::kVerbs);
      open.push_back(std::move(ch).value());
    } else {
      refused = ch.status();
    }
  }
  MESSAGE(open.size() << " verbs sessions under RLIMIT_MEMLOCK = " << kMemlock
                      << ", then: " << refused.to_string());
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.code() == StatusCode::kResourceExhausted);
  CHECK_MESSAGE(refused.message().find("RLIMIT_MEMLOCK") != std::string::npos, refused.message());
  REQUIRE(open.size() >= 1);
  for (size_t i = 0; i < open.size(); ++i) CHECK(call_once(*open[i], i) == "");
  CHECK_MESSAGE(child.running(), "the server process died");
}

int main(int argc, char** argv) {
  return verbs_test::main(argc, argv, [](int c, char** v) {
    return std::string(v[1]) == "--child-memlock" ? run_child(c, v) : 2;
  });
}
