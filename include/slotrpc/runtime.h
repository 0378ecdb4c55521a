// Runtime: a group of event loops that servers and channels share.
//
//   slotrpc::Runtime rt(cfg);             // cfg.reactor_threads loops, started now
//   slotrpc::Server server(rt, cfg);      // its sessions spread over rt's loops
//   auto ch = slotrpc::Channel::connect(addr, rt, cfg).value();
//
// Each loop is one thread with one TCP poller and, once a session uses
// verbs, one device context, protection domain, completion queue (and SRQ):
// every session on the loop, of any server or channel, is polled by that
// one loop.  Sessions are spread round-robin over the loops; a channel
// opened from a handler (on one of the runtime's loops) stays on the
// handler's loop, so its calls, completions and the handler's fiber never
// cross threads.
//
// A Runtime is a handle: copies share the loops.  The loops stop when the
// last handle and the last Server and Channel made on them are gone (each
// holds a reference).  That last reference must not be dropped by a task
// running on one of the loops themselves; if it is, the loops are stopped
// from a helper thread.
//
// Settings: the loop settings of a Config (docs/tuning.md, "Runtimes and
// shared loops": poll mode and spinning, poll batch, fiber stacks,
// keepalive and peer timeout, max_queued_calls, the monitor, every verbs
// device setting) belong to the runtime; a Server or Channel given a
// runtime uses the runtime's values and its config() reports them.  A
// Server or Channel given no runtime uses its side's default runtime (see
// default_runtime()) when its loop settings (and, for a Server,
// reactor_threads) equal that runtime's, and a private runtime made from
// its own config otherwise (the model before runtimes: loops of its own).
#pragma once

#include <cstddef>
#include <memory>

#include "slotrpc/config.h"
#include "slotrpc/export.h"
#include "slotrpc/result.h"

namespace slotrpc {

namespace detail {
struct RuntimeCore;
}

class SLOTRPC_API Runtime {
 public:
  // `config.reactor_threads` loops, after SLOTRPC_* overrides; throws
  // std::invalid_argument naming the bad setting (create() returns it).
  explicit Runtime(Config config = {});
  static Result<Runtime> create(Config config = {});
  // The process-wide runtimes, each made on first use (std::call_once)
  // from Config{} with SLOTRPC_* overrides: SLOTRPC_REACTOR_THREADS loops.
  // Channels given no runtime use default_runtime(), Servers given none
  // default_server_runtime(): a process that serves and calls keeps the two
  // ends of its calls on different loops (a channel opened in a handler
  // stays on the handler's loop all the same).
  static Runtime default_runtime();
  static Runtime default_server_runtime();

  size_t loop_count() const;
  // After SLOTRPC_* overrides: the loop settings every session on it uses.
  const Config& config() const;

  explicit Runtime(std::shared_ptr<detail::RuntimeCore> core) : core_(std::move(core)) {}
  const std::shared_ptr<detail::RuntimeCore>& core() const { return core_; }

 private:
  std::shared_ptr<detail::RuntimeCore> core_;
};

}  // namespace slotrpc
