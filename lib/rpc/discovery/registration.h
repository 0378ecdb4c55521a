// A server's entry in etcd (Server::register_with): the key
// "/prefix/HOST:PORT" = "HOST:PORT" under a lease of kLeaseTtl, which a
// thread keeps alive.  A process that dies stops the keep-alives and etcd
// deletes the key when the lease expires; a lease that is lost all the same
// (etcd restarted, a long pause) is granted and the key put again.
// withdraw() deletes the key at once: Server::stop() and the start of
// shutdown(grace), so that resolvers drop the server before it goes.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "rpc/discovery/etcd_client.h"
#include "rpc/discovery/etcd_target.h"
#include "slotrpc/result.h"

namespace slotrpc::rpc::discovery {

// Long enough to ride out a pause of a second or two, short enough that a
// dead server leaves its clients' lists within a few seconds.
constexpr std::chrono::seconds kLeaseTtl{3};
// The most withdraw() (and so Server::stop()) waits for etcd: a healthy
// etcd answers within milliseconds, and a key left behind expires with its
// lease anyway.
constexpr std::chrono::milliseconds kWithdrawWait{500};

class Registration {
 public:
  // Checks `target` ("etcd://HOST:PORT/prefix") and `address`
  // ("HOST:PORT", what clients connect to); starts nothing.
  static Result<std::unique_ptr<Registration>> make(const std::string& target, const std::string& address);
  // make() with `address`, or when it is empty the listen address with
  // its bound port (127.0.0.1 for a wildcard host, IPv6 in brackets), then
  // start(): what Server::start() does after register_with().
  static Result<std::unique_ptr<Registration>> start(const std::string& target, const std::string& address,
                                                     const std::string& listen_address, uint16_t port);
  ~Registration();

  const std::string& address() const { return address_; }
  // Registers, in the background (a first failure is logged and retried).
  void start();
  // Stops the keep-alives (a request in flight included) and deletes the
  // key, waiting at most kWithdrawWait for etcd.  Idempotent; also what the
  // destructor does.
  void withdraw();

 private:
  Registration(EtcdTarget target, std::string address);
  void run();
  EtcdTarget target_;
  std::string address_;
  std::string key_;
  Interrupt interrupt_;
  EtcdClient client_;
  std::thread thread_;
  int64_t lease_ = 0;  // the thread's until withdraw() joined it
  bool withdrawn_ = false;
};

}  // namespace slotrpc::rpc::discovery
