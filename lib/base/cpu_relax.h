// One iteration of a spin-wait: tells the CPU this is a busy-wait loop
// (x86 PAUSE, Arm YIELD), so a sibling hyperthread gets the core and
// leaving the loop does not pay a memory-order mis-speculation.  Used by
// the waits that spin before they sleep (Future::get(), caller turns).
#pragma once

namespace slotrpc::base {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace slotrpc::base
