// Where a TCP bulk lane thread runs (docs/tuning.md, "Thread placement"):
// a fixed mask from the settings.  SLOTRPC_TCP_LANE_CPUS wins; else, with
// SLOTRPC_LOOP_CPUS set, the process's other CPUs, so bulk copies never
// share a core with an event loop; else none (wherever the kernel puts the
// thread).
//
// Why a fixed mask only.  A lane thread's recv or sendmsg copies up to a
// megabyte, and a kernel without full preemption lets nobody else run on
// that CPU until the system call returns, so a small call whose loop shares
// that core waits.  Lowering the thread's priority (SCHED_BATCH, nice,
// SCHED_IDLE) does not help: the copy is not preemptible, only where it
// runs matters (docs/benchmarks.md).  A rule that moved the thread off the
// first CPU while small calls went by was tried; it was measured on one
// 2-vCPU host only, so placing the threads is left to the CPU lists.
#pragma once

#include <sched.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace slotrpc::transport {

// The fixed mask (see above): the lane list if set; else, with loop_cpus
// set, the CPUs of `process` outside it (none left: nullopt, the thread
// stays where it was started); else nullopt (wherever the kernel puts it).
// `error`: why a list did not parse.
std::optional<cpu_set_t> lane_placement(std::string_view lane_cpus, std::string_view loop_cpus,
                                        const cpu_set_t& process, std::string* error);

}  // namespace slotrpc::transport
