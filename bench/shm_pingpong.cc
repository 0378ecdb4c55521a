// Ping-pong round trips between two processes (this one and a forked
// child), busy polling, for the shared-memory transport and its limits:
//
//   shm      ShmTransport/ShmLink: the client builds its message in the
//            shared send slot (in place), the server gets it copied into its
//            private receive slot (the transport's one copy), builds the
//            reply the same way.
//   tcp      TcpTransport over loopback TCP, same loop (for comparison).
//   line     the raw limit: one cache line each way, a store and a spin.
//   memcpy   the copy limit: per hop the sender memcpys the payload into
//            shared memory and the receiver memcpys it out, then a flag.
//            The same copies as `shm` with nothing else.
//
//   build/bench/shm_pingpong [--iterations N] [--sizes 64,65536] [--modes shm,tcp,line,memcpy]
//
// Prints p50 / p99 / mean round trip in microseconds, one line per mode and
// size.  Figures, not a test: the numbers depend on the machine and its load.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/wire_format.h"
#include "transport/shm/shm_transport.h"
#include "transport/tcp/tcp_transport.h"

namespace {

using namespace slotrpc;
using namespace slotrpc::transport;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

int g_iterations = 20000;
constexpr int kWarmup = 2000;

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "shm_pingpong: %s\n", why.c_str());
  std::exit(1);
}

void report(const char* mode, uint32_t size, std::vector<double>& us) {
  std::sort(us.begin(), us.end());
  double sum = 0;
  for (double v : us) sum += v;
  const auto at = [&](double q) { return us[std::min(us.size() - 1, size_t(q * double(us.size())))]; };
  std::printf("%-7s %7u B  p50 %8.2f us  p99 %8.2f us  mean %8.2f us  (%zu round trips)\n", mode,
              size, at(0.50), at(0.99), sum / double(us.size()), us.size());
  std::fflush(stdout);
}

// One side of the transport ping-pong.  Slot 0 only: one message in flight.
void transport_side(bool client, Transport& t, Link& link, uint32_t size, std::vector<double>* out) {
  const uint32_t slot_size = size + 64;
  std::vector<std::byte> recv(slot_size), send(slot_size), src(size, std::byte{0x5a});
  if (!link.attach({recv.data(), recv.size()}, {send.data(), send.size()}, 1, slot_size, nullptr).ok())
    die("attach");
  std::array<Completion, 16> buf;
  auto wait_message = [&](uint64_t i) {
    for (;;) {
      const size_t n = t.poll(buf);
      for (size_t k = 0; k < n; ++k) {
        if (buf[k].kind == Completion::Kind::kLinkDown) die("link down: " + link.down_reason());
        if (buf[k].kind == Completion::Kind::kMessage) {
          uint64_t got;
          std::memcpy(&got, recv.data(), sizeof got);
          if (got != i) die("out of order");
          return;
        }
      }
    }
  };
  auto send_message = [&](uint64_t i) {
    std::span<std::byte> shared = link.send_slots();
    // In place where the transport offers it (shm), else the private ring.
    std::byte* slot = shared.empty() ? send.data() : shared.data();
    std::memcpy(slot, src.data(), size);  // "building" the message
    std::memcpy(slot, &i, sizeof i);
    const Outgoing o{slot, size, core::make_imm(0, 1), Delivery::kSlot};
    link.arm(0);  // the answer may land now
    link.post({&o, 1});
  };
  const int total = kWarmup + g_iterations;
  if (client) out->reserve(size_t(g_iterations));
  for (int i = 0; i < total; ++i) {
    if (client) {
      const auto t0 = Clock::now();
      send_message(uint64_t(i));
      wait_message(uint64_t(i));
      const auto t1 = Clock::now();
      if (i >= kWarmup) out->push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    } else {
      link.arm(0);
      wait_message(uint64_t(i));
      send_message(uint64_t(i));
    }
  }
  // Let the last answer be taken before the link closes.
  if (!client) {
    for (;;) {
      const size_t n = t.poll(buf);
      bool down = false;
      for (size_t k = 0; k < n; ++k) down |= buf[k].kind == Completion::Kind::kLinkDown;
      if (down) break;
    }
  }
}

void run_shm(uint32_t size) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) die("socketpair");
  const shm::Geometry g{1, size + 64};
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(sv[0]);
    shm::ShmTransport t;
    auto link = t.adopt(sv[1], g, 5s, "server");
    if (!link.ok()) die(link.status().message());
    transport_side(false, t, *link.value(), size, nullptr);
    ::_exit(0);
  }
  ::close(sv[1]);
  std::vector<double> us;
  {
    shm::ShmTransport t;
    auto link = t.adopt(sv[0], g, 5s, "client");
    if (!link.ok()) die(link.status().message());
    transport_side(true, t, *link.value(), size, &us);
    const auto& st = link.value()->shm_stats();
    if (st.copied_sends != 0) die("client copied its sends");
  }
  ::waitpid(pid, nullptr, 0);
  report("shm", size, us);
}

void run_tcp(uint32_t size) {
  const int lst = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (::bind(lst, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(lst, 1) != 0 ||
      ::getsockname(lst, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    die("listen");
  const int c = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (::connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) die("connect");
  const int s = ::accept4(lst, nullptr, nullptr, SOCK_CLOEXEC);
  ::close(lst);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(c);
    TcpTransport t;
    auto link = t.adopt(s, "server");
    if (!link.ok()) die(link.status().message());
    transport_side(false, t, *link.value(), size, nullptr);
    ::_exit(0);
  }
  ::close(s);
  std::vector<double> us;
  {
    TcpTransport t;
    auto link = t.adopt(c, "client");
    if (!link.ok()) die(link.status().message());
    transport_side(true, t, *link.value(), size, &us);
  }
  ::waitpid(pid, nullptr, 0);
  report("tcp", size, us);
}

// The raw limits, over an anonymous shared mapping inherited by the child.
struct alignas(64) Flag {
  std::atomic<uint64_t> v{~uint64_t{0}};
};

void run_line() {
  void* p = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) die("mmap");
  auto* ping = new (p) Flag;
  auto* pong = new (static_cast<char*>(p) + 64) Flag;
  const int total = kWarmup + g_iterations;
  const pid_t pid = ::fork();
  if (pid == 0) {
    for (int i = 0; i < total; ++i) {
      while (ping->v.load(std::memory_order_acquire) != uint64_t(i)) {
      }
      pong->v.store(uint64_t(i), std::memory_order_release);
    }
    ::_exit(0);
  }
  std::vector<double> us;
  us.reserve(size_t(g_iterations));
  for (int i = 0; i < total; ++i) {
    const auto t0 = Clock::now();
    ping->v.store(uint64_t(i), std::memory_order_release);
    while (pong->v.load(std::memory_order_acquire) != uint64_t(i)) {
    }
    const auto t1 = Clock::now();
    if (i >= kWarmup) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  ::waitpid(pid, nullptr, 0);
  ::munmap(p, 4096);
  report("line", 64, us);
}

void run_memcpy(uint32_t size) {
  const size_t bytes = 4096 + 2 * size_t(size);
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) die("mmap");
  auto* ping = new (p) Flag;
  auto* pong = new (static_cast<char*>(p) + 64) Flag;
  std::byte* a = static_cast<std::byte*>(p) + 4096;
  std::byte* b = a + size;
  std::vector<std::byte> src(size, std::byte{0x5a}), dst(size);
  const int total = kWarmup + g_iterations;
  const pid_t pid = ::fork();
  if (pid == 0) {
    for (int i = 0; i < total; ++i) {
      while (ping->v.load(std::memory_order_acquire) != uint64_t(i)) {
      }
      std::memcpy(dst.data(), a, size);
      std::memcpy(b, src.data(), size);
      pong->v.store(uint64_t(i), std::memory_order_release);
    }
    ::_exit(0);
  }
  std::vector<double> us;
  us.reserve(size_t(g_iterations));
  for (int i = 0; i < total; ++i) {
    const auto t0 = Clock::now();
    std::memcpy(a, src.data(), size);
    ping->v.store(uint64_t(i), std::memory_order_release);
    while (pong->v.load(std::memory_order_acquire) != uint64_t(i)) {
    }
    std::memcpy(dst.data(), b, size);
    const auto t1 = Clock::now();
    if (i >= kWarmup) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  ::waitpid(pid, nullptr, 0);
  ::munmap(p, bytes);
  report("memcpy", size, us);
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) out.push_back(x);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> modes = {"line", "shm", "memcpy", "tcp"};
  std::vector<uint32_t> sizes = {64, 65536};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--iterations") {
      g_iterations = std::stoi(v);
    } else if (k == "--sizes") {
      sizes.clear();
      for (const auto& x : split(v)) sizes.push_back(uint32_t(std::stoul(x)));
    } else if (k == "--modes") {
      modes = split(v);
    } else {
      die("unknown option " + k + " (--iterations N, --sizes A,B, --modes line,shm,memcpy,tcp)");
    }
  }
  if (g_iterations <= 0) die("--iterations must be positive");
  for (const auto& m : modes) {
    if (m == "line") {
      run_line();
      continue;
    }
    for (uint32_t size : sizes) {
      if (size < 8) die("sizes must be at least 8 bytes");
      if (m == "shm") run_shm(size);
      else if (m == "tcp") run_tcp(size);
      else if (m == "memcpy") run_memcpy(size);
      else die("unknown mode " + m);
    }
  }
}
