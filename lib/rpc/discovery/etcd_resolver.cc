#include "rpc/discovery/etcd_resolver.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <thread>

#include "base/logging.h"
#include "rpc/discovery/etcd_client.h"
#include "rpc/discovery/etcd_target.h"

namespace slotrpc::rpc::discovery {

namespace {

constexpr auto kFirstBackoff = std::chrono::milliseconds(100);
constexpr auto kMaxBackoff = std::chrono::milliseconds(5000);

class EtcdResolver final : public Resolver {
 public:
  explicit EtcdResolver(EtcdTarget target) : target_(std::move(target)), client_(target_.endpoint, interrupt_) {}
  ~EtcdResolver() override { stop(); }

  void start(ResolverUpdate update) override {
    update_ = std::move(update);
    thread_ = std::thread([this] { run(); });
  }

  void stop() override {
    interrupt_.fire();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void run() {
    auto backoff = kFirstBackoff;
    bool failing = false;
    while (!interrupt_.fired()) {
      auto listed = client_.range_prefix(target_.key_prefix);
      if (!listed.ok()) {
        if (listed.status().code() == StatusCode::kCancelled) return;
        // Once per outage: the channel keeps the endpoints it has.
        if (!failing) report(listed.status());
        failing = true;
        if (!interrupt_.sleep_for(backoff)) return;
        backoff = std::min(backoff * 2, std::chrono::duration_cast<std::chrono::milliseconds>(kMaxBackoff));
        continue;
      }
      failing = false;
      backoff = kFirstBackoff;
      servers_.clear();
      for (KeyValue& kv : listed->kvs) servers_[kv.key] = std::move(kv.value);
      report_list(true);
      Status ended = client_.watch_prefix(target_.key_prefix, listed->revision + 1,
                                          [this](const std::vector<WatchEvent>& events) {
                                            for (const WatchEvent& e : events) {
                                              if (e.deleted)
                                                servers_.erase(e.kv.key);
                                              else
                                                servers_[e.kv.key] = e.kv.value;
                                            }
                                            report_list(false);
                                          });
      if (ended.code() == StatusCode::kCancelled) return;
      base::log().info("slotrpc: etcd resolver for {}: {}; listing again", target_.key_prefix, ended.message());
      // A watch that etcd ends at once (a compacted revision, a restart)
      // lists again after a pause, not in a tight loop.
      if (!interrupt_.sleep_for(kFirstBackoff)) return;
    }
  }

  // The list of addresses, sorted and without duplicates; reported when it
  // changed (or `always`, after a fresh listing).
  void report_list(bool always) {
    std::vector<std::string> list;
    for (const auto& [key, address] : servers_)
      if (!address.empty()) list.push_back(address);
    std::sort(list.begin(), list.end());
    list.erase(std::unique(list.begin(), list.end()), list.end());
    if (!always && list == last_) return;
    last_ = list;
    report(std::move(list));
  }

  void report(Result<std::vector<std::string>> r) {
    if (update_) update_(std::move(r));
  }

  EtcdTarget target_;
  Interrupt interrupt_;
  EtcdClient client_;
  ResolverUpdate update_;
  std::thread thread_;
  std::map<std::string, std::string> servers_;  // key -> address; the resolver's thread only
  std::vector<std::string> last_;
};

}  // namespace

Result<std::unique_ptr<Resolver>> make_etcd_resolver(std::string_view rest) {
  auto target = parse_etcd_target(rest);
  if (!target.ok()) return target.status();
  return std::unique_ptr<Resolver>(new EtcdResolver(std::move(target).value()));
}

}  // namespace slotrpc::rpc::discovery
