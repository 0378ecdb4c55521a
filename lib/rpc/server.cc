#include "slotrpc/server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <array>
#include <atomic>
#include <cstring>
#include <future>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/handshake.h"
#include "core/logging.h"
#include "core/method_table.h"
#include "core/server_session.h"
#include "core/settings.h"
#include "reactor/reactor.h"
#include "rpc/connector.h"
#include "transport/verbs/device.h"
#include "transport/verbs/verbs_transport.h"

namespace slotrpc {

struct Server::Impl {
  Config config;
  std::vector<std::unique_ptr<ServiceDefinition>> services;  // stable addresses
  core::MethodTable methods;

  std::vector<std::unique_ptr<reactor::Reactor>> loops;
  // sessions[i] is touched only on loops[i]'s thread (or after it stopped).
  std::vector<std::unordered_map<core::ServerSession*, std::unique_ptr<core::ServerSession>>> sessions;
  std::atomic<size_t> session_count{0};
  size_t next_loop = 0;

  // Whether this server accepts verbs sessions, and the device or why not.
  bool verbs_ok = false;
  std::string verbs_note;

  int listen_fd = -1;
  uint16_t port = 0;
  std::thread acceptor;
  std::atomic<bool> stopping{false};
  bool started = false;

  void accept_loop();
  void handshake_and_hand_over(int fd);
  void adopt(size_t loop_index, int fd, core::ServerSession::Geometry g, std::string peer);
  // Loop thread: a verbs session towards `remote`, its link owning
  // `link_fd` on success; returns the server's extension.
  Result<std::vector<std::byte>> adopt_verbs(size_t loop_index, int link_fd,
                                             core::ServerSession::Geometry g, std::string peer,
                                             std::string local,
                                             transport::verbs::QpInfo remote);
};

namespace {

struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

// Answers a Hello: OK with the accepted geometry and the chosen transport
// (plus its extension), or a refusal that says why.
Status send_reply(int fd, uint16_t status, const core::Hello& hello, const std::string& message,
                  rpc::Deadline deadline,
                  core::WireTransport transport = core::WireTransport::kTcp,
                  std::span<const std::byte> extension = {}) {
  core::HelloReply reply;
  reply.status = status;
  reply.slot_count = hello.slot_count;
  reply.slot_size = hello.slot_size;
  reply.transport = transport;
  reply.message_len = static_cast<uint32_t>(std::min<size_t>(message.size(), core::kMaxHandshakeMessage));
  reply.extension_len = static_cast<uint32_t>(extension.size());
  std::vector<std::byte> buf(core::kHelloSize + reply.message_len + extension.size());
  core::encode_hello_reply(reply, buf.data());
  std::memcpy(buf.data() + core::kHelloSize, message.data(), reply.message_len);
  std::copy(extension.begin(), extension.end(), buf.begin() + core::kHelloSize + reply.message_len);
  return rpc::write_all(fd, buf, deadline);
}

}  // namespace

Server::Server(Config config) : impl_(std::make_unique<Impl>()) { impl_->config = std::move(config); }

Server::~Server() { stop(); }

Status Server::add_service(ServiceDefinition service) {
  if (impl_->started) {
    return Status(StatusCode::kInvalidArgument, "add_service() after start()");
  }
  auto owned = std::make_unique<ServiceDefinition>(std::move(service));
  Status st = impl_->methods.add(*owned);
  if (!st.ok()) return st;
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
  core::apply_log_level(impl_->config.log_level);
  if (impl_->config.transport != TransportKind::kTcp) {
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
    impl_->verbs_note = "transport=tcp";
  }

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
  impl_->listen_fd = acceptor.release();

  const uint32_t n = impl_->config.reactor_threads;
  impl_->sessions.resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    impl_->loops.push_back(std::make_unique<reactor::Reactor>(impl_->config, fmt::format("slotrpc-srv{}", i)));
    impl_->loops.back()->start();
  }
  impl_->started = true;
  impl_->acceptor = std::thread([impl = impl_.get()] { impl->accept_loop(); });
  const std::string transports =
      impl_->config.transport == TransportKind::kVerbs ? "verbs only, on " + impl_->verbs_note
      : impl_->verbs_ok ? "tcp and verbs on " + impl_->verbs_note
                        : "tcp only: " + impl_->verbs_note;
  spdlog::info("slotrpc: server listening on {}:{} ({}; {} event loop(s), up to {} slots of {} bytes)",
               endpoint->host, impl_->port, transports, n, impl_->config.slot_count,
               impl_->config.slot_size);
  return {};
}

void Server::Impl::accept_loop() {
  pthread_setname_np(pthread_self(), "slotrpc-accept");
  while (!stopping.load()) {
    pollfd p{listen_fd, POLLIN, 0};
    // A short timeout keeps stop() prompt without a wakeup fd.
    if (::poll(&p, 1, 100) <= 0) continue;
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    // One slow client can hold this thread for at most connect_timeout_ms.
    handshake_and_hand_over(fd);
  }
}

void Server::Impl::handshake_and_hand_over(int fd) {
  const std::string peer = rpc::peer_name(fd);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(config.connect_timeout_ms);
  std::array<std::byte, core::kHelloSize> buf;
  Status st = rpc::read_exact(fd, buf, deadline);
  if (!st.ok()) {
    spdlog::warn("slotrpc: handshake with {} failed: {}", peer, st.message());
    ::close(fd);
    return;
  }
  auto hello = core::decode_hello(buf.data());
  core::Hello h = hello.ok() ? hello.value() : core::Hello{};
  auto refuse = [&](StatusCode code, const std::string& why) {
    spdlog::warn("slotrpc: refused session from {}: {}", peer, why);
    (void)send_reply(fd, static_cast<uint16_t>(code), h, why, deadline);
    ::close(fd);
  };
  if (!hello.ok()) return refuse(StatusCode::kUnavailable, hello.status().message());
  std::vector<std::byte> extension(h.extension_len);
  st = rpc::read_exact(fd, extension, deadline);
  if (!st.ok()) {
    spdlog::warn("slotrpc: handshake with {} failed: {}", peer, st.message());
    ::close(fd);
    return;
  }
  if (h.transport == core::WireTransport::kTcp && config.transport == TransportKind::kVerbs) {
    return refuse(StatusCode::kUnavailable,
                  "this server accepts only the verbs transport (SLOTRPC_TRANSPORT=verbs); the "
                  "client offered tcp");
  }
  if (h.slot_count < 1 || h.slot_count > config.slot_count || h.slot_size < core::kMinSlotSize ||
      h.slot_size > config.slot_size || h.slot_size % core::kSlotSizeAlign != 0) {
    return refuse(StatusCode::kResourceExhausted,
                  fmt::format("asked for {} slots of {} bytes; this server allows 1..{} slots of "
                              "{}..{} bytes (multiples of {}); lower the client's slot_count / "
                              "slot_size or raise the server's",
                              h.slot_count, h.slot_size, config.slot_count, core::kMinSlotSize,
                              config.slot_size, core::kSlotSizeAlign));
  }
  std::string tcp_note;  // why a verbs proposal is answered with tcp
  if (h.transport == core::WireTransport::kVerbs) {
    if (!verbs_ok) {
      tcp_note = config.transport == TransportKind::kTcp
                     ? "the server uses tcp only (transport=tcp)"
                     : "the server has no usable RDMA device: " + verbs_note;
    } else {
      auto remote = transport::verbs::decode_qp_info(extension);
      if (!remote.ok()) return refuse(StatusCode::kUnavailable, remote.status().message());
      if (remote->slot_count != h.slot_count || remote->slot_size != h.slot_size) {
        return refuse(StatusCode::kUnavailable,
                      "handshake failed: the verbs extension's ring geometry differs from the hello's");
      }
      // The session is made on its loop (its rings are registered and its
      // window bound there, before this thread answers); its link gets a
      // duplicate of the fd and watches it for EOF, this thread answers on
      // the original.
      const size_t index = next_loop++ % loops.size();
      const int link_fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
      if (link_fd < 0) {
        return refuse(StatusCode::kUnavailable,
                      fmt::format("server cannot set up verbs: dup: {}", std::strerror(errno)));
      }
      using Answer = Result<std::vector<std::byte>>;
      auto answer = std::make_shared<std::promise<Answer>>();
      auto ready = answer->get_future();
      loops[index]->post([this, index, link_fd, g = core::ServerSession::Geometry{h.slot_count, h.slot_size},
                          peer, local = rpc::local_name(fd), info = remote.value(), answer] {
        answer->set_value(adopt_verbs(index, link_fd, g, peer, local, info));
      });
      if (ready.wait_until(deadline) != std::future_status::ready) {
        const std::string why = "server event loop did not set up the session in time";
        spdlog::warn("slotrpc: refused session from {}: {}", peer, why);
        (void)send_reply(fd, static_cast<uint16_t>(StatusCode::kUnavailable), h, why, deadline);
        // The session may still appear on the loop: the shutdown gives its
        // link (which holds a duplicate of this fd) EOF.
        ::shutdown(fd, SHUT_RDWR);
        ::close(fd);
        return;
      }
      Answer a = ready.get();
      if (a.ok()) {
        st = send_reply(fd, 0, h, "", deadline, core::WireTransport::kVerbs, a.value());
        if (!st.ok()) {
          spdlog::warn("slotrpc: handshake with {} failed: {}", peer, st.message());
          ::shutdown(fd, SHUT_RDWR);  // the session's link sees EOF and closes it
        }
        ::close(fd);
        return;
      }
      if (config.transport == TransportKind::kVerbs) {
        return refuse(a.status().code(), "server cannot set up verbs: " + a.status().message());
      }
      spdlog::warn("slotrpc: verbs setup for {} failed, answering with tcp: {}", peer,
                   a.status().message());
      tcp_note = "verbs setup failed on the server: " + a.status().message();
    }
  }
  st = send_reply(fd, 0, h, tcp_note, deadline);
  if (!st.ok()) {
    spdlog::warn("slotrpc: handshake with {} failed: {}", peer, st.message());
    ::close(fd);
    return;
  }
  const size_t index = next_loop++ % loops.size();
  loops[index]->post([this, index, fd, g = core::ServerSession::Geometry{h.slot_count, h.slot_size}, peer] {
    adopt(index, fd, g, peer);
  });
}

void Server::Impl::adopt(size_t index, int fd, core::ServerSession::Geometry g, std::string peer) {
  reactor::Reactor& loop = *loops[index];
  if (stopping.load()) {
    ::close(fd);
    return;
  }
  auto link = loop.tcp().adopt(fd, fmt::format("tcp {} -> {}", rpc::local_name(fd), peer));
  if (!link.ok()) {  // adopt() has closed the fd
    spdlog::warn("slotrpc: cannot serve {}: {}", peer, link.status().message());
    return;
  }
  auto session = core::ServerSession::create(
      loop, std::move(link.value()), g, methods, peer,
      [this, index](core::ServerSession* s) {
        if (sessions[index].erase(s) != 0) --session_count;
      });
  if (!session.ok()) {
    spdlog::warn("slotrpc: cannot serve {}: {}", peer, session.status().message());
    return;
  }
  spdlog::debug("slotrpc: session with {} on loop {}", peer, index);
  core::ServerSession* raw = session.value().get();
  sessions[index].emplace(raw, std::move(session.value()));
  ++session_count;
}

Result<std::vector<std::byte>> Server::Impl::adopt_verbs(size_t index, int link_fd,
                                                          core::ServerSession::Geometry g,
                                                          std::string peer, std::string local,
                                                          transport::verbs::QpInfo remote) {
  FdCloser closer{link_fd};  // until the link owns it
  reactor::Reactor& loop = *loops[index];
  if (stopping.load()) return Status(StatusCode::kUnavailable, "server stopping");
  auto t = loop.verbs();
  if (!t.ok()) return t.status();
  auto link = t.value()->create_link(fmt::format("verbs {} -> {}", local, peer), g.slot_count);
  if (!link.ok()) return link.status();
  transport::verbs::VerbsLink* raw_link = link.value().get();
  auto session = core::ServerSession::create(
      loop, std::move(link.value()), g, methods, peer,
      [this, index](core::ServerSession* s) {
        if (sessions[index].erase(s) != 0) --session_count;
      });
  if (!session.ok()) return session.status();
  // Never registered, never closed: a failure below just destroys it.
  Status st = raw_link->connect(remote, link_fd, peer);
  if (!st.ok()) return st;
  closer.fd = -1;
  std::vector<std::byte> ext(transport::verbs::kQpInfoSize);
  transport::verbs::encode_qp_info(raw_link->local_info(), ext.data());
  spdlog::debug("slotrpc: verbs session with {} on loop {}: {}", peer, index, raw_link->describe());
  core::ServerSession* raw = session.value().get();
  sessions[index].emplace(raw, std::move(session.value()));
  ++session_count;
  return ext;
}

void Server::stop() {
  Impl& d = *impl_;
  if (!d.started) return;
  d.started = false;
  d.stopping.store(true);
  if (d.acceptor.joinable()) d.acceptor.join();
  ::close(d.listen_fd);
  d.listen_fd = -1;
  for (size_t i = 0; i < d.loops.size(); ++i) {
    d.loops[i]->post([&d, i] {
      std::vector<core::ServerSession*> open;
      for (auto& [raw, owned] : d.sessions[i]) open.push_back(raw);
      for (auto* s : open) s->close("server stopping");
    });
  }
  // Give running handlers a moment to return; sessions leave as they do.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (d.session_count.load() != 0 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (auto& loop : d.loops) loop->stop();
  // Loops are stopped: their state is ours now.  Sessions go before their
  // loops (they unregister from them); handlers still suspended in a fiber
  // are unwound when the loops are destroyed.
  for (auto& m : d.sessions) m.clear();
  d.session_count.store(0);
  d.loops.clear();
  d.sessions.clear();
}

uint16_t Server::port() const { return impl_->port; }
const Config& Server::config() const { return impl_->config; }
size_t Server::session_count() const { return impl_->session_count.load(); }

}  // namespace slotrpc
