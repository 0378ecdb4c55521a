// The server's accept path: one thread running a Boost.Asio io_context that
// accepts connections and reads their Hello (and its extension)
// asynchronously, many at once, each under its own deadline
// (connect_timeout_ms).  Accepting never waits on a peer: a connection that
// sends nothing costs one socket and one timer until its deadline, not the
// thread.
//
// Caps (docs/design.md, "Limits and abuse"): at most
// max_pending_handshakes connections whose Hello is incomplete, and at most
// max_pending_handshakes_per_host of them from one source address.  A new
// connection beyond a cap closes the OLDEST pending one (of that address,
// for the per-address cap), so that a client connecting from the same
// address as a crowd of junk sockets still gets in.  A Hello with a bad
// magic or version is refused as soon as those bytes are there.
//
// At the file-descriptor limit (EMFILE/ENFILE) the acceptor does not spin:
// it frees a reserve descriptor, accepts the waiting connection, answers it
// RESOURCE_EXHAUSTED and closes it, then takes the reserve again; if it
// cannot, it pauses accepting for 100 ms.
//
// TLS (set_tls): on TCP, the acceptor peeks at the first byte: a TLS
// ClientHello starts a non-blocking handshake, under the same deadline and
// caps (the Hello then travels inside TLS); a plain slotrpc Hello is
// refused with a plain HelloReply that says the server wants TLS; anything
// else is junk and closed.  A plain server refuses a ClientHello with a
// HelloReply that says "TLS ClientHello on a plain port".
//
// No exception escapes a handler: each is caught, logged, and costs only
// the connection it concerns.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/handshake.h"
#include "slotrpc/peer.h"
#include "slotrpc/config.h"
#include "slotrpc/status.h"
#include "transport/tls/tls_stream.h"

namespace slotrpc::rpc {

// A complete, well-formed Hello on an accepted connection.
struct PendingSession {
  int fd = -1;  // blocking mode unspecified; the receiver owns it
  core::Hello hello;
  std::vector<std::byte> extension;
  std::string peer;  // "127.0.0.1:40000", or "unix:@slotrpc-5000 (pid 12 uid 1000)"
  // Arrived on the server's Unix domain socket: an shm session, whose
  // client offer is readable on `fd` already (the acceptor waited for it).
  bool local = false;
  // Who the client is: what the kernel says about it and, on TLS, its
  // certificate's subject and SANs (info.tls set; both empty when it sent
  // none).  The server fills in info.transport once it knows it.
  PeerInfo info;
  // TLS (Config::tls): the connection's stream, its handshake done; the
  // Hello was read through it, the HelloReply goes back through it
  // (send_hello_reply below) and a TCP session's link keeps using it.
  // Null without TLS.
  std::shared_ptr<transport::tls::Stream> tls_stream;
};

// Writes a HelloReply (status, message, extension) with one non-blocking
// send.  It is under 1 KiB plus the extension and goes to a socket that has
// sent nothing back yet, so it fits the send buffer; a short write is a
// failure (false), never a wait.
bool send_hello_reply(int fd, uint16_t status, const core::Hello& hello, const std::string& message,
                      core::WireTransport transport = core::WireTransport::kTcp,
                      std::span<const std::byte> extension = {},
                      uint16_t features = core::kKnownFeatures);

// The same for a handshake the acceptor handed over: through its TLS
// stream when it has one.
bool send_hello_reply(const PendingSession& p, uint16_t status, const std::string& message,
                      core::WireTransport transport = core::WireTransport::kTcp,
                      std::span<const std::byte> extension = {},
                      uint16_t features = core::kKnownFeatures);

class Acceptor {
 public:
  // Accept thread.  Owns the session's fd from here on.
  using OnHello = std::function<void(PendingSession)>;

  // Takes `listen_fd` (a bound, listening TCP socket, or -1) and
  // `unix_fd` (a listening Unix domain socket for shm sessions, or -1).
  Acceptor(const Config& config, int listen_fd, OnHello on_hello, int unix_fd = -1,
           std::string unix_name = {});
  ~Acceptor();
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;

  // Runs the io_context on the calling thread until stop().
  void run();
  // Any thread.  Makes run() return; pending handshakes are closed.
  void stop();

  // Accept thread or after run() returned.  For tests and monitoring.
  size_t pending() const;

  // Any thread.  TCP connections accepted from now on run a TLS handshake
  // with `context` before their Hello (null: plain).  Handshakes under way
  // keep the context they started with.
  void set_tls(std::shared_ptr<transport::tls::Context> context);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace slotrpc::rpc
