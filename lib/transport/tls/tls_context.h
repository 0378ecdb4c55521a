// TLS contexts (OpenSSL 3): what a Server or Channel's TLS settings
// (Config::tls, tls_cert, tls_key, tls_ca, tls_client_auth) load, once per
// Server start or reload and once per Channel connect.  A context holds the
// certificate chain, the private key and the trusted CAs; every connection
// gets its own SSL object from it (tls_stream.h), which keeps the context
// alive, so a reload never disturbs a connection that is open.
//
// Below transport/tcp and rpc/, above base/ only: the TCP link reads and
// writes through a Stream, the handshake code of rpc/ drives one.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "slotrpc/config.h"
#include "slotrpc/result.h"

typedef struct ssl_ctx_st SSL_CTX;

namespace slotrpc::transport::tls {

class Context {
 public:
  // Server: the certificate chain and key are required; tls_ca is the
  // bundle client certificates are verified against (required unless
  // tls_client_auth is none).  An unreadable or bad file is an error naming
  // the setting, the path and OpenSSL's reason.
  static Result<std::shared_ptr<Context>> server(const Config& config);
  // Client: the server's certificate is always verified, against tls_ca
  // (empty: the system's trusted CAs); tls_cert/tls_key, if set, are the
  // client certificate sent to a server that asks for one.
  static Result<std::shared_ptr<Context>> client(const Config& config);

  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  SSL_CTX* get() const { return ctx_; }
  bool server_side() const { return server_; }

 private:
  Context(SSL_CTX* ctx, bool server) : ctx_(ctx), server_(server) {}
  SSL_CTX* ctx_;
  bool server_;
};

// OpenSSL's error queue of this thread as one line ("reason; reason"),
// emptied; `fallback` when it is empty.
std::string take_errors(std::string_view fallback = "unknown error");

}  // namespace slotrpc::transport::tls
