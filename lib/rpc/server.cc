#include "slotrpc/server.h"
#include "rpc/server_impl.h"

#include "core/bulk/region.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
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
#include "metrics/collect.h"
#include "metrics/http_server.h"
#include "rpc/loop_transports.h"
#include "rpc/admin/admin.h"
#include "rpc/peer_info.h"
#include "transport/verbs/monitor.h"
#include "reactor/reactor.h"
#include "rpc/acceptor.h"
#include "rpc/connector.h"
#include "rpc/runtime_core.h"
#include "transport/verbs/device.h"

namespace slotrpc {



namespace {

// slotrpc.Admin with Config::admin_access checked first in each of its
// handlers: only Admin calls pay for the rule, and user interceptors still
// run before it like before any handler.  The config is read per call
// because start() settles it (environment overlay) after this runs.
ServiceDefinition guard_admin(ServiceDefinition admin, Server::Impl& impl) {
  ServiceDefinition guarded(admin.name());
  guarded.set_schema(admin.schema());
  const uid_t self = ::getuid();
  for (const MethodDescriptor& m : admin.methods()) {
    guarded.add_method(
        std::string_view(m.full_name).substr(admin.name().size() + 1),
        [inner = m.handler, impl = &impl, self](ServerCall& call) -> Status {
          if (Status st = rpc::admin_allows(call.peer_info(), impl->config.admin_access, self);
              !st.ok()) {
            impl->refuse_log.warn(fmt::format("slotrpc: refused {} from {}: {}", call.method_name(),
                                              call.peer_info().describe(), st.message()));
            return st;
          }
          return inner(call);
        },
        m.verify, m.kind);
  }
  return guarded;
}

}  // namespace

Server::Server(Config config) : Server(nullptr, std::move(config)) {}

Server::Server(const Runtime& runtime, Config config) : Server(runtime.core(), std::move(config)) {}

Server::Server(std::shared_ptr<detail::RuntimeCore> runtime, Config config)
    : impl_(std::make_shared<Impl>()) {
  impl_->config = std::move(config);
  impl_->runtime_given = runtime != nullptr;
  impl_->runtime = std::move(runtime);
  // The built-in slotrpc.Admin service (lib/rpc/admin/admin.fbs), over the
  // ordinary RPC port: slotrpc-stat --address reads Admin/Metrics.  Added
  // first, so a user method whose id collides is the one refused.
  impl_->admin = admin::make_service([this] { return metrics(); });
  Status st = add_service(guard_admin(admin::definition(*impl_->admin), *impl_));
  (void)st;  // the table is empty: cannot collide
  // slotrpc.Health (lib/rpc/health/health.fbs): open to every peer, as
  // load balancers and orchestrators ask it.
  impl_->health_service = health::make_service(impl_->health);
  st = add_service(health::definition(*impl_->health_service));
  (void)st;
  // slotrpc.Reflection (lib/rpc/reflection/): what slotrpc-cli lists,
  // describes and calls.
  impl_->reflection_service = reflect::make_service(&impl_->services);
  st = add_service(reflect::definition(*impl_->reflection_service));
  (void)st;
}

void Server::on_monitor_sample(std::function<void(const MetricsSnapshot&)> callback) {
  impl_->monitor_hook->set(std::move(callback));
}

Server::~Server() {
  // As in ~Channel: the monitor callback never runs after the destructor,
  // also when stop() came earlier (a stopped server's hook stays on the
  // loops until its Impl goes, which a tick in progress or a suspended
  // handler can delay).
  impl_->monitor_hook->close();
  stop();
}

Status Server::add_interceptor(ServerInterceptor check) {
  if (impl_->started) return Status(StatusCode::kInvalidArgument, "add_interceptor() after start()");
  if (!check) return Status(StatusCode::kInvalidArgument, "add_interceptor(): an empty function");
  impl_->checks.interceptors.push_back(std::move(check));
  return {};
}

Status Server::add_service(ServiceDefinition service) {
  if (impl_->started) {
    return Status(StatusCode::kInvalidArgument, "add_service() after start()");
  }
  auto owned = std::make_unique<ServiceDefinition>(std::move(service));
  Status st = impl_->methods.add(*owned);
  if (!st.ok()) return st;
  for (const MethodDescriptor& m : owned->methods()) metrics::remember_method_name(m.id, m.full_name);
  impl_->health->add(owned->name());
  impl_->services.push_back(std::move(owned));
  return {};
}

Status Server::register_with(const std::string& target, const std::string& address) {
  if (impl_->started) return Status(StatusCode::kInvalidArgument, "register_with() after start()");
  // Checked now; an empty address is known at start().
  auto check = rpc::discovery::Registration::make(target, address.empty() ? "127.0.0.1:1" : address);
  if (!check.ok()) return check.status();
  impl_->register_target = target;
  impl_->register_address = address;
  return {};
}

Status Server::start(const std::string& listen_address) {
  namespace asio = boost::asio;
  using asio::ip::tcp;
  if (impl_->started) return Status(StatusCode::kInvalidArgument, "server already started");
  auto cfg = impl_->config.with_environment();
  if (!cfg.ok()) return cfg.status();
  impl_->config = cfg.value();
  // The runtime (include/slotrpc/runtime.h): a given one's loop settings
  // and loop count win; without one, the default runtime when this config
  // agrees with it, else loops of the server's own (the model before
  // runtimes, and what reactor_threads other than the default's asks for).
  if (impl_->runtime_given) {
    if (!impl_->runtime) {
      return Status(StatusCode::kInvalidArgument,
                    "server restarted after a stop() that left handlers running on its runtime");
    }
    detail::take_loop_settings(impl_->config, impl_->runtime->config);
    impl_->config.reactor_threads = static_cast<uint32_t>(impl_->runtime->loops.size());
  } else {
    const auto& shared = detail::default_core_here_or(detail::RuntimeCore::Side::kServer);
    std::string differs = detail::loop_setting_difference(impl_->config, shared->config);
    if (differs.empty() && impl_->config.reactor_threads != shared->loops.size()) differs = "reactor_threads";
    if (differs.empty()) {
      impl_->runtime = shared;
    } else {
      auto own = detail::RuntimeCore::make(impl_->config, "slotrpc-srv");
      if (!own.ok()) return own.status();
      impl_->runtime = std::move(own.value());
      base::log().debug("slotrpc: server runs loops of its own: its {} differs from the default runtime's",
                        differs);
    }
  }
  // Handlers run on fibers, which never change threads: no caller runs
  // these loops' turns (reactor/caller_turns.cc).
  for (auto& loop : impl_->runtime->loops) loop->allow_caller_turns(false);
  base::apply_log_level(impl_->config.log_level);
  impl_->tls_context.reset();
  if (impl_->config.tls) {
    // The files are read now: a bad one fails start(), naming it.
    auto context = transport::tls::Context::server(impl_->config);
    if (!context.ok()) return context.status();
    impl_->tls_context = std::move(context).value();
  }
  if (impl_->config.transport == TransportKind::kAuto || impl_->config.transport == TransportKind::kVerbs) {
    auto probe = transport::verbs::probe(impl_->config);
    if (probe.ok()) {
      impl_->verbs_ok = true;
      impl_->verbs_note = probe.value();
    } else if (impl_->config.transport == TransportKind::kVerbs) {
      return Status(StatusCode::kUnavailable,
                    "transport 'verbs' was requested (Config.transport / SLOTRPC_TRANSPORT) but "
                    "this host has no usable RDMA device: " + probe.status().message());
    } else {
      impl_->verbs_note = probe.status().message();
    }
  } else {
    impl_->verbs_note = fmt::format("transport={}", to_string(impl_->config.transport));
  }

  // --- shm: a unix: address listens there only; a TCP server listens on a
  // Unix socket too (SLOTRPC_UNIX_PATH, default @slotrpc-<port>) unless
  // transport=tcp|verbs.
  const bool shm_off = impl_->config.unix_path == "off";
  if (shm_off && impl_->config.transport == TransportKind::kShm) {
    return Status(StatusCode::kInvalidArgument,
                  "transport=shm needs a Unix socket, and SLOTRPC_UNIX_PATH=off turns it off");
  }
  // With TLS on, the default Unix socket is not opened: its peers are not
  // authenticated by a certificate (docs/design.md, "TLS"); an explicit
  // SLOTRPC_UNIX_PATH opens it, trusting what guards the socket instead.
  const bool tls_without_unix = impl_->config.tls && impl_->config.unix_path.empty();
  const bool shm_wanted = !shm_off && !tls_without_unix &&
                          (impl_->config.transport == TransportKind::kAuto ||
                           impl_->config.transport == TransportKind::kShm);
  if (rpc::is_unix_address(listen_address)) {
    if (!shm_wanted) {
      return Status(StatusCode::kInvalidArgument,
                    fmt::format("cannot listen on {}: a Unix socket carries only the shm transport, "
                                "and transport={} was requested", listen_address,
                                to_string(impl_->config.transport)));
    }
    auto name = rpc::parse_unix_address(listen_address);
    if (!name.ok()) return name.status();
    auto fd = rpc::listen_unix(name.value());
    if (!fd.ok()) return fd.status();
    return start_listening(-1, fd.value(), name.value(), listen_address);
  }
  // --- end shm

  auto endpoint = rpc::parse_address(listen_address);
  if (!endpoint.ok()) return endpoint.status();
  asio::io_context io;
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(endpoint->host == "localhost" ? "127.0.0.1" : endpoint->host, ec);
  if (ec) {
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("cannot listen on {}: '{}' is not an IP address", listen_address, endpoint->host));
  }
  tcp::acceptor acceptor(io);
  const tcp::endpoint ep(addr, endpoint->port);
  acceptor.open(ep.protocol(), ec);
  if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor.bind(ep, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return Status(StatusCode::kUnavailable, fmt::format("cannot listen on {}: {}", listen_address, ec.message()));
  }
  impl_->port = acceptor.local_endpoint().port();
  // --- shm
  int unix_fd = -1;
  std::string unix_name;
  if (shm_wanted) {
    unix_name = impl_->config.unix_path.empty() ? rpc::default_unix_name(impl_->port)
                                                : impl_->config.unix_path;
    auto fd = rpc::listen_unix(unix_name);
    if (fd.ok()) {
      unix_fd = fd.value();
    } else if (!impl_->config.unix_path.empty() || impl_->config.transport == TransportKind::kShm) {
      return Status(fd.status().code(),
                    fd.status().message() + (impl_->config.unix_path.empty()
                                                 ? std::string(" (transport=shm)")
                                                 : std::string(" (SLOTRPC_UNIX_PATH)")));
    } else {
      // Name who holds it: another server of this port, or a process that
      // took the name first to catch this server's shm clients (only
      // clients whose SLOTRPC_SHM_PEER_UIDS allows its uid would talk to
      // it; docs/design.md, "Trust and security").  The probe connects and
      // closes, sending nothing.
      std::string holder;
      auto probe = rpc::connect_unix(unix_name,
                                     std::chrono::steady_clock::now() + std::chrono::milliseconds(100));
      if (probe.ok()) {
        holder = fmt::format(" (held by {}: a client on this host uses shm with it only if its "
                             "SLOTRPC_SHM_PEER_UIDS allows that uid, TCP otherwise)",
                             rpc::peer_credentials(probe.value()));
        ::close(probe.value());
      }
      base::log().warn("slotrpc: server on port {} serves no shm sessions: {}{}", impl_->port,
                       fd.status().message(), holder);
      unix_name.clear();
    }
  }
  // --- end shm
  return start_listening(acceptor.release(), unix_fd, unix_name,
                         fmt::format("{}:{}", endpoint->host, impl_->port));
}

Status Server::start_listening(int tcp_fd, int unix_fd, const std::string& unix_name,
                               const std::string& listen_address) {
  impl_->unix_name = unix_name;
  impl_->stopping.store(false);  // a server started again after stop() takes sessions again
  impl_->admission = std::make_unique<rpc::Admission>(
      impl_->config.max_sessions, rpc::resolve_ring_budget(impl_->config, impl_->verbs_ok));
  try {
    impl_->acceptor = std::make_unique<rpc::Acceptor>(
        impl_->config, tcp_fd,
        [impl = impl_.get()](rpc::PendingSession p) { impl->on_hello(std::move(p)); }, unix_fd,
        unix_name);
  } catch (const std::exception& e) {
    return Status(StatusCode::kUnavailable, fmt::format("cannot listen on {}: {}", listen_address, e.what()));
  }
  impl_->acceptor->set_tls(impl_->tls_context);

  const uint32_t n = static_cast<uint32_t>(impl_->runtime->loops.size());
  impl_->sessions.resize(n);
  impl_->loops = impl_->runtime->loops;
  impl_->counters.clear();
  for (auto& loop : impl_->loops) {
    // Every method's counters exist before the first session: a request
    // never allocates to count itself.
    auto counters = std::make_shared<core::LoopCounters>();
    for (const auto& service : impl_->services) {
      for (const MethodDescriptor& m : service->methods()) counters->server.methods[m.id];
    }
    impl_->counters.push_back(std::move(counters));
    rpc::add_monitor_hook(*loop, impl_->monitor_hook);
  }
  impl_->health->serve_again();  // a server started again after a drain serves again
  impl_->health->add("");  // the server as a whole
  {
    std::lock_guard<std::mutex> lock(impl_->state_mu);
    impl_->started = true;
  }
  if (!impl_->config.metrics_address.empty()) {
    // Once the loops exist (a scrape reads them), before the first session:
    // a port that cannot be bound fails start() and undoes it.
    // The same rule as slotrpc.Admin (Config::admin_access): the counters
    // tell the same things.
    auto http = metrics::HttpServer::start(
        impl_->config.metrics_address, [this] { return to_prometheus(metrics()); },
        [impl = impl_.get(), self = ::getuid()](int fd) {
          if (impl->config.admin_access == AdminAccess::kAny) return Status();
          const PeerInfo peer = rpc::identify_peer(fd, false, rpc::peer_name(fd));
          Status st = rpc::admin_allows(peer, impl->config.admin_access, self);
          if (!st.ok()) {
            impl->refuse_log.warn(fmt::format("slotrpc: metrics port refused {}: {}", peer.describe(),
                                              st.message()));
          }
          return st;
        });
    if (!http.ok()) {
      stop();
      return http.status();
    }
    impl_->metrics_port = std::move(http.value());
  }
  impl_->accept_thread = std::thread([impl = impl_.get()] { impl->acceptor->run(); });
  if (!impl_->register_target.empty()) {
    auto registered = rpc::discovery::Registration::start(impl_->register_target, impl_->register_address,
                                                          listen_address, impl_->port);
    if (!registered.ok()) {
      stop();
      return registered.status();
    }
    impl_->registration = std::move(registered).value();
  }
  std::string transports =
      tcp_fd < 0 ? "shm only"
      : impl_->config.transport == TransportKind::kVerbs ? "verbs only, on " + impl_->verbs_note
      : impl_->verbs_ok ? "tcp and verbs on " + impl_->verbs_note
                        : "tcp only: " + impl_->verbs_note;
  if (tcp_fd >= 0 && !unix_name.empty()) transports += "; shm on unix:" + unix_name;
  if (impl_->tls_context != nullptr)
    transports += fmt::format("; TLS, client certificates {}", to_string(impl_->config.tls_client_auth));
  base::log().info("slotrpc: server listening on {} ({}; {} event loop(s), up to {} slots of {} "
               "bytes; at most {} sessions; {})",
               listen_address, transports, n, impl_->config.slot_count,
               impl_->config.slot_size, impl_->config.max_sessions,
               impl_->admission->budget().rule);
  return {};
}

Status Server::set_serving(const std::string& service, bool serving) {
  if (!impl_->health->set(service, serving)) {
    return Status(StatusCode::kNotFound,
                  fmt::format("set_serving: this server runs no service '{}'", service));
  }
  return {};
}

void Server::shutdown(std::chrono::milliseconds grace) {
  Impl& d = *impl_;
  if (!d.started) return;
  // Health watchers hear NOT_SERVING (and their watches end) first, so
  // balancers stop sending while the calls in flight finish.
  d.health->drain();
  if (d.registration) d.registration->withdraw();  // resolvers drop it now
  const auto drained_at = std::chrono::steady_clock::now();
  const auto give_up = drained_at + grace;
  // Balancers stop sending within a round trip of hearing NOT_SERVING, but
  // calls they sent just before may still be on the wire: an idle moment
  // right after drain() is not the end of the calls (a fleet channel lost
  // the calls that arrived after stop()).  So the server stays up for
  // kDrainLinger (or the whole grace, if shorter) before it takes "nothing
  // in flight" as done.
  constexpr std::chrono::milliseconds kDrainLinger{100};
  const auto linger_until = drained_at + std::min<std::chrono::milliseconds>(grace, kDrainLinger);
  for (;;) {
    const MetricsSnapshot m = metrics();
    if (m.server.started <= m.server.finished_total() && std::chrono::steady_clock::now() >= linger_until) break;
    if (std::chrono::steady_clock::now() >= give_up) {
      base::log().warn("slotrpc: server drained for {} ms with {} call(s) still running: stopping",
                       grace.count(), m.server.started - m.server.finished_total());
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // a drain, polled: no event to wait on
  }
  stop();
}

Status Server::reload_tls() {
  if (!impl_->config.tls) {
    return Status(StatusCode::kFailedPrecondition,
                  "reload_tls(): this server has TLS off (Config.tls / SLOTRPC_TLS)");
  }
  // Read outside the lock: a bad file leaves everything as it was.
  auto context = transport::tls::Context::server(impl_->config);
  if (!context.ok()) {
    base::log().warn("slotrpc: TLS reload failed, the server keeps its certificate: {}",
                     context.status().message());
    return context.status();
  }
  std::lock_guard<std::mutex> lock(impl_->state_mu);
  if (!impl_->started || impl_->acceptor == nullptr)
    return Status(StatusCode::kFailedPrecondition, "reload_tls(): the server is not started");
  impl_->tls_context = context.value();
  impl_->acceptor->set_tls(std::move(context).value());
  base::log().info("slotrpc: TLS reloaded on port {}: new connections use {} and {}", impl_->port,
                   impl_->config.tls_cert, impl_->config.tls_key);
  return {};
}

void Server::stop() {
  Impl& d = *impl_;
  if (!d.started) return;
  if (d.registration) d.registration->withdraw();  // before the sessions close
  d.metrics_port.reset();  // a scrape in progress finishes first
  {
    // Snapshots in progress (an Admin handler's, another thread's) finish
    // first; later ones find the server stopped.  They wait only for
    // loops, which run on, so this takes a loop turn or two.  Bounded all
    // the same, like the handlers below: stop() called on a loop thread
    // blocks that loop, and a handler's snapshot on it cannot finish.
    std::unique_lock<std::mutex> lock(d.state_mu);
    d.started = false;
    if (!d.readers_done.wait_for(lock, std::chrono::seconds(2), [&d] { return d.readers == 0; }))
      base::log().warn("slotrpc: server stopping with {} metrics() call(s) still under way", d.readers);
  }
  d.stopping.store(true);
  d.acceptor->stop();
  if (d.accept_thread.joinable()) d.accept_thread.join();
  d.acceptor.reset();
  if (!d.unix_name.empty() && d.unix_name.front() == '/') ::unlink(d.unix_name.c_str());
  d.unix_name.clear();
  // The loops are shared and run on.  Each closes this server's sessions;
  // waiting for that task also lets every session the accept thread posted
  // before it stopped open (and be closed) first.
  for (size_t i = 0; i < d.loops.size(); ++i) {
    detail::on_loop(*d.loops[i], [&d, i] {
      std::vector<core::ServerSession*> open;
      for (auto& [raw, owned] : d.sessions[i]) open.push_back(raw);
      for (auto* s : open) s->close("server stopping");
      return 0;
    });
  }
  // Give running handlers a moment to return; sessions leave as they do.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (d.session_count.load() != 0 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // A handler still suspended in a fiber holds its session, whose services
  // and tables are ours: they stay alive, with the sessions, until the
  // handler returns (the session then leaves its table) or the runtime's
  // loops stop.  Checked on each loop, where the tables live.
  bool left = false;
  for (size_t i = 0; i < d.loops.size(); ++i) {
    left |= detail::on_loop(*d.loops[i], [this, &d, i] {
      if (d.sessions[i].empty()) return false;
      d.runtime->keep_until_stop[i].push_back(impl_);
      return true;
    });
  }
  if (left) {
    // The runtime now holds us; we must not hold it (a cycle).
    d.runtime.reset();
    base::log().warn("slotrpc: server stopped with handlers still running; their sessions are "
                     "freed when they return or the runtime's loops stop");
  } else {
    d.sessions.clear();
  }
  d.session_count.store(0);
  d.loops.clear();
  if (!d.runtime_given) d.runtime.reset();  // a private runtime's loops stop here
}

MetricsSnapshot Server::metrics() const {
  Impl& d = *impl_;
  metrics::Collector collector;
  auto namer = [&d](uint32_t id, bool server) -> std::string {
    if (server) {
      const MethodDescriptor* m = d.methods.find(id);
      return m != nullptr ? m->full_name : std::string();
    }
    return metrics::known_method_name(id);
  };
  // The loops and their counters, copied while the server is known to be
  // serving: stop() may clear its own lists once it stops waiting for us.
  std::vector<std::shared_ptr<reactor::Reactor>> loops;
  std::vector<std::shared_ptr<core::LoopCounters>> counters;
  {
    std::lock_guard<std::mutex> lock(d.state_mu);
    if (!d.started) return collector.finish(namer);
    ++d.readers;
    loops = d.loops;
    counters = d.counters;
  }
  // Counted out however this returns (stop() may be waiting for it).
  struct Reading {
    Impl& d;
    ~Reading() {
      std::lock_guard<std::mutex> lock(d.state_mu);
      if (--d.readers == 0) d.readers_done.notify_all();
    }
  } reading{d};
  // Each loop is read on its own thread; the one we may be running on (an
  // Admin handler) directly.  The wait suspends a handler's fiber only.
  std::vector<std::shared_ptr<detail::SharedState<metrics::LoopReading>>> pending;
  for (size_t i = 0; i < loops.size(); ++i) {
    reactor::Reactor* loop = loops[i].get();
    core::LoopCounters* loop_counters = counters[i].get();
    auto read = [&d, i, loop, loop_counters] {
      std::vector<const transport::Link*> links;
      links.reserve(d.sessions[i].size());
      for (const auto& [raw, owned] : d.sessions[i]) {
        if (!raw->closed()) links.push_back(&raw->link());
      }
      metrics::LoopReading r = metrics::read_loop(*loop, *loop_counters, links, 0);
      if (monitor::Monitor* m = rpc::loop_monitor(*loop)) m->fill(r.monitor);
      return r;
    };
    if (loop->on_this_thread()) {
      collector.add(read());
      continue;
    }
    auto state = std::make_shared<detail::SharedState<metrics::LoopReading>>();
    loop->post([state, read] { state->set(read()); });
    pending.push_back(std::move(state));
  }
  for (auto& state : pending) {
    state->wait();
    collector.add(*state->value);
  }
  return collector.finish(namer);
}

uint16_t Server::port() const { return impl_->port; }

Result<MemoryRegion> Server::register_memory(std::span<std::byte> memory) {
  return bulk::make_region(transport::BulkSource{memory.data(), memory.size()});
}

Result<MemoryRegion> Server::register_memory(const DmaBuf& m) {
  if (m.fd < 0) return Status(StatusCode::kInvalidArgument, "register_memory: dma-buf fd < 0");
  return bulk::make_region(transport::BulkSource{m.address, m.length, m.fd, m.offset});
}
uint16_t Server::metrics_port() const { return impl_->metrics_port ? impl_->metrics_port->port() : 0; }
const Config& Server::config() const { return impl_->config; }
size_t Server::session_count() const { return impl_->session_count.load(); }

}  // namespace slotrpc
