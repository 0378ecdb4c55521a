#include "rpc/health/health.h"

#include <fmt/format.h>

#include <algorithm>

#include "health.slotrpc.h"  // slotrpc-gen health.fbs, at build time
#include "slotrpc/fiber.h"

namespace slotrpc::health {

void Registry::add(const std::string& service) {
  std::lock_guard<std::mutex> lock(mu_);
  serving_.emplace(service, !draining_);
  ++version_;
  notify_locked();
}

bool Registry::set(const std::string& service, bool serving) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = serving_.find(service);
  if (it == serving_.end()) return false;
  // A draining server stays NOT_SERVING whatever a late caller says.
  const bool now = serving && !draining_;
  if (it->second == now) return true;
  it->second = now;
  ++version_;
  notify_locked();
  return true;
}

void Registry::drain() {
  std::lock_guard<std::mutex> lock(mu_);
  if (draining_) return;
  draining_ = true;
  for (auto& [name, serving] : serving_) serving = false;
  ++version_;
  notify_locked();
}

void Registry::serve_again() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!draining_) return;
  draining_ = false;
  for (auto& [name, serving] : serving_) serving = true;
  ++version_;
  notify_locked();
}

bool Registry::draining() const {
  std::lock_guard<std::mutex> lock(mu_);
  return draining_;
}

Registry::State Registry::get(const std::string& service, uint64_t* version) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (version != nullptr) *version = version_;
  auto it = serving_.find(service);
  if (it == serving_.end()) return State::kServiceUnknown;
  return it->second ? State::kServing : State::kNotServing;
}

void Registry::watch(Notifier* n) {
  std::lock_guard<std::mutex> lock(mu_);
  watchers_.push_back(n);
}

void Registry::unwatch(Notifier* n) {
  std::lock_guard<std::mutex> lock(mu_);
  watchers_.erase(std::remove(watchers_.begin(), watchers_.end(), n), watchers_.end());
}

void Registry::notify_locked() {
  // Notifier::notify takes its own lock and wakes a fiber through its loop:
  // never this lock's holder in turn.
  for (Notifier* n : watchers_) n->notify();
}

class HealthServiceImpl final : public HealthService {
 public:
  explicit HealthServiceImpl(std::shared_ptr<Registry> registry) : registry_(std::move(registry)) {}

  Status Check(const HealthCheckRequest& request, ReplyBuilder<HealthCheckReply>& reply,
               ServerCall&) override {
    const std::string service = request.service() != nullptr ? request.service()->str() : "";
    const auto state = registry_->get(service, nullptr);
    if (state == Registry::State::kServiceUnknown) {
      return Status(StatusCode::kNotFound, fmt::format("this server runs no service '{}'", service));
    }
    reply.Finish(CreateHealthCheckReply(reply.fbb(), static_cast<HealthStatus>(state)));
    return {};
  }

  // Sends the status, then each change.  Woken by the registry on a change;
  // between changes it also wakes every kPoll to notice a cancelled call
  // (a cancel reaches the session, not this fiber's Notifier).
  Status Watch(const HealthCheckRequest& request, ServerWriter<HealthCheckReply>& writer,
               ServerCall& call) override {
    const std::string service = request.service() != nullptr ? request.service()->str() : "";
    Notifier changed;
    registry_->watch(&changed);
    struct Unwatch {
      Registry& r;
      Notifier* n;
      ~Unwatch() { r.unwatch(n); }
    } unwatch{*registry_, &changed};
    int8_t sent = -1;
    for (;;) {
      const auto state = registry_->get(service, nullptr);
      if (static_cast<int8_t>(state) != sent) {
        const bool ok = writer.Write([&](flatbuffers::FlatBufferBuilder& b) {
          return CreateHealthCheckReply(b, static_cast<HealthStatus>(state));
        });
        if (!ok) return writer.error();
        sent = static_cast<int8_t>(state);
      }
      // A drained server ends its watches once they have heard so.
      if (registry_->draining()) return {};
      if (call.cancelled()) return Status(StatusCode::kCancelled, "the watch was cancelled");
      wait(changed);
    }
  }

 private:
  static constexpr auto kPoll = std::chrono::milliseconds(200);
  // Waits for a change or kPoll, whichever first, on this fiber only.
  void wait(Notifier& changed) {
    auto done = std::make_shared<bool>(false);
    // A timer fiber wakes the waiter after kPoll unless a change did.
    (void)this_fiber::spawn([done, &changed] {
      this_fiber::sleep_for(kPoll);
      if (!*done) changed.notify();
    });
    changed.wait();
    *done = true;
  }

  std::shared_ptr<Registry> registry_;
};

std::shared_ptr<HealthServiceImpl> make_service(std::shared_ptr<Registry> registry) {
  return std::make_shared<HealthServiceImpl>(std::move(registry));
}

ServiceDefinition definition(HealthServiceImpl& impl) { return impl.definition(); }

}  // namespace slotrpc::health

namespace slotrpc {

std::string_view to_string(ServingStatus status) {
  switch (status) {
    case ServingStatus::kUnknown: return "UNKNOWN";
    case ServingStatus::kServing: return "SERVING";
    case ServingStatus::kNotServing: return "NOT_SERVING";
    case ServingStatus::kServiceUnknown: return "SERVICE_UNKNOWN";
  }
  return "?";
}

namespace {

RequestWriter make_health_request(const std::string& service) {
  return [service](flatbuffers::FlatBufferBuilder& b) {
    b.Finish(CreateHealthCheckRequest(b, b.CreateString(service)));
  };
}

ServingStatus health_to_status(HealthStatus s) {
  switch (s) {
    case HealthStatus_SERVING: return ServingStatus::kServing;
    case HealthStatus_NOT_SERVING: return ServingStatus::kNotServing;
    case HealthStatus_SERVICE_UNKNOWN: return ServingStatus::kServiceUnknown;
    default: return ServingStatus::kUnknown;
  }
}

}  // namespace

Result<ServingStatus> check_health(Channel& channel, const std::string& service, CallOptions options) {
  auto r = channel.call_typed<HealthCheckReply>(method_id(HealthDescriptor::kName + std::string(".Check")),
                                                make_health_request(service), std::move(options))
               .get();
  if (!r.ok()) return r.status();
  return health_to_status(r->status());
}

CallHandle watch_health(Channel& channel, const std::string& service,
                        std::function<void(ServingStatus)> on_status, std::function<void(Status)> on_end,
                        CallOptions options) {
  return slotrpc::raw::call_stream(channel,
      method_id(HealthDescriptor::kName + std::string(".Watch")), make_health_request(service),
      std::move(options),
      [on_status = std::move(on_status)](RawReply&& raw) {
        Reply<HealthCheckReply> r(std::move(raw));
        if (r.ok()) on_status(health_to_status(r->status()));
      },
      std::move(on_end));
}

}  // namespace slotrpc
