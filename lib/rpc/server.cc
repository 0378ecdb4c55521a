#include "slotrpc/server.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <array>
#include <atomic>
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

  int listen_fd = -1;
  uint16_t port = 0;
  std::thread acceptor;
  std::atomic<bool> stopping{false};
  bool started = false;

  void accept_loop();
  void handshake_and_hand_over(int fd);
  void adopt(size_t loop_index, int fd, core::ServerSession::Geometry g, std::string peer);
};

namespace {

// Answers a Hello: OK with the accepted geometry, or a refusal that says why.
Status send_reply(int fd, uint16_t status, const core::Hello& hello, const std::string& message,
                  rpc::Deadline deadline) {
  std::array<std::byte, core::kHelloSize> buf;
  core::HelloReply reply;
  reply.status = status;
  reply.slot_count = hello.slot_count;
  reply.slot_size = hello.slot_size;
  reply.message_len = static_cast<uint32_t>(std::min<size_t>(message.size(), core::kMaxHandshakeMessage));
  core::encode_hello_reply(reply, buf.data());
  Status st = rpc::write_all(fd, buf, deadline);
  if (st.ok() && reply.message_len > 0)
    st = rpc::write_all(fd, std::as_bytes(std::span(message.data(), reply.message_len)), deadline);
  return st;
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
  if (impl_->config.transport == TransportKind::kVerbs) {
    return Status(StatusCode::kUnavailable,
                  "transport 'verbs' was requested (Config.transport / SLOTRPC_TRANSPORT) but "
                  "this build has no verbs transport yet; use 'tcp' or 'auto'");
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
  spdlog::info("slotrpc: server listening on {}:{} (tcp, {} event loop(s), up to {} slots of {} bytes)",
               endpoint->host, impl_->port, n, impl_->config.slot_count, impl_->config.slot_size);
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
  if (h.transport != core::WireTransport::kTcp) {
    return refuse(StatusCode::kUnavailable, "this server offers only the tcp transport");
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
  st = send_reply(fd, 0, h, "", deadline);
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
      loop, loop.tcp(), std::move(link.value()), g, methods, peer,
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
