// Integration: a server that runs out of memory while setting up a session
// refuses that session with RESOURCE_EXHAUSTED naming memory, and keeps
// serving every other one (it used to abort).
//
// The server runs in a child forked from this test before any thread
// exists (this executable has this one test for that reason).
//
// How memory runs out:
//   * release build: setrlimit(RLIMIT_AS) in the child, as `prlimit --as`
//     does to a real server;
//   * under AddressSanitizer RLIMIT_AS cannot work (ASan reserves terabytes
//     of shadow memory up front), so this executable interposes mmap: in
//     the child, large anonymous mappings (the rings: 4 MiB each) fail with
//     ENOMEM after a budget.  The library's mmap call resolves to this
//     definition; ASan's own allocator uses raw system calls and is not
//     affected.  Same failure (mmap returns MAP_FAILED, errno ENOMEM), same
//     code path in the server.
#include <sys/mman.h>
#include <sys/syscall.h>

#include <atomic>
#include <memory>

#include "admission_util.h"
#include "test_messages_generated.h"

#if defined(__SANITIZE_ADDRESS__)
#define SLOTRPC_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SLOTRPC_TEST_ASAN 1
#endif
#endif

#ifdef SLOTRPC_TEST_ASAN
namespace {
// Large anonymous mappings still allowed; < 0 = no limit (the parent).
std::atomic<long> g_large_mappings_left{-1};
constexpr size_t kLarge = 1 << 20;
}  // namespace

extern "C" void* mmap(void* addr, size_t len, int prot, int flags, int fd, off_t off) {
  if ((flags & MAP_ANONYMOUS) != 0 && len >= kLarge && g_large_mappings_left.load() >= 0) {
    if (g_large_mappings_left.fetch_sub(1) <= 0) {
      errno = ENOMEM;
      return MAP_FAILED;
    }
  }
  return reinterpret_cast<void*>(::syscall(SYS_mmap, addr, len, prot, flags, fd, off));
}
#endif

namespace {

using namespace admission_test;
using slotrpc::Channel;
using slotrpc::Config;
using slotrpc::Server;
using slotrpc::ServerCall;
using slotrpc::ServiceDefinition;
using slotrpc::Status;
using slotrpc::StatusCode;

constexpr uint32_t kEcho = slotrpc::method_id("slotrpc.test.Oom.Echo");

// The child: a server limited in memory.  Writes its port to `port_fd`,
// then serves until killed.
[[noreturn]] void run_limited_server(int port_fd) {
#ifdef SLOTRPC_TEST_ASAN
  g_large_mappings_left = 2 * 5;  // the rings of 5 sessions
#else
  // What the process has mapped now plus 320 MiB: about 20 sessions of 8 MiB
  // (the server's threads, their malloc arenas and fiber stacks take a share).
  const long vm_kb = test_process::status_kib(0, "VmSize");
  const rlim_t limit = rlim_t(vm_kb) * 1024 + (320ull << 20);
  rlimit rl{limit, limit};
  if (::setrlimit(RLIMIT_AS, &rl) != 0) ::_exit(10);
#endif
  Config cfg;
  cfg.poll_mode = slotrpc::PollMode::kBlocking;
  cfg.max_ring_memory = 1ull << 40;  // not the budget: the memory itself runs out
  auto server = std::make_unique<Server>(cfg);
  ServiceDefinition svc("slotrpc.test.Oom");
  svc.add_unary<slotrpc::test::Ping>("Echo", [](const slotrpc::test::Ping& req,
                                                flatbuffers::FlatBufferBuilder& out,
                                                ServerCall&) -> Status {
    out.Finish(slotrpc::test::CreatePong(out, req.seq()));
    return {};
  });
  if (!server->add_service(std::move(svc)).ok()) ::_exit(11);
  if (!server->start("127.0.0.1:0").ok()) ::_exit(12);
  const uint16_t port = server->port();
  if (::write(port_fd, &port, sizeof port) != sizeof port) ::_exit(13);
  for (;;) ::pause();
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

TEST_CASE("out of memory while opening a session refuses it and keeps the server serving") {
  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(pipe_fds[0]);
    run_limited_server(pipe_fds[1]);
  }
  ::close(pipe_fds[1]);
  test_process::Child server = test_process::Child::adopt(pid);  // killed and reaped at the end
  uint16_t port = 0;
  REQUIRE(::read(pipe_fds[0], &port, sizeof port) == sizeof port);
  ::close(pipe_fds[0]);
  const std::string address = "127.0.0.1:" + std::to_string(port);

  // 64 slots of 64 KiB (the defaults): 8 MiB of server rings per session.
  std::vector<std::unique_ptr<Channel>> open;
  Status refused;
  for (int i = 0; i < 100 && refused.ok(); ++i) {
    auto ch = Channel::connect(address);
    if (ch.ok()) {
      open.push_back(std::move(ch).value());
    } else {
      refused = ch.status();
    }
  }
  MESSAGE(open.size() << " sessions open, then: " << refused.to_string());
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.code() == StatusCode::kResourceExhausted);
  CHECK_MESSAGE(contains(refused.message(), "out of memory"), refused.message());
  REQUIRE(open.size() >= 1);
  CHECK_MESSAGE(server.running(), "the server process died");
  for (size_t i = 0; i < open.size(); ++i) CHECK(call_once(*open[i], i) == "");
#ifndef SLOTRPC_TEST_ASAN
  // The memory of a closed session comes back: one more fits again.  (Under
  // ASan the mmap budget above does not refill on munmap.)
  open.pop_back();
  const auto until = Clock::now() + 10s;
  slotrpc::Result<std::unique_ptr<Channel>> again = Status(StatusCode::kUnavailable, "not tried");
  while (Clock::now() < until) {
    again = Channel::connect(address);
    if (again.ok()) break;
    REQUIRE(again.status().code() == StatusCode::kResourceExhausted);
    std::this_thread::sleep_for(5ms);
  }
  REQUIRE_MESSAGE(again.ok(), again.status().to_string());
  CHECK(call_once(**again, 99) == "");
#endif
  CHECK(server.running());
}
