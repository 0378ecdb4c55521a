#include "transport/tls/tls_context.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <utility>

#include <fmt/format.h>

namespace slotrpc::transport::tls {

std::string take_errors(std::string_view fallback) {
  std::string out;
  unsigned long e;
  while ((e = ERR_get_error()) != 0) {
    const char* reason = ERR_reason_error_string(e);
    std::string text = reason != nullptr ? reason : fmt::format("error 0x{:x}", e);
    if (out.find(text) != std::string::npos) continue;  // the same reason from several layers
    if (!out.empty()) out += "; ";
    out += text;
  }
  return out.empty() ? std::string(fallback) : out;
}

namespace {

struct CtxGuard {
  SSL_CTX* ctx;
  ~CtxGuard() {
    if (ctx != nullptr) SSL_CTX_free(ctx);
  }
};

Status file_error(std::string_view setting, const std::string& path, std::string_view what) {
  return Status(StatusCode::kInvalidArgument,
                fmt::format("cannot load {} '{}': {}: {}", setting, path, what, take_errors()));
}

Status missing_tls_file(std::string_view setting, std::string_view why) {
  return Status(StatusCode::kInvalidArgument,
                fmt::format("invalid setting {}='': allowed a PEM file path ({})", setting, why));
}

// What every context shares: TLS 1.2 or later; no session tickets or
// cache (a ticket would arrive after the handshake, on a connection whose
// bytes after the HelloReply belong to the session: a verbs session's
// control connection must carry none); read-ahead, so that a burst of
// small records costs one recv.  (A read buffer of 128 KiB instead of
// OpenSSL's one record, 16 recvs per MiB instead of 64, showed no saving
// in CPU per 1 MiB echo, so OpenSSL's default stays.)
//
// TLS 1.3 suites, AES-128-GCM first and the server's order deciding: on
// AES-NI it is the cheapest of the three (openssl speed on this project's
// 2-vCPU EPYC, 16 KiB blocks: AES-128-GCM 5.3 GB/s, ChaCha20-Poly1305 5.2,
// AES-256-GCM 5.1), and OpenSSL's default order would pick AES-256-GCM.
// A client that lists ChaCha20 first (one without AES instructions)
// still gets it (SSL_OP_PRIORITIZE_CHACHA).
constexpr const char* kSuites = "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256";

void common_setup(SSL_CTX* ctx) {
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET | SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE |
                               SSL_OP_PRIORITIZE_CHACHA);
  SSL_CTX_set_num_tickets(ctx, 0);
  SSL_CTX_set_ciphersuites(ctx, kSuites);
  SSL_CTX_set_read_ahead(ctx, 1);
}

Status load_pair(SSL_CTX* ctx, const Config& c) {
  if (SSL_CTX_use_certificate_chain_file(ctx, c.tls_cert.c_str()) != 1)
    return file_error("Config.tls_cert (SLOTRPC_TLS_CERT)", c.tls_cert, "certificate chain");
  if (SSL_CTX_use_PrivateKey_file(ctx, c.tls_key.c_str(), SSL_FILETYPE_PEM) != 1) {
    if (ERR_GET_REASON(ERR_peek_last_error()) != X509_R_KEY_VALUES_MISMATCH)
      return file_error("Config.tls_key (SLOTRPC_TLS_KEY)", c.tls_key, "private key");
    ERR_clear_error();  // a key, but another certificate's: said below
  }
  if (SSL_CTX_check_private_key(ctx) != 1) {
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("Config.tls_key (SLOTRPC_TLS_KEY) '{}' does not belong to the certificate "
                              "in Config.tls_cert (SLOTRPC_TLS_CERT) '{}': {}",
                              c.tls_key, c.tls_cert, take_errors()));
  }
  return {};
}

Status load_ca(SSL_CTX* ctx, const Config& c) {
  if (SSL_CTX_load_verify_locations(ctx, c.tls_ca.c_str(), nullptr) != 1)
    return file_error("Config.tls_ca (SLOTRPC_TLS_CA)", c.tls_ca, "CA bundle");
  return {};
}

}  // namespace

Context::~Context() { SSL_CTX_free(ctx_); }

Result<std::shared_ptr<Context>> Context::server(const Config& c) {
  ERR_clear_error();
  if (c.tls_cert.empty()) return missing_tls_file("Config.tls_cert (SLOTRPC_TLS_CERT)", "a TLS server needs its certificate chain");
  if (c.tls_key.empty()) return missing_tls_file("Config.tls_key (SLOTRPC_TLS_KEY)", "a TLS server needs its private key");
  if (c.tls_client_auth != TlsClientAuth::kNone && c.tls_ca.empty())
    return missing_tls_file("Config.tls_ca (SLOTRPC_TLS_CA)",
                   fmt::format("tls_client_auth={} verifies client certificates against it",
                               to_string(c.tls_client_auth)));
  CtxGuard g{SSL_CTX_new(TLS_server_method())};
  if (g.ctx == nullptr) return Status(StatusCode::kInternal, "SSL_CTX_new: " + take_errors());
  common_setup(g.ctx);
  if (Status st = load_pair(g.ctx, c); !st.ok()) return st;
  if (!c.tls_ca.empty()) {
    if (Status st = load_ca(g.ctx, c); !st.ok()) return st;
    // The CA names a client is told to pick its certificate by.
    if (STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(c.tls_ca.c_str()))
      SSL_CTX_set_client_CA_list(g.ctx, names);
    ERR_clear_error();
  }
  int mode = SSL_VERIFY_NONE;
  if (c.tls_client_auth == TlsClientAuth::kOptional) mode = SSL_VERIFY_PEER;
  if (c.tls_client_auth == TlsClientAuth::kRequired) mode = SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT;
  SSL_CTX_set_verify(g.ctx, mode, nullptr);
  return std::shared_ptr<Context>(new Context(std::exchange(g.ctx, nullptr), true));
}

Result<std::shared_ptr<Context>> Context::client(const Config& c) {
  ERR_clear_error();
  if (c.tls_cert.empty() != c.tls_key.empty()) {
    return c.tls_cert.empty()
               ? missing_tls_file("Config.tls_cert (SLOTRPC_TLS_CERT)", "tls_key is set: a client certificate needs both")
               : missing_tls_file("Config.tls_key (SLOTRPC_TLS_KEY)", "tls_cert is set: a client certificate needs both");
  }
  CtxGuard g{SSL_CTX_new(TLS_client_method())};
  if (g.ctx == nullptr) return Status(StatusCode::kInternal, "SSL_CTX_new: " + take_errors());
  common_setup(g.ctx);
  if (!c.tls_cert.empty()) {
    if (Status st = load_pair(g.ctx, c); !st.ok()) return st;
  }
  if (!c.tls_ca.empty()) {
    if (Status st = load_ca(g.ctx, c); !st.ok()) return st;
  } else if (SSL_CTX_set_default_verify_paths(g.ctx) != 1) {
    return Status(StatusCode::kInvalidArgument,
                  "Config.tls_ca (SLOTRPC_TLS_CA) is empty and the system's trusted CAs cannot be "
                  "loaded: " + take_errors());
  }
  SSL_CTX_set_verify(g.ctx, SSL_VERIFY_PEER, nullptr);
  return std::shared_ptr<Context>(new Context(std::exchange(g.ctx, nullptr), false));
}

}  // namespace slotrpc::transport::tls
