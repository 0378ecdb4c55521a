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

uint64_t stream_case_divisor() { return 1; }

}  // namespace

#define STREAM_CASE_PREFIX ""
#include "stream_cases.h"

#include <fstream>
#include <sstream>

namespace {

// VmRSS of this process, in bytes (/proc/self/status).
uint64_t rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      std::istringstream fields(line.substr(6));
      uint64_t kb = 0;
      fields >> kb;
      return kb * 1024;
    }
  }
  FAIL("no VmRSS in /proc/self/status");
  return 0;
}

}  // namespace

// A writer far faster than its reader: the handler stops reading for 300 ms
// after the first message (and for 5 ms every 500), while the client writes
// 20,000 messages of 3,900 bytes (78 MB) as fast as Write() returns.  If
// writes queued instead of waiting for the window, the writer would get
// thousands of messages ahead during the pause and the process (client and
// server are both in it) would hold most of the 78 MB; with the window it
// is never more than the window (plus the one the handler holds) ahead, and
// the rings are allocated before the stream starts.
TEST_CASE("slow reader and fast writer: the writer waits on the window, memory stays bounded, nothing is lost") {
  constexpr uint32_t kWindow = 4;
  constexpr uint64_t kMessages = 20'000;
  constexpr size_t kPayload = 3900;
  Fixture f(16, kWindow);
  f.unary_works();  // the session and its rings are up before the baseline
  auto w = f.load();
  const uint64_t rss0 = rss_bytes();
  uint64_t rss_max = rss0;
  uint64_t max_ahead = 0;
  for (uint64_t i = 0; i < kMessages; ++i) {
    REQUIRE(w.Write([i](flatbuffers::FlatBufferBuilder& fbb) {
      uint8_t* data = nullptr;
      auto vec = fbb.CreateUninitializedVector(kPayload, &data);
      for (size_t k = 0; k < kPayload; ++k) data[k] = static_cast<uint8_t>(i + k);
      return slotrpc::test::CreatePing(fbb, i, i == 0 ? fbb.CreateString("pauses") : 0, vec);
    }));
    const uint64_t read = f.server_read.load();
    max_ahead = std::max(max_ahead, (i + 1) - std::min(i + 1, read));
    if (i % 64 == 0) rss_max = std::max(rss_max, rss_bytes());
  }
  auto reply = w.Finish();
  REQUIRE(reply.ok());  // the handler checked the order and every byte
  CHECK(reply->seq() == kMessages);
  CHECK(reply->text()->str() == "sum:" + std::to_string(kMessages * kPayload));
  reply.release();
  MESSAGE("writer at most " << max_ahead << " messages ahead of the reader; RSS grew by "
                            << (rss_max - rss0) / 1024 << " KiB (" << kMessages * kPayload / 1024
                            << " KiB written)");
  CHECK(max_ahead <= kWindow + 1);
  CHECK(max_ahead >= kWindow);  // the writer did run into the window: the bound was tested
  CHECK(rss_max - rss0 < 16u * 1024 * 1024);
  CHECK(eventually([&] { return f.idle(); }));
}
