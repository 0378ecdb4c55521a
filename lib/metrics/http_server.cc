#include "metrics/http_server.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>

#include <chrono>
#include <thread>

#include "base/logging.h"
#include "base/address.h"

namespace slotrpc::metrics {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

struct HttpServer::Impl {
  asio::io_context io;
  tcp::acceptor acceptor{io};
  Render render;
  uint16_t port = 0;
  std::thread thread;

  void accept();
};

namespace {

// One connection: read one request, answer, close.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, const HttpServer::Render& render)
      : stream_(std::move(socket)), render_(render) {}

  void start() {
    stream_.expires_after(std::chrono::seconds(5));
    parser_.body_limit(4096);
    parser_.header_limit(8192);
    http::async_read(stream_, buffer_, parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

 private:
  void on_read(beast::error_code ec) {
    if (ec) return;  // timeout, oversized or malformed request, peer gone: just close
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
    } else {
      res_.result(http::status::ok);
      res_.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
      try {
        res_.body() = render_();
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
      beast::error_code ignored;
      self->stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    });
  }

  beast::tcp_stream stream_;
  const HttpServer::Render& render_;
  beast::flat_buffer buffer_;
  http::request_parser<http::string_body> parser_;
  http::response<http::string_body> res_;
};

}  // namespace

void HttpServer::Impl::accept() {
  acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;  // stopping
    if (!ec) std::make_shared<Connection>(std::move(socket), render)->start();
    accept();
  });
}

Result<std::unique_ptr<HttpServer>> HttpServer::start(const std::string& address, Render render) {
  auto fail = [&](const std::string& why) {
    return Status(StatusCode::kUnavailable,
                  fmt::format("cannot serve metrics on {} (SLOTRPC_METRICS_ADDRESS / "
                              "Config.metrics_address): {}",
                              address, why));
  };
  auto endpoint = base::parse_address(address);
  if (!endpoint.ok()) return fail(endpoint.status().message());
  auto impl = std::make_unique<Impl>();
  impl->render = std::move(render);
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
  impl->accept();
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] {
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
  });
  impl_->io.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

uint16_t HttpServer::port() const { return impl_->port; }

}  // namespace slotrpc::metrics
