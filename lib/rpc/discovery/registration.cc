#include "rpc/discovery/registration.h"

#include <fmt/format.h>

#include <algorithm>

#include "base/logging.h"

namespace slotrpc::rpc::discovery {

Result<std::unique_ptr<Registration>> Registration::make(const std::string& target, const std::string& address) {
  constexpr std::string_view kScheme = "etcd://";
  if (target.rfind(kScheme, 0) != 0) {
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("register_with: target '{}' is not etcd://HOST:PORT/prefix (the only registry a "
                              "server registers with)",
                              target));
  }
  auto t = parse_etcd_target(std::string_view(target).substr(kScheme.size()));
  if (!t.ok()) return Status(t.status().code(), "register_with: " + t.status().message());
  auto a = base::parse_address(address);
  if (!a.ok() || a->port == 0 || a->host.empty() || a->host == "0.0.0.0" || a->host == "::") {
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("register_with: address '{}' is not a HOST:PORT clients can connect to{}", address,
                              a.ok() ? "" : ": " + a.status().message()));
  }
  return std::unique_ptr<Registration>(new Registration(std::move(t).value(), address));
}

Result<std::unique_ptr<Registration>> Registration::start(const std::string& target, const std::string& address,
                                                         const std::string& listen_address, uint16_t port) {
  std::string advertised = address;
  if (advertised.empty()) {
    std::string host = listen_address.substr(0, listen_address.rfind(':'));
    if (host == "0.0.0.0" || host == "[::]" || host == "::" || host.empty()) host = "127.0.0.1";
    if (host.find(':') != std::string::npos && host.front() != '[') host = "[" + host + "]";  // IPv6
    advertised = fmt::format("{}:{}", host, port);
  }
  auto r = make(target, advertised);
  if (r.ok()) r.value()->start();
  return r;
}

Registration::Registration(EtcdTarget target, std::string address)
    : target_(std::move(target)),
      address_(std::move(address)),
      key_(target_.key_prefix + address_),
      client_(target_.endpoint, interrupt_) {}

Registration::~Registration() { withdraw(); }

void Registration::start() { thread_ = std::thread([this] { run(); }); }

void Registration::run() {
  auto backoff = std::chrono::milliseconds(100);
  const auto every = std::chrono::duration_cast<std::chrono::milliseconds>(kLeaseTtl) / 3;
  bool failing = false;
  const auto failed = [&](const Status& st) {
    if (st.code() == StatusCode::kCancelled) return false;
    if (!failing)
      base::log().warn("slotrpc: cannot register {} in etcd (retrying): {}", key_, st.message());
    failing = true;
    lease_ = 0;
    if (!interrupt_.sleep_for(backoff)) return false;
    backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
    return true;
  };
  while (!interrupt_.fired()) {
    if (lease_ == 0) {
      auto lease = client_.grant(kLeaseTtl.count());
      if (!lease.ok()) {
        if (!failed(lease.status())) return;
        continue;
      }
      lease_ = lease.value();
      if (Status st = client_.put(key_, address_, lease_); !st.ok()) {
        if (!failed(st)) return;
        continue;
      }
      if (failing) base::log().info("slotrpc: registered {} in etcd", key_);
      failing = false;
      backoff = std::chrono::milliseconds(100);
    }
    if (!interrupt_.sleep_for(every)) return;
    auto ttl = client_.keep_alive(lease_);
    if (!ttl.ok()) {
      if (!failed(ttl.status())) return;
      continue;
    }
    if (ttl.value() <= 0) {
      base::log().warn("slotrpc: etcd lease of {} was lost; registering again", key_);
      lease_ = 0;
    }
  }
}

void Registration::withdraw() {
  if (withdrawn_) return;
  withdrawn_ = true;
  // Ends the keep-alive thread's sleep or request in flight at once.
  interrupt_.fire();
  if (thread_.joinable()) thread_.join();
  // One request, bounded by kWithdrawWait: revoking the lease deletes the
  // key with it (etcd's rule), so a healthy etcd drops the server within a
  // round trip, and one that hangs costs stop() no more than the bound;
  // the key then leaves when the lease expires (kLeaseTtl), as if the
  // process had died.
  Interrupt last;
  EtcdClient client(target_.endpoint, last, kWithdrawWait);
  const Status st = lease_ != 0 ? client.revoke(lease_) : client.remove(key_);
  // A lease etcd no longer has took the key with it.
  if (!st.ok() && st.message().find("lease not found") == std::string::npos) {
    base::log().warn("slotrpc: could not withdraw {} from etcd within {} ms ({}); it leaves when its lease "
                     "expires (within {} s)",
                     key_, kWithdrawWait.count(), st.message(), kLeaseTtl.count());
  }
}

}  // namespace slotrpc::rpc::discovery
