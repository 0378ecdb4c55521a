// slotrpc.Health (health.fbs): SERVING / NOT_SERVING per service name, as
// gRPC's grpc.health.v1, so that load balancers and orchestrators can ask a
// server whether to send it work.  Server::set_serving() changes a status;
// a draining Server::shutdown() makes everything NOT_SERVING first.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "slotrpc/service.h"
#include "slotrpc/stream.h"

namespace slotrpc::health {

// The statuses, shared by every loop's handlers.  "" is the server itself.
class Registry {
 public:
  enum class State : int8_t { kUnknown = 0, kServing = 1, kNotServing = 2, kServiceUnknown = 3 };

  // Known services start SERVING (the server calls this per service).
  void add(const std::string& service);
  // False if the service is unknown.
  bool set(const std::string& service, bool serving);
  // Every service NOT_SERVING, for good (a drain).
  void drain();
  // Every service SERVING again: a server started again after its drain.
  void serve_again();
  bool draining() const;
  // The status, and the change counter it was read at.
  State get(const std::string& service, uint64_t* version) const;

  // Watchers: notified on every change (each has its own Notifier).
  void watch(Notifier* n);
  void unwatch(Notifier* n);

 private:
  void notify_locked();
  mutable std::mutex mu_;
  std::map<std::string, bool> serving_;
  bool draining_ = false;
  uint64_t version_ = 0;
  std::vector<Notifier*> watchers_;
};

class HealthServiceImpl;
std::shared_ptr<HealthServiceImpl> make_service(std::shared_ptr<Registry> registry);
ServiceDefinition definition(HealthServiceImpl& impl);

}  // namespace slotrpc::health
