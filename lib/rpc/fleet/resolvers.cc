// The resolver registry (slotrpc/resolver.h) and the built-in schemes
// list:// and dns:///.  etcd:// registers itself the same way a user's
// scheme does.
#include <netdb.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/address.h"
#include "base/logging.h"
#include "rpc/discovery/etcd_resolver.h"
#include "rpc/fleet/fleet.h"

namespace slotrpc {

Resolver::~Resolver() = default;

namespace fleet {
namespace {

// list://h1:p1,h2:p2: a fixed list, answered once.
class ListResolver final : public Resolver {
 public:
  explicit ListResolver(std::vector<std::string> endpoints) : endpoints_(std::move(endpoints)) {}
  void start(ResolverUpdate update) override { update(endpoints_); }
  void stop() override {}

 private:
  std::vector<std::string> endpoints_;
};

Result<std::unique_ptr<Resolver>> make_list(std::string_view rest) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= rest.size()) {
    const size_t comma = std::min(rest.find(',', at), rest.size());
    const std::string_view one = rest.substr(at, comma - at);
    auto ep = base::parse_address(one);
    if (!ep.ok() || ep.value().port == 0) {
      return Status(StatusCode::kInvalidArgument,
                    fmt::format("list://{}: endpoint '{}' is not HOST:PORT with a port from 1 to 65535{}",
                                rest, one, ep.ok() ? "" : " (" + ep.status().message() + ")"));
    }
    if (std::find(out.begin(), out.end(), one) == out.end()) out.emplace_back(one);
    at = comma + 1;
  }
  return std::unique_ptr<Resolver>(new ListResolver(std::move(out)));
}

// dns:///name:port: every A and AAAA record of `name` (getaddrinfo, so
// /etc/hosts and the system resolver's configuration apply), resolved again
// every kPeriod and, at most once per kMinGap, when the channel says an
// endpoint failed (refresh()).  Kubernetes headless services resolve to
// their ready pods' addresses this way.
class DnsResolver final : public Resolver {
 public:
  static constexpr std::chrono::seconds kPeriod{30};
  static constexpr std::chrono::seconds kMinGap{1};

  DnsResolver(std::string host, uint16_t port) : host_(std::move(host)), port_(port) {}
  ~DnsResolver() override { stop(); }

  void start(ResolverUpdate update) override {
    update_ = std::move(update);
    thread_ = std::thread([this] { run(); });
  }
  void refresh() override {
    std::lock_guard<std::mutex> lock(mu_);
    refresh_ = true;
    cv_.notify_all();
  }
  void stop() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      cv_.notify_all();
    }
    if (thread_.joinable()) thread_.join();
  }

 private:
  Result<std::vector<std::string>> resolve() const {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const int rc = ::getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &res);
    if (rc != 0) {
      return Status(StatusCode::kUnavailable,
                    fmt::format("dns:///{}:{}: cannot resolve '{}': {}", host_, port_, host_, ::gai_strerror(rc)));
    }
    std::vector<std::string> out;
    for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
      char text[INET6_ADDRSTRLEN] = {};
      std::string one;
      if (ai->ai_family == AF_INET) {
        ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(ai->ai_addr)->sin_addr, text, sizeof text);
        one = fmt::format("{}:{}", text, port_);
      } else if (ai->ai_family == AF_INET6) {
        ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(ai->ai_addr)->sin6_addr, text, sizeof text);
        one = fmt::format("[{}]:{}", text, port_);
      } else {
        continue;
      }
      if (std::find(out.begin(), out.end(), one) == out.end()) out.push_back(std::move(one));
    }
    ::freeaddrinfo(res);
    // A stable order, so that an unchanged answer is not reported and
    // pick_first keeps its endpoint however the resolver orders records.
    std::sort(out.begin(), out.end());
    return out;
  }

  void run() {
    std::vector<std::string> last;
    bool first = true;
    for (;;) {
      auto r = resolve();
      if (!r.ok()) {
        base::log().warn("slotrpc: {}", r.status().message());
        update_(r.status());
      } else if (first || r.value() != last) {
        last = r.value();
        update_(std::move(r));
      }
      first = false;
      std::unique_lock<std::mutex> lock(mu_);
      const auto earliest = Clock::now() + kMinGap;
      cv_.wait_for(lock, kPeriod, [this] { return stopping_ || refresh_; });
      if (stopping_) return;
      // A burst of failures resolves once, not once per failure.
      cv_.wait_until(lock, earliest, [this] { return stopping_; });
      if (stopping_) return;
      refresh_ = false;
    }
  }

  std::string host_;
  uint16_t port_;
  ResolverUpdate update_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool refresh_ = false;
  std::thread thread_;
};

Result<std::unique_ptr<Resolver>> make_dns(std::string_view rest) {
  // dns:///name:port is "dns://" + an empty authority + "/name:port".
  if (rest.empty() || rest.front() != '/') {
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("dns://{}: expected dns:///NAME:PORT (three slashes; a DNS server of "
                              "its own in the authority is not supported: the system resolver is used)",
                              rest));
  }
  const std::string_view name = rest.substr(1);
  auto ep = base::parse_address(name);
  if (!ep.ok() || ep.value().port == 0 || ep.value().host.empty()) {
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("dns:///{}: expected NAME:PORT with a port from 1 to 65535{}", name,
                              ep.ok() ? "" : " (" + ep.status().message() + ")"));
  }
  return std::unique_ptr<Resolver>(new DnsResolver(ep.value().host, ep.value().port));
}

struct Registry {
  std::mutex mu;
  std::map<std::string, ResolverFactory, std::less<>> factories{
      {"list", make_list},
      {"dns", make_dns},
      {"etcd", rpc::discovery::make_etcd_resolver},
  };
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: resolvers may be made at exit
  return *r;
}

bool valid_scheme(std::string_view scheme) {
  if (scheme.empty()) return false;
  return std::all_of(scheme.begin(), scheme.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '+' ||
           c == '-' || c == '.';
  });
}

}  // namespace

bool is_resolver_target(std::string_view target) { return target.find("://") != std::string_view::npos; }

Result<std::unique_ptr<Resolver>> make_resolver(std::string_view target) {
  const size_t sep = target.find("://");
  const std::string_view scheme = target.substr(0, sep);
  ResolverFactory factory;
  std::string known;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.factories.find(scheme);
    if (it != r.factories.end()) factory = it->second;
    for (const auto& [name, f] : r.factories) known += (known.empty() ? "" : ", ") + name + "://";
  }
  if (!factory) {
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("Channel::connect('{}'): unknown target scheme '{}'; known: {}, or "
                              "HOST:PORT (register_resolver() adds a scheme)",
                              target, scheme, known));
  }
  auto made = factory(target.substr(sep + 3));
  if (!made.ok()) return made.status();
  if (made.value() == nullptr) {
    return Status(StatusCode::kInternal, fmt::format("the resolver factory of '{}://' returned null", scheme));
  }
  return made;
}

}  // namespace fleet

Status register_resolver(const std::string& scheme, ResolverFactory factory) {
  if (!fleet::valid_scheme(scheme)) {
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("register_resolver: scheme '{}' must be one or more letters, digits, '+', "
                              "'-' or '.'", scheme));
  }
  if (!factory) {
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("register_resolver('{}'): an empty factory", scheme));
  }
  fleet::Registry& r = fleet::registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.factories[scheme] = std::move(factory);
  return {};
}

}  // namespace slotrpc
