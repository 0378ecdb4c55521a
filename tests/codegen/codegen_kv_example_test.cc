// examples/kv as a user runs it: a kv_server process, and a kv_client
// process that puts, gets, deletes and scans (a server stream of more than
// 10,000 entries) and checks everything itself.  KV_SERVER and KV_CLIENT
// come from meson.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A child process with stdout and stderr in files; killed and reaped on
// destruction.
struct Child {
  pid_t pid = -1;
  fs::path out, err;
  Child(std::vector<std::string> args, const fs::path& dir, const std::string& name)
      : out(dir / (name + ".out")), err(dir / (name + ".err")) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&actions, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int rc = posix_spawn(&pid, args[0].c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    REQUIRE_MESSAGE(rc == 0, "cannot run " << args[0]);
  }
  // Exit status, or -1 (killed, or still running after `timeout`).
  int wait(std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    int status = 0;
    while (std::chrono::steady_clock::now() < until) {
      const pid_t r = ::waitpid(pid, &status, WNOHANG);
      if (r == pid) {
        pid = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(10ms);
    }
    return -1;
  }
  bool running() {
    if (pid > 0 && ::waitpid(pid, nullptr, WNOHANG) == pid) pid = -1;  // reaped: forget it
    return pid > 0;
  }
  ~Child() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "slotrpc-kv-example.XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace

TEST_CASE("examples/kv: kv_client against a kv_server process, every check passing") {
  TempDir dir;
  const fs::path port_file = dir.path / "port";
  Child server({KV_SERVER, "--listen", "127.0.0.1:0", "--port-file", port_file.string()}, dir.path, "kv_server");
  const auto until = std::chrono::steady_clock::now() + 30s;
  while (!fs::exists(port_file)) {
    REQUIRE_MESSAGE(server.running(), "kv_server exited early: " << read(server.err));
    REQUIRE_MESSAGE(std::chrono::steady_clock::now() < until, "kv_server wrote no port file");
    std::this_thread::sleep_for(10ms);
  }
  std::string port = read(port_file);
  while (!port.empty() && (port.back() == '\n')) port.pop_back();

  Child client({KV_CLIENT, "--connect", "127.0.0.1:" + port, "--count", "12000"}, dir.path, "kv_client");
  const int status = client.wait(240s);
  const std::string out = read(client.out);
  INFO("kv_client stdout:\n" << out << "\nstderr:\n" << read(client.err));
  CHECK(status == 0);
  CHECK(out.find("put 6000 keys in 60 calls and 6000 in one put-many stream") != std::string::npos);
  CHECK(out.find("got all 12000 back, verified") != std::string::npos);
  CHECK(out.find("scan streamed 10800 entries in key order") != std::string::npos);
  CHECK(out.find("watch: 6 events checked while keys and the subscription changed") != std::string::npos);
  CHECK(out.find("all checks passed") != std::string::npos);

  ::kill(server.pid, SIGTERM);
  CHECK(server.wait(30s) == 0);
}

TEST_CASE("examples/kv: kv_client without a server exits 1 with a message") {
  TempDir dir;
  Child client({KV_CLIENT, "--connect", "127.0.0.1:1"}, dir.path, "kv_client");
  CHECK(client.wait(60s) == 1);
  CHECK(read(client.err).find("kv_client: ") != std::string::npos);
}

TEST_CASE("examples/kv: --help exits 0 and lists every flag; a bad flag value exits 2") {
  TempDir dir;
  for (const auto& [program, flags] :
       {std::pair<const char*, std::vector<std::string>>{KV_SERVER, {"--listen", "--port-file"}},
        std::pair<const char*, std::vector<std::string>>{KV_CLIENT, {"--connect", "--count", "--batch"}}}) {
    const char* const program_path = program;  // clang < 16: no lambda capture of a binding (CAPTURE)
    CAPTURE(program_path);
    Child help({program, "--help"}, dir.path, "help");
    CHECK(help.wait(30s) == 0);
    const std::string text = read(help.out);
    for (const std::string& flag : flags) CHECK_MESSAGE(text.find(flag) != std::string::npos, flag);
  }
  Child bad({KV_CLIENT, "--count", "5"}, dir.path, "bad");
  CHECK(bad.wait(30s) == 2);
  CHECK(read(bad.err).find("--count") != std::string::npos);
}
