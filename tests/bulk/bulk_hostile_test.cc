// A handler's read_bulk against a client that does not play along, over
// TCP with frames built by hand (tests/raw_tcp_client.h): a client that
// never answers the server's READ_REQ, and one that ends the read with a
// status of its own.
//
// The wait of a handler's bulk transfer is bounded (lib/core/bulk/
// server_bulk.h): by the call's deadline plus one second, or by
// bulk_timeout_ms (SLOTRPC_BULK_TIMEOUT_MS) for a call without one.  Past
// it the handler gets DEADLINE_EXCEEDED and the session is closed.
#include <doctest/doctest.h>
#include <slotrpc/slotrpc.h>

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "../raw_tcp_client.h"
#include "core/bulk/descriptors.h"
#include "core/wire_format.h"

using namespace slotrpc;
using namespace raw_tcp;
using namespace std::chrono_literals;

namespace {

constexpr uint32_t kBulkMarker = 0xC000'0000u;  // lib/transport/tcp/tcp_transport.h
constexpr uint32_t kReadRequest = 1;
constexpr uint32_t kReadData = 2;
constexpr uint64_t kSegment = 64 * 1024;

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// What the handler's read_bulk returned, and when.
struct Outcome {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
  Clock::time_point at;

  void set(Status st) {
    std::lock_guard<std::mutex> lock(mu);
    status = std::move(st);
    at = Clock::now();
    done = true;
    cv.notify_all();
  }
  // Waits for the handler's read_bulk to return, at most `limit`.
  bool wait(std::chrono::milliseconds limit) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, limit, [&] { return done; });
  }
};

// A server (keepalives answered or not, the hostile client stays: a long
// peer_timeout_ms) whose one method reads its incoming segment 0.
struct ReadServer {
  Outcome outcome;
  Server server;
  uint32_t method = method_id("slotrpc.test.Hostile.Read");

  explicit ReadServer(uint32_t bulk_timeout_ms) : server(config(bulk_timeout_ms)) {
    ServiceDefinition svc("slotrpc.test.Hostile");
    svc.add_method("Read", [this](ServerCall& call) {
      std::vector<std::byte> dest(kSegment);
      Status st = call.read_bulk(0, dest);
      outcome.set(st);
      return st.ok() ? Status(StatusCode::kInternal, "the read cannot succeed here") : st;
    });
    REQUIRE(server.add_service(std::move(svc)).ok());
    const Status started = server.start("127.0.0.1:0");
    REQUIRE_MESSAGE(started.ok(), started.to_string());
  }

  static Config config(uint32_t bulk_timeout_ms) {
    Config c;
    c.keepalive_ms = 1000;
    c.peer_timeout_ms = 600'000;  // the session ends only for the bulk transfer
    c.bulk_timeout_ms = bulk_timeout_ms;
    c.tcp_bulk_lane = 0;
    c.tcp_bulk_push = 0;
    return c;
  }
};

// Sends a request offering one 64 KiB segment for the server to read
// (rkey 1), with `timeout_us` as its deadline (0: none).
void send_bulk_request(int fd, uint32_t method, uint32_t timeout_us) {
  bulk::RequestBlock block;
  block.reads = 1;
  block.segments[0] = transport::RemoteSegment{0, kSegment, 1};
  std::vector<std::byte> payload(block.bytes() + 8);  // block, then 8 bytes of (ignored) request
  bulk::encode_request_block(block, payload.data());
  auto h = request_header(method, 7, 1, 1, payload.size());
  h.flags |= core::kFlagBulk;
  h.timeout_us = timeout_us;
  send_bytes(fd, frame(false, core::make_imm(1, 1), body_of(h, payload)));
}

struct BulkHeader {
  uint32_t type = 0, rkey = 0, status = 0;
  uint64_t tag = 0, addr = 0, length = 0;
};

uint64_t load_u64(const std::byte* p) { return uint64_t{load_u32(p)} | uint64_t{load_u32(p + 4)} << 32; }
void store_u64(std::byte* p, uint64_t v) {
  store_u32(p, static_cast<uint32_t>(v));
  store_u32(p + 4, static_cast<uint32_t>(v >> 32));
}

// Reads frames until the server's READ_REQ, skipping its control frames.
BulkHeader read_request(int fd) {
  const auto deadline = Clock::now() + 5s;
  for (;;) {
    std::array<std::byte, 8> prefix;
    Status st = rpc::read_exact(fd, prefix, deadline);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    const uint32_t word = load_u32(prefix.data());
    if ((word & kBulkMarker) == kBulkMarker) {
      std::array<std::byte, 32> head;
      st = rpc::read_exact(fd, head, deadline);
      REQUIRE_MESSAGE(st.ok(), st.to_string());
      BulkHeader h;
      h.type = word & ~kBulkMarker;
      h.rkey = load_u32(head.data());
      h.status = load_u32(head.data() + 4);
      h.tag = load_u64(head.data() + 8);
      h.addr = load_u64(head.data() + 16);
      h.length = load_u64(head.data() + 24);
      REQUIRE(h.type == kReadRequest);
      return h;
    }
    std::vector<std::byte> body(word & ~kControlLane);
    REQUIRE(body.size() <= 65536);
    st = rpc::read_exact(fd, body, deadline);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    REQUIRE((word & kControlLane) != 0);  // no reply before the read ended
  }
}

// A failed READ_DATA: length 0, `status` nonzero (docs/protocol.md).
void send_failed_read(int fd, const BulkHeader& req, uint32_t status) {
  std::vector<std::byte> f(8 + 32);
  store_u32(f.data(), kBulkMarker | kReadData);
  store_u32(f.data() + 4, 0);
  store_u32(f.data() + 8, req.rkey);
  store_u32(f.data() + 12, status);
  store_u64(f.data() + 16, req.tag);
  store_u64(f.data() + 24, 0);
  store_u64(f.data() + 32, 0);
  send_bytes(fd, f);
}

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

TEST_CASE("bulk: a READ_REQ the client never answers ends at bulk_timeout_ms for a call without a deadline") {
  ReadServer s(300);
  Fd fd(raw_connect(s.server.port()));
  const auto sent = Clock::now();
  send_bulk_request(fd.fd, s.method, 0);
  const BulkHeader req = read_request(fd.fd);
  CHECK(req.length == kSegment);
  // ... and nothing more from this client.
  REQUIRE_MESSAGE(s.outcome.wait(10s), "the handler is still held in read_bulk after 10 s");
  std::lock_guard<std::mutex> lock(s.outcome.mu);
  CHECK(s.outcome.status.code() == StatusCode::kDeadlineExceeded);
  CHECK_MESSAGE(contains(s.outcome.status.message(), "SLOTRPC_BULK_TIMEOUT_MS"), s.outcome.status.message());
  CHECK_MESSAGE(contains(s.outcome.status.message(), "read_bulk of segment 0"), s.outcome.status.message());
  CHECK(ms_between(sent, s.outcome.at) >= 290);
  // The session is closed: the link could still write into the handler's
  // memory otherwise.
  CHECK(closed_by_peer(fd.fd, 5000ms));
}

TEST_CASE("bulk: a READ_REQ the client never answers ends at the call's deadline plus the grace") {
  ReadServer s(600'000);  // not this bound: the call's deadline
  Fd fd(raw_connect(s.server.port()));
  const auto sent = Clock::now();
  send_bulk_request(fd.fd, s.method, 200'000);  // 200 ms
  (void)read_request(fd.fd);
  REQUIRE_MESSAGE(s.outcome.wait(10s), "the handler is still held in read_bulk after 10 s");
  std::lock_guard<std::mutex> lock(s.outcome.mu);
  CHECK(s.outcome.status.code() == StatusCode::kDeadlineExceeded);
  CHECK_MESSAGE(contains(s.outcome.status.message(), "deadline"), s.outcome.status.message());
  // 200 ms and the 1 s grace for the client's own revoke.
  CHECK(ms_between(sent, s.outcome.at) >= 1150);
  CHECK(closed_by_peer(fd.fd, 5000ms));
}

TEST_CASE("bulk: a failed READ_DATA's status is named in read_bulk's error, and the session goes on") {
  struct Case {
    uint32_t status;
    StatusCode code;
    std::string text;
  };
  const Case cases[] = {
      {999, StatusCode::kUnavailable, "the client ended the transfer with status 999, which is no status code"},
      {14, StatusCode::kUnavailable, "the client ended the transfer with status UNAVAILABLE"},
      {8, StatusCode::kResourceExhausted, "the client ended the transfer with status RESOURCE_EXHAUSTED"},
      {0x12345678, StatusCode::kUnavailable, "status 65535 or above"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.status);
    ReadServer s(600'000);
    Fd fd(raw_connect(s.server.port()));
    send_bulk_request(fd.fd, s.method, 0);
    const BulkHeader req = read_request(fd.fd);
    send_failed_read(fd.fd, req, c.status);
    REQUIRE_MESSAGE(s.outcome.wait(10s), "read_bulk did not return");
    std::lock_guard<std::mutex> lock(s.outcome.mu);
    CHECK(s.outcome.status.code() == c.code);
    CHECK_MESSAGE(contains(s.outcome.status.message(), c.text), s.outcome.status.message());
    CHECK_MESSAGE(!contains(s.outcome.status.message(), "lost"), s.outcome.status.message());
    // The call's error reply comes back on the same session.
    const Frame reply = read_slot_frame(fd.fd);
    const core::Header h = core::decode_header(reply.body.data());
    CHECK(h.kind() == core::Kind::kError);
    CHECK(h.request_id == 7);
    const std::string text(reinterpret_cast<const char*>(reply.body.data()) + core::kHeaderSize,
                           h.payload_len);
    CHECK_MESSAGE(contains(text, c.text), text);
  }
}
