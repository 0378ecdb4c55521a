// A real etcd for the discovery tests: etcd-server (Debian's 3.4, from
// scripts/install-deps.sh) on loopback ports in a temp dir, stopped and
// removed at the end.  No etcd installed is a failure that says how to get
// it, never a skip.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>

#include "process_util.h"
#include "rpc/discovery/etcd_client.h"

namespace etcd_test {

// A free loopback port (bound and released: etcd binds it next).
inline uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// The etcd binary, or "" (the caller fails with install_hint()).
inline std::string etcd_binary() {
  for (const char* p : {"/usr/bin/etcd", "/usr/local/bin/etcd"})
    if (::access(p, X_OK) == 0) return p;
  return "";
}

inline const char* install_hint() {
  return "etcd is not installed: these tests start a real etcd server; run scripts/install-deps.sh "
         "(Debian's etcd-server and etcd-client)";
}

class Etcd {
 public:
  // Starts etcd on a fresh port in `dir`; error() says why not.
  explicit Etcd(const std::filesystem::path& dir) : dir_(dir), client_port_(free_port()) { start(); }

  // Starts it again on the same port and data (after stop()).
  bool start() {
    const std::string exe = etcd_binary();
    if (exe.empty()) {
      error_ = install_hint();
      return false;
    }
    const uint16_t peer = free_port();
    const std::string client_url = "http://127.0.0.1:" + std::to_string(client_port_);
    const std::string peer_url = "http://127.0.0.1:" + std::to_string(peer);
    child_ = std::make_unique<test_process::Child>(
        std::vector<std::string>{exe, "--name", "slotrpc-test", "--data-dir", (dir_ / "data").string(),
                                 "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
                                 "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                                 "--initial-cluster", "slotrpc-test=" + peer_url},
        test_process::SpawnOptions::to_file(dir_ / "etcd.log"));
    // Up once it answers a range on its gateway.
    slotrpc::rpc::discovery::Interrupt never;
    slotrpc::rpc::discovery::EtcdClient client(endpoint(), never, std::chrono::milliseconds(500));
    const bool up = test_process::wait_until(
        [&] { return client.range_prefix("/").ok() || !child_->running(); }, std::chrono::seconds(20),
        std::chrono::milliseconds(20));
    if (!up || !child_->running()) {
      error_ = "etcd did not come up on port " + std::to_string(client_port_) + ": " +
               test_process::read_file(dir_ / "etcd.log").substr(0, 2000);
      return false;
    }
    error_.clear();
    return true;
  }
  void stop() {
    if (child_ == nullptr) return;
    child_->signal(SIGTERM);
    if (!child_->wait(std::chrono::seconds(10))) child_->kill_and_reap();
    child_.reset();
  }
  ~Etcd() {
    signal(SIGCONT);  // a test that paused it and failed
    stop();
  }
  // SIGSTOP: an etcd that hangs (connects succeed, nothing answers); SIGCONT.
  bool signal(int sig) { return child_ != nullptr && child_->signal(sig); }
  // Deletes its data (stopped): the next start() is a new, empty etcd.
  void wipe() {
    std::error_code ec;
    std::filesystem::remove_all(dir_ / "data", ec);
  }

  const std::string& error() const { return error_; }
  uint16_t port() const { return client_port_; }
  slotrpc::base::Endpoint endpoint() const { return {"127.0.0.1", client_port_}; }
  // "127.0.0.1:PORT/prefix": a resolver's REST, and after "etcd://" a target.
  std::string rest(const std::string& prefix) const {
    return "127.0.0.1:" + std::to_string(client_port_) + "/" + prefix;
  }

 private:
  std::filesystem::path dir_;
  uint16_t client_port_;
  std::unique_ptr<test_process::Child> child_;
  std::string error_;
};

}  // namespace etcd_test
