#include "rpc/channel_impl.h"

#include "core/bulk/region.h"

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
#include "base/logging.h"
#include "metrics/collect.h"
#include "transport/verbs/monitor.h"
#include "reactor/reactor.h"
#include "rpc/loop_transports.h"
#include "rpc/connector.h"
#include "rpc/runtime_core.h"
#include "slotrpc/fiber.h"
#include "transport/verbs/device.h"
#include "transport/verbs/device_probe.h"
#include "transport/verbs/verbs_transport.h"
#include "transport/shm/shm_transport.h"
#include "transport/tcp/tcp_transport.h"

#include <poll.h>

namespace slotrpc::rpc {

namespace {

using detail::on_loop;

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
Result<HandshakeResult> read_hello_reply(int fd, rpc::Deadline deadline,
                                         transport::tls::Stream* tls = nullptr) {
  std::array<std::byte, core::kHelloSize> buf;
  Status st = rpc::read_exact(fd, buf, deadline, tls);
  if (!st.ok()) return st;
  auto reply = core::decode_hello_reply(buf.data());
  if (!reply.ok()) return reply.status();
  HandshakeResult r;
  r.reply = reply.value();
  r.message.assign(reply->message_len, '\0');
  st = rpc::read_exact(fd, std::as_writable_bytes(std::span(r.message)), deadline, tls);
  if (!st.ok()) return st;
  r.extension.resize(reply->extension_len);
  st = rpc::read_exact(fd, r.extension, deadline, tls);
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
                                         const std::function<Status()>& after_hello = {},
                                         transport::tls::Stream* tls = nullptr) {
  std::vector<std::byte> out(core::kHelloSize + extension.size());
  core::Hello hello;
  hello.transport = propose;
  hello.slot_count = cfg.slot_count;
  hello.slot_size = cfg.slot_size;
  hello.extension_len = static_cast<uint32_t>(extension.size());
  // PACKs of replies are welcome unless packing is off; never on shm, where
  // a message costs no work request.
  if (cfg.pack_small != 0 && propose != core::WireTransport::kShm) hello.features |= core::kFeaturePack;
  hello.features |= core::kFeatureStatusCodes | core::kFeatureMetadata;
  core::encode_hello(hello, out.data());
  std::copy(extension.begin(), extension.end(), out.begin() + core::kHelloSize);
  Status st = rpc::write_all(fd, out, deadline, tls);
  if (!st.ok()) return st;
  if (after_hello) {
    st = after_hello();
    if (!st.ok()) return st;
  }
  auto reply = read_hello_reply(fd, deadline, tls);
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

// --- attached connections (channel_impl.h).
}  // namespace

Result<int> open_attachment(const Endpoint& endpoint, std::span<const std::byte> token,
                            Deadline deadline) {
  auto connected = rpc::connect_tcp(endpoint, deadline);
  if (!connected.ok()) return connected.status();
  FdGuard fd{connected.value()};
  std::vector<std::byte> hello_buf(core::kHelloSize + token.size());
  core::Hello hello;
  hello.transport = core::WireTransport::kAttach;
  hello.extension_len = static_cast<uint32_t>(token.size());
  core::encode_hello(hello, hello_buf.data());
  std::copy(token.begin(), token.end(), hello_buf.begin() + core::kHelloSize);
  Status st = rpc::write_all(fd.fd, hello_buf, deadline);
  if (!st.ok()) return st;
  auto reply = read_hello_reply(fd.fd, deadline);
  if (!reply.ok()) return reply.status();
  if (reply->reply.status != 0)
    return Status(StatusCode::kUnavailable, "server refused to attach the connection: " + reply->message);
  if (reply->reply.transport != core::WireTransport::kAttach)
    return Status(StatusCode::kUnavailable, "server did not answer the attach hello in kind");
  return fd.release();
}

namespace {

// --- shm: blocking (off the loop): connects to the server's Unix socket
// `name`, sends the Hello and our offer, reads the HelloReply and the
// server's offer, and creates the session on the loop.  `*reached` says
// whether a server answered there (false: nobody listens, ENOENT or
// ECONNREFUSED, so auto falls back quietly); `*refused` whether it refused
// the session in its HelloReply (a limit: that is the answer, no fallback;
// but PERMISSION_DENIED, our uid outside its SLOTRPC_SHM_PEER_UIDS, lets
// auto go on to TCP, as our own refusal of its uid does).
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
  // Whoever listens there is checked before a byte goes out: any local
  // process can bind a server's default name first (docs/design.md,
  // "Trust and security").  A refused one sees a connection close, no
  // Hello, no offer.
  auto policy = base::parse_uid_policy("Config.shm_peer_uids (SLOTRPC_SHM_PEER_UIDS)", cfg.shm_peer_uids);
  if (!policy.ok()) return policy.status();
  if (Status st = rpc::check_shm_peer(fd.fd, policy.value(), "the shm server at unix:" + name,
                                     "this client's"); !st.ok())
    return st;
  reactor::Reactor& loop = *impl.loop;
  auto t = on_loop(loop, [&] { return rpc::loop_shm(loop); });
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
}  // namespace

Result<Established> establish(Channel::Impl& impl) {
  const Config& cfg = impl.config;
  auto fail = [&](const Status& st) {
    // A time-out names the setting that bounds the whole connect.
    const bool timed_out = st.message().find("timed out") != std::string::npos;
    return Status(st.code(),
                  fmt::format("connect to {}: {}{}", impl.address, st.message(),
                              timed_out ? fmt::format(" (connect_timeout_ms = {} ms, SLOTRPC_CONNECT_TIMEOUT_MS)",
                                                      cfg.connect_timeout_ms)
                                        : std::string()));
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
  } else if (cfg.tls && cfg.unix_path.empty() && cfg.transport == TransportKind::kAuto) {
    // shm authenticates no server certificate (docs/design.md, "TLS"):
    // with TLS on, only an explicit SLOTRPC_UNIX_PATH (or transport=shm)
    // uses it.
    shm_note = "no shm (TLS on and SLOTRPC_UNIX_PATH not set); ";
  } else if (cfg.transport == TransportKind::kShm ||
             (cfg.transport == TransportKind::kAuto && rpc::is_local_host(endpoint->host))) {
    const std::string name = cfg.unix_path.empty() ? rpc::default_unix_name(endpoint->port) : cfg.unix_path;
    auto est = establish_shm(impl, name, deadline, &reached, &refused);
    if (est.ok()) {
      est.value().note = fmt::format("{} is on this host; {}", endpoint->host, est.value().note);
      return est;
    }
    // A uid refused, by either end: the shm socket is not for this pair
    // of users (or not the server's at all), TCP is.
    const bool denied = est.status().code() == StatusCode::kPermissionDenied;
    // The server's answer (a limit) is not a reason to fall back.
    if (refused && !denied) return fail(est.status());
    if (cfg.transport == TransportKind::kShm) {
      return fail(Status(denied ? StatusCode::kPermissionDenied : StatusCode::kUnavailable,
                         fmt::format("transport 'shm' was requested (Config.transport / "
                                     "SLOTRPC_TRANSPORT) but the server's Unix socket unix:{} "
                                     "cannot be used: {}", name, est.status().message())));
    }
    if (reached) {
      base::log().warn("slotrpc: shm to {} (unix:{}) failed, trying the network: {}", impl.address, name,
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
  // TLS before the Hello: the Hello, and on verbs the queue pair numbers
  // and ring keys, travel only inside it.
  std::shared_ptr<transport::tls::Stream> tls;
  if (cfg.tls) {
    auto t = rpc::tls_connect(fd.fd, cfg, endpoint->host, deadline);
    if (!t.ok()) return fail(t.status());
    tls = std::move(t).value();
  }

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
                         ? std::string("as requested")
                         : fmt::format("no usable RDMA device here: {}", impl.verbs_note);
  if (propose) {
    Status st = on_loop(loop, [&]() -> Status {
      auto t = rpc::loop_verbs(loop);
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
      base::log().warn("slotrpc: verbs setup for {} failed, offering tcp: {}", impl.address, st.message());
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
                             deadline, {}, tls.get());
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
      e.note = shm_note + (rpc::loop_verbs(loop).ok() ? rpc::loop_verbs(loop).value()->device().describe() : "") +
               (tls ? "; handshake over TLS " + tls->describe() : std::string());
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
  const std::string description = fmt::format("tcp{} {} -> {}", tls ? "+tls" : "", local, e.peer);
  transport::Link* tcp_link = nullptr;  // owned by the session, loop thread only
  auto created = on_loop(loop, [&]() -> Result<std::shared_ptr<core::ClientSession>> {
    auto link = rpc::loop_tcp(loop).adopt(tcp_fd, description, tls);  // takes the fd, even on failure
    if (!link.ok()) return link.status();
    tcp_link = link.value().get();
    link.value()->configure(impl.config);
    if (impl.config.tcp_bulk_push != 0 && (hs->reply.features & core::kFeatureTcpPush) != 0)
      link.value()->set_push_limit(impl.config.tcp_bulk_push);
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
  e.note = shm_note + note + (tls ? "; TLS " + tls->describe() : std::string());
  // A TLS link offers no attached connection (it would run outside TLS):
  // the server sends no token, and the link asks for none.
  if ((hs->reply.features & core::kFeatureAttach) != 0 && !hs->extension.empty()) {
    e.attach_token = std::move(hs->extension);
    e.link = tcp_link;
  }
  return e;
}


}  // namespace slotrpc::rpc
