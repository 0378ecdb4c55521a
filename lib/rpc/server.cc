#include "slotrpc/server.h"

#include "bulk/region.h"

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

#include "core/handshake.h"
#include "core/logging.h"
#include "core/method_table.h"
#include "core/server_session.h"
#include "core/settings.h"
#include "metrics/collect.h"
#include "metrics/http_server.h"
#include "rpc/admin/admin.h"
#include "monitor/monitor.h"
#include "reactor/reactor.h"
#include "rpc/acceptor.h"
#include "rpc/admission.h"
#include "rpc/connector.h"
#include "rpc/runtime_core.h"
#include "transport/verbs/device.h"
#include "transport/verbs/verbs_transport.h"
#include "transport/shm/shm_transport.h"

namespace slotrpc {

struct Server::Impl {
  Config config;
  std::vector<std::unique_ptr<ServiceDefinition>> services;  // stable addresses
  core::MethodTable methods;

  // The runtime the server's sessions live on: given, or chosen by start()
  // (include/slotrpc/runtime.h); released by stop().  loops are its loops.
  std::shared_ptr<detail::RuntimeCore> runtime;
  bool runtime_given = false;
  std::vector<std::shared_ptr<reactor::Reactor>> loops;
  // counters[i]: what this server's sessions on loops[i] count (that loop's
  // thread only), so a server sharing loops reports only its own calls.
  std::vector<std::shared_ptr<metrics::LoopCounters>> counters;
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
  Result<std::unique_ptr<core::ServerSession>> open_tcp(size_t loop_index, int fd,
                                                        core::ServerSession::Geometry g,
                                                        const std::string& peer,
                                                        uint64_t ring_bytes,
                                                        uint64_t* lane_token);
  // A connection that asks to be a tcp session's bulk lane (Hello of
  // transport kTcpLane): routed by its token to the session's loop.
  void on_lane_hello(rpc::PendingSession p);
  core::ServerSession::ClosedFn on_closed(size_t index, uint64_t ring_bytes) {
    return [this, index, ring_bytes](core::ServerSession* s) {
      if (sessions[index].erase(s) != 0) {
        --session_count;
        admission->release(ring_bytes);
      }
    };
  }
};

namespace {

struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

// What ran out, in words an operator can act on, for a setup failure of a
// session (the transport's own message follows).
std::string explain_setup_failure(const Status& st) {
  const std::string& m = st.message();
  if (m.find("ibv_reg_mr") != std::string::npos) {
    return fmt::format("locked memory ran out (RLIMIT_MEMLOCK = {}): {}", rpc::memlock_limit_text(),
                       m);
  }
  if (m.find("ibv_create_qp") != std::string::npos) return "queue pairs ran out: " + m;
  if (m.find("Too many open files") != std::string::npos) {
    return fmt::format("server out of file descriptors (RLIMIT_NOFILE = {}): {}",
                       rpc::nofile_limit_text(), m);
  }
  return m;
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
  Status st = add_service(admin::definition(*impl_->admin));
  (void)st;  // the table is empty: cannot collide
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

Status Server::add_service(ServiceDefinition service) {
  if (impl_->started) {
    return Status(StatusCode::kInvalidArgument, "add_service() after start()");
  }
  auto owned = std::make_unique<ServiceDefinition>(std::move(service));
  Status st = impl_->methods.add(*owned);
  if (!st.ok()) return st;
  for (const MethodDescriptor& m : owned->methods()) metrics::remember_method_name(m.id, m.full_name);
  impl_->services.push_back(std::move(owned));
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
      core::log().debug("slotrpc: server runs loops of its own: its {} differs from the default runtime's",
                        differs);
    }
  }
  core::apply_log_level(impl_->config.log_level);
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
  const bool shm_wanted = !shm_off && (impl_->config.transport == TransportKind::kAuto ||
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
      core::log().warn("slotrpc: server on port {} serves no shm sessions: {}", impl_->port,
                       fd.status().message());
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

  const uint32_t n = static_cast<uint32_t>(impl_->runtime->loops.size());
  impl_->sessions.resize(n);
  impl_->loops = impl_->runtime->loops;
  impl_->counters.clear();
  for (auto& loop : impl_->loops) {
    // Every method's counters exist before the first session: a request
    // never allocates to count itself.
    auto counters = std::make_shared<metrics::LoopCounters>();
    for (const auto& service : impl_->services) {
      for (const MethodDescriptor& m : service->methods()) counters->server.methods[m.id];
    }
    impl_->counters.push_back(std::move(counters));
    loop->add_monitor_hook(impl_->monitor_hook);
  }
  {
    std::lock_guard<std::mutex> lock(impl_->state_mu);
    impl_->started = true;
  }
  if (!impl_->config.metrics_address.empty()) {
    // Once the loops exist (a scrape reads them), before the first session:
    // a port that cannot be bound fails start() and undoes it.
    auto http = metrics::HttpServer::start(impl_->config.metrics_address,
                                           [this] { return to_prometheus(metrics()); });
    if (!http.ok()) {
      stop();
      return http.status();
    }
    impl_->metrics_port = std::move(http.value());
  }
  impl_->accept_thread = std::thread([impl = impl_.get()] { impl->acceptor->run(); });
  std::string transports =
      tcp_fd < 0 ? "shm only"
      : impl_->config.transport == TransportKind::kVerbs ? "verbs only, on " + impl_->verbs_note
      : impl_->verbs_ok ? "tcp and verbs on " + impl_->verbs_note
                        : "tcp only: " + impl_->verbs_note;
  if (tcp_fd >= 0 && !unix_name.empty()) transports += "; shm on unix:" + unix_name;
  core::log().info("slotrpc: server listening on {} ({}; {} event loop(s), up to {} slots of {} "
               "bytes; at most {} sessions; {})",
               listen_address, transports, n, impl_->config.slot_count,
               impl_->config.slot_size, impl_->config.max_sessions,
               impl_->admission->budget().rule);
  return {};
}

void Server::Impl::refuse(rpc::PendingSession& p, StatusCode code, const std::string& why) {
  refuse_log.warn(fmt::format("slotrpc: refused session from {}: {}", p.peer, why));
  (void)rpc::send_hello_reply(p.fd, static_cast<uint16_t>(code), p.hello, why);
  ::close(p.fd);
  p.fd = -1;
}

void Server::Impl::on_hello(rpc::PendingSession p) {
  const core::Hello& h = p.hello;
  // --- shm: only on the Unix socket, and only shm there.
  if (p.local != (h.transport == core::WireTransport::kShm)) {
    return refuse(p, StatusCode::kUnavailable,
                  p.local ? "only the shm transport is served on this Unix socket"
                          : "the shm transport needs the server's Unix socket, not TCP");
  }
  if (!p.local && config.transport == TransportKind::kShm) {
    return refuse(p, StatusCode::kUnavailable,
                  "this server accepts only the shm transport (SLOTRPC_TRANSPORT=shm)");
  }
  // --- end shm
  if (h.transport == core::WireTransport::kTcpLane) return on_lane_hello(std::move(p));
  if (h.transport == core::WireTransport::kTcp && config.transport == TransportKind::kVerbs) {
    return refuse(p, StatusCode::kUnavailable,
                  "this server accepts only the verbs transport (SLOTRPC_TRANSPORT=verbs); the "
                  "client offered tcp");
  }
  if (h.slot_count < 1 || h.slot_count > config.slot_count || h.slot_size < core::kMinSlotSize ||
      h.slot_size > config.slot_size || h.slot_size % core::kSlotSizeAlign != 0) {
    return refuse(p, StatusCode::kResourceExhausted,
                  fmt::format("asked for {} slots of {} bytes; this server allows 1..{} slots of "
                              "{}..{} bytes (multiples of {}); lower the client's slot_count / "
                              "slot_size or raise the server's",
                              h.slot_count, h.slot_size, config.slot_count, core::kMinSlotSize,
                              config.slot_size, core::kSlotSizeAlign));
  }
  std::optional<transport::verbs::QpInfo> remote;
  std::string tcp_note;  // why a verbs proposal is answered with tcp
  if (h.transport == core::WireTransport::kVerbs) {
    if (!verbs_ok) {
      tcp_note = config.transport == TransportKind::kTcp
                     ? "the server uses tcp only (transport=tcp)"
                     : "the server has no usable RDMA device: " + verbs_note;
    } else {
      auto info = transport::verbs::decode_qp_info(p.extension);
      if (!info.ok()) return refuse(p, StatusCode::kUnavailable, info.status().message());
      if (info->slot_count != h.slot_count || info->slot_size != h.slot_size) {
        return refuse(p, StatusCode::kUnavailable,
                      "handshake failed: the verbs extension's ring geometry differs from the hello's");
      }
      remote = info.value();
    }
  }
  // Both rings of the server's end: what this session costs in memory.
  const uint64_t ring_bytes = 2 * uint64_t{h.slot_count} * h.slot_size;
  if (Status st = admission->reserve(ring_bytes); !st.ok()) {
    return refuse(p, st.code(), st.message());
  }
  // Round-robin over the runtime's loops, apart from its channels' turns.
  const size_t index = runtime->pick_loop(detail::RuntimeCore::Side::kServer);
  loops[index]->post([this, index, p = std::move(p), remote, tcp_note = std::move(tcp_note),
                      ring_bytes]() mutable {
    open_session(index, std::move(p), remote, std::move(tcp_note), ring_bytes);
  });
}

void Server::Impl::on_lane_hello(rpc::PendingSession p) {
  if (config.tcp_bulk_lane == 0)
    return refuse(p, StatusCode::kUnavailable, "this server has bulk lanes off (tcp_bulk_lane = 0)");
  if (p.extension.size() != core::kLaneTokenSize)
    return refuse(p, StatusCode::kInvalidArgument,
                  fmt::format("a bulk lane hello carries an {}-byte token, not {} bytes",
                              core::kLaneTokenSize, p.extension.size()));
  const uint64_t token = core::decode_lane_token(p.extension.data());
  const size_t index = token & 0xffff;
  if (index >= loops.size())
    return refuse(p, StatusCode::kInvalidArgument, "bulk lane token of no session");
  loops[index]->post([this, index, token, p = std::move(p)]() mutable {
    if (stopping.load()) return refuse(p, StatusCode::kUnavailable, "server stopping");
    // As for a session: the lane gets a duplicate, the reply goes out on
    // the original.  Nothing can go out on the lane before that reply:
    // only the client's lane exposures make this side use it.
    const int lane_fd = ::fcntl(p.fd, F_DUPFD_CLOEXEC, 0);
    if (lane_fd < 0)
      return refuse(p, StatusCode::kResourceExhausted, fmt::format("dup: {}", std::strerror(errno)));
    Status st = loops[index]->tcp().accept_lane(token, lane_fd);
    if (!st.ok()) return refuse(p, st.code(), "bulk lane refused: " + st.message());
    if (!rpc::send_hello_reply(p.fd, 0, p.hello, std::string(), core::WireTransport::kTcpLane)) {
      // The lane is attached but its client never hears so: it goes on
      // without one, and this end's lane is idle until the session ends.
      refuse_log.warn(fmt::format("slotrpc: bulk lane from {}: the HelloReply could not be written "
                                  "at once", p.peer));
    }
    ::close(p.fd);
    core::log().debug("slotrpc: bulk lane from {} on loop {}", p.peer, index);
  });
}

void Server::Impl::open_session(size_t index, rpc::PendingSession p,
                                 std::optional<transport::verbs::QpInfo> remote,
                                 std::string tcp_note, uint64_t ring_bytes) {
  // Everything the session needs exists before the HelloReply says OK; a
  // failure is a refusal of this session only.
  auto fail = [&](StatusCode code, const std::string& why) {
    admission->release(ring_bytes);
    refuse(p, code, why);
  };
  if (stopping.load()) return fail(StatusCode::kUnavailable, "server stopping");
  const core::ServerSession::Geometry g{p.hello.slot_count, p.hello.slot_size};
  std::unique_ptr<core::ServerSession> session;
  std::vector<std::byte> extension;
  core::WireTransport transport = core::WireTransport::kTcp;
  uint16_t features = core::kKnownFeatures;
  transport::shm::ShmLink* shm_link = nullptr;  // owned by the session
  bool packing = false;  // tcp and verbs sessions, when pack_small is on
  try {
    if (p.local) {
      auto s = open_shm(index, p.fd, g, p.peer, ring_bytes, shm_link);
      if (!s.ok()) {
        const std::string why = explain_setup_failure(s.status());
        return fail(why != s.status().message() ? StatusCode::kResourceExhausted : s.status().code(),
                    "server cannot set up the shm session: " + why);
      }
      session = std::move(s.value());
      transport = core::WireTransport::kShm;
    } else if (remote) {
      auto ext = open_verbs(index, p.fd, g, p.peer, *remote, session, ring_bytes);
      if (ext.ok()) {
        extension = std::move(ext.value());
        transport = core::WireTransport::kVerbs;
        packing = true;
      } else {
        const std::string why = explain_setup_failure(ext.status());
        const bool exhausted = ext.status().code() == StatusCode::kResourceExhausted ||
                               why != ext.status().message();
        if (config.transport == TransportKind::kVerbs || exhausted) {
          // Out of a resource: falling back to tcp would hide the shortage.
          return fail(exhausted ? StatusCode::kResourceExhausted : ext.status().code(),
                      "server cannot set up verbs: " + why);
        }
        core::log().warn("slotrpc: verbs setup for {} failed, answering with tcp: {}", p.peer,
                     ext.status().message());
        tcp_note = "verbs setup failed on the server: " + ext.status().message();
      }
    }
    if (!session) {
      uint64_t lane_token = 0;
      auto s = open_tcp(index, p.fd, g, p.peer, ring_bytes, &lane_token);
      if (!s.ok()) {
        const std::string why = explain_setup_failure(s.status());
        return fail(why != s.status().message() ? StatusCode::kResourceExhausted : s.status().code(),
                    "server cannot set up the session: " + why);
      }
      session = std::move(s.value());
      packing = true;
      if (lane_token != 0) {
        extension.resize(core::kLaneTokenSize);
        core::encode_lane_token(lane_token, extension.data());
        features |= core::kFeatureTcpLane;
      }
      if (config.tcp_bulk_push != 0) features |= core::kFeatureTcpPush;
    }
  } catch (const std::bad_alloc&) {
    session.reset();
    return fail(StatusCode::kResourceExhausted,
                fmt::format("server out of memory: cannot allocate this session's rings ({} slots "
                            "of {} bytes each way, {} bytes)", g.slot_count, g.slot_size, ring_bytes));
  } catch (const std::exception& e) {
    session.reset();
    return fail(StatusCode::kResourceExhausted,
                fmt::format("server cannot set up the session: {}", e.what()));
  }
  session->set_client_takes_all_status_codes((p.hello.features & core::kFeatureStatusCodes) != 0);
  if (packing && config.pack_small != 0) {
    session->configure_packing(config.pack_small, (p.hello.features & core::kFeaturePack) != 0);
    features |= core::kFeaturePack;
  }
  // The reply is written here, on the loop thread, before this task
  // returns: the session cannot have flushed a frame (its first PING is a
  // keepalive period away and would be sent from this thread), so the
  // HelloReply always precedes the session's first frame.  The session is
  // counted first: a client that has its reply must find it in
  // session_count().
  ++session_count;
  if (!rpc::send_hello_reply(p.fd, 0, p.hello,
                             transport == core::WireTransport::kVerbs ? std::string() : tcp_note,
                             transport, extension, features)) {
    refuse_log.warn(fmt::format("slotrpc: handshake with {} failed: the HelloReply could not be "
                                "written at once", p.peer));
    --session_count;
    session.reset();
    admission->release(ring_bytes);
    ::shutdown(p.fd, SHUT_RDWR);
    ::close(p.fd);
    return;
  }
  if (shm_link != nullptr) {
    // Our offer follows the HelloReply (the client reads them in order).
    if (Status st = shm_link->send_own_offer(); !st.ok()) {
      refuse_log.warn(fmt::format("slotrpc: shm handshake with {} failed: {}", p.peer, st.message()));
      session->close("shm offer not sent: " + st.message());
    }
  }
  ::close(p.fd);  // the link works on its own duplicate
  core::log().debug("slotrpc: session with {} on loop {}", p.peer, index);
  core::ServerSession* raw = session.get();
  sessions[index].emplace(raw, std::move(session));
}

Result<std::unique_ptr<core::ServerSession>> Server::Impl::open_shm(
    size_t index, int fd, core::ServerSession::Geometry g, const std::string& peer,
    uint64_t ring_bytes, transport::shm::ShmLink*& raw) {
  reactor::Reactor& loop = *loops[index];
  auto t = loop.shm();
  if (!t.ok()) return t.status();
  const int link_fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (link_fd < 0) {
    return Status(StatusCode::kResourceExhausted, fmt::format("dup: {}", std::strerror(errno)));
  }
  // The acceptor handed the socket over once the client's offer was
  // readable: no wait here (timeout 0), the loop never blocks on a peer.
  auto link = t.value()->accept(link_fd, {g.slot_count, g.slot_size}, std::chrono::milliseconds(0),
                                fmt::format("shm {}", peer));
  if (!link.ok()) return link.status();  // accept() has closed link_fd
  raw = link.value().get();
  auto session = core::ServerSession::create(loop, std::move(link.value()), g, methods, peer,
                                             on_closed(index, ring_bytes));
  if (!session.ok()) {
    raw = nullptr;
    return session.status();
  }
  session.value()->set_counters(counters[index]);
  session.value()->set_max_bulk_bytes(config.max_bulk_bytes);
  core::log().info("slotrpc: shm session with {} on loop {}", peer, index);
  return session;
}

Result<std::unique_ptr<core::ServerSession>> Server::Impl::open_tcp(
    size_t index, int fd, core::ServerSession::Geometry g, const std::string& peer,
    uint64_t ring_bytes, uint64_t* lane_token) {
  reactor::Reactor& loop = *loops[index];
  // The link gets a duplicate: the original stays ours for the reply, even
  // when a failure below destroys the link (and closes its fd).
  const int link_fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (link_fd < 0) {
    return Status(StatusCode::kResourceExhausted, fmt::format("dup: {}", std::strerror(errno)));
  }
  auto link = loop.tcp().adopt(link_fd, fmt::format("tcp {} -> {}", rpc::local_name(fd), peer));
  if (!link.ok()) return link.status();  // adopt() has closed link_fd
  // Loop indexes fit the token's 16 route bits (reactor_threads <= 256).
  if (config.tcp_bulk_lane != 0) *lane_token = link.value()->offer_lane(static_cast<uint16_t>(index));
  link.value()->accept_pushes(config.tcp_bulk_push != 0);  // announced below (kFeatureTcpPush)
  auto session = core::ServerSession::create(loop, std::move(link.value()), g, methods, peer,
                                             on_closed(index, ring_bytes));
  if (session.ok()) {
    session.value()->set_counters(counters[index]);
    session.value()->set_max_bulk_bytes(config.max_bulk_bytes);
    session.value()->set_flush_every(config.tcp_flush_every);
  }
  return session;
}

Result<std::vector<std::byte>> Server::Impl::open_verbs(size_t index, int fd,
                                                        core::ServerSession::Geometry g,
                                                        const std::string& peer,
                                                        const transport::verbs::QpInfo& remote,
                                                        std::unique_ptr<core::ServerSession>& out,
                                                        uint64_t ring_bytes) {
  reactor::Reactor& loop = *loops[index];
  auto t = loop.verbs();
  if (!t.ok()) return t.status();
  // The link watches a duplicate of the connection for EOF.
  FdCloser closer{::fcntl(fd, F_DUPFD_CLOEXEC, 0)};  // until the link owns it
  if (closer.fd < 0) {
    return Status(StatusCode::kResourceExhausted, fmt::format("dup: {}", std::strerror(errno)));
  }
  auto link = t.value()->create_link(fmt::format("verbs {} -> {}", rpc::local_name(fd), peer),
                                     g.slot_count);
  if (!link.ok()) return link.status();
  transport::verbs::VerbsLink* raw_link = link.value().get();
  auto session = core::ServerSession::create(loop, std::move(link.value()), g, methods, peer,
                                             on_closed(index, ring_bytes));
  if (!session.ok()) return session.status();
  session.value()->set_counters(counters[index]);
  session.value()->set_max_bulk_bytes(config.max_bulk_bytes);
  // Never registered, never closed: a failure below just destroys it.
  Status st = raw_link->connect(remote, closer.fd, peer);
  if (!st.ok()) return st;
  closer.fd = -1;
  std::vector<std::byte> ext(transport::verbs::kQpInfoSize);
  transport::verbs::encode_qp_info(raw_link->local_info(), ext.data());
  core::log().debug("slotrpc: verbs session with {} on loop {}: {}", peer, index, raw_link->describe());
  out = std::move(session.value());
  return ext;
}

void Server::stop() {
  Impl& d = *impl_;
  if (!d.started) return;
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
      core::log().warn("slotrpc: server stopping with {} metrics() call(s) still under way", d.readers);
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
    core::log().warn("slotrpc: server stopped with handlers still running; their sessions are "
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
  std::vector<std::shared_ptr<metrics::LoopCounters>> counters;
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
    metrics::LoopCounters* loop_counters = counters[i].get();
    auto read = [&d, i, loop, loop_counters] {
      std::vector<const transport::Link*> links;
      links.reserve(d.sessions[i].size());
      for (const auto& [raw, owned] : d.sessions[i]) {
        if (!raw->closed()) links.push_back(&raw->link());
      }
      return metrics::read_loop(*loop, *loop_counters, links, 0);
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
