#include "rpc/discovery/http_client.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/beast/http.hpp>
#include <fmt/format.h>

#include <cerrno>
#include <cstring>

namespace slotrpc::rpc::discovery {

namespace http = boost::beast::http;
using Clock = std::chrono::steady_clock;

Interrupt::Interrupt() : fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

Interrupt::~Interrupt() {
  if (fd_ >= 0) ::close(fd_);
}

void Interrupt::fire() {
  fired_.store(true);
  const uint64_t one = 1;
  (void)!::write(fd_, &one, sizeof one);
}

bool Interrupt::sleep_for(std::chrono::milliseconds d) const {
  pollfd p{fd_, POLLIN, 0};
  (void)::poll(&p, 1, static_cast<int>(d.count()));
  return !fired();
}

namespace {

// An fd closed on every way out.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Waits for `events` on `fd` until `deadline` (none: forever) or the
// interrupt.  OK when ready.
Status wait_for(int fd, short events, std::optional<Clock::time_point> deadline, const Interrupt& interrupt,
                const char* what) {
  for (;;) {
    if (interrupt.fired()) return Status(StatusCode::kCancelled, "stopped");
    int ms = -1;
    if (deadline) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - Clock::now());
      if (left.count() <= 0) return Status(StatusCode::kUnavailable, fmt::format("timed out {}", what));
      ms = static_cast<int>(left.count()) + 1;
    }
    pollfd p[2] = {{fd, events, 0}, {interrupt.fd(), POLLIN, 0}};
    const int n = ::poll(p, 2, ms);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status(StatusCode::kUnavailable, fmt::format("poll: {}", std::strerror(errno)));
    if (p[1].revents != 0) return Status(StatusCode::kCancelled, "stopped");
    if (p[0].revents != 0) return {};
  }
}

Result<int> connect_to(const base::Endpoint& ep, Clock::time_point deadline, const Interrupt& interrupt) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(ep.port);
  if (int rc = ::getaddrinfo(ep.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return Status(StatusCode::kUnavailable, fmt::format("cannot resolve {}: {}", ep.host, gai_strerror(rc)));
  }
  std::string last = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    Fd s{::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol)};
    if (s.fd < 0) continue;
    if (::connect(s.fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
      last = std::strerror(errno);
      continue;
    }
    Status st = wait_for(s.fd, POLLOUT, deadline, interrupt, "connecting");
    if (st.code() == StatusCode::kCancelled) {
      ::freeaddrinfo(found);
      return st;
    }
    int err = 0;
    socklen_t len = sizeof err;
    if (st.ok()) ::getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (st.ok() && err == 0) {
      ::freeaddrinfo(found);
      const int fd = s.fd;
      s.fd = -1;
      return fd;
    }
    last = st.ok() ? std::strerror(err) : st.message();
  }
  ::freeaddrinfo(found);
  return Status(StatusCode::kUnavailable, fmt::format("cannot connect to {}:{}: {}", ep.host, ep.port, last));
}

Status send_all(int fd, std::string_view data, Clock::time_point deadline, const Interrupt& interrupt) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EINTR)
      return Status(StatusCode::kUnavailable, fmt::format("send: {}", std::strerror(errno)));
    if (Status st = wait_for(fd, POLLOUT, deadline, interrupt, "sending"); !st.ok()) return st;
  }
  return {};
}

// One request: connects, sends, and feeds the answer to the parser; after
// the header, `on_body` sees the body parsed so far (it may consume it) and
// returns false to stop.  `stream`: no deadline after the header.
Status exchange(const base::Endpoint& ep, const std::string& path, const std::string& body,
                std::chrono::milliseconds timeout, bool stream, const Interrupt& interrupt,
                http::response_parser<http::string_body>& parser,
                const std::function<bool(std::string&)>& on_body) {
  const auto deadline = Clock::now() + timeout;
  auto fd = connect_to(ep, deadline, interrupt);
  if (!fd.ok()) return fd.status();
  Fd s{fd.value()};
  const std::string request = fmt::format(
      "POST {} HTTP/1.1\r\nHost: {}:{}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n"
      "Connection: close\r\n\r\n{}",
      path, ep.host, ep.port, body.size(), body);
  if (Status st = send_all(s.fd, request, deadline, interrupt); !st.ok()) return st;

  parser.eager(true);
  parser.body_limit(boost::none);
  std::string in;
  char buf[16384];
  for (;;) {
    const bool header = parser.is_header_done();
    std::optional<Clock::time_point> until;
    if (!stream || !header) until = deadline;
    if (Status st = wait_for(s.fd, POLLIN, until, interrupt, "waiting for etcd's answer"); !st.ok()) return st;
    const ssize_t n = ::recv(s.fd, buf, sizeof buf, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n < 0) return Status(StatusCode::kUnavailable, fmt::format("recv: {}", std::strerror(errno)));
    boost::beast::error_code ec;
    if (n == 0) {
      parser.put_eof(ec);
      if (ec) return Status(StatusCode::kUnavailable, "the server closed the connection mid-answer");
    } else {
      in.append(buf, static_cast<size_t>(n));
      while (!in.empty() && !parser.is_done()) {
        const size_t used = parser.put(boost::asio::buffer(in), ec);
        in.erase(0, used);
        if (ec == http::error::need_more) {
          ec = {};
          break;
        }
        if (ec) return Status(StatusCode::kUnavailable, fmt::format("bad HTTP answer: {}", ec.message()));
        if (used == 0) break;
      }
    }
    if (parser.is_header_done() && parser.get().result() == http::status::ok) {
      if (!on_body(parser.get().body())) return {};
    }
    if (parser.is_done()) break;
    if (n == 0) return Status(StatusCode::kUnavailable, "the server closed the connection mid-answer");
  }
  if (parser.get().result() != http::status::ok) {
    return Status(StatusCode::kUnavailable, fmt::format("{}:{}{} answered HTTP {}: {}", ep.host, ep.port, path,
                                                        parser.get().result_int(), parser.get().body()));
  }
  return stream ? Status(StatusCode::kUnavailable, "the server ended the stream") : Status();
}

}  // namespace

Result<std::string> http_post(const base::Endpoint& endpoint, const std::string& path, const std::string& body,
                              std::chrono::milliseconds timeout, const Interrupt& interrupt) {
  http::response_parser<http::string_body> parser;
  Status st = exchange(endpoint, path, body, timeout, false, interrupt, parser, [](std::string&) { return true; });
  if (!st.ok()) return st;
  return std::move(parser.get().body());
}

Status http_post_lines(const base::Endpoint& endpoint, const std::string& path, const std::string& body,
                       std::chrono::milliseconds timeout, const Interrupt& interrupt,
                       const std::function<bool(std::string_view)>& on_line) {
  http::response_parser<http::string_body> parser;
  return exchange(endpoint, path, body, timeout, true, interrupt, parser, [&](std::string& so_far) {
    // Beast's string body appends at its end: taking lines off the front
    // keeps a long watch's memory to one message.
    size_t start = 0;
    bool go_on = true;
    for (size_t nl; go_on && (nl = so_far.find('\n', start)) != std::string::npos; start = nl + 1) {
      std::string_view line(so_far.data() + start, nl - start);
      if (!line.empty()) go_on = on_line(line);
    }
    so_far.erase(0, start);
    return go_on;
  });
}

}  // namespace slotrpc::rpc::discovery
