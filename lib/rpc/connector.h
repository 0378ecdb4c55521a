// Connection setup over TCP (Boost.Asio): address parsing, connect with a
// timeout, and deadline-bounded blocking I/O for the handshake.  Runs on the
// caller's thread (Channel::connect) or the server's accept thread, never on
// a reactor.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <cstddef>

#include "base/address.h"
#include "base/uid_policy.h"
#include "slotrpc/config.h"
#include "slotrpc/result.h"
#include "transport/tls/tls_stream.h"

namespace slotrpc::rpc {

using Deadline = std::chrono::steady_clock::time_point;

// Addresses are parsed in base/address.h.
using base::Endpoint;
using base::parse_address;

// Connected, blocking socket fd, or UNAVAILABLE naming the address and why.
Result<int> connect_tcp(const Endpoint& to, Deadline deadline);

Status write_all(int fd, std::span<const std::byte> data, Deadline deadline);
Status read_exact(int fd, std::span<std::byte> data, Deadline deadline);

// TLS (Config::tls), client side: the handshake on the connected socket
// `fd` towards `host` (the server's certificate must name
// cfg.tls_server_name, or else `host`), bounded by `deadline`.  A
// certificate either side refused fails with UNAUTHENTICATED, with
// OpenSSL's reason; a server that answered in plain slotrpc (TLS off
// there) with UNAVAILABLE saying so.
Result<std::shared_ptr<transport::tls::Stream>> tls_connect(int fd, const Config& cfg,
                                                            const std::string& host, Deadline deadline);
// The same as above through a TLS stream when `tls` is not null.  A TLS
// error fails with its reason (UNAUTHENTICATED when the server refused
// this client's certificate: under TLS 1.3 its alert arrives only here,
// after the client's side of the handshake is done).
Status write_all(int fd, std::span<const std::byte> data, Deadline deadline, transport::tls::Stream* tls);
Status read_exact(int fd, std::span<std::byte> data, Deadline deadline, transport::tls::Stream* tls);

// "127.0.0.1:5000" for the peer (or local end) of a connected socket.
std::string peer_name(int fd);
std::string local_name(int fd);

// Unix domain sockets (the shared-memory transport's rendezvous,
// docs/design.md "Shared-memory transport").  A socket name is a path, or
// an abstract name written "@name" (in sun_path: a NUL, then the name).
inline constexpr std::string_view kUnixPrefix = "unix:";
bool is_unix_address(std::string_view address);
// "unix:/run/x.sock" -> "/run/x.sock", "unix:@name" -> "@name"; the error
// names the address.
Result<std::string> parse_unix_address(std::string_view address);
// The abstract name a server listening on TCP `port` also listens on.
std::string default_unix_name(uint16_t port);
// Connected, blocking Unix stream socket, or UNAVAILABLE naming the socket
// and errno; `err` (if given) receives errno (ENOENT, ECONNREFUSED: nobody
// listens there).
Result<int> connect_unix(const std::string& name, Deadline deadline, int* err = nullptr);
// A bound, listening Unix stream socket (a stale socket file at a path is
// replaced), or UNAVAILABLE naming the socket.
Result<int> listen_unix(const std::string& name);
// "pid 1234 uid 1000" of the process at the other end (SO_PEERCRED).
std::string peer_credentials(int fd);
// Whether the process at the other end of the Unix socket `fd` runs as a
// uid `policy` allows (SO_PEERCRED, recorded by the kernel when the peer
// connected or listened): ok, or PERMISSION_DENIED naming `who` ("the shm
// server at unix:@slotrpc-5000"), its pid and uid, and the setting of
// `whose` side ("this client's").
Status check_shm_peer(int fd, const base::UidPolicy& policy, std::string_view who,
                      std::string_view whose);
// True when `host` resolves to a loopback address or an address of one of
// this host's interfaces (in this network namespace): a server reached
// there may be on this host.
bool is_local_host(const std::string& host);

}  // namespace slotrpc::rpc
