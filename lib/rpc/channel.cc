#include "slotrpc/channel.h"

#include "bulk/region.h"

#include <fcntl.h>
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
#include "core/handshake.h"
#include "core/logging.h"
#include "metrics/collect.h"
#include "monitor/monitor.h"
#include "reactor/reactor.h"
#include "rpc/connector.h"
#include "rpc/runtime_core.h"
#include "slotrpc/fiber.h"
#include "transport/verbs/device.h"
#include "transport/verbs/device_probe.h"
#include "transport/verbs/verbs_transport.h"
#include "transport/shm/shm_transport.h"
#include "transport/tcp/tcp_transport.h"

#include <poll.h>

namespace slotrpc {

namespace {
struct Established;
}

struct Channel::Impl : std::enable_shared_from_this<Channel::Impl> {
  std::string address;
  Config config;
  std::string peer;
  std::atomic<TransportKind> kind{TransportKind::kTcp};
  // Whether this host may propose verbs (a usable device was found at
  // connect()), and the device's description or why not.
  bool verbs_possible = false;
  std::string verbs_note;
  // The runtime whose loop this channel's session lives on (keeps the
  // loops running), the loop and its index there.
  std::shared_ptr<detail::RuntimeCore> runtime;
  std::shared_ptr<reactor::Reactor> loop;
  size_t loop_index = 0;
  // Calls handed to the loop from another thread: the cross-loop
  // hand-offs Stats::cross_loop_handoffs reports.
  std::atomic<uint64_t> handoffs{0};
  // What this channel's sessions count (loop thread), so a channel on a
  // shared loop reports only its own calls.
  std::shared_ptr<metrics::LoopCounters> counters = std::make_shared<metrics::LoopCounters>();
  // on_monitor_sample()'s callback, shared with the loop's monitor.
  std::shared_ptr<monitor::SampleHook> monitor_hook = std::make_shared<monitor::SampleHook>();
  std::atomic<uint64_t> last_request_id{0};
  std::atomic<bool> closing{false};

  // Loop thread only (after connect() returned).
  std::shared_ptr<core::ClientSession> session;
  bool reconnecting = false;
  std::vector<std::function<void(const Status&)>> waiting_for_session;
  std::thread reconnector;

  // The reconnect policy (docs/design.md, "When the server dies"): after a
  // failed reconnect the next one waits min(kBackoffMax, kBackoffBase x
  // 2^(failures-1)), scaled by a random factor in [0.5, 1] so that many
  // clients of one restarted server do not all come back in step.  The
  // first attempt after a session dies is not delayed; a success resets it.
  static constexpr std::chrono::milliseconds kBackoffBase{100};
  static constexpr std::chrono::milliseconds kBackoffMax{10'000};
  uint32_t reconnect_failures = 0;  // in a row
  Clock::time_point next_attempt{};  // no reconnect before this
  Status last_reconnect_error;
  uint64_t reconnect_attempts = 0;
  uint64_t reconnects = 0;
  std::minstd_rand jitter{std::random_device{}()};

  // Loop thread: runs `then` with OK once a live session exists, starting a
  // reconnect if the current one is closed and the policy allows one now;
  // with the error if that fails, or at once with UNAVAILABLE saying when the
  // next attempt may be made while the policy backs off.
  void with_session(std::function<void(const Status&)> then);
  void reconnected(Result<Established> est);

  // The TCP bulk lane (transport/tcp/bulk_lanes.h) of the current session:
  // opened by a thread of its own on the first call with a bulk segment of
  // at least config.tcp_bulk_lane bytes, so a channel that never moves one
  // costs no second connection and no lane thread.  Calls with such a
  // segment wait (waiting_for_lane) until the attempt is over, so that
  // every large transfer runs on the lane, the first one included; small
  // calls never wait.  Loop thread only.
  uint64_t lane_token = 0;                  // the session's offer; 0: none, or taken
  transport::TcpLink* lane_link = nullptr;  // the session's link, while it lives
  std::thread lane_opener;
  bool lane_opening = false;
  std::vector<core::PendingCall*> waiting_for_lane;
  // While calls wait for the lane, this timer lets them go early: all of
  // them when the session ends meanwhile (they fail with its reason), and
  // each one when its deadline passes.  Without it they waited for the
  // opener, up to connect_timeout_ms, when the server stalled during the
  // lane's handshake (a call with a 300 ms deadline took the full 5 s).
  reactor::TimerHeap::TimerId lane_wait_timer = 0;
  void install(Established& e);
  // True when `pc` waits for the lane (taken over); false: submit it now.
  bool hold_for_lane(core::PendingCall* pc);
  void lane_attempt_over();
  bool cancel_held(uint64_t request_id);
  void arm_lane_wait();
  static void on_lane_wait(void* self, uint64_t);
  void cancel_lane_wait();
  // Lets every held call go: to the session (a closed one fails it with
  // its reason), or CANCELLED when the channel is closing.
  void release_held();
};

namespace {

// A session that is ready to be installed on the channel's loop.
struct Established {
  std::shared_ptr<core::ClientSession> session;
  std::string peer;
  TransportKind kind = TransportKind::kTcp;
  std::string note;  // why this transport, for the log
  // tcp: the server's bulk lane offer (0: none) and the session's link.
  uint64_t lane_token = 0;
  transport::TcpLink* tcp_link = nullptr;
};

using detail::on_loop;

// Runs blocking `fn` (a connect: TCP, handshake, tasks on the channel's
// loop) so that no event loop blocks on it: in a handler's fiber on a
// helper thread while the fiber waits suspended, elsewhere right here.
template <class Fn>
auto off_loop(Fn fn) -> decltype(fn()) {
  if (!this_fiber::in_fiber()) return fn();
  auto state = std::make_shared<detail::SharedState<decltype(fn())>>();
  std::thread helper([&fn, state] { state->set(fn()); });
  state->wait();
  helper.join();  // it has set the value: only its return is left
  return std::move(*state->value);
}

// Closes the fd on scope exit unless released.
struct FdGuard {
  int fd;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
  int release() { return std::exchange(fd, -1); }
};

struct HandshakeResult {
  core::HelloReply reply;
  std::string message;
  std::vector<std::byte> extension;
};

// Reads a HelloReply with its message and extension; the caller judges it.
Result<HandshakeResult> read_hello_reply(int fd, rpc::Deadline deadline) {
  std::array<std::byte, core::kHelloSize> buf;
  Status st = rpc::read_exact(fd, buf, deadline);
  if (!st.ok()) return st;
  auto reply = core::decode_hello_reply(buf.data());
  if (!reply.ok()) return reply.status();
  HandshakeResult r;
  r.reply = reply.value();
  r.message.assign(reply->message_len, '\0');
  st = rpc::read_exact(fd, std::as_writable_bytes(std::span(r.message)), deadline);
  if (!st.ok()) return st;
  r.extension.resize(reply->extension_len);
  st = rpc::read_exact(fd, r.extension, deadline);
  if (!st.ok()) return st;
  return r;
}

// Sends our Hello (with the transport's extension) and reads the server's
// answer.
// `after_hello` (shm) runs after the Hello is written, before the reply
// is read: the shm offer follows the Hello.
Result<HandshakeResult> client_handshake(int fd, const Config& cfg, core::WireTransport propose,
                                         std::span<const std::byte> extension,
                                         rpc::Deadline deadline,
                                         const std::function<Status()>& after_hello = {}) {
  std::vector<std::byte> out(core::kHelloSize + extension.size());
  core::Hello hello;
  hello.transport = propose;
  hello.slot_count = cfg.slot_count;
  hello.slot_size = cfg.slot_size;
  hello.extension_len = static_cast<uint32_t>(extension.size());
  // PACKs of replies are welcome unless packing is off; never on shm, where
  // a message costs no work request.
  if (cfg.pack_small != 0 && propose != core::WireTransport::kShm) hello.features |= core::kFeaturePack;
  hello.features |= core::kFeatureStatusCodes;
  core::encode_hello(hello, out.data());
  std::copy(extension.begin(), extension.end(), out.begin() + core::kHelloSize);
  Status st = rpc::write_all(fd, out, deadline);
  if (!st.ok()) return st;
  if (after_hello) {
    st = after_hello();
    if (!st.ok()) return st;
  }
  auto reply = read_hello_reply(fd, deadline);
  if (!reply.ok()) return reply.status();
  HandshakeResult& r = reply.value();
  if (r.reply.status != 0) {
    const auto code = is_known_status_code(r.reply.status) ? static_cast<StatusCode>(r.reply.status)
                                                           : StatusCode::kUnavailable;
    return Status(code, "server refused the session: " + r.message);
  }
  if (r.reply.slot_count != cfg.slot_count || r.reply.slot_size != cfg.slot_size) {
    return Status(StatusCode::kUnavailable, "server answered with a different ring geometry");
  }
  return r;
}

// --- tcp bulk lane: blocking (off the loop).  Connects a second socket to
// the server and presents the lane token of the session's HelloReply; once
// the server says OK the socket is returned, for the session's link to
// take as its lane (transport/tcp/bulk_lanes.h).
Result<int> open_lane(const rpc::Endpoint& endpoint, uint64_t token, rpc::Deadline deadline) {
  auto connected = rpc::connect_tcp(endpoint, deadline);
  if (!connected.ok()) return connected.status();
  FdGuard fd{connected.value()};
  std::array<std::byte, core::kHelloSize + core::kLaneTokenSize> hello_buf{};
  core::Hello hello;
  hello.transport = core::WireTransport::kTcpLane;
  hello.extension_len = core::kLaneTokenSize;
  core::encode_hello(hello, hello_buf.data());
  core::encode_lane_token(token, hello_buf.data() + core::kHelloSize);
  Status st = rpc::write_all(fd.fd, hello_buf, deadline);
  if (!st.ok()) return st;
  auto reply = read_hello_reply(fd.fd, deadline);
  if (!reply.ok()) return reply.status();
  if (reply->reply.status != 0)
    return Status(StatusCode::kUnavailable, "server refused the lane: " + reply->message);
  if (reply->reply.transport != core::WireTransport::kTcpLane)
    return Status(StatusCode::kUnavailable, "server did not answer the lane hello as a lane");
  return fd.release();
}

// --- shm: blocking (off the loop): connects to the server's Unix socket
// `name`, sends the Hello and our offer, reads the HelloReply and the
// server's offer, and creates the session on the loop.  `*reached` says
// whether a server answered there (false: nobody listens, ENOENT or
// ECONNREFUSED, so auto falls back quietly); `*refused` whether it refused
// the session in its HelloReply (a limit: that is the answer, no fallback).
Result<Established> establish_shm(Channel::Impl& impl, const std::string& name,
                                  rpc::Deadline deadline, bool* reached, bool* refused) {
  *refused = false;
  const Config& cfg = impl.config;
  *reached = false;
  int err = 0;
  auto connected = rpc::connect_unix(name, deadline, &err);
  if (!connected.ok()) {
    *reached = err != ENOENT && err != ECONNREFUSED;
    return connected.status();
  }
  *reached = true;
  FdGuard fd{connected.value()};
  reactor::Reactor& loop = *impl.loop;
  auto t = on_loop(loop, [&] { return loop.shm(); });
  if (!t.ok()) return t.status();
  transport::shm::ShmTransport* shm = t.value();
  const transport::shm::Geometry g{cfg.slot_count, cfg.slot_size};
  std::optional<transport::shm::ShmTransport::Offered> offered;
  auto send_offer = [&]() -> Status {
    // offer() touches no transport state (it creates our segment and sends
    // it): safe off the loop.  It owns a duplicate; `fd` reads the reply.
    const int dup = ::fcntl(fd.fd, F_DUPFD_CLOEXEC, 0);
    if (dup < 0) return Status(StatusCode::kResourceExhausted, fmt::format("dup: {}", std::strerror(errno)));
    auto o = shm->offer(dup, g);
    if (!o.ok()) return o.status();
    offered = std::move(o).value();
    return {};
  };
  auto hs = client_handshake(fd.fd, cfg, core::WireTransport::kShm, {}, deadline, send_offer);
  if (!hs.ok()) {
    *refused = hs.status().message().starts_with("server refused the session");
    return hs.status();
  }
  if (hs->reply.transport != core::WireTransport::kShm || !offered) {
    return Status(StatusCode::kUnavailable, "the server did not answer with shm on its Unix socket");
  }
  // The server's offer follows its reply: wait here, not on the loop.
  pollfd pfd{fd.fd, POLLIN, 0};
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  if (::poll(&pfd, 1, static_cast<int>(std::max<int64_t>(left.count(), 0))) != 1) {
    return Status(StatusCode::kUnavailable, "no shm offer from the server in time");
  }
  const std::string creds = rpc::peer_credentials(fd.fd);
  Established e;
  e.peer = "unix:" + name;
  const core::ClientSession::Geometry geometry{cfg.slot_count, cfg.slot_size};
  auto created = on_loop(loop, [&]() -> Result<std::shared_ptr<core::ClientSession>> {
    auto link = shm->complete(std::move(*offered), std::chrono::milliseconds(0),
                              fmt::format("shm -> unix:{} ({})", name, creds));
    if (!link.ok()) return link.status();
    auto s = core::ClientSession::create(loop, std::move(link.value()), geometry, e.peer);
    if (!s.ok()) return s.status();
    s.value()->set_loop_handle(impl.loop);
    s.value()->set_counters(impl.counters);
    s.value()->set_max_bulk_bytes(impl.config.max_bulk_bytes);
    s.value()->set_peer_features(hs->reply.features);
    return s;
  });
  if (!created.ok()) return created.status();
  e.session = std::move(created.value());
  e.kind = TransportKind::kShm;
  e.note = fmt::format("server {} at unix:{}", creds, name);
  return e;
}
// --- end shm

// Blocking (off the loop): TCP connect, handshake, and the session created
// on the loop, bounded by connect_timeout_ms.  With verbs possible, the
// link and the session (whose registered rings the handshake advertises)
// are made first; the server may answer with tcp instead.
Result<Established> establish(Channel::Impl& impl) {
  const Config& cfg = impl.config;
  auto fail = [&](const Status& st) {
    return Status(st.code(), fmt::format("connect to {}: {}", impl.address, st.message()));
  };
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(cfg.connect_timeout_ms);
  // --- shm first: a unix: address is shm only; with transport=shm, or
  // auto towards an address of this host, the server's Unix socket
  // (SLOTRPC_UNIX_PATH, else @slotrpc-<port>).  Abstract names are per
  // network namespace and the segments travel with SCM_RIGHTS, which only
  // works within one kernel: a completed shm handshake proves same host.
  bool reached = false;
  bool refused = false;
  if (rpc::is_unix_address(impl.address)) {
    auto name = rpc::parse_unix_address(impl.address);
    if (!name.ok()) return name.status();
    if (cfg.transport == TransportKind::kTcp || cfg.transport == TransportKind::kVerbs) {
      return Status(StatusCode::kInvalidArgument,
                    fmt::format("connect to {}: a Unix socket carries only the shm transport, and "
                                "transport={} was requested", impl.address, to_string(cfg.transport)));
    }
    auto est = establish_shm(impl, name.value(), deadline, &reached, &refused);
    if (!est.ok()) return fail(est.status());
    est.value().note = "unix: address; " + est.value().note;
    return est;
  }
  auto endpoint = rpc::parse_address(impl.address);
  if (!endpoint.ok()) return endpoint.status();
  std::string shm_note;
  if (cfg.unix_path == "off") {
    if (cfg.transport == TransportKind::kShm) {
      return fail(Status(StatusCode::kInvalidArgument,
                         "transport=shm needs the server's Unix socket, and SLOTRPC_UNIX_PATH=off "
                         "turns it off"));
    }
    if (cfg.transport == TransportKind::kAuto) shm_note = "no shm (SLOTRPC_UNIX_PATH=off); ";
  } else if (cfg.transport == TransportKind::kShm ||
             (cfg.transport == TransportKind::kAuto && rpc::is_local_host(endpoint->host))) {
    const std::string name = cfg.unix_path.empty() ? rpc::default_unix_name(endpoint->port) : cfg.unix_path;
    auto est = establish_shm(impl, name, deadline, &reached, &refused);
    if (est.ok()) {
      est.value().note = fmt::format("{} is on this host; {}", endpoint->host, est.value().note);
      return est;
    }
    if (refused) return fail(est.status());  // the server's answer (a limit), not a reason to fall back
    if (cfg.transport == TransportKind::kShm) {
      return fail(Status(StatusCode::kUnavailable,
                         fmt::format("transport 'shm' was requested (Config.transport / "
                                     "SLOTRPC_TRANSPORT) but the server's Unix socket unix:{} "
                                     "cannot be used: {}", name, est.status().message())));
    }
    if (reached) {
      core::log().warn("slotrpc: shm to {} (unix:{}) failed, trying the network: {}", impl.address, name,
                       est.status().message());
    }
    shm_note = fmt::format("no shm ({}); ", est.status().message());
  } else if (cfg.transport == TransportKind::kAuto) {
    shm_note = fmt::format("no shm ({} is not an address of this host); ", endpoint->host);
  }
  // --- end shm
  auto connected = rpc::connect_tcp(*endpoint, deadline);
  if (!connected.ok()) return connected.status();
  FdGuard fd{connected.value()};

  Established e;
  e.peer = rpc::peer_name(fd.fd);
  const std::string local = rpc::local_name(fd.fd);
  const core::ClientSession::Geometry geometry{cfg.slot_count, cfg.slot_size};
  reactor::Reactor& loop = *impl.loop;

  std::shared_ptr<core::ClientSession> vsession;
  transport::verbs::VerbsLink* vlink = nullptr;  // owned by vsession, loop thread only
  std::array<std::byte, transport::verbs::kQpInfoSize> ext{};
  bool propose = impl.verbs_possible;
  std::string note = cfg.transport == TransportKind::kTcp
                         ? std::string("transport=tcp")
                         : fmt::format("no usable RDMA device here: {}", impl.verbs_note);
  if (propose) {
    Status st = on_loop(loop, [&]() -> Status {
      auto t = loop.verbs();
      if (!t.ok()) return t.status();
      auto link = t.value()->create_link(fmt::format("verbs {} -> {}", local, e.peer),
                                         geometry.slot_count);
      if (!link.ok()) return link.status();
      vlink = link.value().get();
      auto s = core::ClientSession::create(loop, std::move(link.value()), geometry, e.peer);
      if (!s.ok()) return s.status();
      vsession = std::move(s.value());
      vsession->set_counters(impl.counters);
      vsession->set_max_bulk_bytes(impl.config.max_bulk_bytes);
      vsession->set_loop_handle(impl.loop);
      transport::verbs::encode_qp_info(vlink->local_info(), ext.data());
      return {};
    });
    if (!st.ok()) {
      if (cfg.transport == TransportKind::kVerbs) return fail(Status(st.code(), "verbs setup failed: " + st.message()));
      core::log().warn("slotrpc: verbs setup for {} failed, offering tcp: {}", impl.address, st.message());
      note = "verbs setup failed here: " + st.message();
      propose = false;
    }
  }
  // The verbs session is dropped unless the server takes it.
  auto drop_verbs = [&](const char* why) {
    if (!vsession) return;
    on_loop(loop, [&] {
      vsession->shutdown(Status(StatusCode::kCancelled, why));
      return 0;
    });
    vsession.reset();
  };

  auto hs = client_handshake(fd.fd, cfg, propose ? core::WireTransport::kVerbs : core::WireTransport::kTcp,
                             propose ? std::span<const std::byte>(ext) : std::span<const std::byte>(),
                             deadline);
  if (!hs.ok()) {
    drop_verbs("handshake failed");
    return fail(hs.status());
  }

  if (hs->reply.transport == core::WireTransport::kVerbs) {
    if (!propose) return fail(Status(StatusCode::kUnavailable, "server chose verbs, which this client did not offer"));
    auto info = transport::verbs::decode_qp_info(hs->extension);
    if (!info.ok()) {
      drop_verbs("handshake failed");
      return fail(info.status());
    }
    const int link_fd = fd.release();
    Status st = on_loop(loop, [&]() -> Status {
      // A session that died meanwhile (keepalive) has dropped its link.
      if (vsession->closed()) return vsession->close_status();
      Status s = vlink->connect(info.value(), link_fd, e.peer);
      vsession->set_peer_features(hs->reply.features);
      vsession->configure_packing(impl.config.pack_small,
                                  (hs->reply.features & core::kFeaturePack) != 0);
      if (s.ok()) vsession->link_ready();
      return s;
    });
    if (!st.ok()) {
      ::close(link_fd);  // connect() takes the fd only on success
      drop_verbs("verbs connect failed");
      return fail(Status(StatusCode::kUnavailable, "verbs connect failed: " + st.message()));
    }
    e.session = std::move(vsession);
    e.kind = TransportKind::kVerbs;
    on_loop(loop, [&] {
      e.note = shm_note + (loop.verbs().ok() ? loop.verbs().value()->device().describe() : "");
      return 0;
    });
    return e;
  }

  // The server answered with tcp.
  drop_verbs("the server chose tcp");
  if (propose) {
    if (cfg.transport == TransportKind::kVerbs) {
      return fail(Status(StatusCode::kUnavailable,
                         "transport 'verbs' was requested (Config.transport / SLOTRPC_TRANSPORT) "
                         "but the server answered with tcp: " + hs->message));
    }
    note = "the server chose tcp: " + hs->message;
  }
  const int tcp_fd = fd.release();
  const std::string description = fmt::format("tcp {} -> {}", local, e.peer);
  transport::TcpLink* tcp_link = nullptr;  // owned by the session, loop thread only
  auto created = on_loop(loop, [&]() -> Result<std::shared_ptr<core::ClientSession>> {
    auto link = loop.tcp().adopt(tcp_fd, description);  // takes the fd, even on failure
    if (!link.ok()) return link.status();
    tcp_link = link.value().get();
    if (impl.config.tcp_bulk_push != 0 && (hs->reply.features & core::kFeatureTcpPush) != 0)
      tcp_link->set_push_limit(impl.config.tcp_bulk_push);
    auto s = core::ClientSession::create(loop, std::move(link.value()), geometry, e.peer);
    if (!s.ok()) return s.status();
    s.value()->set_loop_handle(impl.loop);
    s.value()->set_counters(impl.counters);
    s.value()->set_max_bulk_bytes(impl.config.max_bulk_bytes);
    s.value()->set_peer_features(hs->reply.features);
    s.value()->configure_packing(impl.config.pack_small,
                                 (hs->reply.features & core::kFeaturePack) != 0);
    s.value()->set_flush_every(impl.config.tcp_flush_every);
    return s;
  });
  if (!created.ok()) return fail(created.status());
  e.session = std::move(created.value());
  e.kind = TransportKind::kTcp;
  e.note = shm_note + note;
  if (cfg.tcp_bulk_lane != 0 && (hs->reply.features & core::kFeatureTcpLane) != 0 &&
      hs->extension.size() == core::kLaneTokenSize) {
    e.lane_token = core::decode_lane_token(hs->extension.data());
    e.tcp_link = tcp_link;
  }
  return e;
}

}  // namespace

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
  core::log().info("slotrpc: reconnecting to {}", address);
  // Connecting blocks (and waits for the loop), so it runs beside the loop.
  // The thread holds the Impl: a channel destroyed on its loop detaches it
  // rather than joining it there.
  reconnector = std::thread([self = shared_from_this()] {
    Result<Established> est = establish(*self);
    self->loop->post([self, est = std::move(est)]() mutable { self->reconnected(std::move(est)); });
  });
}

void Channel::Impl::install(Established& e) {
  session = std::move(e.session);
  peer = e.peer;
  kind = e.kind;
  lane_token = e.lane_token;
  lane_link = e.tcp_link;
}

bool Channel::Impl::hold_for_lane(core::PendingCall* pc) {
  size_t biggest = 0;
  for (const BulkSegment& s : pc->send_bulk) biggest = std::max(biggest, s.length);
  for (const BulkSegment& s : pc->receive_bulk) biggest = std::max(biggest, s.length);
  if (biggest == 0 || biggest < config.tcp_bulk_lane) return false;
  if (lane_opening) {
    waiting_for_lane.push_back(pc);
    arm_lane_wait();
    return true;
  }
  if (lane_token == 0 || !session || session->closed()) return false;
  // The opener of an earlier session has finished (its task ran): joining
  // takes no time.
  if (lane_opener.joinable()) lane_opener.join();
  const uint64_t token = std::exchange(lane_token, 0);
  lane_opening = true;
  waiting_for_lane.push_back(pc);
  arm_lane_wait();
  // Connect and handshake off the loop (bounded by connect_timeout_ms),
  // then one task on the loop attaches the lane and lets the calls go.
  lane_opener = std::thread([self = shared_from_this(), s = session, link = lane_link, token] {
    auto endpoint = rpc::parse_address(self->address);
    const auto deadline = Clock::now() + std::chrono::milliseconds(self->config.connect_timeout_ms);
    Result<int> fd = endpoint.ok() ? open_lane(*endpoint, token, deadline) : endpoint.status();
    self->loop->post([self, s, link, fd]() mutable {
      Status st = fd.status();
      if (fd.ok()) {
        if (self->closing.load() || s->closed()) {
          ::close(fd.value());
          st = Status(StatusCode::kCancelled, "the session ended first");
        } else {
          st = link->attach_lane(fd.value());  // takes the fd
        }
      }
      if (st.ok()) {
        core::log().debug("slotrpc: channel to {}: bulk lane open", self->peer);
      } else if (!self->closing.load()) {
        // A session without its lane still works: bulk data shares its connection.
        core::log().warn("slotrpc: channel to {}: no bulk lane, bulk data shares the connection: {}",
                         self->peer, st.message());
      }
      self->lane_attempt_over();
    });
  });
  return true;
}

// The lane-wait timer's next check: the earliest deadline of a held call,
// and at most 10 ms away, for the session's end (a session has no hook to
// call us; 10 ms is noise beside the peer timeout that ends it).
void Channel::Impl::arm_lane_wait() {
  cancel_lane_wait();
  if (!lane_opening || waiting_for_lane.empty()) return;
  Clock::time_point next = Clock::now() + std::chrono::milliseconds(10);
  for (const core::PendingCall* pc : waiting_for_lane)
    if (pc->deadline) next = std::min(next, *pc->deadline);
  lane_wait_timer = loop->timers().add(next, &Impl::on_lane_wait, this, 0);
}

void Channel::Impl::cancel_lane_wait() {
  if (lane_wait_timer != 0) loop->timers().cancel(lane_wait_timer);
  lane_wait_timer = 0;
}

void Channel::Impl::on_lane_wait(void* self_ptr, uint64_t) {
  auto* self = static_cast<Impl*>(self_ptr);
  self->lane_wait_timer = 0;
  if (!self->lane_opening) return;
  if (!self->session || self->session->closed()) {
    // The session ended while its lane was being opened: its calls fail
    // now, with its reason.  The opener's result finds the session closed
    // and no calls left.
    self->release_held();
    return;
  }
  const Clock::time_point now = Clock::now();
  auto& held = self->waiting_for_lane;
  for (size_t i = 0; i < held.size();) {
    core::PendingCall* pc = held[i];
    if (pc->deadline && *pc->deadline <= now) {
      held.erase(held.begin() + static_cast<ptrdiff_t>(i));
      core::ClientSession::fail_later(
          *self->loop, pc,
          Status(StatusCode::kDeadlineExceeded,
                 "deadline passed before the call was sent (it waited for the channel's bulk lane)"));
    } else {
      ++i;
    }
  }
  self->arm_lane_wait();
}

void Channel::Impl::lane_attempt_over() {
  cancel_lane_wait();
  lane_opening = false;
  release_held();
}

void Channel::Impl::release_held() {
  auto calls = std::move(waiting_for_lane);
  waiting_for_lane.clear();
  for (core::PendingCall* pc : calls) {
    if (closing.load() || !session) {
      core::ClientSession::fail_later(*loop, pc, Status(StatusCode::kCancelled, "channel closed"));
    } else {
      session->submit(pc);  // a session closed meanwhile fails it with its reason
    }
  }
}

bool Channel::Impl::cancel_held(uint64_t request_id) {
  auto it = std::find_if(waiting_for_lane.begin(), waiting_for_lane.end(),
                         [request_id](core::PendingCall* pc) { return pc->request_id == request_id; });
  if (it == waiting_for_lane.end()) return false;
  core::PendingCall* pc = *it;
  waiting_for_lane.erase(it);
  if (waiting_for_lane.empty()) cancel_lane_wait();
  core::ClientSession::fail_later(*loop, pc, Status(StatusCode::kCancelled, "cancelled by the caller"));
  return true;
}

void Channel::Impl::reconnected(Result<Established> est) {
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
    core::log().info("slotrpc: reconnected to {} ({})", peer, to_string(kind.load()));
  } else {
    ++reconnect_failures;
    const uint32_t doublings = std::min<uint32_t>(reconnect_failures - 1, 20);
    const auto delay = std::min<std::chrono::milliseconds>(kBackoffMax, kBackoffBase * (uint64_t{1} << doublings));
    const double factor = std::uniform_real_distribution<double>(0.5, 1.0)(jitter);
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(delay * factor);
    next_attempt = Clock::now() + wait;
    last_reconnect_error = st;
    core::log().warn("slotrpc: reconnect to {} failed ({} in a row), next attempt in {} ms: {}", address,
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
  core::log().debug("slotrpc: channel to {} runs a loop of its own: its {} differs from the default runtime's",
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
  core::apply_log_level(cfg->log_level);
  if (runtime->current_index() >= 0 && !this_fiber::in_fiber()) {
    // A connect waits for the server, which may sit on this very loop.
    return Status(StatusCode::kInvalidArgument,
                  "Channel::connect() on one of the runtime's event loops outside a handler would "
                  "block that loop; connect from a handler (its fiber waits) or another thread");
  }

  auto impl = std::make_shared<Impl>();
  impl->address = address;
  impl->config = *cfg;
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
  impl->loop->add_monitor_hook(impl->monitor_hook);
  auto est = off_loop([&] { return establish(*impl); });
  if (!est.ok()) return est.status();
  on_loop(*impl->loop, [p = impl.get(), &est] {
    p->install(est.value());
    return 0;
  });
  core::log().info("slotrpc: channel to {} uses {} ({}; transport={}; loop {} of {})", impl->peer,
                   to_string(impl->kind.load()), est.value().note, to_string(cfg->transport),
                   impl->loop_index, impl->runtime->loops.size());
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
  // The loop is shared: it runs on.  The session is shut down on it (its
  // callbacks run there), and the channel's reference to it dropped there.
  impl_->closing.store(true);
  reactor::Reactor& loop = *impl_->loop;
  std::thread lane_opener;
  std::thread reconnector = on_loop(loop, [impl = impl_.get(), &lane_opener] {
    std::thread r = std::move(impl->reconnector);
    lane_opener = std::move(impl->lane_opener);
    impl->lane_token = 0;  // no new opener from here on
    impl->cancel_lane_wait();
    auto held = std::move(impl->waiting_for_lane);
    impl->waiting_for_lane.clear();
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
  // So does a bulk lane being opened (the same bound; it holds the Impl too).
  for (std::thread* t : {&reconnector, &lane_opener}) {
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
  if (!impl_->loop->on_this_thread()) impl_->handoffs.fetch_add(1, std::memory_order_relaxed);
  impl_->loop->run_or_post([impl = impl_.get(), pc] {
    if (impl->session) {
      if ((impl->lane_token != 0 || impl->lane_opening) && impl->hold_for_lane(pc)) return;
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
  // Loop thread.  Between attempts the call waits for a session (a
  // reconnect, bounded by connect_timeout_ms); a cancel or its deadline
  // ends it there and then, not when the reconnect is over (before, a
  // cancelled call was sent again after the reconnect, and a 300 ms
  // deadline waited out the whole connect timeout).
  bool finished = false;  // the caller's sink has run
  bool waiting = false;   // between attempts, in with_session
  reactor::Reactor* loop = nullptr;
  reactor::TimerHeap::TimerId deadline_timer = 0;
  std::shared_ptr<RetryingCall> keep;  // alive while the timer is armed

  void finish(RawReply&& reply) {
    if (finished) return;
    finished = true;
    stop_waiting();
    sink(std::move(reply));
  }
  void stop_waiting() {
    waiting = false;
    if (deadline_timer != 0) loop->timers().cancel(deadline_timer);
    deadline_timer = 0;
    keep.reset();
  }
  // Waits for a session until the deadline, if any.
  void start_waiting(reactor::Reactor& on) {
    waiting = true;
    loop = &on;
    if (!options.deadline) return;
    keep = shared_from_this();
    deadline_timer = on.timers().add(*options.deadline, &RetryingCall::on_deadline, this, 0);
  }
  static void on_deadline(void* self_ptr, uint64_t) {
    auto* self = static_cast<RetryingCall*>(self_ptr);
    self->deadline_timer = 0;
    auto hold = std::move(self->keep);  // `self` lives to the end of this function
    if (!self->waiting) return;
    self->finish(RawReply(Status(StatusCode::kDeadlineExceeded,
                                 "deadline passed while the channel reconnected for a retry")));
  }
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
      if (!impl) return r->finish(RawReply(Status(StatusCode::kCancelled, "channel closed")));
      auto* pc = new core::PendingCall;
      pc->method_id = r->method_id;
      pc->writer = r->writer;
      pc->deadline = r->options.deadline;
      pc->send_bulk = r->options.send_segments;
      pc->receive_bulk = r->options.receive_segments;
      pc->request_id = impl->last_request_id.fetch_add(1, std::memory_order_relaxed) + 1;
      r->current_id = pc->request_id;
      auto again = weak_attempt.lock();
      pc->sink = [r, again](RawReply&& reply) {
        auto impl = r->channel.lock();
        const bool retry = reply.status().code() == StatusCode::kUnavailable &&
                           r->retries_left > 0 && !r->cancelled && impl && again &&
                           !impl->closing.load() &&
                           (!r->options.deadline || Clock::now() < *r->options.deadline);
        if (!retry) return r->finish(std::move(reply));
        --r->retries_left;
        core::log().info("slotrpc: retrying idempotent call (method id 0x{:08x}) after: {}", r->method_id,
                     reply.status().message());
        r->start_waiting(*impl->loop);
        impl->with_session([r, again, failed = Status(reply.status())](const Status& st) {
          if (r->finished) return;  // its deadline or a cancel ended it while it waited
          r->stop_waiting();
          if (r->cancelled) return r->finish(RawReply(Status(StatusCode::kCancelled, "cancelled by the caller")));
          if (!st.ok()) {
            return r->finish(RawReply(Status(StatusCode::kUnavailable,
                                             fmt::format("{}; reconnect failed: {}", failed.message(),
                                                         st.message()))));
          }
          (*again)();
        });
      };
      if (!impl->session) {
        return core::ClientSession::fail_later(*impl->loop, pc, Status(StatusCode::kCancelled, "channel closed"));
      }
      impl->session->submit(pc);
    };
    // The attempt chain keeps itself alive through the pending call's sink.
    if (!impl_->loop->on_this_thread()) impl_->handoffs.fetch_add(1, std::memory_order_relaxed);
    impl_->loop->run_or_post([attempt, keep = attempt] { (*attempt)(); });
    std::weak_ptr<Impl> weak = impl_;
    return CallHandle([weak, r] {
      r->cancelled = true;
      auto impl = weak.lock();
      if (!impl || impl->closing.load()) return;
      impl->loop->run_or_post([impl, r] {
        if (r->waiting) {  // between attempts: no call of it is in a session
          r->finish(RawReply(Status(StatusCode::kCancelled, "cancelled by the caller")));
          return;
        }
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
  pc->send_bulk = std::move(options.send_segments);
  pc->receive_bulk = std::move(options.receive_segments);
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
  pc->send_bulk = std::move(options.send_segments);  // refused: streams carry no bulk segments
  pc->receive_bulk = std::move(options.receive_segments);
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

TransportKind Channel::transport() const { return impl_->kind.load(); }

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
  auto read = [impl = impl_.get()] {
    std::vector<const transport::Link*> links;
    uint64_t queued = 0;
    if (impl->session) {
      links.push_back(impl->session->link());
      queued = impl->session->counters().queued;
    }
    return metrics::read_loop(*impl->loop, *impl->counters, links, queued);
  };
  metrics::Collector collector;
  collector.add(on_loop(*impl_->loop, read));
  return collector.finish([](uint32_t id, bool) { return metrics::known_method_name(id); });
}

Channel::Stats Channel::stats() const {
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
    out.inline_sends = c.link.inline_sends;
    out.noninline_sends = c.link.noninline_sends;
    out.doorbells = c.link.doorbells;
    out.max_inline = c.link.max_inline;
    out.shared_receive_queue = c.link.shared_receive_queue;
    out.memory_window = c.link.memory_window;
    out.bulk_lane = c.link.bulk_lane;
    out.bulk_lane_bytes_sent = c.link.lane_bytes_sent;
    out.bulk_lane_bytes_received = c.link.lane_bytes_received;
    out.packs_sent = c.packs_sent;
    out.packed_requests = c.packed_messages;
    out.packs_received = c.packs_received;
    out.work_requests = c.link.slot_sends + c.link.control_sends;
    out.link_messages = c.link.messages;
    out.link_packets = c.link.packets;
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
  auto* pc = new core::PendingCall;
  pc->method_id = method_id;
  pc->sink = std::move(on_reply);
  pc->on_end = std::move(on_end);
  pc->stream = bidi;
  pc->client_stream = true;
  pc->window = options.stream_window != 0 ? options.stream_window : impl_->config.stream_window;
  pc->deadline = options.deadline;
  pc->send_bulk = std::move(options.send_segments);  // refused: streams carry no bulk segments
  pc->receive_bulk = std::move(options.receive_segments);
  auto out = std::make_shared<core::OutStream>(impl_->loop, pc->window);
  pc->out = out;
  CallHandle handle = submit(pc);
  {
    std::lock_guard<std::mutex> lock(out->mu);
    if (!out->ended.load()) out->cancel = [handle] { handle.cancel(); };
  }
  return out;
}

}  // namespace slotrpc
