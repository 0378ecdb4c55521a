// One TLS connection: an SSL object over a socket the caller owns, driven
// non-blocking.  The handshake (Channel::connect's thread, or the server's
// accept thread) and then the TCP link (its event loop) use the same
// Stream, so nothing OpenSSL read ahead is lost between them.
//
// Userspace TLS (SSL_read / SSL_write; this code uses no kTLS, which needs
// OpenSSL's own socket BIO and the kernel's tls module).  Its own BIO:
//   * reads recv() the socket (MSG_DONTWAIT);
//   * writes never fail or block: the ciphertext goes to an output buffer
//     of the Stream's, sent at once unless corked.  SSL_write therefore
//     always takes all it is given, and the TCP link's accounting ("these
//     frame bytes are gone") stays exact: OpenSSL never holds a half-sent
//     record that must be retried with the same bytes.  The link corks
//     while it encrypts a batch of frames and sends the batch with one
//     send(), and encrypts no more while ciphertext is left over (the
//     socket is full): at most about kOutBatch bytes wait here.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "slotrpc/result.h"
#include "transport/tls/tls_context.h"

typedef struct ssl_st SSL;
typedef struct bio_st BIO;

namespace slotrpc::transport::tls {

// The peer's certificate, as the server learns a client's (mTLS).
struct Identity {
  std::string subject;            // RFC 2253: "CN=client-1,O=Example"
  std::vector<std::string> sans;  // "DNS:host", "IP:10.0.0.1", "URI:spiffe://...", "email:..."
};

class Stream {
 public:
  // `server_name` (client side): the name the server's certificate must
  // carry in its SANs (a DNS name, or an IP address); also sent as SNI.
  static Result<std::unique_ptr<Stream>> create(std::shared_ptr<Context> context, int fd,
                                                const std::string& server_name = {});
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // The socket the Stream reads and writes (a TCP link works on a
  // duplicate of the handshake's fd).  Not owned.
  void set_fd(int fd) { fd_ = fd; }
  int fd() const { return fd_; }

  // One step of the handshake, non-blocking.
  enum class Step : uint8_t { kDone, kWantRead, kWantWrite, kFailed };
  Step handshake();
  // After kFailed (or a read or write that failed): why, with OpenSSL's
  // reason and, where a certificate was refused, the verification error.
  const std::string& error() const { return error_; }
  // Whether the failure was about authentication: a certificate refused by
  // this side, or an alert from the peer that refused ours (a client's
  // connect then fails with UNAUTHENTICATED).
  bool auth_failure() const { return auth_failure_; }
  // The first bytes the peer sent (up to 1056): a peer that does not speak
  // TLS is recognised by them (a plain slotrpc HelloReply, say).
  const std::vector<std::byte>& first_bytes() const { return first_; }

  // Plaintext, non-blocking.  read: > 0 bytes; 0 the peer closed; -1 with
  // errno (EAGAIN: nothing now; EPROTO: a TLS error, error() says which).
  ssize_t read(void* buf, size_t len);
  // Encrypts the iovecs in order, a batch at a time, and sends; returns
  // the plaintext bytes taken (all of them unless the socket filled up),
  // or -1 with errno (EAGAIN: the socket is full with earlier output;
  // EPIPE and the like; EPROTO).  n == 0 only sends what is left over.
  ssize_t write(const iovec* iov, size_t n);
  // Bytes decrypted or read ahead but not yet returned by read(): epoll
  // will not report them, the reader must come back on its own.
  bool pending_in() const;
  // Nothing left to read now: the socket's last recv() came back short (or
  // empty) and OpenSSL holds nothing: a reader need not call again until
  // epoll says so (a plain socket's short read means the same).
  bool drained() const { return rx_short_ && !pending_in(); }
  // Ciphertext not yet taken by the socket: wait for EPOLLOUT.
  bool pending_out() const { return out_head_ < out_.size(); }

  // The peer's certificate (after the handshake); empty when it sent none.
  Identity peer_identity() const;
  // "TLSv1.3 TLS_AES_256_GCM_SHA384", for log lines.
  std::string describe() const;

  // Ciphertext waiting past this is sent before more is encrypted.
  static constexpr size_t kOutBatch = 128 * 1024;

  // The Stream's BIO (OpenSSL calls them; not for other callers).
  static int bio_write(BIO* bio, const char* data, int len);
  static int bio_read(BIO* bio, char* data, int len);

 private:
  Stream() = default;
  // Sends out_; false when some is left (errno EAGAIN) or on an error.
  bool flush_out();
  void set_error(int ssl_result, const char* what);

  std::shared_ptr<Context> context_;
  SSL* ssl_ = nullptr;
  int fd_ = -1;
  bool corked_ = false;
  bool rx_short_ = false;  // the last recv() took less than asked
  int send_errno_ = 0;  // a hard send() error, reported by the next write()
  std::vector<std::byte> out_;  // ciphertext; [out_head_, size) unsent
  size_t out_head_ = 0;
  std::vector<std::byte> gather_;  // small iovecs coalesced into one record
  std::vector<std::byte> first_;
  std::string error_;
  bool auth_failure_ = false;
};

}  // namespace slotrpc::transport::tls
