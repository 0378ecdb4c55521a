#include "metrics/http_server.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <list>
#include <thread>

#include "base/logging.h"
#include "base/address.h"

namespace slotrpc::metrics {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

// Caps of the metrics port (the header says why).
constexpr size_t kMaxConnections = 16;
constexpr auto kConnectionTimeout = std::chrono::seconds(5);
constexpr auto kFdPause = std::chrono::milliseconds(100);
constexpr std::string_view kLoopback = "127.0.0.1";

}  // namespace

namespace http_detail {
class Connection;
}

struct HttpServer::Impl {
  asio::io_context io;
  tcp::acceptor acceptor{io};
  asio::steady_timer fd_timer{io};  // accepting paused at the descriptor limit
  Render render;
  Authorize authorize;
  uint16_t port = 0;
  std::thread thread;
  size_t max_connections = kMaxConnections;
  // Open connections, oldest first: at max_connections a new one closes
  // the oldest (a scraper still gets in past a crowd of idle sockets).
  std::list<std::shared_ptr<http_detail::Connection>> connections;
  int reserve_fd = -1;  // given up at EMFILE to take one waiting connection off the backlog
  bool fd_episode = false;
  uint64_t fd_dropped = 0;

  ~Impl() {
    if (reserve_fd >= 0) ::close(reserve_fd);
  }
  void accept();
  void on_fd_limit(const beast::error_code& ec);
  void admit(tcp::socket socket);
};

namespace http_detail {

// One connection: read one request, answer, close.  Listed in the
// server's `connections` while open.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, HttpServer::Impl& owner) : stream_(std::move(socket)), owner_(owner) {}

  void start(std::list<std::shared_ptr<Connection>>::iterator pos) {
    pos_ = pos;
    if (owner_.authorize) {
      allowed_ = owner_.authorize(stream_.socket().native_handle());
    }
    // The whole exchange, idle time included: a socket that sends nothing
    // is closed after this, and holds one of max_connections till then.
    stream_.expires_after(kConnectionTimeout);
    parser_.body_limit(4096);
    parser_.header_limit(8192);
    http::async_read(stream_, buffer_, parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  // Closes the socket (its pending operation ends with an error) and
  // leaves the list.  Idempotent.
  void close() {
    if (closed_) return;
    closed_ = true;
    owner_.connections.erase(pos_);
    beast::error_code ignored;
    stream_.socket().close(ignored);
  }

 private:
  void on_read(beast::error_code ec) {
    // Timeout, oversized or malformed request, peer gone, or evicted: just close.
    if (ec || closed_) return close();
    const auto& req = parser_.get();
    res_.version(req.version());
    res_.keep_alive(false);
    res_.set(http::field::server, "slotrpc");
    const std::string_view target(req.target().data(), req.target().size());
    const std::string_view path = target.substr(0, target.find('?'));
    if (req.method() != http::verb::get && req.method() != http::verb::head) {
      res_.result(http::status::method_not_allowed);
      res_.set(http::field::allow, "GET, HEAD");
      res_.set(http::field::content_type, "text/plain; charset=utf-8");
      res_.body() = "only GET /metrics\n";
    } else if (path != "/metrics") {
      res_.result(http::status::not_found);
      res_.set(http::field::content_type, "text/plain; charset=utf-8");
      res_.body() = "not found: this port serves /metrics only\n";
    } else if (!allowed_.ok()) {
      res_.result(http::status::forbidden);
      res_.set(http::field::content_type, "text/plain; charset=utf-8");
      res_.body() = allowed_.message() + "\n";
    } else {
      res_.result(http::status::ok);
      res_.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
      try {
        res_.body() = owner_.render();
      } catch (const std::exception& e) {
        res_.result(http::status::internal_server_error);
        res_.body() = fmt::format("metrics unavailable: {}\n", e.what());
      }
      if (req.method() == http::verb::head) {
        res_.prepare_payload();
        res_.body().clear();
      }
    }
    if (req.method() != http::verb::head) res_.prepare_payload();
    http::async_write(stream_, res_, [self = shared_from_this()](beast::error_code, size_t) {
      if (self->closed_) return;
      beast::error_code ignored;
      self->stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
      self->close();
    });
  }

  beast::tcp_stream stream_;
  HttpServer::Impl& owner_;
  std::list<std::shared_ptr<Connection>>::iterator pos_;
  bool closed_ = false;
  Status allowed_;  // owner_.authorize's answer for this connection
  beast::flat_buffer buffer_;
  http::request_parser<http::string_body> parser_;
  http::response<http::string_body> res_;
};

}  // namespace http_detail

namespace {

// The descriptor limit, for the cap and for log lines.
rlim_t nofile_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return RLIM_INFINITY;
  return rl.rlim_cur;
}

}  // namespace

void HttpServer::Impl::accept() {
  acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;  // stopping
    if (ec == asio::error::no_descriptors || ec.value() == ENFILE || ec.value() == ENOBUFS ||
        ec.value() == ENOMEM) {
      on_fd_limit(ec);
      return;
    }
    if (!ec) {
      if (fd_episode) {
        base::log().info("slotrpc: metrics port: file descriptors are available again; {} "
                         "connection(s) were closed unanswered while there were none",
                         fd_dropped);
        fd_episode = false;
        fd_dropped = 0;
      }
      admit(std::move(socket));
    }
    accept();
  });
}

void HttpServer::Impl::admit(tcp::socket socket) {
  if (connections.size() >= max_connections) connections.front()->close();
  auto c = std::make_shared<http_detail::Connection>(std::move(socket), *this);
  c->start(connections.insert(connections.end(), c));
}

// EMFILE/ENFILE: the connection stays in the backlog and accepting again
// at once fails again at once (this loop used to spin a core here).  The
// reserve descriptor takes it off the backlog, closed unanswered (a scrape
// is retried by its scraper); without a reserve, accepting pauses.  The
// RPC acceptor (lib/rpc/acceptor.cc) does the same for its port.
void HttpServer::Impl::on_fd_limit(const beast::error_code& ec) {
  if (!fd_episode) {
    fd_episode = true;
    base::log().warn("slotrpc: metrics port: out of file descriptors (accept: {}; RLIMIT_NOFILE = "
                     "{}): scrapes are closed unanswered until some are freed",
                     ec.message(), nofile_limit());
  }
  bool took_one = false;
  if (reserve_fd >= 0) {
    ::close(reserve_fd);
    reserve_fd = -1;
    const int fd = ::accept4(acceptor.native_handle(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      took_one = true;
      ++fd_dropped;
      ::close(fd);
    }
    reserve_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  }
  if (took_one && reserve_fd >= 0) {
    accept();
    return;
  }
  fd_timer.expires_after(kFdPause);
  fd_timer.async_wait([this](const beast::error_code& e) {
    if (e || !acceptor.is_open()) return;
    if (reserve_fd < 0) reserve_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    accept();
  });
}

Result<std::unique_ptr<HttpServer>> HttpServer::start(const std::string& address, Render render,
                                                      Authorize authorize) {
  auto fail = [&](const std::string& why) {
    return Status(StatusCode::kUnavailable,
                  fmt::format("cannot serve metrics on {} (SLOTRPC_METRICS_ADDRESS / "
                              "Config.metrics_address): {}",
                              address, why));
  };
  // A port alone (":9464" or "9464") is served on loopback: exposing the
  // counters to the network is a choice the address has to spell out.
  std::string full = address;
  if (!full.empty() && full.find(':') == std::string::npos) full = ":" + full;
  if (!full.empty() && full.front() == ':') full = std::string(kLoopback) + full;
  auto endpoint = base::parse_address(full);
  if (!endpoint.ok()) return fail(endpoint.status().message());
  auto impl = std::make_unique<Impl>();
  impl->render = std::move(render);
  impl->authorize = std::move(authorize);
  beast::error_code ec;
  tcp::resolver resolver(impl->io);
  auto results = resolver.resolve(endpoint->host, std::to_string(endpoint->port),
                                  tcp::resolver::passive, ec);
  if (ec || results.empty()) return fail(ec ? ec.message() : "the host resolves to nothing");
  const tcp::endpoint ep = results.begin()->endpoint();
  impl->acceptor.open(ep.protocol(), ec);
  if (!ec) impl->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(ep, ec);
  if (!ec) impl->acceptor.listen(64, ec);
  if (ec) {
    return fail(ec == asio::error::address_in_use
                    ? ec.message() + " (another Server of this process, or another process, "
                                     "serves metrics there: give each Server its own address)"
                    : ec.message());
  }
  impl->port = impl->acceptor.local_endpoint().port();
  impl->reserve_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  // Head-room for the RPC port: the metrics port holds at most 1/16
  // of the descriptor limit (and at most kMaxConnections, at least 2).
  const rlim_t nofile = nofile_limit();
  if (nofile != RLIM_INFINITY)
    impl->max_connections = std::clamp<size_t>(static_cast<size_t>(nofile / 16), 2, kMaxConnections);
  impl->accept();
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] {
    pthread_setname_np(pthread_self(), "slotrpc-metrics");
    for (;;) {
      try {
        raw->io.run();
        return;
      } catch (const std::exception& e) {
        base::log().error("slotrpc: metrics port: {}", e.what());
      }
    }
  });
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() {
  asio::post(impl_->io, [impl = impl_.get()] {
    beast::error_code ignored;
    impl->acceptor.close(ignored);
    impl->fd_timer.cancel();
  });
  impl_->io.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

uint16_t HttpServer::port() const { return impl_->port; }

}  // namespace slotrpc::metrics
