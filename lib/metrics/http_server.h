// The metrics port: GET /metrics answers with the Prometheus text of a
// Server (SLOTRPC_METRICS_ADDRESS).
//
// Boost.Beast rather than prometheus-cpp: the library already depends on
// Boost (Asio, Context) and Beast is header-only within it, so this adds no
// package; prometheus-cpp would bring its own metric types and registry
// (slotrpc keeps its counters per event loop without atomics and renders the
// text itself, slotrpc::to_prometheus) and an embedded civetweb server, of
// which we would use only the socket.
//
// One thread of its own with an io_context: a scrape renders the snapshot
// there (Server::metrics() asks each loop on its thread and waits), so a
// slow scraper never delays an event loop or the accept thread.  One request
// per connection, bounded in size and time (5 s, idle time included); other
// paths get 404, other methods 405.
//
// The port must not cost the RPC port its descriptors, nor spin: at most
// 16 connections are open at once (RLIMIT_NOFILE / 16 if that is
// lower, at least 2), and one more closes the oldest, so a scraper still
// gets in past a crowd of idle sockets.  At the descriptor limit
// (EMFILE/ENFILE) it takes the waiting connection off the backlog with a
// reserve descriptor and closes it, or pauses accepting for 100 ms, as the
// RPC acceptor does (lib/rpc/acceptor.h).
//
// An address that is a port alone (":9464" or "9464") binds 127.0.0.1:
// serving the counters beyond the host takes an explicit host.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "slotrpc/result.h"
#include "slotrpc/status.h"

namespace slotrpc::metrics {

class HttpServer {
 public:
  using Render = std::function<std::string()>;
  // Who may read the metrics: called once per connection with its socket
  // (on the port's thread); a non-OK status is answered with 403 and its
  // message.  Empty: everyone.
  using Authorize = std::function<Status(int fd)>;

  // Binds `address` (HOST:PORT; port 0 picks one) and starts the thread.
  // The error names the address and why (e.g. already in use).
  static Result<std::unique_ptr<HttpServer>> start(const std::string& address, Render render,
                                                   Authorize authorize = {});
  ~HttpServer();  // stops and joins
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  uint16_t port() const;

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace slotrpc::metrics
