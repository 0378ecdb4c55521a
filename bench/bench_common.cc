#include "bench_common.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <thread>

namespace bench {

bool write_port_file(const std::string& path, uint16_t port) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << port << "\n";
    if (!out) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

namespace {
sigset_t termination_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}
}  // namespace

void block_termination_signals() {
  const sigset_t set = termination_signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

void wait_for_termination() {
  const sigset_t set = termination_signals();
  int sig = 0;
  sigwait(&set, &sig);
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0) {
    ::kill(pid_, SIGTERM);
    // A stopped server (SIGSTOP, as a failure test does) acts on the TERM
    // only once continued; without this the benchmark waited forever.
    ::kill(pid_, SIGCONT);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  if (!port_file_.empty()) ::unlink(port_file_.c_str());
}

std::string ChildProcess::start(const std::vector<std::string>& args) {
  char tmpl[] = "/tmp/slotrpc-bench-port-XXXXXX";
  const int fd = ::mkstemp(tmpl);
  if (fd < 0) return std::string("mkstemp: ") + std::strerror(errno);
  ::close(fd);
  ::unlink(tmpl);
  port_file_ = tmpl;
  std::vector<std::string> all = {"/proc/self/exe"};
  all.insert(all.end(), args.begin(), args.end());
  all.push_back("--port-file");
  all.push_back(port_file_);
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_ = ::fork();
  if (pid_ < 0) return std::string("fork: ") + std::strerror(errno);
  if (pid_ == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    ::execv("/proc/self/exe", argv.data());
    std::fprintf(stderr, "bench: exec: %s\n", std::strerror(errno));
    ::_exit(127);
  }
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (Clock::now() < deadline) {
    std::ifstream in(port_file_);
    if (in >> port_) return {};
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return "the server process exited early (status " + std::to_string(status) + ")";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling a file; nothing to wait on
  }
  return "the server wrote no port file within 30 s";
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string json_number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

bool finish_results_file(std::string text, const std::string& path) {
  text += "\n  ]\n}\n";
  std::ofstream out(path);
  out << text;
  return static_cast<bool>(out);
}

namespace {
std::string first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

std::string kernel_release() {
  utsname u{};
  ::uname(&u);
  return u.release;
}
}  // namespace

std::string machine_json() {
  return "{\"cpu\": " + json_string(cpu_model()) +
         ", \"hardware_threads\": " + std::to_string(std::thread::hardware_concurrency()) +
         ", \"kernel\": " + json_string(kernel_release()) +
         ", \"loadavg\": " + json_string(first_line("/proc/loadavg")) + "}";
}

std::string machine_line() {
  return cpu_model() + ", " + std::to_string(std::thread::hardware_concurrency()) + " hardware threads, kernel " +
         kernel_release() + ", load " + first_line("/proc/loadavg");
}

}  // namespace bench
