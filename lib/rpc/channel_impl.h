// Channel::Impl, what a Channel is behind its public header, shared by the
// files that implement it by concept:
//   channel.cc         the channel: connect(), reconnects, submit, stats
//   client_connect.cc  connecting a session (TCP, verbs, shm): the mirror
//                      of acceptor.cc
//   channel_attach.cc  calls held while the session's attached connection
//                      opens (transport.h, "Attached connections")
//   retrying_call.cc   idempotent calls sent again after UNAVAILABLE
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "base/timer_heap.h"
#include "core/client_session.h"
#include "core/loop_counters.h"
#include "reactor/reactor.h"
#include "rpc/connector.h"
#include "rpc/runtime_core.h"
#include "slotrpc/channel.h"
#include "slotrpc/fiber.h"
#include "transport/verbs/monitor.h"

namespace slotrpc::transport {
class Link;
}
namespace slotrpc::fleet {
class Fleet;
}

namespace slotrpc {

namespace rpc {
struct Established;
}

struct Channel::Impl : std::enable_shared_from_this<Channel::Impl> {
  std::string address;
  // A target with a resolver (list://, dns:///, ...): the endpoints' own
  // channels, which every call is routed to (rpc/fleet/fleet.h).  Null for
  // HOST:PORT, whose calls go to `session` below.
  std::shared_ptr<fleet::Fleet> fleet;
  Config config;
  std::string peer;
  std::atomic<TransportKind> kind{TransportKind::kTcp};
  // Whether this host may propose verbs (a usable device was found at
  // connect()), and the device's description or why not.
  bool verbs_possible = false;
  std::string verbs_note;
  // The runtime whose loop this channel's session lives on (keeps the
  // loops running), the loop and its index there.
  std::shared_ptr<detail::RuntimeCore> runtime;
  std::shared_ptr<reactor::Reactor> loop;
  size_t loop_index = 0;
  // Calls handed to the loop from another thread: the cross-loop
  // hand-offs Stats::cross_loop_handoffs reports.
  std::atomic<uint64_t> handoffs{0};
  // What this channel's sessions count (loop thread), so a channel on a
  // shared loop reports only its own calls.
  std::shared_ptr<core::LoopCounters> counters = std::make_shared<core::LoopCounters>();
  // on_monitor_sample()'s callback, shared with the loop's monitor.
  std::shared_ptr<monitor::SampleHook> monitor_hook = std::make_shared<monitor::SampleHook>();
  std::atomic<uint64_t> last_request_id{0};
  std::atomic<bool> closing{false};
  // add_interceptor()'s, frozen by the first call (called).
  std::vector<ClientInterceptor> interceptors;
  std::atomic<bool> called{false};
  // Every call entry runs this first: OK, or why the call fails unsent.
  // Inline and one branch when there are no interceptors.
  Status intercept(uint32_t method_id, CallOptions& options) {
    if (!called.load(std::memory_order_relaxed)) called.store(true, std::memory_order_relaxed);
    if (interceptors.empty()) return {};
    return run_interceptors(method_id, options);
  }
  Status run_interceptors(uint32_t method_id, CallOptions& options);

  // Loop thread only (after connect() returned).
  std::shared_ptr<core::ClientSession> session;
  bool reconnecting = false;
  std::vector<std::function<void(const Status&)>> waiting_for_session;
  std::thread reconnector;

  // The reconnect policy (docs/design.md, "When the server dies"): after a
  // failed reconnect the next one waits min(kBackoffMax, kBackoffBase x
  // 2^(failures-1)), scaled by a random factor in [0.5, 1] so that many
  // clients of one restarted server do not all come back in step.  The
  // first attempt after a session dies is not delayed; a success resets it.
  static constexpr std::chrono::milliseconds kBackoffBase{100};
  static constexpr std::chrono::milliseconds kBackoffMax{10'000};
  uint32_t reconnect_failures = 0;  // in a row
  Clock::time_point next_attempt{};  // no reconnect before this
  Status last_reconnect_error;
  uint64_t reconnect_attempts = 0;
  uint64_t reconnects = 0;
  std::minstd_rand jitter{std::random_device{}()};

  // Loop thread: runs `then` with OK once a live session exists, starting a
  // reconnect if the current one is closed and the policy allows one now;
  // with the error if that fails, or at once with UNAVAILABLE saying when the
  // next attempt may be made while the policy backs off.
  void with_session(std::function<void(const Status&)> then);
  void reconnected(Result<rpc::Established> est);

  // The attached connection (transport.h, "Attached connections") of the
  // current session: opened by a thread of its own on the first call with
  // a bulk segment of at least the link's attachment_threshold(), so a
  // channel that never moves one costs no second connection.  Calls with
  // such a segment wait (waiting_for_attachment) until the attempt is
  // over, so that every large transfer runs there, the first one
  // included; small calls never wait.  Loop thread only.
  std::vector<std::byte> attach_token;      // the session's offer; empty: none, or taken
  transport::Link* attach_link = nullptr;   // the session's link, while it lives
  std::thread attach_opener;
  bool attaching = false;
  uint64_t attach_threshold = 0;            // of the attempt under way
  std::vector<core::PendingCall*> waiting_for_attachment;
  // While calls wait, this timer lets them go early: all of them when the
  // session ends meanwhile (they fail with its reason), and each one when
  // its deadline passes.  Without it they waited for the opener, up to
  // connect_timeout_ms, when the server stalled during the attach
  // handshake (a call with a 300 ms deadline took the full 5 s).
  base::TimerHeap::TimerId attach_wait_timer = 0;
  void install(rpc::Established& e);
  // True when `pc` waits for the attached connection (taken over); false:
  // submit it now.
  bool hold_for_attachment(core::PendingCall* pc);
  void attach_attempt_over();
  bool cancel_held(uint64_t request_id);
  void arm_attach_wait();
  static void on_attach_wait(void* self, uint64_t);
  void cancel_attach_wait();
  // Lets every held call go: to the session (a closed one fails it with
  // its reason), or CANCELLED when the channel is closing.
  void release_held();
};

namespace rpc {

// A session that is ready to be installed on the channel's loop.
struct Established {
  std::shared_ptr<core::ClientSession> session;
  std::string peer;
  TransportKind kind = TransportKind::kTcp;
  std::string note;  // why this transport, for the log
  // The server's attach token (empty: none) and the session's link.
  std::vector<std::byte> attach_token;
  transport::Link* link = nullptr;
};

// Blocking (off the loop): TCP connect, handshake, and the session created
// on the loop, bounded by connect_timeout_ms; shm first where it applies
// (client_connect.cc).
Result<Established> establish(Channel::Impl& impl);

// Blocking (off the loop): connects a second socket to the server and
// presents the attach token of the session's HelloReply; once the server
// says OK the socket is returned, for the session's link to take
// (Link::attach_connection).
Result<int> open_attachment(const Endpoint& endpoint, std::span<const std::byte> token,
                            Deadline deadline);

// Runs blocking `fn` (a connect: TCP, handshake, tasks on the channel's
// loop) so that no event loop blocks on it: in a handler's fiber on a
// helper thread while the fiber waits suspended, elsewhere right here.
template <class Fn>
auto off_loop(Fn fn) -> decltype(fn()) {
  if (!this_fiber::in_fiber()) return fn();
  auto state = std::make_shared<detail::SharedState<decltype(fn())>>();
  std::thread helper([&fn, state] { state->set(fn()); });
  state->wait();
  helper.join();  // it has set the value: only its return is left
  return std::move(*state->value);
}

}  // namespace rpc

}  // namespace slotrpc
