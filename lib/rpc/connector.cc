#include "rpc/connector.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <ifaddrs.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <fmt/format.h>

#include "core/handshake.h"

#include <fcntl.h>

#include <cerrno>
#include <cstddef>
#include <charconv>
#include <cstring>

namespace slotrpc::rpc {
namespace {

int ms_left(Deadline deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                  deadline - std::chrono::steady_clock::now())
                  .count();
  return left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1 << 30));
}

// Waits for `events` on fd; false on timeout.
bool wait_fd(int fd, short events, Deadline deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int r = ::poll(&p, 1, ms_left(deadline));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return false;
  }
}

std::string endpoint_name(const sockaddr_storage& ss) {
  namespace ip = boost::asio::ip;
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    ip::address_v4 addr(ntohl(a->sin_addr.s_addr));
    return fmt::format("{}:{}", addr.to_string(), ntohs(a->sin_port));
  }
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    ip::address_v6::bytes_type b;
    std::memcpy(b.data(), &a->sin6_addr, 16);
    return fmt::format("[{}]:{}", ip::address_v6(b).to_string(), ntohs(a->sin6_port));
  }
  return "?";
}

}  // namespace

Result<int> connect_tcp(const Endpoint& to, Deadline deadline) {
  namespace asio = boost::asio;
  using asio::ip::tcp;
  asio::io_context io;
  boost::system::error_code ec;
  tcp::resolver resolver(io);
  auto results = resolver.resolve(to.host, std::to_string(to.port), ec);
  if (ec) {
    return Status(StatusCode::kUnavailable,
                  fmt::format("cannot resolve {}: {}", to.host, ec.message()));
  }
  std::string last_error = "no addresses";
  for (const auto& entry : results) {
    tcp::socket sock(io);
    sock.open(entry.endpoint().protocol(), ec);
    if (ec) {
      last_error = ec.message();
      continue;
    }
    sock.non_blocking(true, ec);
    sock.connect(entry.endpoint(), ec);
    if (ec == asio::error::in_progress || ec == asio::error::would_block) {
      if (!wait_fd(sock.native_handle(), POLLOUT, deadline)) {
        last_error = "connect timed out";
        continue;
      }
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(sock.native_handle(), SOL_SOCKET, SO_ERROR, &err, &len);
      ec = err == 0 ? boost::system::error_code()
                    : boost::system::error_code(err, boost::system::system_category());
    }
    if (ec) {
      last_error = ec.message();
      continue;
    }
    sock.non_blocking(false, ec);
    sock.set_option(tcp::no_delay(true), ec);
    return sock.release();
  }
  return Status(StatusCode::kUnavailable,
                fmt::format("cannot connect to {}:{}: {}", to.host, to.port, last_error));
}

Status write_all(int fd, std::span<const std::byte> data, Deadline deadline) {
  size_t done = 0;
  while (done < data.size()) {
    if (!wait_fd(fd, POLLOUT, deadline)) return Status(StatusCode::kUnavailable, "handshake write timed out");
    ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Status(StatusCode::kUnavailable, fmt::format("handshake write: {}", std::strerror(errno)));
    }
    done += static_cast<size_t>(n);
  }
  return {};
}

Status read_exact(int fd, std::span<std::byte> data, Deadline deadline) {
  size_t done = 0;
  while (done < data.size()) {
    if (!wait_fd(fd, POLLIN, deadline)) return Status(StatusCode::kUnavailable, "handshake read timed out");
    ssize_t n = ::recv(fd, data.data() + done, data.size() - done, MSG_DONTWAIT);
    if (n == 0) return Status(StatusCode::kUnavailable, "peer closed the connection during the handshake");
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Status(StatusCode::kUnavailable, fmt::format("handshake read: {}", std::strerror(errno)));
    }
    done += static_cast<size_t>(n);
  }
  return {};
}

// ------------------------------------------------------------------ TLS

namespace {

Status tls_failure(const transport::tls::Stream& tls, std::string_view during) {
  if (tls.auth_failure()) {
    return Status(StatusCode::kUnauthenticated,
                  fmt::format("{}: authentication failed: {}", during, tls.error()));
  }
  return Status(StatusCode::kUnavailable, fmt::format("{}: {}", during, tls.error()));
}

}  // namespace

Result<std::shared_ptr<transport::tls::Stream>> tls_connect(int fd, const Config& cfg,
                                                            const std::string& host, Deadline deadline) {
  auto context = transport::tls::Context::client(cfg);
  if (!context.ok()) return context.status();
  auto created = transport::tls::Stream::create(std::move(context).value(), fd,
                                                cfg.tls_server_name.empty() ? host : cfg.tls_server_name);
  if (!created.ok()) return created.status();
  std::shared_ptr<transport::tls::Stream> tls = std::move(created).value();
  for (;;) {
    switch (tls->handshake()) {
      case transport::tls::Stream::Step::kDone:
        return tls;
      case transport::tls::Stream::Step::kWantRead:
        if (!wait_fd(fd, POLLIN, deadline)) return Status(StatusCode::kUnavailable, "TLS handshake timed out");
        break;
      case transport::tls::Stream::Step::kWantWrite:
        if (!wait_fd(fd, POLLOUT, deadline)) return Status(StatusCode::kUnavailable, "TLS handshake timed out");
        break;
      case transport::tls::Stream::Step::kFailed: {
        // A plain server refuses a ClientHello with a plain HelloReply:
        // what it says is better than OpenSSL's "wrong version number".
        const auto& got = tls->first_bytes();
        if (got.size() >= core::kHelloSize) {
          if (auto reply = core::decode_hello_reply(got.data()); reply.ok()) {
            const size_t len = std::min<size_t>(reply->message_len, got.size() - core::kHelloSize);
            return Status(StatusCode::kUnavailable,
                          fmt::format("the server does not speak TLS (it answered with a plain slotrpc "
                                      "HelloReply: '{}'); turn TLS off here or on there (Config.tls / "
                                      "SLOTRPC_TLS)",
                                      std::string(reinterpret_cast<const char*>(got.data()) + core::kHelloSize, len)));
          }
        }
        return tls_failure(*tls, "TLS handshake");
      }
    }
  }
}

Status write_all(int fd, std::span<const std::byte> data, Deadline deadline, transport::tls::Stream* tls) {
  if (tls == nullptr) return write_all(fd, data, deadline);
  size_t done = 0;
  while (done < data.size() || tls->pending_out()) {
    iovec iov{const_cast<std::byte*>(data.data() + done), data.size() - done};
    const ssize_t n = tls->write(&iov, done < data.size() ? 1 : 0);
    if (n < 0 && errno == EPROTO) return tls_failure(*tls, "handshake write");
    if (n < 0 && errno != EAGAIN)
      return Status(StatusCode::kUnavailable, fmt::format("handshake write: {}", std::strerror(errno)));
    if (n > 0) done += static_cast<size_t>(n);
    if ((n < 0 || tls->pending_out()) && !wait_fd(fd, POLLOUT, deadline))
      return Status(StatusCode::kUnavailable, "handshake write timed out");
  }
  return {};
}

Status read_exact(int fd, std::span<std::byte> data, Deadline deadline, transport::tls::Stream* tls) {
  if (tls == nullptr) return read_exact(fd, data, deadline);
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = tls->read(data.data() + done, data.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return Status(StatusCode::kUnavailable, "peer closed the connection during the handshake");
    if (errno == EPROTO) return tls_failure(*tls, "TLS");
    if (errno != EAGAIN)
      return Status(StatusCode::kUnavailable, fmt::format("handshake read: {}", std::strerror(errno)));
    if (!wait_fd(fd, POLLIN, deadline)) return Status(StatusCode::kUnavailable, "handshake read timed out");
  }
  return {};
}

std::string peer_name(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  return endpoint_name(ss);
}

std::string local_name(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  return endpoint_name(ss);
}

// ------------------------------------------------------ Unix domain sockets

namespace {

// sun_path for `name` ("@x" = abstract), or an error naming it.
Result<std::pair<sockaddr_un, socklen_t>> unix_sockaddr(const std::string& name) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  const bool abstract = !name.empty() && name.front() == '@';
  if (name.empty() || name.size() >= sizeof a.sun_path) {
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("invalid Unix socket name '{}': 1 to {} bytes", name, sizeof a.sun_path - 1));
  }
  std::memcpy(a.sun_path, name.data(), name.size());
  if (abstract) a.sun_path[0] = '\0';
  // An abstract name's length is part of it: exactly its bytes, no NUL.
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size() + (abstract ? 0 : 1));
  return std::pair{a, len};
}

}  // namespace

bool is_unix_address(std::string_view address) { return address.starts_with(kUnixPrefix); }

Result<std::string> parse_unix_address(std::string_view address) {
  std::string_view name = address.substr(kUnixPrefix.size());
  if (name.empty() || (name.front() != '/' && name.front() != '@') || name.size() >= sizeof(sockaddr_un::sun_path) ||
      name.find('\0') != std::string_view::npos) {
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("invalid address '{}': expected unix:/absolute/path or unix:@abstract-name "
                              "(at most {} bytes)", address, sizeof(sockaddr_un::sun_path) - 1));
  }
  return std::string(name);
}

std::string default_unix_name(uint16_t port) { return fmt::format("@slotrpc-{}", port); }

Result<int> connect_unix(const std::string& name, Deadline deadline, int* err) {
  if (err != nullptr) *err = 0;
  auto addr = unix_sockaddr(name);
  if (!addr.ok()) return addr.status();
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return Status(StatusCode::kUnavailable, fmt::format("socket(AF_UNIX): {}", std::strerror(errno)));
  int r = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr->first), addr->second);
  if (r != 0 && errno == EAGAIN) {
    // The listener's backlog is full: wait like a TCP connect would.
    if (wait_fd(fd, POLLOUT, deadline)) {
      int e = 0;
      socklen_t len = sizeof e;
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len);
      r = e == 0 ? 0 : -1;
      errno = e;
    } else {
      errno = ETIMEDOUT;
    }
  }
  if (r != 0) {
    const int e = errno;
    ::close(fd);
    if (err != nullptr) *err = e;
    return Status(StatusCode::kUnavailable, fmt::format("cannot connect to unix:{}: {}", name, std::strerror(e)));
  }
  const int flags = ::fcntl(fd, F_GETFL);
  ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

Result<int> listen_unix(const std::string& name) {
  auto addr = unix_sockaddr(name);
  if (!addr.ok()) return addr.status();
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status(StatusCode::kUnavailable, fmt::format("socket(AF_UNIX): {}", std::strerror(errno)));
  if (name.front() == '/') {
    // A socket file left by a server that died is replaced; anything else
    // at the path is not ours to remove.
    struct stat st {};
    if (::lstat(name.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) ::unlink(name.c_str());
  }
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr->first), addr->second) != 0 || ::listen(fd, SOMAXCONN) != 0) {
    const int e = errno;
    ::close(fd);
    return Status(StatusCode::kUnavailable, fmt::format("cannot listen on unix:{}: {}", name, std::strerror(e)));
  }
  return fd;
}

std::string peer_credentials(int fd) {
  ucred c{};
  socklen_t len = sizeof c;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c, &len) != 0) return "pid ? uid ?";
  return fmt::format("pid {} uid {}", c.pid, c.uid);
}

Status check_shm_peer(int fd, const base::UidPolicy& policy, std::string_view who,
                      std::string_view whose) {
  ucred c{};
  socklen_t len = sizeof c;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c, &len) != 0)
    return Status(StatusCode::kPermissionDenied,
                  fmt::format("{}: its credentials cannot be read (SO_PEERCRED: {}), so {} {} "
                              "cannot be checked", who, std::strerror(errno), whose,
                              base::describe(policy)));
  if (base::allows(policy, c.uid)) return {};
  return Status(StatusCode::kPermissionDenied,
                fmt::format("{} is pid {} uid {}, which {} {} does not allow (list uid {} there to "
                            "trust it)", who, c.pid, c.uid, whose, base::describe(policy), c.uid));
}

bool is_local_host(const std::string& host) {
  namespace asio = boost::asio;
  asio::io_context io;
  boost::system::error_code ec;
  asio::ip::tcp::resolver resolver(io);
  auto results = resolver.resolve(host, "0", ec);
  if (ec) return false;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) list = nullptr;
  bool local = false;
  for (const auto& entry : results) {
    const asio::ip::address a = entry.endpoint().address();
    if (a.is_loopback()) {
      local = true;
      break;
    }
    for (ifaddrs* i = list; i != nullptr && !local; i = i->ifa_next) {
      if (i->ifa_addr == nullptr) continue;
      if (i->ifa_addr->sa_family == AF_INET && a.is_v4()) {
        local = reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr == htonl(a.to_v4().to_uint());
      } else if (i->ifa_addr->sa_family == AF_INET6 && a.is_v6()) {
        const auto b = a.to_v6().to_bytes();
        local = std::memcmp(&reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr, b.data(), 16) == 0;
      }
    }
    if (local) break;
  }
  if (list != nullptr) ::freeifaddrs(list);
  return local;
}

}  // namespace slotrpc::rpc
