// The loops behind a slotrpc::Runtime (include/slotrpc/runtime.h).
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "reactor/reactor.h"
#include "slotrpc/config.h"
#include "slotrpc/future.h"
#include "slotrpc/result.h"

namespace slotrpc::detail {

struct RuntimeCore {
  Config config;  // validated, after SLOTRPC_* overrides
  std::vector<std::shared_ptr<reactor::Reactor>> loops;
  // Round-robin placement, one turn per side: a process that opens a
  // channel to its own server places a client session and then a server
  // session, so a single shared counter sent every client to the even loops
  // and every server session to the odd ones (16 channels to in-process
  // servers on 2 loops: all 16 client sessions on loop 0).  Each side on
  // its own spreads over every loop, and so do both together.
  enum class Side { kClient = 0, kServer = 1 };
  mutable std::atomic<size_t> next_loop[2] = {0, 0};
  // Per loop, that loop's thread only: what must outlive the loop's fibers
  // (a server stopped while one of its handlers was still suspended), freed
  // after the loops have stopped.
  std::vector<std::vector<std::shared_ptr<void>>> keep_until_stop;
  // Per loop, that loop's thread only: closed client sessions that the
  // application still references (a RawReply it holds).  Their links belong
  // to the loop's transports, so they must be destroyed on the loop (or
  // after it stopped), never by the RawReply on some other thread.
  std::vector<std::vector<std::shared_ptr<void>>> orphans;

  // Loop `i`'s thread.  Destroys `object` now when nothing else holds it,
  // else keeps it in orphans[i] until it is the last holder (checked at
  // every retire() on that loop, and at stop).
  void retire(size_t i, std::shared_ptr<void> object);

  // Loops named "<prefix><i>" (thread names, and the monitor's `loop`
  // label; just "<prefix>" when not `numbered`), started.  The shared_ptr's deleter never joins a loop from
  // that loop's own thread.
  static Result<std::shared_ptr<RuntimeCore>> make(const Config& validated, const std::string& prefix,
                                                   bool numbered = true);
  ~RuntimeCore();  // stops and joins the loops

  // The loop a new session goes on: the calling handler's loop when it is
  // one of ours (no cross-thread hand-off for a nested call), otherwise
  // `side`'s next one round-robin.
  size_t pick_loop(Side side) const;
  // Index of `loop` among ours, or -1.
  int index_of(const reactor::Reactor* loop) const;
  // Index of the loop running on the calling thread, or -1.
  int current_index() const { return index_of(reactor::Reactor::current()); }
};

// The settings that are per loop (what Reactor, its transports and its
// sessions read from the loop's config).  The first that differs, by field
// name, or "" when none does.
std::string loop_setting_difference(const Config& a, const Config& b);
// Copies the loop settings of `from` into `into`.
void take_loop_settings(Config& into, const Config& from);

// Runs `fn` on `loop` and waits for its result: at once on the loop's own
// thread, else posted; a handler's fiber (on another loop) waits suspended,
// so its loop runs on meanwhile.  Cold paths only (it allocates).
template <class Fn>
auto on_loop(reactor::Reactor& loop, Fn fn) -> decltype(fn()) {
  if (loop.on_this_thread()) return fn();
  auto state = std::make_shared<SharedState<decltype(fn())>>();
  loop.post([&fn, state] { state->set(fn()); });
  state->wait();
  return std::move(*state->value);
}

// The process-wide default runtimes, one per side, each made on first use:
// channels given no runtime share one (loops "slotrpc-loopN"), servers
// given none another ("slotrpc-serveN").  A process that both serves and
// calls so keeps the two ends of its calls on different threads, as before
// runtimes existed, while all its channels still share one loop.  One
// runtime for both put a process's server sessions and channels on the
// same single loop: in-process echoes over verbs took 1.5x as long at 64 B
// and moved half the 4 KiB calls at 32 in flight (the verbs comparison
// in docs/benchmarks.md).
const std::shared_ptr<RuntimeCore>& default_core(RuntimeCore::Side side);
// For a Server or Channel given no runtime: the default runtime whose loop
// runs the calling thread (a channel opened in a handler stays on the
// handler's loop), otherwise `side`'s.
const std::shared_ptr<RuntimeCore>& default_core_here_or(RuntimeCore::Side side);

}  // namespace slotrpc::detail
