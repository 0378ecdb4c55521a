// Config: every tunable setting of a Server or Channel.
//
// Each field has a SLOTRPC_* environment variable.  When a Server or Channel
// is created, set variables override the struct (operators tune deployed
// binaries without a rebuild; each one applied is logged once, with its
// value), and the result is validated: an invalid value is an error naming
// the setting, the value and the allowed range.  A program can refuse the
// overlay: set_environment_overlay(false).
// docs/tuning.md lists every setting; lib/base/settings.h is the one table
// the parser, validator and docs are written from.
#pragma once

#include <cstdint>
#include <string>

#include "slotrpc/result.h"

namespace slotrpc {

enum class PollMode : uint8_t {
  kBusy,      // never sleep: lowest latency, one core per reactor at 100 %
  kBlocking,  // sleep in epoll as soon as a turn finds no work
  kAdaptive,  // spin for `spin_us`, then sleep (default)
};

// Who may call the built-in slotrpc.Admin service (docs/design.md, "Trust
// and security").  Admin tells method names, call counts, latencies and
// sessions: by default only the server's own user on its own host sees them.
enum class AdminAccess : uint8_t {
  kSameUser,  // peers on this host with the server's uid (Unix socket, or TCP from this host)
  kAny,       // every peer that opened a session (put mTLS or an interceptor in front)
  kOff,       // nobody: Admin calls fail with PERMISSION_DENIED
};

enum class TransportKind : uint8_t {
  kAuto,   // shm on one host, else verbs when both ends have an RDMA device, else TCP
  kTcp,
  kVerbs,
  kShm,    // shared memory, same host only (docs/design.md, "Shared-memory transport")
};

// How a channel to several servers (a list://, dns:/// or other resolver
// target, slotrpc/resolver.h) picks one per call (docs/guide.md, "Running
// a fleet").  A HOST:PORT channel has one server and ignores it.
enum class LbPolicy : uint8_t {
  kRoundRobin,  // each call to the next endpoint in turn (default)
  kPickFirst,   // every call to the first usable endpoint of the list
  kP2c,         // the less busy (fewer calls outstanding) of two picked at random
};

// IBV_ACCESS_RELAXED_ORDERING on registered memory (verbs).
enum class RelaxedOrdering : uint8_t {
  kOff,   // default: PCIe writes of a message land in order
  kOn,    // always ask for it (the device may ignore it)
  kAuto,  // on when the device sits on PCI and accepts the flag
};

// How a verbs event loop receives and protects its sessions' rings
// (docs/design.md, "Receive queues and ring protection").
enum class SharedReceiveQueue : uint8_t {
  kOff,   // each session: its own protection domain and receive queue
  kOn,    // one protection domain and SRQ per event loop; each receive ring
          // is exposed through a type-2 memory window bound to its session's
          // queue pair.  An error where the device lacks either.
  kAuto,  // on when the device has SRQs and type-2 memory windows (default)
};

// Whether a TLS server asks connecting clients for a certificate
// (docs/design.md, "TLS").
enum class TlsClientAuth : uint8_t {
  kNone,      // never asks
  kOptional,  // asks; a client without one gets in, one with a bad one does not
  kRequired,  // mutual TLS: a client without a valid certificate is refused
};

struct SLOTRPC_API Config {
  // Slot ring geometry, per session and direction.  A message (32-byte
  // header + payload) must fit one slot.  A Channel proposes its geometry;
  // a Server accepts up to its own values.
  uint32_t slot_count = 64;          // SLOTRPC_SLOT_COUNT
  uint32_t slot_size = 64 * 1024;    // SLOTRPC_SLOT_SIZE (bytes, multiple of 64)

  PollMode poll_mode = PollMode::kAdaptive;  // SLOTRPC_POLL_MODE busy|blocking|adaptive
  uint32_t spin_us = 200;            // SLOTRPC_SPIN_US: adaptive spin before sleeping
  // Adaptive mode: the spin doubles, up to this, while the loop's sleeps
  // keep ending sooner than its spin, and halves (down to spin_us) after a
  // sleep this long (docs/tuning.md, "Adaptive spin").  <= spin_us, or
  // spin_us = 0: the spin stays spin_us.
  uint32_t spin_max_us = 1000;       // SLOTRPC_SPIN_MAX_US
  // Spinning under oversubscription (docs/tuning.md, "Busy polling"): an
  // idle spinning loop (busy mode, and adaptive mode within spin_us) yields
  // the CPU after busy_yield_us; a busy loop sleeps after busy_sleep_us;
  // 0 = never.
  uint32_t busy_yield_us = 5;        // SLOTRPC_BUSY_YIELD_US
  uint32_t busy_sleep_us = 10'000;   // SLOTRPC_BUSY_SLEEP_US
  uint32_t poll_batch = 32;          // SLOTRPC_POLL_BATCH: completions per poll
  // SLOTRPC_LOOP_CPUS: the CPUs event-loop threads run on, as `taskset -c`
  // writes them ("0-3,8"); empty = wherever the kernel puts them
  // (docs/tuning.md, "Thread placement").  At least one must be online.
  std::string loop_cpus;

  uint32_t connect_timeout_ms = 5000;  // SLOTRPC_CONNECT_TIMEOUT_MS
  uint32_t keepalive_ms = 1000;        // SLOTRPC_KEEPALIVE_MS: ping an idle peer this often
  uint32_t peer_timeout_ms = 5000;     // SLOTRPC_PEER_TIMEOUT_MS: silent peer is dead after
  // SLOTRPC_BULK_TIMEOUT_MS: server, a handler's read_bulk / write_bulk of
  // a call without a deadline fails with DEADLINE_EXCEEDED, and the session
  // is closed, when the client has not completed it within this long (a
  // call with a deadline: its deadline plus 1 s).
  uint32_t bulk_timeout_ms = 60'000;

  uint32_t fiber_stack_kb = 256;     // SLOTRPC_FIBER_STACK_KB: handler fiber stack
  uint32_t reactor_threads = 1;      // SLOTRPC_REACTOR_THREADS: loops of a Runtime (the default one too)
  uint32_t max_queued_calls = 65536; // SLOTRPC_MAX_QUEUED_CALLS: calls waiting for a credit
  uint32_t stream_window = 8;        // SLOTRPC_STREAM_WINDOW: a stream's in-flight messages, each way

  TransportKind transport = TransportKind::kAuto;  // SLOTRPC_TRANSPORT auto|tcp|verbs|shm
  // SLOTRPC_LB_POLICY round_robin|pick_first|p2c: a multi-endpoint
  // channel's choice of endpoint per call (LbPolicy).
  LbPolicy lb_policy = LbPolicy::kRoundRobin;
  // SLOTRPC_UNIX_PATH: the Unix domain socket a Server started on TCP also
  // listens on for shm sessions, and the one a Channel tries first with
  // transport auto|shm: /absolute/path or @abstract-name.  Empty (default):
  // the abstract name @slotrpc-<TCP port>.  "off": no Unix socket, and auto
  // never tries shm.
  std::string unix_path;
  // SLOTRPC_SHM_PEER_UIDS: which users may be at the other end of an shm
  // session's Unix socket, checked on both ends by the uid the kernel
  // records for the peer (SO_PEERCRED).  Empty or "self" (default): this
  // process's own effective uid only; a comma-separated list of uids and
  // "self" ("self,1001"); or "any".  A Channel refuses a server outside it
  // before sending anything, a Server refuses such a client, both with
  // PERMISSION_DENIED naming the uid and this setting; transport auto then
  // uses TCP.  Why: any local process can bind a server's default name
  // @slotrpc-<port> first (docs/design.md, "Trust and security").
  std::string shm_peer_uids;

  // Server admission (docs/design.md, "Limits and abuse").  A session
  // beyond a limit is refused in its HelloReply with RESOURCE_EXHAUSTED
  // naming the limit.
  uint32_t max_sessions = 4096;          // SLOTRPC_MAX_SESSIONS: open sessions of a server
  // SLOTRPC_MAX_RING_MEMORY auto|BYTES: ring bytes (both directions) of all
  // sessions of a server.  0 = auto: a quarter of physical memory, and no
  // more than RLIMIT_MEMLOCK when verbs is possible and that is finite.
  uint64_t max_ring_memory = 0;
  // SLOTRPC_MAX_BULK_BYTES: bulk bytes one call may carry (the sum of its
  // send and receive segments).  A client refuses a larger call before it
  // is sent; a server refuses a request that offers more, with
  // RESOURCE_EXHAUSTED, and serves the session's other calls on.
  uint64_t max_bulk_bytes = 4ull << 30;
  // SLOTRPC_TCP_BULK_SLICE: bulk bytes a TCP link moves per data frame
  // while calls share its connection (docs/tuning.md, "TCP bulk slices").
  // Small calls on a session that moves bulk data wait behind about this
  // much in each loop and twice this much in the socket; larger slices
  // move bulk data faster and small calls beside it slower.  A connection
  // that carries bulk data alone grows its frames up to 1 MiB.
  uint32_t tcp_bulk_slice = 64 * 1024;
  // SLOTRPC_TCP_BULK_LANE: a TCP session whose two ends have it on opens a
  // second connection, its bulk lane, moved by a thread of the event loop's
  // own; a transfer through a bulk segment of at least this many bytes
  // runs there, so small calls never queue behind it in a socket or a
  // loop (docs/tuning.md, "TCP bulk lanes").  Smaller ones stay on the
  // session's connection, where they cost fewer thread hand-offs.  0 turns
  // lanes off.
  uint32_t tcp_bulk_lane = 16 * 1024 * 1024;
  // SLOTRPC_TCP_BULK_PUSH: a TCP client sends a send_bulk segment of at
  // most this many bytes right behind its request, unasked, instead of
  // waiting for the server's read request: one trip across the connection
  // less per call (docs/tuning.md, "TCP pushes").  A server with it at 0
  // does not accept pushes; a client with 0 sends none.
  uint32_t tcp_bulk_push = 1024 * 1024;
  // SLOTRPC_TCP_FLUSH_EVERY: a TCP session sends what it has queued as soon
  // as this many messages wait, not only at the end of the event-loop turn
  // that made them, so the peer works on the first ones while this side
  // builds the rest (docs/tuning.md, "Early flush").  0: once per turn.
  uint32_t tcp_flush_every = 16;
  // SLOTRPC_TCP_LANE_SPIN_US: how long a bulk lane thread keeps polling its
  // lanes (yielding the CPU between polls) after it last found work,
  // before it sleeps in epoll_wait.  A transfer's data arrives and drains
  // in pieces, and a thread that slept between them paid a wake-up for
  // each (docs/tuning.md, "TCP bulk lanes").  0: sleep at once.
  uint32_t tcp_lane_spin_us = 200;
  // SLOTRPC_TCP_LANE_CPUS: the CPUs bulk lane threads run on ("0-3,8").
  // Empty: with loop_cpus set, the process's other CPUs (if it has any),
  // so that bulk copies never share a core with an event loop; else
  // wherever the kernel puts them.
  std::string tcp_lane_cpus;
  // SLOTRPC_PACK_SMALL: requests and replies of at most this many bytes
  // (32-byte header + payload) that are ready in the same event-loop turn
  // travel together in one slot message, one work request or frame
  // (docs/tuning.md, "Packing").  Nothing waits to be packed.  Used on a
  // tcp or verbs session whose two ends have it on; 0 turns it off (and
  // refuses PACKs from the peer).
  uint32_t pack_small = 512;
  uint32_t max_pending_handshakes = 1024;         // SLOTRPC_MAX_PENDING_HANDSHAKES
  uint32_t max_pending_handshakes_per_host = 256; // SLOTRPC_MAX_PENDING_HANDSHAKES_PER_HOST

  // RDMA verbs transport (docs/tuning.md, "Verbs").
  std::string device;                // SLOTRPC_DEVICE: "mlx5_0"; empty = first with an active port
  uint32_t device_port = 1;          // SLOTRPC_PORT: port of the device
  int32_t gid_index = -1;            // SLOTRPC_GID_INDEX auto|N: -1 = auto (RoCE v2 first)
  uint32_t traffic_class = 0;        // SLOTRPC_TRAFFIC_CLASS: GRH traffic class (RoCE: DSCP << 2 | ECN)
  uint32_t service_level = 0;        // SLOTRPC_SERVICE_LEVEL
  RelaxedOrdering relaxed_ordering = RelaxedOrdering::kOff;  // SLOTRPC_RELAXED_ORDERING off|on|auto
  // SLOTRPC_QP_TIMEOUT: ACK timeout 4.096 us * 2^N (0 = infinite); 18 is
  // about 1.07 s, as UCX (1 s) and NCCL (18) choose.  A lost packet is rare
  // on a lossless fabric, while a short timeout costs spurious go-back-N
  // resends where the timer is not pushed back by every ACK: Soft-RoCE at
  // 14 (67 ms) resent about one 60 KB message in 60 (docs/benchmarks.md).
  uint32_t qp_timeout = 18;
  uint32_t retry_count = 7;          // SLOTRPC_RETRY_COUNT: transport retries before an error
  uint32_t rnr_retry = 7;            // SLOTRPC_RNR_RETRY: 7 = retry forever
  uint32_t min_rnr_timer = 12;       // SLOTRPC_MIN_RNR_TIMER: IB encoding, 12 = 0.64 ms
  uint32_t inline_bytes = 256;       // SLOTRPC_INLINE_BYTES: messages up to this go inline
  SharedReceiveQueue srq = SharedReceiveQueue::kAuto;  // SLOTRPC_SRQ off|on|auto
  uint32_t srq_depth = 16384;        // SLOTRPC_SRQ_DEPTH: receive requests of a loop's SRQ
  // SLOTRPC_MONITOR_INTERVAL_MS: how often each event loop that uses verbs
  // samples the device port's hardware counters and its receive pools
  // (lib/transport/verbs/monitor.h, docs/design.md "Metrics and the monitor"); 0 = off.
  uint32_t monitor_interval_ms = 1000;
  std::string log_level = "info";  // SLOTRPC_LOG_LEVEL trace|debug|info|warn|error|critical|off

  // SLOTRPC_METRICS_ADDRESS HOST:PORT: a Server serves its metrics in the
  // Prometheus text format at http://HOST:PORT/metrics.  Empty (default):
  // off.  A port alone (PORT or :PORT) serves on 127.0.0.1 only; any other
  // interface has to be named.  Port 0 picks a free one
  // (Server::metrics_port()).  One port per Server: a second Server of the
  // process with the same address fails in start().
  std::string metrics_address;
  // SLOTRPC_ADMIN_ACCESS same-user|any|off: who may call slotrpc.Admin
  // (slotrpc-stat --address); server interceptors run before it.
  AdminAccess admin_access = AdminAccess::kSameUser;

  // TLS on TCP sessions, and on the handshake connection of verbs sessions
  // (docs/design.md, "TLS"; docs/tuning.md, "TLS").  Server: tls_cert and
  // tls_key are required, tls_ca verifies client certificates.  Client: the
  // server's certificate is verified against tls_ca (empty: the system's
  // CAs) and must name tls_server_name (empty: the host part of the
  // address); tls_cert and tls_key, if set, are its client certificate.
  // Files are PEM.  With TLS on, shm is used only where unix_path is set
  // explicitly, and TCP bulk lanes are off.
  bool tls = false;           // SLOTRPC_TLS off|on
  std::string tls_cert;       // SLOTRPC_TLS_CERT: certificate chain file
  std::string tls_key;        // SLOTRPC_TLS_KEY: private key file
  std::string tls_ca;         // SLOTRPC_TLS_CA: CA bundle file
  TlsClientAuth tls_client_auth = TlsClientAuth::kNone;  // SLOTRPC_TLS_CLIENT_AUTH none|optional|required
  std::string tls_server_name;  // SLOTRPC_TLS_SERVER_NAME

  // Checks every field; the error names the first bad setting.
  Status validate() const;
  // Applies set SLOTRPC_* variables on top of `*this`, then validates
  // (only validates while the overlay is off: set_environment_overlay).
  // Each variable it applies is logged once per process, with its value.
  Result<Config> with_environment() const;
};

// Process-wide: whether Config::with_environment() applies the SLOTRPC_*
// variables, and so whether every Server, Channel and Runtime created from
// now on takes them.  On by default, so that operators can tune a deployed
// binary; a program that must not be tuned from outside (an embedded use,
// a test that needs its own values) turns it off before it creates any.
SLOTRPC_API void set_environment_overlay(bool enabled);
SLOTRPC_API bool environment_overlay();

SLOTRPC_API std::string_view to_string(PollMode mode);
SLOTRPC_API std::string_view to_string(TransportKind kind);
SLOTRPC_API std::string_view to_string(AdminAccess access);
SLOTRPC_API std::string_view to_string(LbPolicy policy);
SLOTRPC_API std::string_view to_string(RelaxedOrdering mode);
SLOTRPC_API std::string_view to_string(SharedReceiveQueue mode);
SLOTRPC_API std::string_view to_string(TlsClientAuth mode);

}  // namespace slotrpc
