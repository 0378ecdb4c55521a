// Server::Impl, what a Server is behind its public header, shared by
//   server.cc           the server: start, listening, stop, metrics
//   server_sessions.cc  answering a Hello: admission, and the session opened
//                       on the transport it agreed (tcp, verbs, shm), or a
//                       connection attached to a session's link
#pragma once

#include "slotrpc/server.h"


#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/logging.h"
#include "core/method_table.h"
#include "core/server_session.h"
#include "metrics/collect.h"
#include "metrics/http_server.h"
#include "rpc/loop_transports.h"
#include "core/call_checks.h"
#include "rpc/admin/admin.h"
#include "rpc/discovery/registration.h"
#include "rpc/health/health.h"
#include "rpc/reflection/reflection.h"
#include "transport/verbs/monitor.h"
#include "reactor/reactor.h"
#include "rpc/acceptor.h"
#include "rpc/admission.h"
#include "rpc/connector.h"
#include "rpc/runtime_core.h"
#include "transport/verbs/qp_info.h"

namespace slotrpc::transport::shm {
class ShmLink;
}

namespace slotrpc {

struct Server::Impl {
  Config config;
  std::vector<std::unique_ptr<ServiceDefinition>> services;  // stable addresses
  core::MethodTable methods;
  // add_interceptor()'s, frozen by start(); sessions point at it.
  core::CallChecks checks;

  // The runtime the server's sessions live on: given, or chosen by start()
  // (include/slotrpc/runtime.h); released by stop().  loops are its loops.
  std::shared_ptr<detail::RuntimeCore> runtime;
  bool runtime_given = false;
  std::vector<std::shared_ptr<reactor::Reactor>> loops;
  // counters[i]: what this server's sessions on loops[i] count (that loop's
  // thread only), so a server sharing loops reports only its own calls.
  std::vector<std::shared_ptr<core::LoopCounters>> counters;
  // on_monitor_sample()'s callback, shared with every loop's monitor.
  std::shared_ptr<monitor::SampleHook> monitor_hook = std::make_shared<monitor::SampleHook>();
  // sessions[i] is touched only on loops[i]'s thread (or after it stopped).
  std::vector<std::unordered_map<core::ServerSession*, std::unique_ptr<core::ServerSession>>> sessions;
  std::atomic<size_t> session_count{0};

  // Whether this server accepts verbs sessions, and the device or why not.
  bool verbs_ok = false;
  std::string verbs_note;

  uint16_t port = 0;
  // The Unix domain socket shm sessions arrive on ("@name" or a path), or
  // empty; a path is removed again by stop().
  std::string unix_name;
  std::unique_ptr<rpc::Admission> admission;
  std::unique_ptr<rpc::Acceptor> acceptor;
  std::unique_ptr<metrics::HttpServer> metrics_port;  // SLOTRPC_METRICS_ADDRESS
  std::shared_ptr<admin::AdminServiceImpl> admin;     // slotrpc.Admin, on every server
  std::shared_ptr<health::Registry> health = std::make_shared<health::Registry>();
  std::shared_ptr<health::HealthServiceImpl> health_service;  // slotrpc.Health, on every server
  std::shared_ptr<reflect::ReflectionServiceImpl> reflection_service;  // slotrpc.Reflection, too
  // register_with(): the target and address given; the entry in etcd
  // from start() until stop() or a drain withdraws it.
  std::string register_target, register_address;
  std::unique_ptr<rpc::discovery::Registration> registration;
  std::thread accept_thread;
  std::atomic<bool> stopping{false};
  // Written by start() and stop() under state_mu; read under it by
  // metrics(), which any thread may call at any time.  metrics() counts
  // itself in readers while it reads the loops and session tables, and
  // stop() waits for readers to reach 0 (2 s at most) before it takes
  // those apart (a handler's or another thread's snapshot in progress
  // would read freed tables).  Never held across a wait for a loop.
  mutable std::mutex state_mu;
  mutable std::condition_variable readers_done;
  bool started = false;
  mutable size_t readers = 0;
  rpc::RateLimitedLog refuse_log;  // refusals a client can provoke at will
  // Config::tls: what start() (or the last reload_tls()) loaded; the
  // acceptor holds its own reference.
  std::shared_ptr<transport::tls::Context> tls_context;

  // Accept thread: a complete Hello.  Refuses it, or reserves its place and
  // hands it to an event loop.
  void on_hello(rpc::PendingSession p);
  // Accept thread or loop: answers with a refusal and closes.
  void refuse(rpc::PendingSession& p, StatusCode code, const std::string& why);
  // Loop thread: creates the session (rings, link, on verbs registration and
  // connection), then answers the Hello.  Nothing escapes it.
  void open_session(size_t loop_index, rpc::PendingSession p,
                    std::optional<transport::verbs::QpInfo> remote, std::string tcp_note,
                    uint64_t ring_bytes);
  // Loop thread: a verbs session towards `remote` in `out`; returns the
  // server's extension.
  Result<std::vector<std::byte>> open_verbs(size_t loop_index, int fd,
                                            core::ServerSession::Geometry g,
                                            const std::string& peer,
                                            const transport::verbs::QpInfo& remote,
                                            std::unique_ptr<core::ServerSession>& out,
                                            uint64_t ring_bytes);
  // Loop thread: an shm session on the accepted Unix socket `fd`; the
  // link's own offer is sent after the HelloReply (open_session).
  Result<std::unique_ptr<core::ServerSession>> open_shm(size_t loop_index, int fd,
                                                        core::ServerSession::Geometry g,
                                                        const std::string& peer,
                                                        uint64_t ring_bytes,
                                                        transport::shm::ShmLink*& link);
  Result<std::unique_ptr<core::ServerSession>> open_tcp(size_t loop_index, const rpc::PendingSession& p,
                                                        core::ServerSession::Geometry g,
                                                        uint64_t ring_bytes,
                                                        std::vector<std::byte>* attach_token);
  // A connection to be attached to a session's link (Hello of transport
  // kAttach): routed by its token to the session's loop, whose transport
  // hands it to the link (transport.h, "Attached connections").
  void on_attach_hello(rpc::PendingSession p);
  core::ServerSession::ClosedFn on_closed(size_t index, uint64_t ring_bytes) {
    return [this, index, ring_bytes](core::ServerSession* s) {
      if (sessions[index].erase(s) != 0) {
        --session_count;
        admission->release(ring_bytes);
      }
    };
  }
};

}  // namespace slotrpc
