// The transports of one event loop.  This is where the library picks and
// creates transports: the reactor polls whatever is handed in
// (Reactor::add_transport) and names none, and the core sees only
// transport::Link.  Each loop gets its TCP transport on first use, its
// verbs transport (with the verbs monitor) and its shared-memory
// transport on the first session that uses them.
//
// Kept with the loop as its extension (Reactor::extension), so a loop
// created by hand (tests, tools) works the same as a Runtime's.
#pragma once

#include <memory>

#include "reactor/reactor.h"
#include "slotrpc/result.h"

namespace slotrpc::transport {
class TcpTransport;
}
namespace slotrpc::transport::verbs {
class VerbsTransport;
}
namespace slotrpc::transport::shm {
class ShmTransport;
}
namespace slotrpc::monitor {
class Monitor;
class SampleHook;
}

namespace slotrpc::rpc {

// Loop thread, or before the loop starts.  The loop's TCP transport,
// created on first use.
transport::TcpTransport& loop_tcp(reactor::Reactor& loop);
// Loop thread.  The loop's verbs transport, created on first use (it opens
// the RDMA device the config selects); the error says why not.  Creating it
// also starts the loop's monitor unless SLOTRPC_MONITOR_INTERVAL_MS is 0.
Result<transport::verbs::VerbsTransport*> loop_verbs(reactor::Reactor& loop);
// Loop thread.  The loop's shared-memory transport (same-host peers,
// lib/transport/shm/), created on first use.
Result<transport::shm::ShmTransport*> loop_shm(reactor::Reactor& loop);
// Loop thread.  The loop's monitor (hardware counters, receive pools), or
// nullptr while the loop uses no verbs or the monitor is off.
monitor::Monitor* loop_monitor(reactor::Reactor& loop);

// Before the loop uses verbs.  The callback holder the monitor calls after
// each sample, instead of the fan-out to add_monitor_hook()'s holders.
void set_monitor_hook(reactor::Reactor& loop, std::shared_ptr<monitor::SampleHook> hook);
// Any thread, any time.  Adds a callback holder that the loop's monitor
// calls after each sample, for as long as `hook` lives (the loop keeps a
// weak reference): every channel and server sharing the loop adds its own.
void add_monitor_hook(reactor::Reactor& loop, const std::shared_ptr<monitor::SampleHook>& hook);

}  // namespace slotrpc::rpc
