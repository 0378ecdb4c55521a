// Process plumbing of the tests, in one place: child processes (spawned
// with their arguments, environment, resource limit and output files),
// port files, bounded waits, stopping (SIGSTOP, waited for), killing and
// reaping, and what /proc says about a process (state, CPU, RSS, fds).
//
// Used by the tests that run servers or clients in child processes
// (failure_util.h, admission_util.h, two_process, rpc_faults, buffers,
// admission_oom, the verbs tests).  It holds no assertions: every piece
// returns what happened and the test asserts on it, so a test's checks
// stay where they are read.  Every wait is bounded; a Child is SIGKILLed
// and reaped when it goes out of scope, also when a check failed.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

extern char** environ;

namespace test_process {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// The whole file, or "" if it cannot be read.
inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Polls `done` every `poll` until it holds (true) or `limit` passes (false).
inline bool wait_until(const std::function<bool()>& done, milliseconds limit = milliseconds(10000),
                       milliseconds poll = milliseconds(1)) {
  const auto until = Clock::now() + limit;
  while (!done()) {
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(poll);
  }
  return true;
}

// A fresh directory under the temp dir, removed with everything in it.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& prefix = "slotrpc-test") {
    std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    if (::mkdtemp(tmpl.data()) == nullptr)
      throw std::runtime_error("mkdtemp " + tmpl + ": " + std::strerror(errno));
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

// The executable an environment variable names (ECHO_SERVER, ...: set by
// meson test), or nullptr and `error` says what is wrong.
inline const char* binary_from_env(const char* env, std::string* error) {
  const char* exe = std::getenv(env);
  if (exe == nullptr) {
    *error = std::string(env) + " is not set (run through meson test)";
    return nullptr;
  }
  if (::access(exe, X_OK) != 0) {
    *error = std::string(exe) + " is not executable";
    return nullptr;
  }
  return exe;
}

// This test binary (for children that run its own "--child..." modes).
inline std::string self_exe() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

// Waits up to `limit` for `pid` to exit and reaps it; fills `status`.
inline bool wait_exit(pid_t pid, milliseconds limit, int* status) {
  const auto until = Clock::now() + limit;
  for (;;) {
    const pid_t r = ::waitpid(pid, status, WNOHANG);
    if (r == pid) return true;
    if (r < 0 && errno != EINTR) return false;
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(milliseconds(1));
  }
}

// ------------------------------------------------------------------ /proc

// Fields of /proc/PID/stat after the command name (which may hold spaces
// and parentheses): [0] is field 3 (state), [11] field 14 (utime), ...
inline std::vector<std::string> stat_fields(pid_t pid) {
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = stat.rfind(')');
  std::vector<std::string> out;
  if (paren == std::string::npos || paren + 2 >= stat.size()) return out;
  std::istringstream in(stat.substr(paren + 2));
  std::string field;
  while (in >> field) out.push_back(field);
  return out;
}

// The state letter of /proc/PID/stat ('R', 'S', 'T', 'Z', ...), or 0.
inline char process_state(pid_t pid) {
  const auto f = stat_fields(pid);
  return f.empty() || f[0].empty() ? 0 : f[0][0];
}

// utime + stime (fields 14 and 15 of /proc/PID/stat), in clock ticks; 0 if
// unreadable.
inline uint64_t cpu_ticks(pid_t pid) {
  const auto f = stat_fields(pid);
  if (f.size() < 13) return 0;
  return std::stoull(f[11]) + std::stoull(f[12]);
}

inline double cpu_seconds(pid_t pid) { return double(cpu_ticks(pid)) / double(::sysconf(_SC_CLK_TCK)); }

// A "Name: value kB" line of /proc/PID/status (VmRSS, VmSize, ...), in
// KiB; 0 if unreadable.  pid 0 reads /proc/self.
inline long status_kib(pid_t pid, const std::string& name) {
  std::ifstream in(pid == 0 ? std::string("/proc/self/status") : "/proc/" + std::to_string(pid) + "/status");
  const std::string key = name + ":";
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::strtol(line.c_str() + key.size(), nullptr, 10);
  return 0;
}

// Resident set of `pid` in KiB (VmRSS); 0 if unreadable.
inline long rss_kib(pid_t pid) { return status_kib(pid, "VmRSS"); }

// Open file descriptors of `pid` (entries of /proc/PID/fd); -1 if unreadable.
inline int fd_count(pid_t pid) {
  std::error_code ec;
  std::filesystem::directory_iterator it("/proc/" + std::to_string(pid) + "/fd", ec);
  if (ec) return -1;
  int n = 0;
  for (const auto& e : it) {
    (void)e;
    ++n;
  }
  return n;
}

// ------------------------------------------------------------ Child

// How to start a child.
struct SpawnOptions {
  // Where its stdout and stderr go (empty: inherited).  The same path for
  // both makes one file, in the order the child wrote them.
  std::filesystem::path stdout_path, stderr_path;
  // Added to this process's environment; replaces a variable of the same
  // name.
  std::vector<std::string> env;
  // Inherited variables starting with this are dropped (e.g. "SLOTRPC_":
  // only `env`'s settings reach the child).
  std::string drop_env_prefix;
  // A resource limit set in the child before exec (RLIMIT_*; -1: none).
  int rlimit_resource = -1;
  rlim_t rlimit_value = 0;

  // stdout and stderr to DIR/NAME.stdout and DIR/NAME.stderr.
  static SpawnOptions to_files(const std::filesystem::path& dir, const std::string& name) {
    SpawnOptions o;
    o.stdout_path = dir / (name + ".stdout");
    o.stderr_path = dir / (name + ".stderr");
    return o;
  }
  // Both streams into one file (a server's log goes wherever spdlog sends it).
  static SpawnOptions to_file(const std::filesystem::path& log) {
    SpawnOptions o;
    o.stdout_path = o.stderr_path = log;
    return o;
  }
};

// A child process: SIGKILLed and reaped on destruction unless it was
// reaped before.  `pid` is -1 once reaped; `exit_status` then holds how it
// ended.
class Child {
 public:
  pid_t pid = -1;
  int exit_status = 0;
  std::filesystem::path out, err;

  // Runs args[0] with `args`.  Throws std::runtime_error naming the
  // program if it cannot be started.
  explicit Child(std::vector<std::string> args, const SpawnOptions& o = {}) : out(o.stdout_path), err(o.stderr_path) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_store;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string s = *e;
      if (!o.drop_env_prefix.empty() && s.rfind(o.drop_env_prefix, 0) == 0) continue;
      bool replaced = false;
      for (const auto& x : o.env) replaced = replaced || s.substr(0, s.find('=') + 1) == x.substr(0, x.find('=') + 1);
      if (!replaced) env_store.push_back(s);
    }
    env_store.insert(env_store.end(), o.env.begin(), o.env.end());
    std::vector<char*> envp;
    for (auto& e : env_store) envp.push_back(e.data());
    envp.push_back(nullptr);
    if (o.rlimit_resource >= 0) {
      spawn_with_rlimit(args[0], argv, envp, o);
    } else {
      posix_spawn_file_actions_t fa;
      posix_spawn_file_actions_init(&fa);
      if (!out.empty()) posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (!err.empty()) {
        if (err == out)
          posix_spawn_file_actions_adddup2(&fa, 1, 2);
        else
          posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      }
      const int rc = ::posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), envp.data());
      posix_spawn_file_actions_destroy(&fa);
      if (rc != 0) {
        pid = -1;
        throw std::runtime_error("posix_spawn " + args[0] + ": " + std::strerror(rc));
      }
    }
  }
  // Adopts a child this process forked itself.
  static Child adopt(pid_t forked) { return Child(forked); }

  ~Child() { kill_and_reap(); }
  Child(Child&& o) noexcept : pid(std::exchange(o.pid, -1)), exit_status(o.exit_status), out(o.out), err(o.err) {}
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  // True while it runs; once it has exited it is reaped here.
  bool running() {
    if (pid <= 0) return false;
    if (::waitpid(pid, &exit_status, WNOHANG) != pid) return true;
    pid = -1;
    return false;
  }
  // Bounded wait for exit; false (the child is left to the destructor) on
  // timeout.
  bool wait(milliseconds limit, int* status = nullptr) {
    if (pid <= 0 || !wait_exit(pid, limit, &exit_status)) return false;
    pid = -1;
    if (status != nullptr) *status = exit_status;
    return true;
  }
  bool signal(int sig) const { return pid > 0 && ::kill(pid, sig) == 0; }
  // SIGSTOP, then waits (waitpid WUNTRACED) until the kernel reports it
  // stopped: the signal is delivered asynchronously, and until then it may
  // still answer.  False if it did not stop within `limit` or exited
  // instead (then it is reaped and `exit_status` says how).
  bool stop(milliseconds limit = milliseconds(5000)) {
    if (!signal(SIGSTOP)) return false;
    return wait_stopped(limit);
  }
  bool wait_stopped(milliseconds limit) {
    const auto until = Clock::now() + limit;
    for (;;) {
      int status = 0;
      const pid_t r = ::waitpid(pid, &status, WNOHANG | WUNTRACED);
      if (r == pid && WIFSTOPPED(status)) return true;
      if (r == pid) {  // exited instead
        exit_status = status;
        pid = -1;
        return false;
      }
      if (r < 0 && errno != EINTR) return false;
      if (Clock::now() >= until) return false;
      std::this_thread::sleep_for(milliseconds(1));
    }
  }
  // SIGKILL and reap, waiting at most `limit`; true once reaped (or there
  // was nothing to reap).  `exit_status` then holds how it ended.
  bool kill_and_reap(milliseconds limit = milliseconds(10000)) {
    if (pid <= 0) return true;
    ::kill(pid, SIGKILL);
    const bool reaped = wait_exit(pid, limit, &exit_status);
    pid = -1;
    return reaped;
  }

  std::string stdout_text() const { return read_file(out); }
  std::string stderr_text() const { return read_file(err); }

 private:
  explicit Child(pid_t forked) : pid(forked) {}

  // fork + setrlimit + exec: posix_spawn cannot set a limit in the child.
  void spawn_with_rlimit(const std::string& exe, std::vector<char*>& argv, std::vector<char*>& envp,
                         const SpawnOptions& o) {
    pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork: " + std::string(std::strerror(errno)));
    if (pid == 0) {
      // Only async-signal-safe calls between fork and exec.
      if (!out.empty()) {
        const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd >= 0) ::dup2(fd, 1);
        if (fd >= 0 && err == out) ::dup2(fd, 2);
      }
      if (!err.empty() && err != out) {
        const int fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd >= 0) ::dup2(fd, 2);
      }
      rlimit rl{o.rlimit_value, o.rlimit_value};
      if (::setrlimit(o.rlimit_resource, &rl) != 0) ::_exit(120);
      ::execve(exe.c_str(), argv.data(), envp.data());
      ::_exit(121);
    }
  }
};

// What a child wrote into its port file.
struct PortFile {
  uint16_t port = 0;    // 0: none within the limit, or the child exited first
  bool exited = false;  // the child exited before it wrote one
};

// Waits up to `limit` for `file` to hold a port number (servers write it
// whole, by rename, once they listen), or for `child` to exit.
inline PortFile wait_for_port_file(const std::filesystem::path& file, Child& child, milliseconds limit) {
  PortFile r;
  wait_until(
      [&] {
        std::ifstream in(file);
        unsigned p = 0;
        if (in >> p) r.port = static_cast<uint16_t>(p);
        if (r.port != 0) return true;
        r.exited = !child.running();
        return r.exited;
      },
      limit, milliseconds(2));
  return r;
}

// A server child that listens: what start_echo_server() returns.
struct Listening {
  std::unique_ptr<Child> child;  // null if it could not be started
  uint16_t port = 0;             // 0: it does not listen, and `error` says why
  std::string error;
};

// examples/echo/echo_server (ECHO_SERVER) --listen 127.0.0.1:0 --port-file
// DIR/port, started with `o`, once it listens (its port file is written);
// at most `limit`.
inline Listening start_echo_server(const std::filesystem::path& dir, const SpawnOptions& o,
                                   milliseconds limit = milliseconds(15000)) {
  Listening r;
  const char* exe = binary_from_env("ECHO_SERVER", &r.error);
  if (exe == nullptr) return r;
  const std::string port_file = (dir / "port").string();
  try {
    r.child = std::make_unique<Child>(std::vector<std::string>{exe, "--listen", "127.0.0.1:0", "--port-file", port_file}, o);
  } catch (const std::exception& e) {
    r.error = e.what();
    return r;
  }
  const PortFile up = wait_for_port_file(port_file, *r.child, limit);
  r.port = up.port;
  if (up.exited) r.error = "echo_server exited early: " + r.child->stderr_text();
  else if (up.port == 0) r.error = "echo_server wrote no port file";
  return r;
}

}  // namespace test_process
