// Client and bidi streaming over TCP: order, flow control through the
// stream's window, half-close in both orders, the server ending early,
// cancellation, deadlines, and every slot coming back (Channel::stats()).
// The cases are in stream_cases.h (shared with the verbs test in the VM).
#include <cstdint>
#include <cstdlib>

#include <slotrpc/config.h>

namespace {

// Messages of the long runs: 1,000,000 per kind in the release build.  The
// sanitizer builds run the same code 10-30 times slower, so there the count
// is 50,000, picked at compile time (GCC and Clang define
// __SANITIZE_ADDRESS__ / have __has_feature under -fsanitize=address).
// STREAM_MESSAGES=N overrides it for a manual run.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define CS_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define CS_SANITIZED 1
#endif
#endif
#ifdef CS_SANITIZED
constexpr uint64_t kLongRun = 50'000;
#else
constexpr uint64_t kLongRun = 1'000'000;
#endif

uint64_t stream_message_count() {
  const char* v = std::getenv("STREAM_MESSAGES");
  return v != nullptr ? std::strtoull(v, nullptr, 10) : kLongRun;
}

// The default transport choice: TCP on a host without an RDMA device.
slotrpc::Config stream_base_config() { return {}; }

}  // namespace

#define STREAM_CASE_PREFIX ""
#include "stream_cases.h"
