// A fleet's health watches (slotrpc.Health, lib/rpc/health/): one of the
// server as a whole per endpoint, and one per service that this channel's
// calls name, so that an endpoint NOT_SERVING one service gets no calls of
// that service and keeps serving the others.
#include <fmt/format.h>

#include <algorithm>
#include <string_view>

#include "base/logging.h"
#include "rpc/fleet/fleet.h"
#include "slotrpc/health.h"

namespace slotrpc::fleet {

namespace {
// A methods_ value for a method whose service has no bit: a name with no
// service part, or past kMaxWatchedServices.
constexpr uint32_t kNoService = 0xffffffffu;

size_t first_slot(uint32_t method_id, size_t table) {
  // The id is an FNV hash already; the multiply spreads ids that differ in
  // their low bits only (raw ids a user picked).
  return (static_cast<uint32_t>(method_id * 0x9E3779B1u) >> 24) & (table - 1);
}

uint64_t bit_of(uint32_t value) {
  return value == 0 || value > kMaxWatchedServices ? 0 : uint64_t{1} << (value - 1);
}
}  // namespace

void Endpoint::cancel_watches() {
  std::vector<CallHandle> handles;
  {
    std::lock_guard<std::mutex> lock(watch_mu);
    retired = true;
    handles.swap(service_watches);
    handles.push_back(std::move(watch));
  }
  for (const CallHandle& h : handles) h.cancel();
}

uint64_t Fleet::service_bit(uint32_t method_id, const char* method_name) {
  if (method_name == nullptr) return 0;
  static_assert((kMethodTable & (kMethodTable - 1)) == 0, "a power of two");
  size_t i = first_slot(method_id, kMethodTable);
  for (size_t n = 0; n < kMethodTable; ++n, i = (i + 1) & (kMethodTable - 1)) {
    const uint64_t e = methods_[i].load(std::memory_order_acquire);
    if (e == 0) break;
    if (static_cast<uint32_t>(e >> 32) == method_id) return bit_of(static_cast<uint32_t>(e));
  }
  return learn_service(method_id, method_name);
}

uint64_t Fleet::learn_service(uint32_t method_id, const char* method_name) {
  const std::string_view full(method_name);
  const size_t dot = full.rfind('.');
  uint32_t value = kNoService;
  bool added = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_) return 0;
    if (dot != std::string_view::npos && dot != 0) {
      const std::string_view service = full.substr(0, dot);
      const auto it = std::find(services_.begin(), services_.end(), service);
      if (it != services_.end()) {
        value = static_cast<uint32_t>(it - services_.begin()) + 1;
      } else if (services_.size() < kMaxWatchedServices) {
        services_.emplace_back(service);
        value = static_cast<uint32_t>(services_.size());
        added = true;
      } else {
        base::log().warn("slotrpc: {}: more than {} services called; {} is balanced by the health of whole "
                         "servers only",
                         opt_.target, kMaxWatchedServices, service);
      }
    }
    // Cached unless another call did it first, or the table is 3/4 full (a
    // channel calling hundreds of methods then takes this lock per call of
    // the rest, which is still correct).
    size_t i = first_slot(method_id, kMethodTable);
    bool present = false;
    for (size_t n = 0; n < kMethodTable; ++n, i = (i + 1) & (kMethodTable - 1)) {
      const uint64_t e = methods_[i].load(std::memory_order_relaxed);
      if (e == 0) break;
      if (static_cast<uint32_t>(e >> 32) == method_id) {
        present = true;
        break;
      }
    }
    if (!present && methods_used_ < kMethodTable * 3 / 4) {
      methods_[i].store((uint64_t{method_id} << 32) | value, std::memory_order_release);
      ++methods_used_;
    }
  }
  if (added) {
    // Every endpoint watches the new service from now on; until a watch
    // answers, the endpoint counts as serving it.
    const auto snap = snapshot_.load(std::memory_order_acquire);  // held: see Fleet::channels()
    for (const auto& ep : snap->endpoints) watch_services(ep);
  }
  return bit_of(value);
}

void Fleet::watch_health(const std::shared_ptr<Endpoint>& ep) {
  std::weak_ptr<Endpoint> weak = ep;
  CallHandle h = slotrpc::watch_health(
      *ep->channel, "",
      [weak, target = opt_.target](ServingStatus s) {
        auto e = weak.lock();
        if (!e) return;
        const bool serving = s == ServingStatus::kServing;
        if (e->serving.exchange(serving) != serving)
          base::log().info("slotrpc: {}: endpoint {} reports {}", target, e->address, to_string(s));
      },
      [weak](Status end) {
        // A watch ends OK when the server drains: no more calls there.  A
        // failed watch says nothing about serving (an old server without
        // slotrpc.Health); a dead session is noticed on its own.
        if (auto e = weak.lock(); e && end.ok()) e->serving.store(false);
      });
  {
    std::lock_guard<std::mutex> lock(ep->watch_mu);
    if (!ep->retired) {
      ep->watch = std::move(h);
      h = CallHandle();
    }
  }
  h.cancel();  // retired meanwhile: no watch to keep
  watch_services(ep);
}

void Fleet::watch_services(const std::shared_ptr<Endpoint>& ep) {
  std::vector<std::string> services;
  {
    std::lock_guard<std::mutex> lock(mu_);
    services = services_;
  }
  // Under the endpoint's lock: two threads adding the same service's watch
  // (a new endpoint's, and a new service's) start it once.
  std::lock_guard<std::mutex> lock(ep->watch_mu);
  if (ep->retired) return;
  for (size_t i = ep->service_watches.size(); i < services.size(); ++i) {
    const uint64_t bit = uint64_t{1} << i;
    std::weak_ptr<Endpoint> weak = ep;
    ep->service_watches.push_back(slotrpc::watch_health(
        *ep->channel, services[i],
        [weak, bit, service = services[i], target = opt_.target](ServingStatus s) {
          auto e = weak.lock();
          if (!e) return;
          // SERVICE_UNKNOWN too: that server does not run the service, so
          // its calls would fail there with UNIMPLEMENTED.
          const bool down = s != ServingStatus::kServing;
          const uint64_t before = down ? e->services_down.fetch_or(bit) : e->services_down.fetch_and(~bit);
          if (((before & bit) != 0) != down)
            base::log().info("slotrpc: {}: endpoint {} reports {} for {}", target, e->address, to_string(s), service);
        },
        [weak, bit](Status end) {
          // OK: the server drained (its own watch says so).  A failed watch
          // (a server without slotrpc.Health, a cancel) says nothing: serving.
          if (auto e = weak.lock(); e && !end.ok()) e->services_down.fetch_and(~bit);
        }));
  }
}

}  // namespace slotrpc::fleet
