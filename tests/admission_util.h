// Helpers of the admission tests (tests/admission_test.cc,
// tests/admission_oom_test.cc): an echo_server child under resource limits,
// its CPU time, and checked calls of the echo example's method.
#pragma once

#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <slotrpc/slotrpc.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

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

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "slotrpc-admission-XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// utime + stime of `pid`, in seconds (/proc/PID/stat fields 14 and 15).
inline double cpu_seconds(pid_t pid) {
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = stat.rfind(')');
  REQUIRE(paren != std::string::npos);
  std::istringstream in(stat.substr(paren + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && in >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return double(utime + stime) / double(::sysconf(_SC_CLK_TCK));
}

// An echo_server child with one resource limit set before exec; killed and
// reaped on destruction.
struct LimitedEchoServer {
  pid_t pid = -1;
  uint16_t port = 0;
  TempDir dir;

  LimitedEchoServer(int resource, rlim_t limit, std::vector<std::string> env_extra = {}) {
    const char* exe = std::getenv("ECHO_SERVER");
    REQUIRE_MESSAGE(exe != nullptr, "ECHO_SERVER is not set (run through meson test)");
    const std::string port_file = (dir.path / "port").string();
    const std::string err = (dir.path / "stderr").string();
    std::vector<std::string> args = {exe, "--listen", "127.0.0.1:0", "--port-file", port_file};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_store;
    for (char** e = environ; *e != nullptr; ++e) env_store.emplace_back(*e);
    for (auto& e : env_extra) env_store.push_back(e);
    std::vector<char*> envp;
    for (auto& e : env_store) envp.push_back(e.data());
    envp.push_back(nullptr);
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      // Only async-signal-safe calls between fork and exec.
      const int fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);  // spdlog writes to stdout
        ::dup2(fd, 2);
      }
      rlimit rl{limit, limit};
      if (::setrlimit(resource, &rl) != 0) ::_exit(120);
      ::execve(exe, argv.data(), envp.data());
      ::_exit(121);
    }
    const auto until = Clock::now() + 15s;
    for (;;) {
      const std::string text = read_file(port_file);
      if (!text.empty()) {
        port = static_cast<uint16_t>(std::stoul(text));
        break;
      }
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        pid = -1;
        FAIL("echo_server exited early: " << read_file(err));
      }
      REQUIRE_MESSAGE(Clock::now() < until, "echo_server wrote no port file");
      std::this_thread::sleep_for(5ms);
    }
  }
  ~LimitedEchoServer() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      int status = 0;
      ::waitpid(pid, &status, 0);
    }
  }
  bool alive() const {
    int status = 0;
    return pid > 0 && ::waitpid(pid, &status, WNOHANG) == 0;
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
  std::string log() const { return read_file(dir.path / "stderr"); }  // stdout and stderr
};

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace admission_test
