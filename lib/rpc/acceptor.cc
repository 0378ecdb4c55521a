#include "rpc/acceptor.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>
#include <fmt/format.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <list>
#include <mutex>
#include <unordered_map>

#include "base/logging.h"
#include "rpc/admission.h"
#include "rpc/connector.h"
#include "rpc/peer_info.h"

namespace slotrpc::rpc {

namespace asio = boost::asio;
using asio::ip::tcp;
// TCP and Unix connections share one handshake path.
using Socket = asio::generic::stream_protocol::socket;

namespace {

// Builds a HelloReply and writes it at once: through `tls` when given.
bool write_hello_reply(int fd, transport::tls::Stream* tls, uint16_t status, const core::Hello& hello,
                       const std::string& message, core::WireTransport transport,
                       std::span<const std::byte> extension, uint16_t features) {
  core::HelloReply reply;
  reply.status = status;
  reply.features = features;
  reply.slot_count = hello.slot_count;
  reply.slot_size = hello.slot_size;
  reply.transport = transport;
  reply.message_len =
      static_cast<uint32_t>(std::min<size_t>(message.size(), core::kMaxHandshakeMessage));
  reply.extension_len = static_cast<uint32_t>(extension.size());
  // At most 32 + 1024 + 4096 bytes: a fresh socket's send buffer takes it.
  std::array<std::byte, core::kHelloSize + core::kMaxHandshakeMessage + core::kMaxHandshakeExtension>
      buf;
  const size_t len = core::kHelloSize + reply.message_len + extension.size();
  if (extension.size() > core::kMaxHandshakeExtension) return false;
  core::encode_hello_reply(reply, buf.data());
  std::memcpy(buf.data() + core::kHelloSize, message.data(), reply.message_len);
  std::copy(extension.begin(), extension.end(), buf.begin() + core::kHelloSize + reply.message_len);
  if (tls != nullptr) {
    // The stream sends what it encrypts at once; what the socket did not
    // take is a failure here as for the plain send below.
    iovec iov{buf.data(), len};
    return tls->write(&iov, 1) == static_cast<ssize_t>(len) && !tls->pending_out();
  }
  ssize_t n;
  do {
    n = ::send(fd, buf.data(), len, MSG_NOSIGNAL | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  return n == static_cast<ssize_t>(len);
}

}  // namespace

bool send_hello_reply(int fd, uint16_t status, const core::Hello& hello, const std::string& message,
                      core::WireTransport transport, std::span<const std::byte> extension,
                      uint16_t features) {
  return write_hello_reply(fd, nullptr, status, hello, message, transport, extension, features);
}

bool send_hello_reply(const PendingSession& p, uint16_t status, const std::string& message,
                      core::WireTransport transport, std::span<const std::byte> extension,
                      uint16_t features) {
  if (p.tls_stream == nullptr)
    return write_hello_reply(p.fd, nullptr, status, p.hello, message, transport, extension, features);
  // Through p.fd, which the caller still holds: the stream may have moved
  // to a link's duplicate that a failed setup has closed already.  A link
  // that lives on gets its own fd back.
  const int link_fd = p.tls_stream->fd();
  p.tls_stream->set_fd(p.fd);
  const bool ok =
      write_hello_reply(p.fd, p.tls_stream.get(), status, p.hello, message, transport, extension, features);
  p.tls_stream->set_fd(link_fd);
  return ok;
}

namespace {

constexpr auto kFdPause = std::chrono::milliseconds(100);

}  // namespace

// A connection whose Hello has not arrived yet.  In a named namespace, not
// the anonymous one: Acceptor::Impl (external linkage) holds a list of them.
namespace acceptor_detail {

struct Pending {
  Pending(asio::io_context& io, Socket s) : sock(std::move(s)), timer(io) {}
  Socket sock;
  asio::steady_timer timer;
  std::array<std::byte, core::kHelloSize> head{};
  size_t have = 0;
  core::Hello hello;
  std::vector<std::byte> extension;
  size_t ext_have = 0;
  std::string host;  // source address, the per-host cap's key
  PeerInfo info;
  std::string peer;  // address:port, for log lines
  std::list<std::shared_ptr<Pending>>::iterator pos;
  bool done = false;
  bool local = false;  // the Unix socket: wait for the client's shm offer too
  bool handed = false;  // released to on_hello
  std::shared_ptr<transport::tls::Stream> tls;  // TLS: created once a ClientHello is seen
  std::shared_ptr<transport::tls::Context> tls_context;  // the server's when accepted
};

}  // namespace acceptor_detail

namespace {

using acceptor_detail::Pending;

// The Hello's first 6 bytes are fixed (magic, version): a prefix that
// differs is refused at once instead of waiting for all 32.
std::array<std::byte, 6> hello_prefix() {
  std::array<std::byte, core::kHelloSize> h{};
  core::encode_hello(core::Hello{}, h.data());
  std::array<std::byte, 6> p{};
  std::copy_n(h.begin(), 6, p.begin());
  return p;
}

}  // namespace

struct Acceptor::Impl {
  Impl(const Config& c, int listen_fd, OnHello cb, int unix_fd, std::string unix_name_)
      : config(c), acceptor(io), unix_acceptor(io), unix_name(std::move(unix_name_)), fd_timer(io),
        on_hello(std::move(cb)), prefix(hello_prefix()) {
    auto peers = base::parse_uid_policy("Config.shm_peer_uids", config.shm_peer_uids);
    if (!peers.ok()) throw std::runtime_error("slotrpc acceptor: " + peers.status().message());
    shm_peers = std::move(peers).value();
    boost::system::error_code ec;
    if (unix_fd >= 0) {
      unix_acceptor.assign(asio::local::stream_protocol(), unix_fd, ec);
      if (ec) throw std::runtime_error("slotrpc acceptor: assign unix: " + ec.message());
      unix_acceptor.non_blocking(true, ec);
    }
    reserve_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (listen_fd < 0) return;
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    ::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&ss), &len);
    acceptor.assign(ss.ss_family == AF_INET6 ? tcp::v6() : tcp::v4(), listen_fd, ec);
    if (ec) throw std::runtime_error("slotrpc acceptor: assign: " + ec.message());
    acceptor.non_blocking(true, ec);
  }
  ~Impl() {
    if (reserve_fd >= 0) ::close(reserve_fd);
  }

  const Config config;
  asio::io_context io;
  tcp::acceptor acceptor;
  asio::local::stream_protocol::acceptor unix_acceptor;  // shm sessions, if open
  std::string unix_name;
  // Who may connect there (SLOTRPC_SHM_PEER_UIDS; the Config is valid).
  base::UidPolicy shm_peers;
  asio::steady_timer fd_timer;  // paused accepting at the fd limit
  OnHello on_hello;
  const std::array<std::byte, 6> prefix;

  std::list<std::shared_ptr<Pending>> pending;  // oldest first
  std::unordered_map<std::string, uint32_t> per_host;

  int reserve_fd = -1;
  bool fd_episode = false;
  uint64_t fd_refused = 0;

  RateLimitedLog evict_log;
  RateLimitedLog timeout_log;
  RateLimitedLog junk_log;
  RateLimitedLog error_log;
  RateLimitedLog tls_log;

  // set_tls(): any thread writes, the accept thread reads once per connection.
  std::mutex tls_mu;
  std::shared_ptr<transport::tls::Context> tls_context;

  void arm_accept();
  void arm_unix_accept();
  void on_accept(const boost::system::error_code& ec, tcp::socket sock);
  void on_fd_limit(const boost::system::error_code& ec);
  void start(Socket sock, bool local);
  void handed_over(const std::shared_ptr<Pending>& p);
  void read_more(const std::shared_ptr<Pending>& p);
  // TLS: the first byte says what the peer speaks; then the handshake, a
  // step per readiness of the socket; then the Hello through the stream.
  void sniff(const std::shared_ptr<Pending>& p);
  void tls_step(const std::shared_ptr<Pending>& p);
  void tls_read(const std::shared_ptr<Pending>& p, std::byte* dst, size_t len);
  template <class Then>
  void when_ready(const std::shared_ptr<Pending>& p, Socket::wait_type what, Then then);
  // Answers with a refusal outside TLS (a plain Hello on a TLS port), lets
  // the client's unread bytes go, and closes.
  void refuse_plain(const std::shared_ptr<Pending>& p, const std::string& why);
  void on_read(const std::shared_ptr<Pending>& p, size_t n);
  void finish(const std::shared_ptr<Pending>& p);
  void refuse(const std::shared_ptr<Pending>& p, const Status& why);
  void evict_oldest(const std::string* host, const char* cap, uint32_t value);

  // The exception barrier of the accept path: a handler that throws costs
  // at most the connection it was handling.
  template <class Fn>
  void guarded(const std::shared_ptr<Pending>& p, Fn&& fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      error_log.warn(fmt::format("slotrpc: accept path: {} (closing {})", e.what(),
                                 p ? p->peer : std::string("no connection")));
      if (p && !p->done) finish(p);
    }
  }
};

void Acceptor::Impl::arm_unix_accept() {
  if (!unix_acceptor.is_open()) return;
  unix_acceptor.async_accept([this](const boost::system::error_code& ec,
                                    asio::local::stream_protocol::socket sock) {
    guarded(nullptr, [&] {
      if (ec == asio::error::operation_aborted || !unix_acceptor.is_open()) return;
      // The fd limit and the like: the TCP path's handling covers the
      // server; here the connection is simply not taken this time.
      if (ec) {
        error_log.warn(fmt::format("slotrpc: accept on unix:{}: {}", unix_name, ec.message()));
      } else {
        start(Socket(std::move(sock)), true);
      }
      arm_unix_accept();
    });
  });
}

void Acceptor::Impl::arm_accept() {
  if (!acceptor.is_open()) return;
  acceptor.async_accept([this](const boost::system::error_code& ec, tcp::socket sock) {
    guarded(nullptr, [&] { on_accept(ec, std::move(sock)); });
  });
}

void Acceptor::Impl::on_accept(const boost::system::error_code& ec, tcp::socket sock) {
  if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
  if (ec == asio::error::no_descriptors || ec.value() == ENFILE || ec.value() == ENOBUFS ||
      ec.value() == ENOMEM) {
    on_fd_limit(ec);
    return;
  }
  if (ec) {
    // ECONNABORTED and the like: the peer gave up while queued.
    error_log.warn(fmt::format("slotrpc: accept: {}", ec.message()));
    arm_accept();
    return;
  }
  if (fd_episode) {
    base::log().info("slotrpc: file descriptors are available again; {} connection(s) were refused "
                 "while there were none", fd_refused);
    fd_episode = false;
    fd_refused = 0;
  }
  start(Socket(std::move(sock)), false);
  arm_accept();
}

// EMFILE/ENFILE: the connection stays in the backlog, and accepting again
// at once would fail again at once (the old accept loop spun a core here).
// Use the reserve descriptor to take it off the backlog with a clear
// refusal, then continue; without a reserve, wait 100 ms.
void Acceptor::Impl::on_fd_limit(const boost::system::error_code& ec) {
  if (!fd_episode) {
    fd_episode = true;
    base::log().warn("slotrpc: server out of file descriptors (accept: {}; RLIMIT_NOFILE = {}): new "
                 "connections are refused with RESOURCE_EXHAUSTED until some are freed",
                 ec.message(), nofile_limit_text());
  }
  bool took_one = false;
  if (reserve_fd >= 0) {
    ::close(reserve_fd);
    reserve_fd = -1;
    const int fd = ::accept4(acceptor.native_handle(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) {
      took_one = true;
      ++fd_refused;
      (void)send_hello_reply(fd, static_cast<uint16_t>(StatusCode::kResourceExhausted), core::Hello{},
                             fmt::format("server out of file descriptors (RLIMIT_NOFILE = {})",
                                         nofile_limit_text()));
      // The client's Hello is unread: drain it, so close() sends FIN and not
      // RST (an RST could destroy the reply before the client reads it).
      ::shutdown(fd, SHUT_WR);
      std::array<char, 512> sink;
      while (::recv(fd, sink.data(), sink.size(), MSG_DONTWAIT) > 0) {
      }
      ::close(fd);
    }
    reserve_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  }
  if (took_one && reserve_fd >= 0) {
    arm_accept();
    return;
  }
  fd_timer.expires_after(kFdPause);
  fd_timer.async_wait([this](const boost::system::error_code& e) {
    guarded(nullptr, [&] {
      if (e || !acceptor.is_open()) return;
      if (reserve_fd < 0) reserve_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      arm_accept();
    });
  });
}

void Acceptor::Impl::evict_oldest(const std::string* host, const char* cap, uint32_t value) {
  for (auto it = pending.begin(); it != pending.end(); ++it) {
    if (host != nullptr && (*it)->host != *host) continue;
    std::shared_ptr<Pending> victim = *it;
    evict_log.warn(fmt::format("slotrpc: {} = {} reached: closing the oldest unfinished handshake "
                               "({})", cap, value, victim->peer));
    finish(victim);
    return;
  }
}

void Acceptor::Impl::start(Socket sock, bool local) {
  boost::system::error_code ec;
  sock.non_blocking(true, ec);
  std::string host;
  std::string peer;
  const int fd = sock.native_handle();
  if (local) {
    // Every local peer counts as one host for the per-host cap.
    host = "unix";
    peer = fmt::format("unix:{} ({})", unix_name, peer_credentials(fd));
  } else {
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    peer = peer_name(fd);
    if (peer == "?") return;  // already gone; the socket closes here
    // "1.2.3.4:5" / "[::1]:5" -> the address, the per-host cap's key.
    host = peer.substr(0, peer.rfind(':'));
    if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  }

  if (pending.size() >= config.max_pending_handshakes) {
    evict_oldest(nullptr, "SLOTRPC_MAX_PENDING_HANDSHAKES", config.max_pending_handshakes);
  }
  if (auto it = per_host.find(host); it != per_host.end() &&
                                     it->second >= config.max_pending_handshakes_per_host) {
    evict_oldest(&host, "SLOTRPC_MAX_PENDING_HANDSHAKES_PER_HOST",
                 config.max_pending_handshakes_per_host);
  }

  auto p = std::make_shared<Pending>(io, std::move(sock));
  // Asked now, while the client is surely still connected.
  p->info = identify_peer(fd, local, local ? "unix:" + unix_name : peer);
  p->peer = std::move(peer);
  p->local = local;
  p->host = std::move(host);
  ++per_host[p->host];
  p->pos = pending.insert(pending.end(), p);
  if (!local) {
    std::lock_guard<std::mutex> lock(tls_mu);
    p->tls_context = tls_context;
  }
  p->timer.expires_after(std::chrono::milliseconds(config.connect_timeout_ms));
  p->timer.async_wait([this, p](const boost::system::error_code& e) {
    guarded(p, [&] {
      if (e || p->done) return;
      timeout_log.warn(fmt::format("slotrpc: handshake with {} failed: no complete hello within "
                                   "{} ms (SLOTRPC_CONNECT_TIMEOUT_MS)", p->peer,
                                   config.connect_timeout_ms));
      finish(p);
    });
  });
  if (p->tls_context != nullptr) return sniff(p);
  read_more(p);
}

void Acceptor::Impl::read_more(const std::shared_ptr<Pending>& p) {
  if (p->tls != nullptr) {
    if (p->have < core::kHelloSize) return tls_read(p, p->head.data() + p->have, core::kHelloSize - p->have);
    return tls_read(p, p->extension.data() + p->ext_have, p->extension.size() - p->ext_have);
  }
  auto handler = [this, p](const boost::system::error_code& ec, size_t n) {
    guarded(p, [&] {
      if (p->done) return;
      if (ec) {
        // EOF or reset before the hello was complete: nothing to answer.
        if (ec != asio::error::operation_aborted) finish(p);
        return;
      }
      on_read(p, n);
    });
  };
  if (p->have < core::kHelloSize) {
    p->sock.async_read_some(asio::buffer(p->head.data() + p->have, core::kHelloSize - p->have),
                            std::move(handler));
  } else {
    p->sock.async_read_some(
        asio::buffer(p->extension.data() + p->ext_have, p->extension.size() - p->ext_have),
        std::move(handler));
  }
}

void Acceptor::Impl::on_read(const std::shared_ptr<Pending>& p, size_t n) {
  if (p->have < core::kHelloSize) {
    p->have += n;
    const size_t check = std::min(p->have, prefix.size());
    if (!std::equal(p->head.begin(), p->head.begin() + static_cast<ptrdiff_t>(check), prefix.begin())) {
      if (p->head[0] == std::byte{0x16} && p->tls == nullptr) {
        // A TLS record (a ClientHello) where a slotrpc Hello belongs.
        return refuse(p, Status(StatusCode::kUnavailable,
                                "TLS ClientHello on a plain port: this server has TLS off "
                                "(Config.tls / SLOTRPC_TLS)"));
      }
      // Decoding the (zero-padded) head names what is wrong: magic or version.
      auto bad = core::decode_hello(p->head.data());
      refuse(p, bad.ok() ? Status(StatusCode::kUnavailable, "handshake failed: bad hello")
                         : bad.status());
      return;
    }
    if (p->have < core::kHelloSize) return read_more(p);
    auto hello = core::decode_hello(p->head.data());
    if (!hello.ok()) return refuse(p, hello.status());
    p->hello = hello.value();
    p->extension.resize(p->hello.extension_len);
  } else {
    p->ext_have += n;
  }
  if (p->ext_have < p->extension.size()) return read_more(p);
  if (p->local) {
    // The client's shm offer follows its Hello: hand over only once it is
    // readable, so that the loop taking it never waits on a peer.
    p->sock.async_wait(Socket::wait_read, [this, p](const boost::system::error_code& ec) {
      guarded(p, [&] {
        if (p->done) return;
        if (ec) {
          if (ec != asio::error::operation_aborted) finish(p);
          return;
        }
        // A client of a user SLOTRPC_SHM_PEER_UIDS leaves out is refused
        // before anything of it is taken (docs/design.md, "Trust and
        // security").  Here, with its Hello and offer read, so that the
        // refusal reaches it as a HelloReply, not a broken pipe.
        if (Status st = check_shm_peer(p->sock.native_handle(), shm_peers, "the shm client",
                                       "this server's");
            !st.ok()) {
          return refuse(p, st);
        }
        handed_over(p);
      });
    });
    return;
  }
  handed_over(p);
}

void Acceptor::Impl::handed_over(const std::shared_ptr<Pending>& p) {
  // Complete: the session is the server's now.
  p->handed = true;
  PendingSession s;
  s.hello = p->hello;
  s.extension = std::move(p->extension);
  s.peer = p->peer;
  s.local = p->local;
  s.info = std::move(p->info);
  s.tls_stream = p->tls;
  finish(p);  // leaves the socket open: released below
  s.fd = p->sock.release();
  on_hello(std::move(s));
}

void Acceptor::Impl::finish(const std::shared_ptr<Pending>& p) {
  if (p->done) return;
  p->done = true;
  pending.erase(p->pos);
  if (auto it = per_host.find(p->host); it != per_host.end() && --it->second == 0) per_host.erase(it);
  boost::system::error_code ec;
  p->timer.cancel();
  if (!p->handed) p->sock.close(ec);
}

void Acceptor::Impl::refuse(const std::shared_ptr<Pending>& p, const Status& why) {
  junk_log.warn(fmt::format("slotrpc: refused session from {}: {}", p->peer, why.message()));
  (void)write_hello_reply(p->sock.native_handle(), p->tls.get(), static_cast<uint16_t>(why.code()),
                          core::Hello{}, why.message(), core::WireTransport::kTcp, {},
                          core::kKnownFeatures);
  finish(p);
  boost::system::error_code ec;
  p->sock.close(ec);
}

// ------------------------------------------------------------------ TLS

template <class Then>
void Acceptor::Impl::when_ready(const std::shared_ptr<Pending>& p, Socket::wait_type what, Then then) {
  p->sock.async_wait(what, [this, p, then](const boost::system::error_code& ec) {
    guarded(p, [&] {
      if (p->done) return;
      if (ec) {
        if (ec != asio::error::operation_aborted) finish(p);
        return;
      }
      then();
    });
  });
}

void Acceptor::Impl::sniff(const std::shared_ptr<Pending>& p) {
  when_ready(p, Socket::wait_read, [this, p] {
    std::array<std::byte, 1> first{};
    const ssize_t n = ::recv(p->sock.native_handle(), first.data(), first.size(), MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return finish(p);  // closed before a byte: nothing to answer
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return sniff(p);
      return finish(p);
    }
    if (first[0] == std::byte{0x16}) {  // a TLS handshake record: the ClientHello
      auto stream = transport::tls::Stream::create(p->tls_context, p->sock.native_handle());
      if (!stream.ok()) {
        tls_log.warn(fmt::format("slotrpc: TLS with {}: {}", p->peer, stream.status().message()));
        return finish(p);
      }
      p->tls = std::move(stream).value();
      return tls_step(p);
    }
    if (first[0] == prefix[0]) {
      return refuse_plain(p, "this server requires TLS (Config.tls / SLOTRPC_TLS): the client sent a "
                             "plain slotrpc Hello on a TLS port");
    }
    junk_log.warn(fmt::format("slotrpc: closed connection from {}: junk before the TLS ClientHello "
                              "(first byte 0x{:02x})", p->peer, static_cast<unsigned>(first[0])));
    finish(p);
  });
}

void Acceptor::Impl::tls_step(const std::shared_ptr<Pending>& p) {
  switch (p->tls->handshake()) {
    case transport::tls::Stream::Step::kDone: {
      // The client's certificate goes straight into the PeerInfo the
      // session and every call's ServerCall will see.
      transport::tls::Identity id = p->tls->peer_identity();
      p->info.tls = true;
      p->info.tls_subject = std::move(id.subject);
      p->info.tls_sans = std::move(id.sans);
      base::log().debug("slotrpc: TLS with {}: {}{}", p->peer, p->tls->describe(),
                        p->info.tls_subject.empty() ? std::string(", no client certificate")
                                                    : ", client " + p->info.tls_subject);
      return read_more(p);
    }
    case transport::tls::Stream::Step::kWantRead:
      return when_ready(p, Socket::wait_read, [this, p] { tls_step(p); });
    case transport::tls::Stream::Step::kWantWrite:
      return when_ready(p, Socket::wait_write, [this, p] { tls_step(p); });
    case transport::tls::Stream::Step::kFailed:
      tls_log.warn(fmt::format("slotrpc: refused session from {}: {}", p->peer, p->tls->error()));
      return finish(p);
  }
}

void Acceptor::Impl::tls_read(const std::shared_ptr<Pending>& p, std::byte* dst, size_t len) {
  const ssize_t n = p->tls->read(dst, len);
  if (n > 0) return on_read(p, static_cast<size_t>(n));
  if (n == 0) return finish(p);
  if (errno == EAGAIN) return when_ready(p, Socket::wait_read, [this, p] { read_more(p); });
  if (errno == EPROTO) tls_log.warn(fmt::format("slotrpc: handshake with {} failed: {}", p->peer, p->tls->error()));
  finish(p);
}

void Acceptor::Impl::refuse_plain(const std::shared_ptr<Pending>& p, const std::string& why) {
  junk_log.warn(fmt::format("slotrpc: refused session from {}: {}", p->peer, why));
  const int fd = p->sock.native_handle();
  (void)write_hello_reply(fd, nullptr, static_cast<uint16_t>(StatusCode::kUnavailable), core::Hello{}, why,
                          core::WireTransport::kTcp, {}, core::kKnownFeatures);
  // The client's Hello is unread: take it, so that close() sends FIN and
  // not RST (which could destroy the reply before the client reads it).
  ::shutdown(fd, SHUT_WR);
  std::array<char, 512> sink;
  while (::recv(fd, sink.data(), sink.size(), MSG_DONTWAIT) > 0) {
  }
  finish(p);
}

Acceptor::Acceptor(const Config& config, int listen_fd, OnHello on_hello, int unix_fd,
                   std::string unix_name)
    : impl_(std::make_unique<Impl>(config, listen_fd, std::move(on_hello), unix_fd,
                                   std::move(unix_name))) {}

Acceptor::~Acceptor() = default;

void Acceptor::run() {
  pthread_setname_np(pthread_self(), "slotrpc-accept");
  impl_->arm_accept();
  impl_->arm_unix_accept();
  for (;;) {
    try {
      impl_->io.run();
      break;  // stopped
    } catch (const std::exception& e) {
      // A handler's own barrier should have caught it; keep accepting.
      base::log().error("slotrpc: accept path: {}", e.what());
    }
  }
  // Pending handshakes die with the server.
  for (auto& p : impl_->pending) {
    boost::system::error_code ec;
    p->done = true;
    p->sock.close(ec);
  }
  impl_->pending.clear();
  impl_->per_host.clear();
}

void Acceptor::stop() {
  asio::post(impl_->io, [impl = impl_.get()] {
    boost::system::error_code ec;
    impl->acceptor.close(ec);
    impl->unix_acceptor.close(ec);
    impl->fd_timer.cancel();
    impl->io.stop();
  });
}

size_t Acceptor::pending() const { return impl_->pending.size(); }

void Acceptor::set_tls(std::shared_ptr<transport::tls::Context> context) {
  std::lock_guard<std::mutex> lock(impl_->tls_mu);
  impl_->tls_context = std::move(context);
}

}  // namespace slotrpc::rpc
