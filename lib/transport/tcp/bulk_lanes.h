// Bulk lanes (docs/design.md "TCP: bulk lanes"): a second TCP
// connection per session that carries only large bulk transfers, moved by a
// thread of its own.
//
// Why: on the session's own connection a small call's frame waits behind
// whatever bulk data is already in the socket buffers (megabytes once the
// kernel's autotuning has grown them), and on the session's loop it waits
// for the loop's bulk copies.  Slicing (Config::tcp_bulk_slice) bounds the
// second, not the first.  A lane removes both: the session's connection
// keeps slot, control and small bulk frames, and a transfer through an
// exposure of at least Config::tcp_bulk_lane bytes runs on the lane, whose
// recv and sendmsg copies run on the lane thread.  docs/benchmarks.md has
// the figures that chose this (small-call p99 beside a 1 GiB transfer).
//
// Threads.  The lanes of one TcpTransport (one event loop) share one
// BulkLanes: a TcpTransport of its own, whose links are TcpLinks in lane
// mode (bulk frames only), and one thread that polls it, asleep in
// epoll_wait while no lane has work.  Everything in that transport is
// guarded by mu(): the lane thread holds it while it polls; the loop thread
// while it exposes, revokes, reads or writes through a lane, or attaches or
// drops one.  Nothing a small call does takes it.  Lane completions reach
// the loop through a queue with a lock of its own and an eventfd in the
// loop transport's epoll set, so a sleeping loop wakes for them.
//
// Ordering.  A write's data on the lane and the reply that follows it on
// the session's connection travel on two streams, so the writer's loop
// puts a FENCE frame (the lane's byte count once the write was in the
// kernel) on the session's connection before the write's kBulkDone, and the
// receiving link stops parsing at a FENCE until its lane has received that
// many bytes (docs/protocol.md, "TCP bulk lanes").
//
// Why not a lock-free queue or a thread per lane: lane work is megabytes
// per call, a mutex per operation is noise there, and one thread per loop
// keeps the thread count at twice the loops however many sessions there are.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <sched.h>
#include <sys/types.h>
#include <thread>
#include <vector>

#include "slotrpc/config.h"
#include "slotrpc/result.h"
#include "transport/transport.h"

namespace slotrpc::transport {

class TcpLink;
class TcpTransport;

class BulkLanes {
 public:
  // What the lane thread hands the loop, for the lane's session link.
  struct Event {
    enum class Kind : uint8_t {
      kDone,       // a read or revoke finished: a kBulkDone for the session
      kWriteDone,  // a write finished: FENCE at lane_offset, then the kBulkDone
      kDown,       // the lane failed: the session link fails with `reason`
      kFence,      // the lane has received what a FENCE waits for
    };
    Kind kind = Kind::kDone;
    TcpLink* link = nullptr;  // the session's link (not the lane)
    uint64_t token = 0;
    uint16_t status = 0;
    uint64_t lane_offset = 0;
    std::string reason;
  };

  // Starts the lane thread.  `loop_epoll_fd` gets wake_fd() so that a loop
  // asleep in epoll_wait wakes for lane events.
  static Result<std::unique_ptr<BulkLanes>> start(const Config& loop_config, int loop_epoll_fd);
  // Stops and joins the thread.  Every lane link must be destroyed first.
  ~BulkLanes();
  BulkLanes(const BulkLanes&) = delete;
  BulkLanes& operator=(const BulkLanes&) = delete;

  std::mutex& mu() { return mu_; }
  TcpTransport& transport() { return *transport_; }  // under mu()

  // Loop thread.  pending(): cheap check (an atomic) for poll and sleep.
  bool pending() const { return pending_.load(std::memory_order_acquire); }
  // Appends every queued event to `out`, in order, and clears the wake.
  void take(std::vector<Event>& out);
  // Removes the queued events of `link` (it is being destroyed); with
  // `out`, appends them there first (it is failing: they still count).
  void take_for(TcpLink* link, std::vector<Event>* out);
  // Lane completions the lane transport has queued for `lane` and not yet
  // forwarded, converted to events (under mu(), for a failing session
  // link that must report them before its own kLinkDown).
  void drain_lane(TcpLink* lane, std::vector<Event>& out);
  int wake_fd() const { return wake_fd_; }
  // Times the lane thread went to sleep in epoll_wait (any thread; for
  // tests of Config::tcp_lane_spin_us).
  uint64_t sleeps() const { return sleeps_.load(std::memory_order_relaxed); }
  // The lane thread's kernel thread id once it runs, else 0 (for tests of
  // its placement: sched_getaffinity on it).
  pid_t thread_id() const { return tid_.load(std::memory_order_acquire); }

 private:
  BulkLanes() = default;
  void run();
  // Applies the fixed placement (lane_placement()), if a CPU list asks for one.
  void place_thread();
  void forward(Event e);
  // Turns one lane transport completion into an event (under mu()).
  static Event to_event(const Completion& c);

  std::mutex mu_;
  std::unique_ptr<TcpTransport> transport_;
  int loop_epoll_fd_ = -1;
  int wake_fd_ = -1;   // eventfd: the loop's wake (in the loop's epoll set)
  int stop_fd_ = -1;   // eventfd: stops the lane thread
  int wait_fd_ = -1;   // epoll of the lane thread: transport_'s epoll fd and stop_fd_
  std::chrono::microseconds spin_{0};  // Config::tcp_lane_spin_us
  std::string lane_cpus_, loop_cpus_;  // Config::tcp_lane_cpus, Config::loop_cpus
  std::atomic<pid_t> tid_{0};
  std::atomic<uint64_t> sleeps_{0};
  std::thread thread_;

  std::mutex events_mu_;
  std::vector<Event> events_;  // guarded by events_mu_
  std::atomic<bool> pending_{false};
};

}  // namespace slotrpc::transport
