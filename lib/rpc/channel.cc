#include "slotrpc/channel.h"

#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <array>
#include <cassert>
#include <future>
#include <vector>

#include "core/client_session.h"
#include "core/handshake.h"
#include "core/logging.h"
#include "reactor/reactor.h"
#include "rpc/connector.h"
#include "transport/verbs/device_probe.h"

namespace slotrpc {

struct Channel::Impl {
  Config config;
  std::string peer;
  TransportKind kind = TransportKind::kTcp;
  uint32_t slot_count = 0;
  uint32_t slot_size = 0;
  std::shared_ptr<reactor::Reactor> loop;  // shared only with held replies' releases
  std::shared_ptr<core::ClientSession> session;
};

namespace {

// Sends our Hello and reads the server's answer; returns the agreed geometry.
Status client_handshake(int fd, const Config& cfg, rpc::Deadline deadline) {
  std::array<std::byte, core::kHelloSize> buf;
  core::Hello hello;
  hello.transport = core::WireTransport::kTcp;
  hello.slot_count = cfg.slot_count;
  hello.slot_size = cfg.slot_size;
  core::encode_hello(hello, buf.data());
  Status st = rpc::write_all(fd, buf, deadline);
  if (!st.ok()) return st;
  st = rpc::read_exact(fd, buf, deadline);
  if (!st.ok()) return st;
  auto reply = core::decode_hello_reply(buf.data());
  if (!reply.ok()) return reply.status();
  std::string message(reply->message_len, '\0');
  st = rpc::read_exact(fd, std::as_writable_bytes(std::span(message)), deadline);
  if (!st.ok()) return st;
  if (reply->status != 0) {
    const auto code = is_known_status_code(reply->status) ? static_cast<StatusCode>(reply->status)
                                                          : StatusCode::kUnavailable;
    return Status(code, "server refused the session: " + message);
  }
  if (reply->slot_count != cfg.slot_count || reply->slot_size != cfg.slot_size) {
    return Status(StatusCode::kUnavailable, "server answered with a different ring geometry");
  }
  return {};
}

}  // namespace

Result<std::unique_ptr<Channel>> Channel::connect(const std::string& address, Config config) {
  auto cfg = config.with_environment();
  if (!cfg.ok()) return cfg.status();
  core::apply_log_level(cfg->log_level);
  if (cfg->transport == TransportKind::kVerbs) {
    return Status(StatusCode::kUnavailable,
                  "transport 'verbs' was requested (Config.transport / SLOTRPC_TRANSPORT) but "
                  "this build has no verbs transport yet; use 'tcp' or 'auto'");
  }
  auto endpoint = rpc::parse_address(address);
  if (!endpoint.ok()) return endpoint.status();
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(cfg->connect_timeout_ms);
  auto fd = rpc::connect_tcp(*endpoint, deadline);
  if (!fd.ok()) return fd.status();
  Status st = client_handshake(*fd, *cfg, deadline);
  if (!st.ok()) {
    ::close(*fd);
    return Status(st.code(), fmt::format("connect to {}: {}", address, st.message()));
  }

  auto impl = std::make_unique<Impl>();
  impl->config = *cfg;
  impl->peer = rpc::peer_name(*fd);
  impl->kind = TransportKind::kTcp;
  impl->slot_count = cfg->slot_count;
  impl->slot_size = cfg->slot_size;
  spdlog::info("slotrpc: channel to {} uses tcp (transport={}; RDMA devices here: {}; this build "
               "has no verbs transport yet)",
               impl->peer, to_string(cfg->transport), transport::verbs::describe_devices());
  impl->loop = std::make_shared<reactor::Reactor>(*cfg, "slotrpc-chan");
  impl->loop->start();

  std::promise<Status> ready;
  Impl* p = impl.get();
  const int sock = *fd;
  p->loop->post([p, sock, &ready] {
    const std::string description = fmt::format("tcp {} -> {}", rpc::local_name(sock), p->peer);
    auto link = p->loop->tcp().adopt(sock, description);
    if (!link.ok()) return ready.set_value(link.status());  // adopt() closed the fd
    auto session = core::ClientSession::create(
        *p->loop, p->loop->tcp(), std::move(link.value()),
        core::ClientSession::Geometry{p->slot_count, p->slot_size}, p->peer);
    if (!session.ok()) return ready.set_value(session.status());
    p->session = std::move(session.value());
    p->session->set_loop_handle(p->loop);
    ready.set_value(Status());
  });
  st = ready.get_future().get();
  if (!st.ok()) return st;
  return std::unique_ptr<Channel>(new Channel(std::move(impl)));
}

Channel::Channel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Channel::~Channel() {
  assert(!impl_->loop->on_this_thread() && "a Channel cannot be destroyed on its own event loop");
  impl_->loop->post([s = impl_->session] {
    s->shutdown(Status(StatusCode::kCancelled, "channel closed"));
  });
  impl_->loop->stop();
}

CallHandle Channel::call(uint32_t method_id, RequestWriter writer, CallOptions options,
                         ReplySink sink) {
  auto* pc = new core::PendingCall;
  pc->method_id = method_id;
  pc->writer = std::move(writer);
  pc->sink = std::move(sink);
  pc->deadline = options.deadline;
  core::ClientSession* session = impl_->session.get();
  pc->request_id = session->next_request_id();
  impl_->loop->run_or_post([session, pc] { session->submit(pc); });

  std::weak_ptr<core::ClientSession> weak = impl_->session;
  const uint64_t id = pc->request_id;
  return CallHandle([weak, id] {
    auto s = weak.lock();
    if (!s || s->closed()) return;
    s->loop().run_or_post([s, id] {
      s->cancel(id, Status(StatusCode::kCancelled, "cancelled by the caller"));
    });
  });
}

Future<RawReply> Channel::call(uint32_t method_id, RequestWriter writer, CallOptions options) {
  auto state = std::make_shared<detail::SharedState<RawReply>>();
  CallHandle handle = call(method_id, std::move(writer), std::move(options),
                           [state](RawReply&& reply) { state->set(std::move(reply)); });
  std::lock_guard<std::mutex> lock(state->mu);
  if (!state->value) state->cancel = [handle] { handle.cancel(); };
  return Future<RawReply>(state);
}

TransportKind Channel::transport() const { return impl_->kind; }
const std::string& Channel::peer() const { return impl_->peer; }
const Config& Channel::config() const { return impl_->config; }
uint32_t Channel::slot_count() const { return impl_->slot_count; }
uint32_t Channel::slot_size() const { return impl_->slot_size; }

Channel::Stats Channel::stats() const {
  auto snapshot = [s = impl_->session] {
    const auto c = s->counters();
    Stats out;
    out.free_slots = c.free_slots;
    out.in_flight = c.in_flight;
    out.zombies = c.zombies;
    out.held_replies = c.held;
    out.queued = c.queued;
    out.late_replies_dropped = c.late_replies_dropped;
    out.messages_sent = c.messages_sent;
    out.closed = s->closed();
    return out;
  };
  if (impl_->loop->on_this_thread()) return snapshot();
  std::promise<Stats> result;
  impl_->loop->post([&] { result.set_value(snapshot()); });
  return result.get_future().get();
}

}  // namespace slotrpc
