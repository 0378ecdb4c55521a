#include "transport/tls/tls_stream.h"

#include <arpa/inet.h>
#include <sys/socket.h>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace slotrpc::transport::tls {

namespace {

// The largest TLS record's plaintext: small frames are gathered up to this
// so that a burst of them is one record, not one each.
constexpr size_t kRecord = 16 * 1024;
// Plaintext handed to one SSL_write straight from a large frame's memory.
constexpr size_t kDirectChunk = 64 * 1024;
// A plain HelloReply with its message fits (kHelloSize + kMaxHandshakeMessage).
constexpr size_t kFirstBytes = 32 + 1024;

BIO_METHOD* stream_bio_method();

// Alerts a peer sends when it refused this side's certificate (or sent
// none it would take), and this side's own verification failure: the
// handshake failed on authentication, not on the network.
bool is_auth_reason(int reason) {
  switch (reason) {
    case SSL_R_CERTIFICATE_VERIFY_FAILED:
    case SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE:
    case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
    case SSL_R_SSLV3_ALERT_UNSUPPORTED_CERTIFICATE:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_REVOKED:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
    case SSL_R_SSLV3_ALERT_HANDSHAKE_FAILURE:
    case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
    case SSL_R_TLSV1_ALERT_ACCESS_DENIED:
    case SSL_R_TLSV1_ALERT_DECRYPT_ERROR:
    case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
      return true;
    default:
      return false;
  }
}

std::string asn1_text(const ASN1_STRING* s) {
  return std::string(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)),
                     static_cast<size_t>(ASN1_STRING_length(s)));
}

}  // namespace

int Stream::bio_write(BIO* bio, const char* data, int len) {
  auto* s = static_cast<Stream*>(BIO_get_data(bio));
  BIO_clear_retry_flags(bio);
  if (len <= 0) return 0;
  const auto* p = reinterpret_cast<const std::byte*>(data);
  s->out_.insert(s->out_.end(), p, p + len);
  // The handshake and the HelloReply go out at once; a link's batch when
  // it uncorks.  What the socket does not take waits in out_.
  if (!s->corked_) s->flush_out();
  return len;
}

int Stream::bio_read(BIO* bio, char* data, int len) {
  auto* s = static_cast<Stream*>(BIO_get_data(bio));
  BIO_clear_retry_flags(bio);
  if (len <= 0) return 0;
  ssize_t n;
  do {
    n = ::recv(s->fd_, data, static_cast<size_t>(len), MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  s->rx_short_ = n < len;
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) BIO_set_retry_read(bio);
    return -1;
  }
  if (n > 0 && s->first_.size() < kFirstBytes) {
    const size_t take = std::min(kFirstBytes - s->first_.size(), static_cast<size_t>(n));
    const auto* p = reinterpret_cast<const std::byte*>(data);
    s->first_.insert(s->first_.end(), p, p + take);
  }
  return static_cast<int>(n);
}

namespace {

long bio_ctrl(BIO*, int cmd, long, void*) {
  // Flushing is the Stream's business (write() and the uncorked BIO); the
  // rest (kTLS, datagrams, push and pop) does not apply.
  return cmd == BIO_CTRL_FLUSH ? 1 : 0;
}

int bio_create(BIO* bio) {
  BIO_set_init(bio, 1);
  return 1;
}

BIO_METHOD* stream_bio_method() {
  static BIO_METHOD* const method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "slotrpc stream");
    BIO_meth_set_write(m, &Stream::bio_write);
    BIO_meth_set_read(m, &Stream::bio_read);
    BIO_meth_set_ctrl(m, &bio_ctrl);
    BIO_meth_set_create(m, &bio_create);
    return m;
  }();
  return method;
}

// An IPv4 or IPv6 address in text: the server's certificate must carry it
// as an IP SAN, not as a DNS name.
bool is_ip_literal(const std::string& name) {
  unsigned char buf[16];
  return ::inet_pton(AF_INET, name.c_str(), buf) == 1 || ::inet_pton(AF_INET6, name.c_str(), buf) == 1;
}

}  // namespace

Result<std::unique_ptr<Stream>> Stream::create(std::shared_ptr<Context> context, int fd,
                                              const std::string& server_name) {
  ERR_clear_error();
  std::unique_ptr<Stream> s(new Stream());
  s->context_ = std::move(context);
  s->fd_ = fd;
  s->ssl_ = SSL_new(s->context_->get());
  BIO* bio = s->ssl_ != nullptr ? BIO_new(stream_bio_method()) : nullptr;
  if (bio == nullptr) return Status(StatusCode::kInternal, "SSL_new: " + take_errors());
  BIO_set_data(bio, s.get());
  SSL_set_bio(s->ssl_, bio, bio);  // one BIO both ways; the SSL owns it
  if (s->context_->server_side()) {
    SSL_set_accept_state(s->ssl_);
  } else {
    SSL_set_connect_state(s->ssl_);
    if (!server_name.empty()) {
      int ok;
      if (is_ip_literal(server_name)) {
        ok = X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(s->ssl_), server_name.c_str());
      } else {
        SSL_set_hostflags(s->ssl_, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
        ok = SSL_set1_host(s->ssl_, server_name.c_str()) == 1 &&
             SSL_set_tlsext_host_name(s->ssl_, server_name.c_str()) == 1;
      }
      if (ok != 1) {
        return Status(StatusCode::kInvalidArgument,
                      fmt::format("invalid setting Config.tls_server_name (SLOTRPC_TLS_SERVER_NAME)='{}': "
                                  "allowed a DNS name or an IP address ({})",
                                  server_name, take_errors()));
      }
    }
  }
  s->out_.reserve(kOutBatch + 2 * kDirectChunk);
  s->gather_.reserve(kRecord);
  return s;
}

Stream::~Stream() {
  if (ssl_ != nullptr) SSL_free(ssl_);  // never closes fd_: the BIO does not own it
}

bool Stream::flush_out() {
  while (out_head_ < out_.size()) {
    const ssize_t n = ::send(fd_, out_.data() + out_head_, out_.size() - out_head_, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) send_errno_ = errno;
      return false;
    }
    out_head_ += static_cast<size_t>(n);
  }
  out_.clear();  // keeps capacity
  out_head_ = 0;
  return true;
}

void Stream::set_error(int ssl_result, const char* what) {
  const int e = SSL_get_error(ssl_, ssl_result);
  const unsigned long code = ERR_peek_error();
  const int reason = ERR_GET_LIB(code) == ERR_LIB_SSL ? ERR_GET_REASON(code) : 0;
  auth_failure_ = is_auth_reason(reason);
  if (e == SSL_ERROR_SYSCALL && code == 0) {
    error_ = fmt::format("{}: {}", what,
                         send_errno_ != 0 ? std::strerror(send_errno_)
                         : errno != 0    ? std::strerror(errno)
                                         : "the peer closed the connection");
    return;
  }
  if (e == SSL_ERROR_ZERO_RETURN) {
    error_ = fmt::format("{}: the peer closed the connection", what);
    return;
  }
  std::string text = take_errors("the peer closed the connection");
  const long verify = SSL_get_verify_result(ssl_);
  if (reason == SSL_R_CERTIFICATE_VERIFY_FAILED && verify != X509_V_OK)
    text += fmt::format(" ({})", X509_verify_cert_error_string(verify));
  error_ = fmt::format("{}: {}", what, text);
}

Stream::Step Stream::handshake() {
  ERR_clear_error();
  if (!flush_out()) {
    if (send_errno_ == 0) return Step::kWantWrite;
    error_ = fmt::format("TLS handshake: send: {}", std::strerror(send_errno_));
    return Step::kFailed;
  }
  errno = 0;
  const int r = SSL_do_handshake(ssl_);
  if (r == 1) return flush_out() ? Step::kDone : send_errno_ == 0 ? Step::kWantWrite : Step::kFailed;
  const int e = SSL_get_error(ssl_, r);
  if (e == SSL_ERROR_WANT_READ) return pending_out() ? Step::kWantWrite : Step::kWantRead;
  if (e == SSL_ERROR_WANT_WRITE) return Step::kWantWrite;
  set_error(r, "TLS handshake");
  return Step::kFailed;
}

ssize_t Stream::read(void* buf, size_t len) {
  ERR_clear_error();
  errno = 0;
  size_t got = 0;
  const int r = SSL_read_ex(ssl_, buf, len, &got);
  if (r == 1) {
    // A TLS 1.3 KeyUpdate from the peer makes OpenSSL answer one: out.
    if (pending_out()) flush_out();
    return static_cast<ssize_t>(got);
  }
  const int e = SSL_get_error(ssl_, r);
  if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
    errno = EAGAIN;
    return -1;
  }
  if (e == SSL_ERROR_ZERO_RETURN) return 0;  // close_notify
  if (e == SSL_ERROR_SYSCALL && ERR_peek_error() == 0) {
    if (errno == 0) return 0;  // EOF
    return -1;                 // errno from recv
  }
  const unsigned long code = ERR_peek_error();
  if (ERR_GET_LIB(code) == ERR_LIB_SSL && ERR_GET_REASON(code) == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
    ERR_clear_error();
    return 0;  // closed without close_notify: as a plain socket's EOF
  }
  set_error(r, "TLS");
  errno = EPROTO;
  return -1;
}

ssize_t Stream::write(const iovec* iov, size_t n) {
  if (send_errno_ != 0) {
    errno = send_errno_;
    return -1;
  }
  if (!flush_out()) {
    errno = send_errno_ != 0 ? send_errno_ : EAGAIN;
    return -1;
  }
  ERR_clear_error();
  corked_ = true;
  size_t taken = 0;
  bool failed = false;
  auto encrypt = [&](const void* p, size_t len) {
    size_t written = 0;
    if (SSL_write_ex(ssl_, p, len, &written) != 1) {
      set_error(0, "TLS write");
      failed = true;
    }
  };
  auto seal_gathered = [&] {
    if (!gather_.empty() && !failed) encrypt(gather_.data(), gather_.size());
    gather_.clear();
  };
  bool full = false;
  for (size_t i = 0; i < n && !full && !failed; ++i) {
    const auto* p = static_cast<const std::byte*>(iov[i].iov_base);
    size_t len = iov[i].iov_len;
    while (len > 0 && !failed) {
      size_t take;
      if (gather_.empty() && len >= kRecord) {
        // Full records straight from the frame's memory: no copy.
        take = std::min(len, kDirectChunk);
        encrypt(p, take);
      } else {
        take = std::min(len, kRecord - gather_.size());
        gather_.insert(gather_.end(), p, p + take);
        if (gather_.size() == kRecord) seal_gathered();
      }
      p += take;
      len -= take;
      taken += take;
      if (out_.size() - out_head_ >= kOutBatch) {
        seal_gathered();
        if (!flush_out()) {
          full = true;  // the socket is full: what is taken is encrypted and waits in out_
          break;
        }
      }
    }
  }
  seal_gathered();
  corked_ = false;
  if (failed) {
    errno = EPROTO;
    return -1;
  }
  flush_out();
  if (taken == 0 && n != 0) {
    errno = send_errno_ != 0 ? send_errno_ : EAGAIN;
    return -1;
  }
  return static_cast<ssize_t>(taken);
}

bool Stream::pending_in() const { return SSL_has_pending(ssl_) == 1; }

Identity Stream::peer_identity() const {
  Identity id;
  X509* cert = SSL_get1_peer_certificate(ssl_);
  if (cert == nullptr) return id;
  if (BIO* mem = BIO_new(BIO_s_mem())) {
    X509_NAME_print_ex(mem, X509_get_subject_name(cert), 0, XN_FLAG_RFC2253);
    char* data = nullptr;
    const long len = BIO_get_mem_data(mem, &data);
    if (len > 0) id.subject.assign(data, static_cast<size_t>(len));
    BIO_free(mem);
  }
  auto* names = static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  for (int i = 0; names != nullptr && i < sk_GENERAL_NAME_num(names); ++i) {
    const GENERAL_NAME* g = sk_GENERAL_NAME_value(names, i);
    switch (g->type) {
      case GEN_DNS:
        id.sans.push_back("DNS:" + asn1_text(g->d.dNSName));
        break;
      case GEN_URI:
        id.sans.push_back("URI:" + asn1_text(g->d.uniformResourceIdentifier));
        break;
      case GEN_EMAIL:
        id.sans.push_back("email:" + asn1_text(g->d.rfc822Name));
        break;
      case GEN_IPADD: {
        const ASN1_OCTET_STRING* ip = g->d.iPAddress;
        char text[INET6_ADDRSTRLEN] = {};
        const int family = ASN1_STRING_length(ip) == 4 ? AF_INET : AF_INET6;
        if (ASN1_STRING_length(ip) == 4 || ASN1_STRING_length(ip) == 16) {
          ::inet_ntop(family, ASN1_STRING_get0_data(ip), text, sizeof text);
          id.sans.push_back(std::string("IP:") + text);
        }
        break;
      }
      default:
        break;
    }
  }
  if (names != nullptr) GENERAL_NAMES_free(names);
  X509_free(cert);
  return id;
}

std::string Stream::describe() const {
  return fmt::format("{} {}", SSL_get_version(ssl_), SSL_get_cipher_name(ssl_));
}

}  // namespace slotrpc::transport::tls
