// Server: listens on a TCP address, accepts sessions, and dispatches their
// requests to registered services on the event loops of a Runtime
// (slotrpc/runtime.h): the default runtime, or loops of its own when its
// config's loop settings or reactor_threads differ from the default's.
//
//   slotrpc::Server server;
//   server.add_service(std::move(echo_service));
//   if (auto st = server.start("0.0.0.0:7000"); !st.ok()) die(st);
//   ...
//   server.stop();
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "slotrpc/config.h"
#include "slotrpc/memory.h"
#include "slotrpc/metrics.h"
#include "slotrpc/runtime.h"
#include "slotrpc/service.h"
#include "slotrpc/status.h"

namespace slotrpc {

class SLOTRPC_API Server {
 public:
  // `config` (after SLOTRPC_* overrides) is validated by start().  Its
  // slot_count and slot_size are the largest ring a client may ask for.
  explicit Server(Config config = {});
  // On `runtime`'s loops: its loop settings and loop count replace
  // `config`'s (config() reports them).
  Server(const Runtime& runtime, Config config = {});
  ~Server();  // stop()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Before start().  Fails on a method id already registered.
  Status add_service(ServiceDefinition service);

  // Before start(): `check` runs before the handler of every call, in the
  // order added, on the handler's fiber, with the method, the peer
  // (ServerCall::peer_info) and the deadline; a non-OK status is the
  // call's answer and the handler does not run.  For authentication and
  // authorization (PERMISSION_DENIED, UNAUTHENTICATED), audit logs, quotas.
  // A server with none pays nothing per call.
  Status add_interceptor(ServerInterceptor check);
  // Before start(): once started, the server registers itself with the
  // service registry `target`, etcd://HOST:PORT/prefix: the key
  // "/prefix/ADDRESS" = ADDRESS under a lease of 3 s that it keeps alive,
  // so a channel to the same target finds it (a server that dies leaves
  // when its lease expires).  stop() and the start of shutdown() withdraw
  // it at once.  `address` is what clients connect to ("HOST:PORT"); empty:
  // the listen address with its bound port (127.0.0.1 for a wildcard
  // host).  INVALID_ARGUMENT for a target or address it cannot use; etcd
  // being down is no error (the server retries in the background).
  Status register_with(const std::string& target, const std::string& address = "");
  // Binds "host:port" (port 0 picks a free one) and starts serving; same-
  // host clients can also reach it over shared memory, through the Unix
  // socket SLOTRPC_UNIX_PATH or by default the abstract @slotrpc-<port>
  // (not with transport=tcp|verbs).  "unix:/path" or "unix:@name" serves
  // shm sessions on that Unix socket only.
  Status start(const std::string& listen_address);
  // Closes every session (running handlers finish first) and joins threads.
  void stop();
  // A graceful stop: every service reports NOT_SERVING on slotrpc.Health
  // (its watches end), calls in flight get up to `grace` to finish, then
  // stop().  New calls meanwhile are still served, and the server stays up
  // at least 100 ms (or `grace`, if shorter) for the calls that fleet
  // channels sent before they heard NOT_SERVING.  start() after a drain
  // reports SERVING again.
  void shutdown(std::chrono::milliseconds grace);
  // slotrpc.Health (slotrpc/health.h): whether `service` (a fully qualified
  // name, or "" for the whole server) reports SERVING.  Every service
  // starts SERVING; NOT_FOUND for one the server does not run.  Any thread.
  Status set_serving(const std::string& service, bool serving);

  // TLS (Config::tls): reads the certificate chain, key and CA bundle
  // files again.  Connections accepted from now on use them; open sessions
  // stay up.  A file that cannot be loaded keeps the old certificate and
  // returns the error, naming the setting, the file and OpenSSL's reason.
  // Any thread, after start().
  Status reload_tls();

  uint16_t port() const;            // after start()
  const Config& config() const;     // after start(): with environment overrides

  // Bulk payloads (slotrpc/memory.h): a handle on memory the user
  // owns, for bulk attachments of calls.  Checks the range, registers
  // lazily in each transport domain the region is used in.  Any thread.
  // A dma-buf region is device (GPU) memory; TCP refuses it at use.
  Result<MemoryRegion> register_memory(std::span<std::byte> memory);
  Result<MemoryRegion> register_memory(const DmaBuf& device_memory);
  size_t session_count() const;     // open sessions, for tests and monitoring

  // Counters and histograms of every event loop, added up, with the
  // monitor's hardware counters (slotrpc/metrics.h).  Any thread, also a
  // handler (a fiber waits without blocking its loop); empty before start().
  MetricsSnapshot metrics() const;
  // The metrics port (Config::metrics_address) after start(); 0 when off.
  uint16_t metrics_port() const;
  // Called after every sample of the monitor (each event loop that serves
  // verbs sessions samples every SLOTRPC_MONITOR_INTERVAL_MS), on that
  // loop's thread, with the snapshot's monitor fields filled: the device
  // port's hardware counters (deltas since that loop's previous sample) and
  // that loop's receive pools.  Any thread, any time; an empty function
  // removes it.  Keep it short: it runs on the event loop.  It never runs
  // after ~Server returned (which waits for a call in progress on a loop;
  // the callback may destroy the server itself); a stopped server's is still
  // called until then.
  void on_monitor_sample(std::function<void(const MetricsSnapshot&)> callback);

  struct SLOTRPC_LOCAL Impl;

 private:
  Server(std::shared_ptr<detail::RuntimeCore> runtime, Config config);
  // start()'s second half: the acceptor on these sockets (-1: none).
  Status start_listening(int tcp_fd, int unix_fd, const std::string& unix_name,
                         const std::string& listen_address);
  // Shared: stop() leaves it to the runtime while a handler still runs.
  std::shared_ptr<Impl> impl_;
};

}  // namespace slotrpc
