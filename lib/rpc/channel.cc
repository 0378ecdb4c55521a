#include "slotrpc/channel.h"

#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <array>
#include <cassert>
#include <future>
#include <thread>
#include <vector>

#include "core/client_session.h"
#include "core/handshake.h"
#include "core/logging.h"
#include "reactor/reactor.h"
#include "rpc/connector.h"
#include "transport/verbs/device_probe.h"

namespace slotrpc {

struct Channel::Impl {
  std::string address;
  Config config;
  std::string peer;
  TransportKind kind = TransportKind::kTcp;
  std::shared_ptr<reactor::Reactor> loop;
  std::atomic<uint64_t> last_request_id{0};
  std::atomic<bool> closing{false};

  // Loop thread only (after connect() returned).
  std::shared_ptr<core::ClientSession> session;
  bool reconnecting = false;
  std::vector<std::function<void(const Status&)>> waiting_for_session;
  std::thread reconnector;

  // Loop thread: runs `then` with OK once a live session exists, starting a
  // reconnect if the current one is closed; with the error if that fails.
  void with_session(std::function<void(const Status&)> then);
  Status start_session(int fd);  // loop thread
};

namespace {

// Sends our Hello and reads the server's answer.
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

// Blocking: TCP connect plus handshake, bounded by connect_timeout_ms.
Result<int> open_session_socket(const std::string& address, const Config& cfg) {
  auto endpoint = rpc::parse_address(address);
  if (!endpoint.ok()) return endpoint.status();
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(cfg.connect_timeout_ms);
  auto fd = rpc::connect_tcp(*endpoint, deadline);
  if (!fd.ok()) return fd.status();
  Status st = client_handshake(*fd, cfg, deadline);
  if (!st.ok()) {
    ::close(*fd);
    return Status(st.code(), fmt::format("connect to {}: {}", address, st.message()));
  }
  return *fd;
}

}  // namespace

Status Channel::Impl::start_session(int fd) {
  peer = rpc::peer_name(fd);
  const std::string description = fmt::format("tcp {} -> {}", rpc::local_name(fd), peer);
  auto link = loop->tcp().adopt(fd, description);
  if (!link.ok()) return link.status();  // adopt() closed the fd
  auto created = core::ClientSession::create(
      *loop, loop->tcp(), std::move(link.value()),
      core::ClientSession::Geometry{config.slot_count, config.slot_size}, peer);
  if (!created.ok()) return created.status();
  session = std::move(created.value());
  session->set_loop_handle(loop);
  return {};
}

void Channel::Impl::with_session(std::function<void(const Status&)> then) {
  if (session && !session->closed()) return then(Status());
  if (closing.load()) return then(Status(StatusCode::kCancelled, "channel closed"));
  waiting_for_session.push_back(std::move(then));
  if (reconnecting) return;
  reconnecting = true;
  if (reconnector.joinable()) reconnector.join();  // the previous one has finished
  spdlog::info("slotrpc: reconnecting to {}", address);
  // Connecting blocks, so it runs beside the loop, never on it.
  reconnector = std::thread([this] {
    Result<int> fd = open_session_socket(address, config);
    loop->post([this, fd] {
      reconnecting = false;
      Status st = fd.ok() ? start_session(fd.value()) : fd.status();
      if (st.ok()) spdlog::info("slotrpc: reconnected to {}", peer);
      auto waiting = std::move(waiting_for_session);
      waiting_for_session.clear();
      for (auto& fn : waiting) fn(st);
    });
  });
}

Result<std::unique_ptr<Channel>> Channel::connect(const std::string& address, Config config) {
  auto cfg = config.with_environment();
  if (!cfg.ok()) return cfg.status();
  core::apply_log_level(cfg->log_level);
  if (cfg->transport == TransportKind::kVerbs) {
    return Status(StatusCode::kUnavailable,
                  "transport 'verbs' was requested (Config.transport / SLOTRPC_TRANSPORT) but "
                  "this build has no verbs transport yet; use 'tcp' or 'auto'");
  }
  auto fd = open_session_socket(address, *cfg);
  if (!fd.ok()) return fd.status();

  auto impl = std::make_shared<Impl>();
  impl->address = address;
  impl->config = *cfg;
  impl->kind = TransportKind::kTcp;
  impl->loop = std::make_shared<reactor::Reactor>(*cfg, "slotrpc-chan");
  impl->loop->start();
  std::promise<Status> ready;
  impl->loop->post([p = impl.get(), sock = *fd, &ready] { ready.set_value(p->start_session(sock)); });
  Status st = ready.get_future().get();
  if (!st.ok()) return st;
  spdlog::info("slotrpc: channel to {} uses tcp (transport={}; RDMA devices here: {}; this build "
               "has no verbs transport yet)",
               impl->peer, to_string(cfg->transport), transport::verbs::describe_devices());
  return std::unique_ptr<Channel>(new Channel(std::move(impl)));
}

Channel::Channel(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

Channel::~Channel() {
  assert(!impl_->loop->on_this_thread() && "a Channel cannot be destroyed on its own event loop");
  impl_->closing.store(true);
  // A reconnect in progress finishes (bounded by connect_timeout_ms) and
  // posts its result, which the shutdown below then overrides.
  std::thread reconnector;
  std::promise<void> taken;
  impl_->loop->post([impl = impl_.get(), &reconnector, &taken] {
    reconnector = std::move(impl->reconnector);
    taken.set_value();
  });
  taken.get_future().wait();
  if (reconnector.joinable()) reconnector.join();
  impl_->loop->post([impl = impl_.get()] {
    if (impl->session) impl->session->shutdown(Status(StatusCode::kCancelled, "channel closed"));
    auto waiting = std::move(impl->waiting_for_session);
    for (auto& fn : waiting) fn(Status(StatusCode::kCancelled, "channel closed"));
  });
  impl_->loop->stop();
}

CallHandle Channel::submit(core::PendingCall* pc) {
  pc->request_id = impl_->last_request_id.fetch_add(1, std::memory_order_relaxed) + 1;
  const uint64_t id = pc->request_id;
  // The session is touched only on the loop (a reconnect may replace it).
  impl_->loop->run_or_post([impl = impl_.get(), pc] {
    if (impl->session) {
      impl->session->submit(pc);
    } else {
      delete pc;  // unreachable: connect() leaves a session behind
    }
  });
  std::weak_ptr<Impl> weak = impl_;
  return CallHandle([weak, id] {
    auto impl = weak.lock();
    if (!impl || impl->closing.load()) return;
    impl->loop->run_or_post([impl, id] {
      if (impl->session) impl->session->cancel(id, Status(StatusCode::kCancelled, "cancelled by the caller"));
    });
  });
}

namespace {

// An idempotent call that may be sent again after UNAVAILABLE.
struct RetryingCall : std::enable_shared_from_this<RetryingCall> {
  std::weak_ptr<Channel::Impl> channel;
  uint32_t method_id = 0;
  RequestWriter writer;  // kept: every attempt builds the request afresh
  CallOptions options;
  ReplySink sink;
  uint32_t retries_left = 0;
  std::atomic<bool> cancelled{false};
  std::atomic<uint64_t> current_id{0};
};

}  // namespace

CallHandle Channel::call(uint32_t method_id, RequestWriter writer, CallOptions options,
                         ReplySink sink) {
  if (options.idempotent && options.max_retries > 0) {
    auto r = std::make_shared<RetryingCall>();
    r->channel = impl_;
    r->method_id = method_id;
    r->writer = std::move(writer);
    r->options = options;
    r->sink = std::move(sink);
    r->retries_left = options.max_retries;
    // Each attempt is an ordinary call whose sink decides whether to retry.
    auto attempt = std::make_shared<std::function<void()>>();
    *attempt = [r, weak_attempt = std::weak_ptr<std::function<void()>>(attempt)]() {
      auto impl = r->channel.lock();
      if (!impl) return r->sink(RawReply(Status(StatusCode::kCancelled, "channel closed")));
      auto* pc = new core::PendingCall;
      pc->method_id = r->method_id;
      pc->writer = r->writer;
      pc->deadline = r->options.deadline;
      pc->request_id = impl->last_request_id.fetch_add(1, std::memory_order_relaxed) + 1;
      r->current_id = pc->request_id;
      auto again = weak_attempt.lock();
      pc->sink = [r, again](RawReply&& reply) {
        auto impl = r->channel.lock();
        const bool retry = reply.status().code() == StatusCode::kUnavailable &&
                           r->retries_left > 0 && !r->cancelled && impl && again &&
                           !impl->closing.load() &&
                           (!r->options.deadline || Clock::now() < *r->options.deadline);
        if (!retry) return r->sink(std::move(reply));
        --r->retries_left;
        spdlog::info("slotrpc: retrying idempotent call (method id 0x{:08x}) after: {}", r->method_id,
                     reply.status().message());
        impl->with_session([r, again, failed = Status(reply.status())](const Status& st) {
          if (!st.ok()) {
            return r->sink(RawReply(Status(StatusCode::kUnavailable,
                                           fmt::format("{}; reconnect failed: {}", failed.message(),
                                                       st.message()))));
          }
          (*again)();
        });
      };
      impl->session->submit(pc);
    };
    // The attempt chain keeps itself alive through the pending call's sink.
    impl_->loop->run_or_post([attempt, keep = attempt] { (*attempt)(); });
    std::weak_ptr<Impl> weak = impl_;
    return CallHandle([weak, r] {
      r->cancelled = true;
      auto impl = weak.lock();
      if (!impl || impl->closing.load()) return;
      impl->loop->run_or_post([impl, r] {
        if (impl->session)
          impl->session->cancel(r->current_id.load(), Status(StatusCode::kCancelled, "cancelled by the caller"));
      });
    });
  }
  auto* pc = new core::PendingCall;
  pc->method_id = method_id;
  pc->writer = std::move(writer);
  pc->sink = std::move(sink);
  pc->deadline = options.deadline;
  return submit(pc);
}

CallHandle Channel::call_stream(uint32_t method_id, RequestWriter writer, CallOptions options,
                                ReplySink on_message, std::function<void(Status)> on_end) {
  auto* pc = new core::PendingCall;
  pc->method_id = method_id;
  pc->writer = std::move(writer);
  pc->sink = std::move(on_message);
  pc->on_end = std::move(on_end);
  pc->stream = true;
  pc->window = options.stream_window != 0 ? options.stream_window : impl_->config.stream_window;
  pc->deadline = options.deadline;
  return submit(pc);
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
uint32_t Channel::slot_count() const { return impl_->config.slot_count; }
uint32_t Channel::slot_size() const { return impl_->config.slot_size; }

Channel::Stats Channel::stats() const {
  auto snapshot = [impl = impl_.get()] {
    const auto c = impl->session->counters();
    Stats out;
    out.free_slots = c.free_slots;
    out.in_flight = c.in_flight;
    out.zombies = c.zombies;
    out.held_replies = c.held;
    out.queued = c.queued;
    out.lent = c.lent;
    out.late_replies_dropped = c.late_replies_dropped;
    out.messages_sent = c.messages_sent;
    out.closed = impl->session->closed();
    return out;
  };
  if (impl_->loop->on_this_thread()) return snapshot();
  std::promise<Stats> result;
  impl_->loop->post([&] { result.set_value(snapshot()); });
  return result.get_future().get();
}

}  // namespace slotrpc
