#include "slotrpc/channel.h"
#include "rpc/channel_impl.h"

#include "core/bulk/region.h"

#include <unistd.h>

#include <fmt/format.h>

#include <array>
#include <cassert>
#include <future>
#include <optional>
#include <random>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "core/client_session.h"
#include "base/logging.h"
#include "metrics/collect.h"
#include "transport/verbs/monitor.h"
#include "reactor/reactor.h"
#include "rpc/loop_transports.h"
#include "rpc/connector.h"
#include "rpc/fleet/fleet.h"
#include "rpc/runtime_core.h"
#include "slotrpc/fiber.h"
#include "transport/verbs/device_probe.h"
#include "transport/verbs/verbs_transport.h"


namespace slotrpc {


using detail::on_loop;

void Channel::Impl::with_session(std::function<void(const Status&)> then) {
  if (session && !session->closed()) return then(Status());
  if (closing.load()) return then(Status(StatusCode::kCancelled, "channel closed"));
  if (reconnecting) {
    waiting_for_session.push_back(std::move(then));
    return;
  }
  const Clock::time_point now = Clock::now();
  if (now < next_attempt) {
    // Backing off: fail fast instead of queueing behind a reconnect that may
    // be seconds away (a caller with a deadline could not wait anyway).
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(next_attempt - now).count();
    return then(Status(StatusCode::kUnavailable,
                       fmt::format("not reconnecting to {} for another {} ms (backing off after {} "
                                   "failed attempt{}; last: {})",
                                   address, left, reconnect_failures,
                                   reconnect_failures == 1 ? "" : "s", last_reconnect_error.message())));
  }
  waiting_for_session.push_back(std::move(then));
  reconnecting = true;
  ++reconnect_attempts;
  if (reconnector.joinable()) reconnector.join();  // the previous one has finished
  base::log().info("slotrpc: reconnecting to {}", address);
  // Connecting blocks (and waits for the loop), so it runs beside the loop.
  // The thread holds the Impl: a channel destroyed on its loop detaches it
  // rather than joining it there.
  reconnector = std::thread([self = shared_from_this()] {
    Result<rpc::Established> est = rpc::establish(*self);
    self->loop->post([self, est = std::move(est)]() mutable { self->reconnected(std::move(est)); });
  });
}

void Channel::Impl::install(rpc::Established& e) {
  session = std::move(e.session);
  peer = e.peer;
  kind = e.kind;
  attach_token = std::move(e.attach_token);
  attach_link = e.link;
}

void Channel::Impl::reconnected(Result<rpc::Established> est) {
  reconnecting = false;
  if (closing.load()) {
    // The channel was destroyed while this reconnect ran.
    if (est.ok()) {
      est.value().session->shutdown(Status(StatusCode::kCancelled, "channel closed"));
      runtime->retire(loop_index, std::move(est.value().session));
    }
    auto waiting = std::move(waiting_for_session);
    waiting_for_session.clear();
    for (auto& fn : waiting) fn(Status(StatusCode::kCancelled, "channel closed"));
    return;
  }
  Status st = est.status();
  if (st.ok()) {
    if (session) runtime->retire(loop_index, std::move(session));
    install(est.value());
    reconnect_failures = 0;
    next_attempt = {};
    ++reconnects;
    base::log().info("slotrpc: reconnected to {} ({})", peer, to_string(kind.load()));
  } else {
    ++reconnect_failures;
    const uint32_t doublings = std::min<uint32_t>(reconnect_failures - 1, 20);
    const auto delay = std::min<std::chrono::milliseconds>(kBackoffMax, kBackoffBase * (uint64_t{1} << doublings));
    const double factor = std::uniform_real_distribution<double>(0.5, 1.0)(jitter);
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(delay * factor);
    next_attempt = Clock::now() + wait;
    last_reconnect_error = st;
    base::log().warn("slotrpc: reconnect to {} failed ({} in a row), next attempt in {} ms: {}", address,
                 reconnect_failures, wait.count(), st.message());
  }
  auto waiting = std::move(waiting_for_session);
  waiting_for_session.clear();
  for (auto& fn : waiting) fn(st);
}

Result<std::unique_ptr<Channel>> Channel::connect(const std::string& address, Config config) {
  auto cfg = config.with_environment();
  if (!cfg.ok()) return cfg.status();
  // No runtime given: the default one, unless this config asks for other
  // loop settings; then a loop of its own, as before runtimes existed
  // (include/slotrpc/runtime.h).
  const auto& shared = detail::default_core_here_or(detail::RuntimeCore::Side::kClient);
  const std::string differs = detail::loop_setting_difference(*cfg, shared->config);
  if (differs.empty()) return connect_on(address, shared, std::move(cfg.value()));
  Config own = cfg.value();
  own.reactor_threads = 1;
  auto core = detail::RuntimeCore::make(own, "slotrpc-chan", /*numbered=*/false);
  if (!core.ok()) return core.status();
  base::log().debug("slotrpc: channel to {} runs a loop of its own: its {} differs from the default runtime's",
                    address, differs);
  return connect_on(address, std::move(core.value()), std::move(cfg.value()));
}

Result<std::unique_ptr<Channel>> Channel::connect(const std::string& address, const Runtime& runtime,
                                                  Config config) {
  auto cfg = config.with_environment();
  if (!cfg.ok()) return cfg.status();
  // The runtime's loop settings win (include/slotrpc/runtime.h).
  detail::take_loop_settings(cfg.value(), runtime.core()->config);
  return connect_on(address, runtime.core(), std::move(cfg.value()));
}

Result<std::unique_ptr<Channel>> Channel::connect_on(const std::string& address,
                                                     std::shared_ptr<detail::RuntimeCore> runtime,
                                                     Config cfg_value) {
  const Config* cfg = &cfg_value;
  base::apply_log_level(cfg->log_level);
  if (runtime->current_index() >= 0 && !this_fiber::in_fiber()) {
    // A connect waits for the server, which may sit on this very loop.
    return Status(StatusCode::kInvalidArgument,
                  "Channel::connect() on one of the runtime's event loops outside a handler would "
                  "block that loop; connect from a handler (its fiber waits) or another thread");
  }

  auto impl = std::make_shared<Impl>();
  impl->address = address;
  impl->config = *cfg;
  if (fleet::is_resolver_target(address)) return connect_fleet(std::move(impl), std::move(runtime));
  if (cfg->transport == TransportKind::kAuto || cfg->transport == TransportKind::kVerbs) {
    auto probe = transport::verbs::probe(*cfg);
    if (probe.ok()) {
      impl->verbs_possible = true;
      impl->verbs_note = probe.value();
    } else if (cfg->transport == TransportKind::kVerbs) {
      return Status(StatusCode::kUnavailable,
                    "transport 'verbs' was requested (Config.transport / SLOTRPC_TRANSPORT) but "
                    "this host has no usable RDMA device: " + probe.status().message() +
                    " (RDMA devices listed: " + transport::verbs::describe_devices() + ")");
    } else {
      impl->verbs_note = probe.status().message();
    }
  }
  // A handler's channel stays on the handler's loop; others go round-robin.
  impl->loop_index = runtime->pick_loop(detail::RuntimeCore::Side::kClient);
  impl->loop = runtime->loops[impl->loop_index];
  impl->runtime = std::move(runtime);
  rpc::add_monitor_hook(*impl->loop, impl->monitor_hook);
  auto est = rpc::off_loop([&] { return rpc::establish(*impl); });
  if (!est.ok()) return est.status();
  on_loop(*impl->loop, [p = impl.get(), &est] {
    p->install(est.value());
    return 0;
  });
  base::log().info("slotrpc: channel to {} uses {} ({}; transport={}; loop {} of {})", impl->peer,
                   to_string(impl->kind.load()), est.value().note, to_string(cfg->transport),
                   impl->loop_index, impl->runtime->loops.size());
  return std::unique_ptr<Channel>(new Channel(std::move(impl)));
}

Result<std::unique_ptr<Channel>> Channel::connect_fleet(std::shared_ptr<Impl> impl,
                                                       std::shared_ptr<detail::RuntimeCore> runtime) {
  auto resolver = fleet::make_resolver(impl->address);
  if (!resolver.ok()) return resolver.status();
  impl->loop_index = runtime->pick_loop(detail::RuntimeCore::Side::kClient);
  impl->loop = runtime->loops[impl->loop_index];
  impl->runtime = runtime;
  impl->peer = impl->address;
  fleet::Fleet::Options o;
  o.target = impl->address;
  o.policy = impl->config.lb_policy;
  o.connect_timeout_ms = impl->config.connect_timeout_ms;
  o.home = impl->loop;
  // Each endpoint is a one-server channel on the same runtime and config.
  o.connect = [runtime, config = impl->config](const std::string& address) {
    return connect_on(address, runtime, config);
  };
  auto f = rpc::off_loop([&] { return fleet::Fleet::start(std::move(resolver.value()), std::move(o)); });
  if (!f.ok()) return f.status();
  impl->fleet = std::move(f.value());
  impl->kind = impl->fleet->transport();
  base::log().info("slotrpc: channel to {} (policy {}): {}", impl->address, to_string(impl->config.lb_policy),
                   impl->fleet->describe());
  return std::unique_ptr<Channel>(new Channel(std::move(impl)));
}

Channel::Channel(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

void Channel::on_monitor_sample(std::function<void(const MetricsSnapshot&)> callback) {
  impl_->monitor_hook->set(std::move(callback));
}

Channel::~Channel() {
  // The monitor callback points at the application's state, which may die
  // right after us: no call of it runs past this line (a tick in progress
  // holds the hook, not the channel; monitor.h, SampleHook).
  impl_->monitor_hook->close();
  // A fleet closes its endpoints' channels first (each like this one).
  if (impl_->fleet) impl_->fleet->close(impl_->runtime->current_index() < 0 && !this_fiber::in_fiber());
  // The loop is shared: it runs on.  The session is shut down on it (its
  // callbacks run there), and the channel's reference to it dropped there.
  impl_->closing.store(true);
  reactor::Reactor& loop = *impl_->loop;
  std::thread attach_opener;
  std::thread reconnector = on_loop(loop, [impl = impl_.get(), &attach_opener] {
    std::thread r = std::move(impl->reconnector);
    attach_opener = std::move(impl->attach_opener);
    impl->attach_token.clear();  // no new opener from here on
    impl->cancel_attach_wait();
    auto held = std::move(impl->waiting_for_attachment);
    impl->waiting_for_attachment.clear();
    for (core::PendingCall* pc : held)
      core::ClientSession::fail_later(*impl->loop, pc, Status(StatusCode::kCancelled, "channel closed"));
    if (impl->session) {
      impl->session->shutdown(Status(StatusCode::kCancelled, "channel closed"));
      impl->runtime->retire(impl->loop_index, std::move(impl->session));
    }
    auto waiting = std::move(impl->waiting_for_session);
    impl->waiting_for_session.clear();
    for (auto& fn : waiting) fn(Status(StatusCode::kCancelled, "channel closed"));
    return r;
  });
  // A reconnect in progress finishes (bounded by connect_timeout_ms); its
  // result finds the channel closing (reconnected()).  On the loop itself
  // it is not waited for: the thread holds the Impl it needs.
  // So does an attached connection being opened (the same bound; it holds
  // the Impl too).
  for (std::thread* t : {&reconnector, &attach_opener}) {
    if (!t->joinable()) continue;
    if (loop.on_this_thread() || this_fiber::in_fiber()) {
      t->detach();
    } else {
      t->join();
    }
  }
}

CallHandle Channel::submit(core::PendingCall* pc) {
  pc->request_id = impl_->last_request_id.fetch_add(1, std::memory_order_relaxed) + 1;
  const uint64_t id = pc->request_id;
  // The session is touched only on the loop (a reconnect may replace it).
  // A closed session fails the call fast with its own status, from a task
  // posted to the loop (never on this stack: the caller may be a completion
  // callback issuing its next call).
  // run_or_drive: a plain thread sends the call from its own stack when
  // the loop is parked for it (reactor/caller_turns.cc).
  if (!impl_->loop->on_this_thread()) impl_->handoffs.fetch_add(1, std::memory_order_relaxed);
  impl_->loop->run_or_drive([impl = impl_.get(), pc] {
    if (impl->session) {
      if ((!impl->attach_token.empty() || impl->attaching) && impl->hold_for_attachment(pc)) return;
      impl->session->submit(pc);
    } else {  // unreachable: connect() leaves a session behind
      core::ClientSession::fail_later(*impl->loop, pc, Status(StatusCode::kUnavailable, "no session"));
    }
  });
  std::weak_ptr<Impl> weak = impl_;
  return CallHandle([weak, id] {
    auto impl = weak.lock();
    if (!impl || impl->closing.load()) return;
    impl->loop->run_or_post([impl, id] {
      if (impl->cancel_held(id)) return;
      if (impl->session) impl->session->cancel(id, Status(StatusCode::kCancelled, "cancelled by the caller"));
    });
  });
}

Status Channel::add_interceptor(ClientInterceptor check) {
  if (impl_->called.load()) {
    return Status(StatusCode::kInvalidArgument,
                  "add_interceptor() after the channel's first call");
  }
  if (!check) return Status(StatusCode::kInvalidArgument, "add_interceptor(): an empty function");
  impl_->interceptors.push_back(std::move(check));
  return {};
}

Status Channel::Impl::run_interceptors(uint32_t method_id, CallOptions& options) {
  ClientCallInfo info;
  info.method_id = method_id;
  info.method_name = options.method_name;
  info.target = address;
  info.deadline = options.deadline;
  info.metadata = &options.metadata;
  for (const ClientInterceptor& check : interceptors) {
    Status st = check(info);
    if (!st.ok()) return st;
  }
  options.deadline = info.deadline;
  return {};
}

CallHandle Channel::call_stream(uint32_t method_id, RequestWriter writer, CallOptions options,
                                ReplySink on_message, std::function<void(Status)> on_end) {
  Status refused = impl_->intercept(method_id, options);
  if (impl_->fleet && refused.ok()) {
    // A stream stays on the endpoint it starts on, counted there (p2c).
    if (auto ep = impl_->fleet->start_stream(method_id, options, nullptr, on_end))
      return ep->channel->call_stream(method_id, std::move(writer), std::move(options), std::move(on_message),
                                      std::move(on_end));
    refused = Status(StatusCode::kUnavailable, "no usable endpoint: " + impl_->fleet->describe());
  }
  auto* pc = new core::PendingCall;
  pc->method_id = method_id;
  pc->method_name = options.method_name;
  pc->writer = std::move(writer);
  pc->sink = std::move(on_message);
  pc->on_end = std::move(on_end);
  pc->stream = true;
  pc->window = options.stream_window != 0 ? options.stream_window : impl_->config.stream_window;
  pc->deadline = options.deadline;
  // Refused in submit: streams carry no bulk segments.
  pc->take_options(std::move(options.metadata), std::move(options.send_segments),
                   std::move(options.receive_segments));
  if (!refused.ok()) return refuse(pc, refused);
  return submit(pc);
}

CallHandle Channel::refuse(core::PendingCall* pc, const Status& why) {
  // Completed on the loop like any early failure: never on this stack.
  core::ClientSession::fail_later(*impl_->loop, pc, why);
  return CallHandle();
}

Future<RawReply> Channel::call(uint32_t method_id, RequestWriter writer, CallOptions options) {
  auto state = std::make_shared<detail::SharedState<RawReply>>();
  CallHandle handle = call(method_id, std::move(writer), std::move(options),
                           [state](RawReply&& reply) { state->set(std::move(reply)); });
  std::lock_guard<std::mutex> lock(state->mu);
  if (!state->value) state->cancel = [handle] { handle.cancel(); };
  return Future<RawReply>(state);
}

TransportKind Channel::transport() const {
  return impl_->fleet ? impl_->fleet->transport() : impl_->kind.load();
}

Result<MemoryRegion> Channel::register_memory(std::span<std::byte> memory) {
  return bulk::make_region(transport::BulkSource{memory.data(), memory.size()});
}

Result<MemoryRegion> Channel::register_memory(const DmaBuf& m) {
  if (transport() == TransportKind::kShm)
    return Status(StatusCode::kUnimplemented,
                  "register_memory: shm (same-host shared memory) copies bulk data with the CPU "
                  "and cannot reach dma-buf (device) memory; use SLOTRPC_TRANSPORT=verbs for "
                  "device memory");
  if (m.fd < 0) return Status(StatusCode::kInvalidArgument, "register_memory: dma-buf fd < 0");
  return bulk::make_region(transport::BulkSource{m.address, m.length, m.fd, m.offset});
}
const std::string& Channel::peer() const { return impl_->peer; }
const Config& Channel::config() const { return impl_->config; }
uint32_t Channel::slot_count() const { return impl_->config.slot_count; }
uint32_t Channel::slot_size() const { return impl_->config.slot_size; }

MetricsSnapshot Channel::metrics() const {
  // A fleet: the sum over its endpoints' channels (each one's calls and
  // links; the loop-wide parts once per endpoint on that loop).
  std::vector<Impl*> impls{impl_.get()};
  std::vector<std::shared_ptr<Channel>> endpoints;
  if (impl_->fleet) {
    endpoints = impl_->fleet->channels();
    impls.clear();
    for (const auto& ch : endpoints) impls.push_back(ch->impl_.get());
  }
  metrics::Collector collector;
  for (Impl* one : impls) collector.add(on_loop(*one->loop, [impl = one] {
    std::vector<const transport::Link*> links;
    uint64_t queued = 0;
    if (impl->session) {
      links.push_back(impl->session->link());
      queued = impl->session->counters().queued;
    }
    metrics::LoopReading r = metrics::read_loop(*impl->loop, *impl->counters, links, queued);
    if (monitor::Monitor* m = rpc::loop_monitor(*impl->loop)) m->fill(r.monitor);
    return r;
  }));
  return collector.finish([](uint32_t id, bool) { return metrics::known_method_name(id); });
}

Channel::Stats Channel::stats() const {
  if (impl_->fleet) {
    Stats out = impl_->fleet->stats();  // the sum over its endpoints
    out.loop_index = static_cast<uint32_t>(impl_->loop_index);
    return out;
  }
  auto snapshot = [impl = impl_.get()] {
    Stats out;
    out.cross_loop_handoffs = impl->handoffs.load(std::memory_order_relaxed);
    out.loop_index = static_cast<uint32_t>(impl->loop_index);
    if (!impl->session) {
      out.closed = true;
      return out;
    }
    const auto c = impl->session->counters();
    out.free_slots = c.free_slots;
    out.in_flight = c.in_flight;
    out.zombies = c.zombies;
    out.held_replies = c.held;
    out.queued = c.queued;
    out.lent = c.lent;
    out.late_replies_dropped = c.late_replies_dropped;
    out.messages_sent = c.messages_sent;
    out.packs_sent = c.packs_sent;
    out.packed_requests = c.packed_messages;
    out.packs_received = c.packs_received;
    out.work_requests = c.link.slot_sends + c.link.control_sends;
    out.link_messages = c.link.messages;
    out.closed = impl->session->closed();
    out.reconnect_attempts = impl->reconnect_attempts;
    out.reconnects = impl->reconnects;
    return out;
  };
  return on_loop(*impl_->loop, snapshot);
}

}  // namespace slotrpc

// Client and bidi streaming (docs/protocol.md, section 5a).  The writer
// builds each message in a send slot of the stream's window on its own
// thread and hands the slot to the session through the stream's rings
// (core/out_stream.h); nothing is posted per message.
namespace slotrpc {

std::shared_ptr<detail::OutStreamState> Channel::open_stream(uint32_t method_id, bool bidi,
                                                             CallOptions options, ReplySink on_reply,
                                                             std::function<void(Status)> on_end) {
  Status refused = impl_->intercept(method_id, options);
  if (impl_->fleet && refused.ok()) {
    if (auto ep = impl_->fleet->start_stream(method_id, options, bidi ? nullptr : &on_reply, on_end))
      return ep->channel->open_stream(method_id, bidi, std::move(options), std::move(on_reply), std::move(on_end));
    refused = Status(StatusCode::kUnavailable, "no usable endpoint: " + impl_->fleet->describe());
  }
  auto* pc = new core::PendingCall;
  pc->method_id = method_id;
  pc->method_name = options.method_name;
  pc->sink = std::move(on_reply);
  pc->on_end = std::move(on_end);
  pc->stream = bidi;
  pc->client_stream = true;
  pc->window = options.stream_window != 0 ? options.stream_window : impl_->config.stream_window;
  pc->deadline = options.deadline;
  // Refused in submit: streams carry no bulk segments.
  pc->take_options(std::move(options.metadata), std::move(options.send_segments),
                   std::move(options.receive_segments));
  auto out = std::make_shared<core::OutStream>(impl_->loop, pc->window);
  pc->out = out;
  if (!refused.ok()) {
    refuse(pc, refused);
    return out;
  }
  CallHandle handle = submit(pc);
  {
    std::lock_guard<std::mutex> lock(out->mu);
    if (!out->ended.load()) out->cancel = [handle] { handle.cancel(); };
  }
  return out;
}

}  // namespace slotrpc
