// Server::Impl: answering a Hello (rpc/acceptor.h hands each one over):
// admission, then the session opened on the transport the handshake agreed,
// or a connection attached to an existing session's link (transport.h,
// "Attached connections").
#include "rpc/server_impl.h"

#include <fcntl.h>
#include <unistd.h>

#include "base/settings.h"
#include "core/bulk/region.h"
#include "core/handshake.h"
#include "transport/shm/shm_transport.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/verbs/device.h"
#include "transport/verbs/verbs_transport.h"

namespace slotrpc {

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

void Server::Impl::refuse(rpc::PendingSession& p, StatusCode code, const std::string& why) {
  refuse_log.warn(fmt::format("slotrpc: refused session from {}: {}", p.peer, why));
  (void)rpc::send_hello_reply(p, static_cast<uint16_t>(code), why);
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
  if (h.transport == core::WireTransport::kAttach) return on_attach_hello(std::move(p));
  if (h.transport == core::WireTransport::kTcp && config.transport == TransportKind::kVerbs) {
    return refuse(p, StatusCode::kUnavailable,
                  "this server accepts only the verbs transport (SLOTRPC_TRANSPORT=verbs); the "
                  "client offered tcp");
  }
  if (h.slot_count < 1 || h.slot_count > config.slot_count || h.slot_size < base::kMinSlotSize ||
      h.slot_size > config.slot_size || h.slot_size % base::kSlotSizeAlign != 0) {
    return refuse(p, StatusCode::kResourceExhausted,
                  fmt::format("asked for {} slots of {} bytes; this server allows 1..{} slots of "
                              "{}..{} bytes (multiples of {}); lower the client's slot_count / "
                              "slot_size or raise the server's",
                              h.slot_count, h.slot_size, config.slot_count, base::kMinSlotSize,
                              config.slot_size, base::kSlotSizeAlign));
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

void Server::Impl::on_attach_hello(rpc::PendingSession p) {
  // The token is the transport's; only its route (the loop) is ours.
  const std::optional<uint16_t> index = transport::attachment_route(p.extension);
  if (!index || *index >= loops.size())
    return refuse(p, StatusCode::kInvalidArgument,
                  fmt::format("an attach hello whose {}-byte token names no event loop of this server",
                              p.extension.size()));
  loops[*index]->post([this, index = *index, p = std::move(p)]() mutable {
    if (stopping.load()) return refuse(p, StatusCode::kUnavailable, "server stopping");
    // As for a session: the link gets a duplicate, the reply goes out on
    // the original.  Nothing goes out on the attached connection before
    // that reply: the client decides when it is used.
    const int attach_fd = ::fcntl(p.fd, F_DUPFD_CLOEXEC, 0);
    if (attach_fd < 0)
      return refuse(p, StatusCode::kResourceExhausted, fmt::format("dup: {}", std::strerror(errno)));
    // Only tcp links offer tokens.
    transport::Transport& t = rpc::loop_tcp(*loops[index]);
    Status st = t.accept_attachment(p.extension, attach_fd);
    if (!st.ok()) return refuse(p, st.code(), st.message());
    if (!rpc::send_hello_reply(p, 0, std::string(), core::WireTransport::kAttach)) {
      // Attached, but its client never hears so: it goes on without, and
      // this end's side stays idle until the session ends.
      refuse_log.warn(fmt::format("slotrpc: attached connection from {}: the HelloReply could not "
                                  "be written at once", p.peer));
    }
    ::close(p.fd);
    base::log().debug("slotrpc: attached connection from {} on loop {}", p.peer, index);
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
        base::log().warn("slotrpc: verbs setup for {} failed, answering with tcp: {}", p.peer,
                     ext.status().message());
        tcp_note = "verbs setup failed on the server: " + ext.status().message();
      }
    }
    if (!session) {
      std::vector<std::byte> attach_token;
      auto s = open_tcp(index, p, g, ring_bytes, &attach_token);
      if (!s.ok()) {
        const std::string why = explain_setup_failure(s.status());
        return fail(why != s.status().message() ? StatusCode::kResourceExhausted : s.status().code(),
                    "server cannot set up the session: " + why);
      }
      session = std::move(s.value());
      packing = true;
      if (!attach_token.empty()) {
        extension = std::move(attach_token);
        features |= core::kFeatureAttach;
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
  p.info.transport = transport == core::WireTransport::kShm     ? "shm"
                     : transport == core::WireTransport::kVerbs ? "verbs"
                                                                : "tcp";
  session->set_peer_info(std::move(p.info));
  session->set_client_takes_trailers((p.hello.features & core::kFeatureMetadata) != 0);
  features |= core::kFeatureMetadata;
  if (!checks.interceptors.empty()) session->set_call_checks(&checks);
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
  if (!rpc::send_hello_reply(p, 0, transport == core::WireTransport::kVerbs ? std::string() : tcp_note,
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
  base::log().debug("slotrpc: session with {} on loop {}", p.peer, index);
  core::ServerSession* raw = session.get();
  if (const PeerInfo& peer = raw->peer_info(); peer.tls) {
    // Who the client is, as its certificate says (the session's PeerInfo).
    std::string who = peer.tls_subject.empty() ? std::string("no client certificate")
                                               : "client certificate " + peer.tls_subject;
    for (size_t i = 0; i < peer.tls_sans.size(); ++i) who += (i == 0 ? " [" : ", ") + peer.tls_sans[i];
    if (!peer.tls_sans.empty()) who += "]";
    // The transport named too: on verbs and shm TLS protects the handshake
    // only (docs/design.md, "Trust and security").
    base::log().info("slotrpc: TLS session with {} on loop {} ({}): {}", p.peer, index, peer.transport, who);
  }
  sessions[index].emplace(raw, std::move(session));
}

Result<std::unique_ptr<core::ServerSession>> Server::Impl::open_shm(
    size_t index, int fd, core::ServerSession::Geometry g, const std::string& peer,
    uint64_t ring_bytes, transport::shm::ShmLink*& raw) {
  reactor::Reactor& loop = *loops[index];
  auto t = rpc::loop_shm(loop);
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
  session.value()->set_bulk_timeout_ms(config.bulk_timeout_ms);
  base::log().info("slotrpc: shm session with {} on loop {}", peer, index);
  return session;
}

Result<std::unique_ptr<core::ServerSession>> Server::Impl::open_tcp(
    size_t index, const rpc::PendingSession& p, core::ServerSession::Geometry g, uint64_t ring_bytes,
    std::vector<std::byte>* attach_token) {
  const int fd = p.fd;
  const std::string& peer = p.peer;
  reactor::Reactor& loop = *loops[index];
  // The link gets a duplicate: the original stays ours for the reply, even
  // when a failure below destroys the link (and closes its fd).
  const int link_fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (link_fd < 0) {
    return Status(StatusCode::kResourceExhausted, fmt::format("dup: {}", std::strerror(errno)));
  }
  // A TLS link reads and writes through the handshake's stream, which the
  // HelloReply is written through before any frame (open_session).
  auto link = rpc::loop_tcp(loop).adopt(
      link_fd, fmt::format("tcp{} {} -> {}", p.tls_stream != nullptr ? "+tls" : "", rpc::local_name(fd), peer), p.tls_stream);
  if (!link.ok()) return link.status();  // adopt() has closed link_fd
  link.value()->configure(config);
  // Loop indexes fit the token's 16 route bits (reactor_threads <= 256).
  // A TLS link offers none (TcpLink::offer_attachment): an attached
  // connection would run outside TLS.
  *attach_token = link.value()->offer_attachment(static_cast<uint16_t>(index));
  link.value()->accept_pushes(config.tcp_bulk_push != 0);  // announced below (kFeatureTcpPush)
  auto session = core::ServerSession::create(loop, std::move(link.value()), g, methods, peer,
                                             on_closed(index, ring_bytes));
  if (session.ok()) {
    session.value()->set_counters(counters[index]);
    session.value()->set_max_bulk_bytes(config.max_bulk_bytes);
    session.value()->set_bulk_timeout_ms(config.bulk_timeout_ms);
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
  auto t = rpc::loop_verbs(loop);
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
  session.value()->set_bulk_timeout_ms(config.bulk_timeout_ms);
  // Never registered, never closed: a failure below just destroys it.
  Status st = raw_link->connect(remote, closer.fd, peer);
  if (!st.ok()) return st;
  closer.fd = -1;
  std::vector<std::byte> ext(transport::verbs::kQpInfoSize);
  transport::verbs::encode_qp_info(raw_link->local_info(), ext.data());
  base::log().debug("slotrpc: verbs session with {} on loop {}: {}", peer, index, raw_link->describe());
  out = std::move(session.value());
  return ext;
}

}  // namespace slotrpc
