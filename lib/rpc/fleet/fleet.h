// A channel to several servers: the routing layer above one-server
// channels (docs/guide.md, "Running a fleet"; docs/design.md, "Fleets").
//
// Channel::connect("list://a:1,b:2" | "dns:///name:port" | "SCHEME://...")
// makes a Fleet behind the Channel.  The Fleet runs the target's Resolver
// (slotrpc/resolver.h), keeps one ordinary Channel per endpoint (each with
// its own session, loop and transport: shm to a local replica, verbs or TCP
// to a remote one), and picks one per call with Config::lb_policy.
//
//   resolvers.cc   the scheme registry, list:// and dns:///
//   fleet.cc       endpoints: connect, eject with backoff, probe back,
//                  the pickers, stats over live and retired endpoints
//   fleet_health.cc  health watches: the server's, and one per service this
//                  channel's calls name (per-service NOT_SERVING)
//   fleet_call.cc  a unary call's attempts: moved to another endpoint when
//                  its session died and it may be retried; parked while no
//                  endpoint is usable
//
// Why a layer of whole Channels and not sessions under one Channel: every
// per-endpoint concern (reconnect, attached connections, shm/verbs/TCP
// choice, metrics, the call hand-off to the loop) already lives in Channel
// and stays there unchanged; a HOST:PORT channel has no Fleet and pays one
// branch per call for it.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "reactor/reactor.h"
#include "slotrpc/channel.h"
#include "slotrpc/resolver.h"

namespace slotrpc::fleet {

// True for "SCHEME://REST" targets (a resolver's), false for HOST:PORT and
// unix: addresses, which keep the one-server channel.
bool is_resolver_target(std::string_view target);

// The resolver for `target`: INVALID_ARGUMENT for an unknown scheme (naming
// it and the known ones) or a REST the scheme's factory refuses.
Result<std::unique_ptr<Resolver>> make_resolver(std::string_view target);

// Per-service health: each service a call names (CallOptions::method_name,
// which generated clients set) gets a bit, and every endpoint a watch of
// slotrpc.Health for it; an endpoint with the bit down gets no calls of
// that service.  Past this many services a channel watches only the
// server as a whole for the rest.
constexpr size_t kMaxWatchedServices = 64;

// One server of the fleet, connected.  Immutable but for its atomics: an
// endpoint that fails is replaced by a new Endpoint when it is probed back.
struct Endpoint {
  std::string address;
  std::shared_ptr<Channel> channel;
  // Calls, streams and bulk calls in flight from this channel (p2c).
  std::atomic<uint32_t> outstanding{0};
  std::atomic<bool> serving{true};       // slotrpc.Health says SERVING (or nothing yet)
  std::atomic<bool> failed{false};       // its session died: eject at the next tick
  // Bit i: service i of the fleet (Fleet::service_bit) is not SERVING here.
  std::atomic<uint64_t> services_down{0};
  CallHandle watch;  // the health watch of the server as a whole
  std::mutex watch_mu;
  std::vector<CallHandle> service_watches;  // watch_mu; index i watches service i
  bool retired = false;                     // watch_mu: its watches are cancelled
  // `service`: the bit of the call's service (0: none known).
  bool usable(uint64_t service = 0) const {
    return serving.load(std::memory_order_relaxed) && !failed.load(std::memory_order_relaxed) &&
           (services_down.load(std::memory_order_relaxed) & service) == 0;
  }
  // Ends its health watches (an endpoint leaving the fleet).
  void cancel_watches();
};

// The endpoints calls may go to now, in the resolver's order.
struct Snapshot {
  std::vector<std::shared_ptr<Endpoint>> endpoints;
};

struct UnaryCall;  // fleet_call.cc

using ConnectFn = std::function<Result<std::unique_ptr<Channel>>(const std::string& address)>;

class Fleet : public std::enable_shared_from_this<Fleet> {
 public:
  struct Options {
    std::string target;
    LbPolicy policy = LbPolicy::kRoundRobin;
    uint32_t connect_timeout_ms = 5000;
    ConnectFn connect;                       // one endpoint's channel
    std::shared_ptr<reactor::Reactor> home;  // where calls failed by the fleet itself complete
  };
  // Starts the resolver and waits for its first answer and one connect
  // attempt per endpoint (at most connect_timeout_ms).  An error when the
  // resolver failed or no endpoint of a non-empty list could be reached.
  static Result<std::shared_ptr<Fleet>> start(std::unique_ptr<Resolver> resolver, Options options);
  ~Fleet();
  // Stops the resolver and the maintainer, fails parked calls with
  // CANCELLED and closes every endpoint's channel.  Once.  `may_block`
  // false (on an event loop, which the maintainer may be waiting for): the
  // maintainer is not waited for; it holds the Fleet until it is done.
  void close(bool may_block = true);

  // A usable endpoint by the policy, other than `avoid` when there is one;
  // null when none is usable.  `service`: the call's service_bit().  Any
  // thread; no lock.
  std::shared_ptr<Endpoint> pick(const Endpoint* avoid = nullptr, uint64_t service = 0);

  // The bit of the service `method_name` ("pkg.Service.Method") belongs to,
  // 0 for none (a raw call without a name, or past kMaxWatchedServices).
  // The first call of a method learns its service under the lock and starts
  // watching it on every endpoint; later ones read a lock-free table.
  uint64_t service_bit(uint32_t method_id, const char* method_name);

  // A stream's endpoint (it stays there): picked as a call of its service
  // would be, and counted as outstanding there until it ends.  The count
  // is held by a wrapper of `on_end`, or of `*reply_ends` for a client
  // stream (whose reply ends it).  Null when no endpoint is usable.
  std::shared_ptr<Endpoint> start_stream(uint32_t method_id, const CallOptions& options, ReplySink* reply_ends,
                                         std::function<void(Status)>& on_end);

  // Unary call (fleet_call.cc): on the picked endpoint; idempotent calls
  // with max_retries move to another endpoint when the session died.
  CallHandle call(uint32_t method_id, RequestWriter writer, CallOptions options, ReplySink sink);

  // A call on `ep` failed with UNAVAILABLE: if its session is closed, the
  // endpoint is ejected now and probed back with backoff.
  void report_failure(const std::shared_ptr<Endpoint>& ep, const Status& why);
  // Holds `call` until an endpoint is usable, its deadline passes or
  // connect_timeout_ms does.
  void park(std::shared_ptr<UnaryCall> call);

  std::vector<std::shared_ptr<Channel>> channels() const;
  Channel::Stats stats() const;
  TransportKind transport() const;
  // "3 endpoints: a:1 (SERVING), b:2 (NOT_SERVING), c:3 (ejected: why)";
  // with a service bit, an endpoint NOT_SERVING that service says so.
  std::string describe(uint64_t service = 0) const;
  const std::string& target() const { return opt_.target; }
  reactor::Reactor& home() const { return *opt_.home; }

 private:
  struct Slot {
    std::shared_ptr<Endpoint> live;
    uint32_t failures = 0;  // connect failures and ejections in a row
    Clock::time_point next_attempt{};
    bool connecting = false;
    bool attempted = false;
    Status last_error;
  };
  struct Parked {
    std::shared_ptr<UnaryCall> call;
    Clock::time_point give_up;
    bool deadline = false;  // give_up is the call's own deadline
  };
  explicit Fleet(Options options) : opt_(std::move(options)) {}
  void on_update(Result<std::vector<std::string>> update);
  void maintain();
  void publish_locked();
  void eject_locked(Slot& slot, const Status& why);
  void watch_health(const std::shared_ptr<Endpoint>& ep);
  // Starts the watches `ep` lacks of services_ (fleet_health.cc).
  void watch_services(const std::shared_ptr<Endpoint>& ep);
  uint64_t learn_service(uint32_t method_id, const char* method_name);
  // An endpoint leaves the fleet (ejected, or no longer listed): its
  // counters still count in stats() until fold_retired() adds them up.
  void retire_locked(std::shared_ptr<Endpoint> ep);
  void fold_retired();
  void settle_parked();
  void finish_parked(const std::shared_ptr<UnaryCall>& call, Status why);
  std::chrono::milliseconds backoff(uint32_t failures);

  Options opt_;
  std::unique_ptr<Resolver> resolver_;
  std::atomic<std::shared_ptr<const Snapshot>> snapshot_;
  std::atomic<uint64_t> next_rr_{0};
  // method id -> service bit: (id << 32) | (index + 1), 0 = empty slot;
  // written under mu_, read without a lock.  Open addressing, linear probe.
  static constexpr size_t kMethodTable = 256;
  std::array<std::atomic<uint64_t>, kMethodTable> methods_{};
  size_t methods_used_ = 0;            // mu_
  std::vector<std::string> services_;  // mu_; append only, index = bit

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool closing_ = false;
  bool closed_ = false;
  bool have_update_ = false;
  Status resolver_error_;           // the last failed resolution
  std::vector<std::string> order_;  // the resolver's list
  std::map<std::string, Slot> slots_;
  std::deque<Parked> parked_;
  uint64_t probes_ = 0, reconnects_ = 0;
  // Endpoints that left the fleet, until their calls are over, and the
  // counters of those since folded (stats() must not lose them).
  struct Retired {
    std::shared_ptr<Endpoint> ep;
    Clock::time_point since;
  };
  std::vector<Retired> retired_;  // mu_
  Channel::Stats retired_sum_;    // mu_
  std::minstd_rand jitter_{std::random_device{}()};
  std::thread maintainer_;
};

}  // namespace slotrpc::fleet
