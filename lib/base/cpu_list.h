// CPU lists (Config::loop_cpus, Config::tcp_lane_cpus): which CPUs a
// thread of ours may run on, written as `taskset -c` and cpuset(7) write
// them ("0-3,8").
//
// Why slotrpc places its own threads: a TCP bulk lane thread that shares a
// CPU with an event loop delays the loop by each of its system calls (up
// to a megabyte copied, hundreds of microseconds, on a kernel that does not
// preempt inside them), so small calls beside a large transfer wait for
// bulk copies whenever the kernel happens to put the two together
// (docs/benchmarks.md).  Only the application knows
// which cores it can spare; these settings let it say so, the way eRPC and
// DPDK applications pin their threads.
#pragma once

#include <sched.h>

#include <string>
#include <string_view>

#include "slotrpc/result.h"

namespace slotrpc::base {

// Parses `text`: comma-separated CPU numbers and ranges `N-M` (N <= M),
// each below CPU_SETSIZE, no spaces, at least one CPU.  The error names
// `setting`, the text and the syntax.
Result<cpu_set_t> parse_cpu_list(std::string_view setting, std::string_view text);

// `text` parses, and at least one of its CPUs is online: the error names
// the online ones.  Empty `text` (no placement) is fine.  (A cpuset that
// keeps this process off the listed CPUs shows only when a thread is
// pinned: it is logged then, and the thread runs where it was.)
Status check_cpu_list(std::string_view setting, std::string_view text);

// The CPUs this process's main thread may run on (what `taskset` gave the
// process, say).
cpu_set_t process_cpus();

// The CPUs online now (/sys/devices/system/cpu/online).
cpu_set_t online_cpus();

// "0-1,4": the inverse of parse_cpu_list, for messages and logs.
std::string format_cpu_list(const cpu_set_t& set);

// Restricts the calling thread to `set`.  false (errno set) when the
// kernel refuses: none of the CPUs is available any more.
bool pin_this_thread(const cpu_set_t& set);

}  // namespace slotrpc::base
