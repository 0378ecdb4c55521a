// The streaming test cases (client, bidi and server streaming), shared by
// the TCP test (tests/client_stream_test.cc) and the verbs test in the
// Soft-RoCE VM (tests/verbs/verbs_stream_test.cc): the same cases, every
// message checked in order, over both transports.
//
// Include it in exactly one translation unit, after defining
//   STREAM_CASE_PREFIX          a string literal that starts every test name
//                               ("" for TCP, "verbs: " over verbs), so the
//                               helper processes are found by name;
//   slotrpc::Config stream_base_config()   the transport, peer timeouts, ...
//                               (slot count, size and window are set here);
//   uint64_t stream_message_count()        messages per kind of the long runs;
//   uint64_t stream_case_divisor()         the other cases' message counts
//                               are divided by it (1 over TCP; the emulated
//                               VM is about 100 times slower).
#pragma once

#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <slotrpc/slotrpc.h>

#include "failure_util.h"
#include "test_messages_generated.h"

#ifndef STREAM_CASE_PREFIX
#error "define STREAM_CASE_PREFIX, stream_base_config() and stream_message_count() before including stream_cases.h"
#endif

namespace {

using slotrpc::StatusCode;
using slotrpc::test::Ping;
using slotrpc::test::Pong;
using namespace std::chrono_literals;

const uint32_t kLoad = slotrpc::method_id("test.CStreams.Load");
const uint32_t kSync = slotrpc::method_id("test.CStreams.Sync");
const uint32_t kEcho = slotrpc::method_id("test.CStreams.Echo");
const uint32_t kScan = slotrpc::method_id("test.CStreams.Scan");
const uint32_t kWatch = slotrpc::method_id("test.CStreams.Watch");

// A case's message count on this transport (never below 20).
uint64_t scaled(uint64_t n) { return std::max<uint64_t>(20, n / stream_case_divisor()); }

// Polls `pred` until it holds or `limit` passes.
template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds limit = 10s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(1ms);
  }
  return pred();
}

// Load: reads Pings, checks each seq is the next one (the first seq is the
// start), replies Pong{seq = count, text = "sum:<payload bytes>"}.  Text
// "stop-after-N" in a message ends the call with INVALID_ARGUMENT after N
// messages; "slow" makes the handler sleep 1 ms per message from then on;
// "pauses" makes it stop reading for 300 ms after the first message, then
// for 5 ms every 500.
// Sync (bidi): echoes each Ping as Pong with the same seq and payload; a
// Ping with text "end" makes the handler return OK at once (the server
// half-closes first).
struct Fixture {
  // Watch's updates from outside the call (the test thread), as a store's
  // writers would push them.
  std::mutex watch_mu;
  slotrpc::Notifier* watch_notifier = nullptr;
  uint64_t watch_updates = 0;
  std::atomic<uint64_t> watch_written{0};  // Watch's messages written (echoes and updates)
  void push_update() {
    std::lock_guard<std::mutex> lock(watch_mu);
    ++watch_updates;
    if (watch_notifier != nullptr) watch_notifier->notify();
  }
  std::atomic<uint64_t> server_read{0};
  std::atomic<uint64_t> server_written{0};  // Scan's messages written
  std::atomic<int> server_end_code{-1};
  std::atomic<bool> handler_done{false};
  slotrpc::Server server;
  std::unique_ptr<slotrpc::Channel> channel;
  uint32_t slots;

  explicit Fixture(uint32_t slot_count = 16, uint32_t window = 4, uint32_t slot_size = 4096)
      : server(config(slot_count, window, slot_size)), slots(slot_count) {
    slotrpc::ServiceDefinition svc("test.CStreams");
    svc.add_client_stream<Ping, Pong>(
        "Load", [this](slotrpc::ServerReader<Ping>& in, slotrpc::ReplyBuilder<Pong>& out,
                       slotrpc::ServerCall&) -> slotrpc::Status {
          uint64_t n = 0;
          uint64_t bytes = 0;
          uint64_t next = 0;
          bool first = true;
          uint64_t stop_after = 0;
          bool slow = false;
          bool pauses = false;
          while (const Ping* p = in.Read()) {
            if (!first && p->seq() != next) {
              return slotrpc::Status(StatusCode::kInvalidArgument,
                                     "out of order: got " + std::to_string(p->seq()) + " wanted " +
                                         std::to_string(next));
            }
            first = false;
            next = p->seq() + 1;
            if (p->payload() != nullptr) {
              for (uint32_t i = 0; i < p->payload()->size(); ++i) {
                if (p->payload()->Get(i) != static_cast<uint8_t>(p->seq() + i)) {
                  return slotrpc::Status(StatusCode::kInvalidArgument, "payload corrupted");
                }
              }
              bytes += p->payload()->size();
            }
            ++n;
            ++server_read;
            // The first message's text sets the mode for the whole stream.
            const std::string text = p->text() != nullptr ? p->text()->str() : "";
            if (text == "slow") slow = true;
            if (text == "pauses") pauses = true;
            if (text.rfind("stop-after-", 0) == 0) stop_after = std::stoull(text.substr(11));
            if (slow) slotrpc::this_fiber::sleep_for(1ms);
            if (pauses && (n == 1 || n % 500 == 0)) slotrpc::this_fiber::sleep_for(n == 1 ? 300ms : 5ms);
            if (stop_after != 0 && n >= stop_after) {
              handler_done = true;
              return slotrpc::Status(StatusCode::kInvalidArgument, "stopped early");
            }
          }
          server_end_code = static_cast<int>(in.status().code());
          handler_done = true;
          if (!in.status().ok()) return in.status();
          out.Finish(slotrpc::test::CreatePong(out.fbb(), n,
                                               out.fbb().CreateString("sum:" + std::to_string(bytes))));
          return {};
        });
    svc.add_bidi_stream<Ping, Pong>(
        "Sync", [this](slotrpc::ServerReaderWriter<Ping, Pong>& s, slotrpc::ServerCall&) -> slotrpc::Status {
          while (const Ping* p = s.Read()) {
            ++server_read;
            if (p->text() != nullptr && p->text()->str() == "end") {
              handler_done = true;
              return {};
            }
            const uint64_t seq = p->seq();
            std::vector<uint8_t> payload;
            if (p->payload() != nullptr) payload.assign(p->payload()->begin(), p->payload()->end());
            if (!s.Write([seq, &payload](flatbuffers::FlatBufferBuilder& fbb) {
                  return slotrpc::test::CreatePong(fbb, seq, 0, fbb.CreateVector(payload));
                })) {
              server_end_code = static_cast<int>(s.write_error().code());
              handler_done = true;
              return s.write_error();
            }
          }
          server_end_code = static_cast<int>(s.read_status().code());
          handler_done = true;
          return s.read_status();
        });
    // Scan (server streaming): Pong{seq = i} for i in 0..seq-1, each with a
    // payload of `text` bytes (a decimal number; none if empty), byte k =
    // (i + k) mod 256.
    svc.add_server_stream<Ping, Pong>(
        "Scan", [this](const Ping& req, slotrpc::ServerWriter<Pong>& out, slotrpc::ServerCall&) {
          const size_t size = req.text() != nullptr ? std::stoull(req.text()->str()) : 0;
          for (uint64_t i = 0; i < req.seq(); ++i) {
            const bool ok = out.Write([i, size](flatbuffers::FlatBufferBuilder& fbb) {
              flatbuffers::Offset<flatbuffers::Vector<uint8_t>> vec = 0;
              if (size != 0) {
                uint8_t* data = nullptr;
                vec = fbb.CreateUninitializedVector(size, &data);
                for (size_t k = 0; k < size; ++k) data[k] = static_cast<uint8_t>(i + k);
              }
              return slotrpc::test::CreatePong(fbb, i, 0, vec);
            });
            if (!ok) {
              server_end_code = static_cast<int>(out.error().code());
              handler_done = true;
              return out.error();
            }
            ++server_written;
          }
          handler_done = true;
          return slotrpc::Status();
        });
    // Watch (bidi): the handler waits for either a client message or an
    // update pushed from outside (push_update): a reader fiber reads and
    // notifies, the handler's fiber waits on the Notifier and writes
    // Pong{seq, "echo"} per message and Pong{updates so far, "update"} per
    // update; it ends when the client half-closes.
    svc.add_bidi_stream<Ping, Pong>(
        "Watch", [this](slotrpc::ServerReaderWriter<Ping, Pong>& s, slotrpc::ServerCall&) -> slotrpc::Status {
          slotrpc::Notifier n;
          std::deque<uint64_t> pings;  // the loop's fibers only: no lock
          bool reader_done = false;
          slotrpc::Status read_status;
          {
            std::lock_guard<std::mutex> lock(watch_mu);
            watch_notifier = &n;
          }
          uint64_t sent_updates = 0;
          {
            std::lock_guard<std::mutex> lock(watch_mu);
            sent_updates = watch_updates;  // only updates after the call started
          }
          REQUIRE(slotrpc::this_fiber::spawn([&] {
            while (const Ping* p = s.Read()) {
              pings.push_back(p->seq());
              n.notify();
            }
            read_status = s.read_status();
            reader_done = true;
            n.notify();
          }));
          slotrpc::Status result;
          for (;;) {
            n.wait();
            bool ok = true;
            while (ok && !pings.empty()) {
              const uint64_t seq = pings.front();
              pings.pop_front();
              ok = s.Write([seq](flatbuffers::FlatBufferBuilder& fbb) {
                return slotrpc::test::CreatePong(fbb, seq, fbb.CreateString("echo"));
              });
              if (ok) ++watch_written;
            }
            uint64_t updates = 0;
            {
              std::lock_guard<std::mutex> lock(watch_mu);
              updates = watch_updates;
            }
            while (ok && sent_updates < updates) {
              const uint64_t k = ++sent_updates;
              ok = s.Write([k](flatbuffers::FlatBufferBuilder& fbb) {
                return slotrpc::test::CreatePong(fbb, k, fbb.CreateString("update"));
              });
              if (ok) ++watch_written;
            }
            if (!ok && result.ok()) result = s.write_error();
            if (reader_done) break;  // the reader must finish before we return
          }
          {
            std::lock_guard<std::mutex> lock(watch_mu);
            watch_notifier = nullptr;
          }
          handler_done = true;
          return result.ok() ? read_status : result;
        });
    svc.add_typed_unary<Ping, Pong>(
        "Echo", [](const Ping& req, slotrpc::ReplyBuilder<Pong>& out, slotrpc::ServerCall&) {
          out.Finish(slotrpc::test::CreatePong(out.fbb(), req.seq()));
          return slotrpc::Status();
        });
    REQUIRE(server.add_service(std::move(svc)).ok());
    REQUIRE(server.start("127.0.0.1:0").ok());
    auto ch = slotrpc::Channel::connect("127.0.0.1:" + std::to_string(server.port()),
                                        config(slot_count, window, slot_size));
    REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
    channel = std::move(ch.value());
  }

  static slotrpc::Config config(uint32_t slots, uint32_t window, uint32_t slot_size) {
    slotrpc::Config c = stream_base_config();  // the includer's transport and timeouts
    c.slot_count = slots;
    c.slot_size = slot_size;
    c.stream_window = window;
    return c;
  }

  slotrpc::ClientWriter<Ping, Pong> load(slotrpc::CallOptions o = {}) {
    return channel->client_stream<Ping, Pong>(kLoad, o);
  }

  slotrpc::ClientReader<Pong> scan(uint64_t n, size_t payload = 0, slotrpc::CallOptions o = {}) {
    return channel->server_stream<Ping, Pong>(
        kScan,
        [n, payload](flatbuffers::FlatBufferBuilder& fbb) {
          return slotrpc::test::CreatePing(fbb, n, payload == 0 ? 0 : fbb.CreateString(std::to_string(payload)));
        },
        o);
  }

  // Every slot back on the free list, nothing lent or held.
  bool idle() {
    const auto st = channel->stats();
    return st.free_slots == slots && st.lent == 0 && st.in_flight == 0 && st.zombies == 0 &&
           st.held_replies == 0;
  }

  void unary_works() {
    auto r = channel->unary<Ping, Pong>(kEcho, [](flatbuffers::FlatBufferBuilder& fbb) {
                 return slotrpc::test::CreatePing(fbb, 77);
               }).get();
    REQUIRE(r.ok());
    CHECK(r->seq() == 77);
  }
};

slotrpc::Build<Ping> ping(uint64_t seq, std::string text = "") {
  return [seq, text](flatbuffers::FlatBufferBuilder& fbb) {
    return slotrpc::test::CreatePing(fbb, seq, text.empty() ? 0 : fbb.CreateString(text));
  };
}

slotrpc::Build<Ping> ping_payload(uint64_t seq, size_t size) {
  return [seq, size](flatbuffers::FlatBufferBuilder& fbb) {
    uint8_t* data = nullptr;
    auto vec = fbb.CreateUninitializedVector(size, &data);
    for (size_t i = 0; i < size; ++i) data[i] = static_cast<uint8_t>(seq + i);
    return slotrpc::test::CreatePing(fbb, seq, 0, vec);
  };
}

}  // namespace

// ---- Long runs: every kind, 1,000,000 small messages (kLongRun) ----------
// A larger ring and window than the other cases (64 slots, a window of 32),
// as a streaming deployment would use; every message is checked in order
// (counted, and one CHECK at the end: a REQUIRE per message would be most
// of the run's time).

TEST_CASE(STREAM_CASE_PREFIX "long run: server stream, kLongRun small messages in order") {
  Fixture f(64, 32);
  const uint64_t n = stream_message_count();
  auto r = f.scan(n);
  uint64_t expected = 0;
  uint64_t wrong = 0;
  while (auto m = r.Read()) {
    if (!m->ok() || m->message()->seq() != expected) ++wrong;
    ++expected;
  }
  CHECK(wrong == 0);
  CHECK(expected == n);
  CHECK(r.status().ok());
  CHECK(eventually([&] { return f.idle(); }));
}

TEST_CASE(STREAM_CASE_PREFIX "long run: client stream, kLongRun small messages in order, one reply") {
  Fixture f(64, 32);
  const uint64_t n = stream_message_count();
  auto w = f.load();
  uint64_t written = 0;
  // A lambda, not a Build<Ping>: no std::function per message.
  while (written < n && w.Write([i = written](flatbuffers::FlatBufferBuilder& fbb) {
           return slotrpc::test::CreatePing(fbb, i);
         })) {
    ++written;
  }
  CHECK(written == n);
  w.WritesDone();
  auto reply = w.Finish();
  REQUIRE(reply.ok());  // the handler checks the order and fails the call otherwise
  CHECK(reply->seq() == n);
  CHECK(f.server_read.load() == n);
  reply.release();  // a held reply keeps its slot
  CHECK(eventually([&] { return f.idle(); }));
  f.unary_works();
}

TEST_CASE(STREAM_CASE_PREFIX "long run: bidi, kLongRun small messages echoed in order, reads and writes on their own threads") {
  Fixture f(64, 32);
  const uint64_t n = stream_message_count();
  auto s = f.channel->bidi_stream<Ping, Pong>(kSync);
  std::thread writer([&] {
    for (uint64_t i = 0; i < n; ++i) {
      if (!s.Write([i](flatbuffers::FlatBufferBuilder& fbb) { return slotrpc::test::CreatePing(fbb, i); }))
        return;
    }
    s.WritesDone();  // the client half-closes first
  });
  uint64_t expected = 0;
  uint64_t wrong = 0;
  while (auto m = s.Read()) {
    if (!m->ok() || m->message()->seq() != expected) ++wrong;
    ++expected;
  }
  writer.join();
  CHECK(wrong == 0);
  CHECK(expected == n);
  CHECK(s.Finish().ok());
  CHECK(eventually([&] { return f.idle(); }));
  f.unary_works();
}

TEST_CASE(STREAM_CASE_PREFIX "server stream: messages near the slot size, every byte checked") {
  constexpr uint32_t kSlotSize = 4096;
  Fixture f(8, 4, kSlotSize);
  const size_t size = kSlotSize - 32 - 64;
  auto r = f.scan(scaled(2000), size);
  uint64_t expected = 0;
  while (auto m = r.Read()) {
    REQUIRE(m->ok());
    REQUIRE(m->message()->seq() == expected);
    const auto* p = m->message()->payload();
    REQUIRE(p != nullptr);
    REQUIRE(p->size() == size);
    for (uint32_t i = 0; i < p->size(); ++i) REQUIRE(p->Get(i) == static_cast<uint8_t>(expected + i));
    ++expected;
  }
  CHECK(expected == scaled(2000));
  CHECK(r.status().ok());
  // One more byte than fits: the server's write fails, and so does the call.
  auto too_big = f.scan(1, kSlotSize);
  while (too_big.Read()) {
  }
  CHECK(too_big.status().code() == StatusCode::kResourceExhausted);
  CHECK(eventually([&] { return f.idle(); }));
}

TEST_CASE(STREAM_CASE_PREFIX "server stream: the client cancels mid-stream") {
  Fixture f(8, 2);
  auto r = f.scan(1'000'000);
  for (uint64_t i = 0; i < 10; ++i) {
    auto m = r.Read();
    REQUIRE(m.has_value());
    REQUIRE(m->ok());
    REQUIRE(m->message()->seq() == i);
  }
  r.Cancel();
  while (r.Read()) {
  }
  CHECK(r.status().code() == StatusCode::kCancelled);
  REQUIRE(eventually([&] { return f.handler_done.load(); }));
  CHECK(f.server_end_code.load() == static_cast<int>(StatusCode::kCancelled));
  CHECK(eventually([&] { return f.idle(); }));
  f.unary_works();
}

TEST_CASE(STREAM_CASE_PREFIX "server stream: the deadline passes mid-stream") {
  Fixture f(8, 2);
  auto r = f.scan(1'000'000, 0, slotrpc::CallOptions::with_timeout(300ms));
  // Read two, then stop reading: the server stalls on the window and the
  // deadline ends the call on both sides.
  for (uint64_t i = 0; i < 2; ++i) {
    auto m = r.Read();
    REQUIRE(m.has_value());
    REQUIRE(m->ok());
    REQUIRE(m->message()->seq() == i);
  }
  REQUIRE(eventually([&] { return f.handler_done.load(); }));
  CHECK(f.server_end_code.load() == static_cast<int>(StatusCode::kDeadlineExceeded));
  uint64_t n = 2;
  while (auto m = r.Read()) {
    if (m->ok()) CHECK(m->message()->seq() == n);
    ++n;
  }
  CHECK(n <= 2 + 2 + 1);  // at most the window (and the one in hand) was written ahead
  CHECK(r.status().code() == StatusCode::kDeadlineExceeded);
  CHECK(eventually([&] { return f.idle(); }));
  f.unary_works();
}

TEST_CASE(STREAM_CASE_PREFIX "client stream: messages near the slot size, every byte checked") {
  constexpr uint32_t kSlotSize = 4096;
  Fixture f(8, 4, kSlotSize);
  // Header 32 + FlatBuffer overhead: a payload of slot - 32 - 64 fits; a
  // payload as large as the slot does not and fails the stream.
  const size_t size = kSlotSize - 32 - 64;
  auto w = f.load();
  for (uint64_t i = 0; i < scaled(2000); ++i) REQUIRE(w.Write(ping_payload(i, size)));
  auto reply = w.Finish();
  REQUIRE(reply.ok());
  CHECK(reply->seq() == scaled(2000));
  CHECK(reply->text()->str() == "sum:" + std::to_string(scaled(2000) * size));
  reply.release();
  CHECK(eventually([&] { return f.idle(); }));

  auto too_big = f.load();
  REQUIRE(too_big.Write(ping(0)));
  // Built on this thread, in the send slot: Write() itself fails, and the
  // stream with it (the next writes fail with the same status).
  CHECK_FALSE(too_big.Write(ping_payload(1, kSlotSize)));
  CHECK(too_big.status().code() == StatusCode::kResourceExhausted);
  uint64_t i = 2;
  while (too_big.Write(ping(i))) REQUIRE(++i < 1'000'000);
  CHECK(too_big.status().code() == StatusCode::kResourceExhausted);
  auto r = too_big.Finish();
  CHECK(r.status().code() == StatusCode::kResourceExhausted);
  CHECK(eventually([&] { return f.idle(); }));
  f.unary_works();
}

TEST_CASE(STREAM_CASE_PREFIX "client stream: an empty stream gets its reply") {
  Fixture f;
  auto w = f.load();
  auto reply = w.Finish();
  REQUIRE(reply.ok());
  CHECK(reply->seq() == 0);
  reply.release();
  CHECK(eventually([&] { return f.idle(); }));
}

TEST_CASE(STREAM_CASE_PREFIX "client stream: the server ends the call early; the next write fails with its status") {
  Fixture f(8, 2);
  auto w = f.load();
  REQUIRE(w.Write(ping(0, "stop-after-3")));
  uint64_t i = 1;
  // The server stops after 3 messages; writes keep succeeding until the
  // end reaches the client, then fail with the server's status.
  while (w.Write(ping(i))) {
    ++i;
    REQUIRE(i < 1'000'000);
  }
  CHECK(w.status().code() == StatusCode::kInvalidArgument);
  CHECK(w.status().message() == "stopped early");
  auto reply = w.Finish();
  CHECK(reply.status().code() == StatusCode::kInvalidArgument);
  CHECK(eventually([&] { return f.idle(); }));
  f.unary_works();
}

TEST_CASE(STREAM_CASE_PREFIX "client stream: the client cancels mid-stream") {
  Fixture f(8, 2);
  auto w = f.load();
  for (uint64_t i = 0; i < 100; ++i) REQUIRE(w.Write(ping(i)));
  REQUIRE(eventually([&] { return f.server_read.load() >= 1; }));
  w.Cancel();  // takes effect on the channel's loop, soon
  uint64_t i = 100;
  while (w.Write(ping(i))) REQUIRE(++i < 1'000'000);
  CHECK(w.status().code() == StatusCode::kCancelled);
  auto reply = w.Finish();
  CHECK(reply.status().code() == StatusCode::kCancelled);
  REQUIRE(eventually([&] { return f.handler_done.load(); }));
  CHECK(f.server_end_code.load() == static_cast<int>(StatusCode::kCancelled));
  CHECK(eventually([&] { return f.idle(); }));
  f.unary_works();
}

TEST_CASE(STREAM_CASE_PREFIX "client stream: the deadline passes mid-stream") {
  Fixture f(8, 2);
  auto w = f.load(slotrpc::CallOptions::with_timeout(200ms));
  uint64_t i = 0;
  // The server reads slowly (1 ms a message): the writer is held back by
  // the window and the deadline ends the stream.
  while (w.Write(ping(i, "slow"))) {
    ++i;
    REQUIRE(i < 100'000);
  }
  CHECK(w.status().code() == StatusCode::kDeadlineExceeded);
  CHECK(w.Finish().status().code() == StatusCode::kDeadlineExceeded);
  REQUIRE(eventually([&] { return f.handler_done.load(); }));
  CHECK(f.server_end_code.load() == static_cast<int>(StatusCode::kDeadlineExceeded));
  CHECK(eventually([&] { return f.idle(); }));
  f.unary_works();
}

TEST_CASE(STREAM_CASE_PREFIX "client stream: a slow reader holds a fast writer to the window") {
  constexpr uint32_t kWindow = 3;
  Fixture f(8, kWindow);
  auto w = f.load();
  uint64_t max_ahead = 0;
  for (uint64_t i = 0; i < 200; ++i) {
    REQUIRE(w.Write(ping(i, "slow")));
    // What the client has written and the server not yet read is bounded by
    // the window plus the one message the handler holds.
    const uint64_t read = f.server_read.load();
    max_ahead = std::max(max_ahead, (i + 1) - std::min(i + 1, read));
    CHECK(f.channel->stats().lent <= kWindow);
  }
  CHECK(max_ahead <= kWindow + 1);
  CHECK(max_ahead >= 2);  // the writer did get ahead: the bound was tested
  auto reply = w.Finish();
  REQUIRE(reply.ok());
  CHECK(reply->seq() == 200);
  reply.release();
  CHECK(eventually([&] { return f.idle(); }));
}

TEST_CASE(STREAM_CASE_PREFIX "client stream: more concurrent streams than credits all finish") {
  constexpr uint32_t kSlots = 8;
  Fixture f(kSlots, 4);
  constexpr int kStreams = 12;  // each needs 2 credits to start: 24 > 8
  const uint64_t kEach = scaled(2000);
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < kStreams; ++t) {
    threads.emplace_back([&] {
      auto w = f.load();
      for (uint64_t i = 0; i < kEach; ++i) {
        if (!w.Write(ping(i))) return;
      }
      auto r = w.Finish();
      if (r.ok() && r->seq() == kEach) ++ok;
    });
  }
  for (auto& t : threads) t.join();
  CHECK(ok.load() == kStreams);
  CHECK(eventually([&] { return f.idle(); }));
  f.unary_works();
}

TEST_CASE(STREAM_CASE_PREFIX "client stream: a unary method called as a client stream is refused") {
  Fixture f;
  auto w = f.channel->client_stream<Ping, Pong>(kEcho);
  auto r = w.Finish();
  CHECK(r.status().code() == StatusCode::kInvalidArgument);
  CHECK(eventually([&] { return f.idle(); }));
}

TEST_CASE(STREAM_CASE_PREFIX "bidi: messages near the slot size, every byte checked") {
  constexpr uint32_t kSlotSize = 4096;
  Fixture f(8, 2, kSlotSize);
  const size_t size = kSlotSize - 32 - 64;
  auto s = f.channel->bidi_stream<Ping, Pong>(kSync);
  std::thread writer([&] {
    for (uint64_t i = 0; i < scaled(1000); ++i) {
      if (!s.Write(ping_payload(i, size))) return;
    }
    s.WritesDone();
  });
  uint64_t expected = 0;
  while (auto m = s.Read()) {
    REQUIRE(m->ok());
    REQUIRE(m->message()->seq() == expected);
    const auto* p = m->message()->payload();
    REQUIRE(p != nullptr);
    REQUIRE(p->size() == size);
    for (uint32_t i = 0; i < p->size(); ++i) REQUIRE(p->Get(i) == static_cast<uint8_t>(expected + i));
    ++expected;
  }
  writer.join();
  CHECK(expected == scaled(1000));
  CHECK(s.Finish().ok());
  CHECK(eventually([&] { return f.idle(); }));
}

TEST_CASE(STREAM_CASE_PREFIX "bidi: the server half-closes first; the client's writes then fail, reads end") {
  Fixture f(8, 2);
  auto s = f.channel->bidi_stream<Ping, Pong>(kSync);
  REQUIRE(s.Write(ping(0)));
  REQUIRE(s.Write(ping(1, "end")));
  uint64_t n = 0;
  while (auto m = s.Read()) {
    CHECK(m->message()->seq() == n);
    ++n;
  }
  CHECK(n == 1);
  // The stream is over: a write fails with the final status (OK here).
  CHECK_FALSE(s.Write(ping(2)));
  CHECK(s.write_status().ok());
  CHECK(s.Finish().ok());
  CHECK(eventually([&] { return f.idle(); }));
  f.unary_works();
}

TEST_CASE(STREAM_CASE_PREFIX "bidi: the client cancels mid-stream") {
  Fixture f(8, 2);
  auto s = f.channel->bidi_stream<Ping, Pong>(kSync);
  for (uint64_t i = 0; i < 2; ++i) REQUIRE(s.Write(ping(i)));
  auto first = s.Read();
  REQUIRE(first.has_value());
  REQUIRE(first->ok());
  s.Cancel();
  while (s.Read()) {
  }
  // Read() ended: so did the writes.
  CHECK_FALSE(s.Write(ping(9)));
  CHECK(s.write_status().code() == StatusCode::kCancelled);
  CHECK(s.Finish().code() == StatusCode::kCancelled);
  REQUIRE(eventually([&] { return f.handler_done.load(); }));
  CHECK(f.server_end_code.load() == static_cast<int>(StatusCode::kCancelled));
  first.reset();
  CHECK(eventually([&] { return f.idle(); }));
  f.unary_works();
}

TEST_CASE(STREAM_CASE_PREFIX "bidi: the deadline passes mid-stream") {
  Fixture f(8, 2);
  auto s = f.channel->bidi_stream<Ping, Pong>(kSync, slotrpc::CallOptions::with_timeout(200ms));
  // Write without reading: the server's writes fill the window, then it
  // stops reading, then our writes stall; the deadline ends it all.
  uint64_t i = 0;
  while (s.Write(ping(i))) {
    ++i;
    REQUIRE(i < 100'000);
  }
  CHECK(s.write_status().code() == StatusCode::kDeadlineExceeded);
  CHECK(s.Finish().code() == StatusCode::kDeadlineExceeded);
  REQUIRE(eventually([&] { return f.handler_done.load(); }));
  CHECK(f.server_end_code.load() == static_cast<int>(StatusCode::kDeadlineExceeded));
  CHECK(eventually([&] { return f.idle(); }));
  f.unary_works();
}

TEST_CASE(STREAM_CASE_PREFIX "bidi: more concurrent streams than credits all finish") {
  constexpr uint32_t kSlots = 8;
  Fixture f(kSlots, 2);
  constexpr int kStreams = 10;  // each needs 3 credits to start: 30 > 8
  const uint64_t kEach = scaled(1000);
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < kStreams; ++t) {
    threads.emplace_back([&] {
      auto s = f.channel->bidi_stream<Ping, Pong>(kSync);
      std::thread writer([&] {
        for (uint64_t i = 0; i < kEach; ++i) {
          if (!s.Write(ping(i))) return;
        }
        s.WritesDone();
      });
      uint64_t n = 0;
      bool in_order = true;
      while (auto m = s.Read()) {
        in_order = in_order && m->ok() && m->message()->seq() == n;
        ++n;
      }
      writer.join();
      if (s.Finish().ok() && in_order && n == kEach) ++ok;
    });
  }
  for (auto& t : threads) t.join();
  CHECK(ok.load() == kStreams);
  CHECK(eventually([&] { return f.idle(); }));
  f.unary_works();
}

TEST_CASE(STREAM_CASE_PREFIX "bidi: a handler waits for a client message or an outside update (reader fiber + Notifier)") {
  Fixture f(16, 4);
  auto s = f.channel->bidi_stream<Ping, Pong>(kWatch);
  auto next = [&](const char* what, uint64_t seq) {
    auto m = s.Read();
    REQUIRE(m.has_value());
    REQUIRE(m->ok());
    CHECK(m->message()->text()->str() == what);
    CHECK(m->message()->seq() == seq);
  };
  REQUIRE(s.Write(ping(7)));
  next("echo", 7);
  // No client message: the update alone must reach the client, so the
  // handler is not stuck in Read().
  REQUIRE(eventually([&] {
    std::lock_guard<std::mutex> lock(f.watch_mu);
    return f.watch_notifier != nullptr;
  }));
  f.push_update();
  next("update", 1);
  f.push_update();
  f.push_update();
  next("update", 2);
  next("update", 3);
  REQUIRE(s.Write(ping(8)));
  next("echo", 8);
  s.WritesDone();
  CHECK_FALSE(s.Read().has_value());
  CHECK(s.Finish().ok());
  CHECK(f.handler_done.load());
  CHECK(eventually([&] { return f.idle(); }));
  f.unary_works();
}

// The server session keeps two waiters per call, a fiber in Write() and one
// in Read() (ServerSession::Slot::waiter and read_waiter): here both wait at
// once.  The reader fiber waits for a client message; the handler's fiber
// then blocks in Write() on the window (more updates than credits).  With a
// single waiter field the writer's wait would overwrite the reader's: the
// grants wake the writer, and the next client message finds no reader to
// wake, so its echo never comes (the deadline ends the call instead).
TEST_CASE(STREAM_CASE_PREFIX "bidi: a reader fiber waiting in Read() and a writer blocked on credits are both woken") {
  constexpr uint32_t kWindow = 2;
  Fixture f(16, kWindow);
  auto s = f.channel->bidi_stream<Ping, Pong>(kWatch, slotrpc::CallOptions::with_timeout(10s));
  auto next = [&](const char* what, uint64_t seq) {
    auto m = s.Read();
    REQUIRE_MESSAGE(m.has_value(), "the stream ended: " << s.Finish().to_string());
    REQUIRE_MESSAGE(m->ok(), m->status().to_string());
    CHECK(m->message()->text()->str() == what);
    CHECK(m->message()->seq() == seq);
  };
  REQUIRE(s.Write(ping(7)));
  next("echo", 7);  // the reader fiber is back in Read(), waiting
  REQUIRE(eventually([&] {
    std::lock_guard<std::mutex> lock(f.watch_mu);
    return f.watch_notifier != nullptr;
  }));
  constexpr uint64_t kUpdates = 4 * kWindow;
  for (uint64_t k = 0; k < kUpdates; ++k) f.push_update();
  // The handler wrote the window's worth and blocks in Write() for a grant
  // before its loop runs anything else (fibers on one loop take turns), so
  // our reads below, which send the grants, come after it waits.
  REQUIRE(eventually([&] { return f.watch_written.load() >= 1 + kWindow; }));
  for (uint64_t k = 1; k <= kUpdates; ++k) next("update", k);
  REQUIRE(s.Write(ping(9)));
  next("echo", 9);  // the reader fiber was woken by the message
  s.WritesDone();
  CHECK_FALSE(s.Read().has_value());
  CHECK(s.Finish().ok());
  CHECK(eventually([&] { return f.idle(); }));
}

// ---- Peer processes killed mid-stream --------------------------------------
// The child is this test binary, re-run with one of the two helper cases
// below (skipped unless named with --no-skip): a server that writes its port
// to CS_PORT_FILE, or a client that streams to CS_PORT until killed.

namespace {

std::string self_exe() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

std::unique_ptr<failure_test::Child> spawn_helper(const failure_test::TempDir& dir, const std::string& name) {
  return std::make_unique<failure_test::Child>(
      std::vector<std::string>{self_exe(), "--no-skip", "--test-case=" STREAM_CASE_PREFIX + name},
      test_process::SpawnOptions::to_files(dir.path, "helper"));
}

}  // namespace

TEST_CASE(STREAM_CASE_PREFIX "helper: stream server process" * doctest::skip()) {
  const char* port_file = std::getenv("CS_PORT_FILE");
  REQUIRE(port_file != nullptr);
  Fixture f;
  const std::string tmp = std::string(port_file) + ".tmp";
  {
    std::ofstream out(tmp);
    out << f.server.port();
  }
  std::filesystem::rename(tmp, port_file);
  for (;;) ::pause();  // until the test kills it
}

TEST_CASE(STREAM_CASE_PREFIX "helper: stream client process" * doctest::skip()) {
  const char* port = std::getenv("CS_PORT");
  const char* mode = std::getenv("CS_MODE");
  REQUIRE(port != nullptr);
  REQUIRE(mode != nullptr);
  auto ch = slotrpc::Channel::connect(std::string("127.0.0.1:") + port, Fixture::config(8, 2, 4096));
  REQUIRE(ch.ok());
  if (std::string(mode) == "client") {
    auto w = ch.value()->client_stream<Ping, Pong>(kLoad);
    for (uint64_t i = 0; w.Write(ping(i)); ++i) {
    }
  } else if (std::string(mode) == "server") {
    auto r = ch.value()->server_stream<Ping, Pong>(
        kScan, [](flatbuffers::FlatBufferBuilder& fbb) { return slotrpc::test::CreatePing(fbb, ~uint64_t{0}); });
    while (r.Read()) {
    }
  } else {
    auto s = ch.value()->bidi_stream<Ping, Pong>(kSync);
    std::thread reader([&] {
      while (s.Read()) {
      }
    });
    for (uint64_t i = 0; s.Write(ping(i)); ++i) {
    }
    reader.join();
  }
  ::_exit(3);  // the stream ended before the kill: the test sees exit 3, not SIGKILL
}

// How long a side may take to see its peer process gone: the peer timeout
// (a verbs peer that vanishes says nothing; TCP sees the close at once), plus
// a second for the keepalive tick and a slow (emulated) machine.
std::chrono::milliseconds peer_gone_limit() {
  return std::chrono::milliseconds(stream_base_config().peer_timeout_ms) + 1000ms;
}

TEST_CASE(STREAM_CASE_PREFIX "all three kinds: the server process is killed mid-stream: UNAVAILABLE within the peer timeout") {
  failure_test::TempDir dir;
  const std::string port_file = (dir.path / "port").string();
  ::setenv("CS_PORT_FILE", port_file.c_str(), 1);
  auto child = spawn_helper(dir, "helper: stream server process");
  std::string port;
  REQUIRE(eventually(
      [&] {
        port = failure_test::read_file(port_file);
        return !port.empty() || !child->running();
      },
      60s));  // a fresh process: see the client-killed case below
  REQUIRE_MESSAGE(!port.empty(), "helper wrote no port: " << child->stderr_text());
  // 16 slots: each of the three streams takes its call slot and a window of 2.
  auto ch = slotrpc::Channel::connect("127.0.0.1:" + port, Fixture::config(16, 2, 4096));
  REQUIRE(ch.ok());
  auto w = ch.value()->client_stream<Ping, Pong>(kLoad);
  auto s = ch.value()->bidi_stream<Ping, Pong>(kSync);
  auto r = ch.value()->server_stream<Ping, Pong>(
      kScan, [](flatbuffers::FlatBufferBuilder& fbb) { return slotrpc::test::CreatePing(fbb, ~uint64_t{0}); });
  for (uint64_t i = 0; i < 50; ++i) REQUIRE(w.Write(ping(i)));
  REQUIRE(s.Write(ping(0)));
  auto echoed = s.Read();
  REQUIRE(echoed.has_value());
  REQUIRE(echoed->ok());
  echoed.reset();
  {
    auto scanned = r.Read();
    REQUIRE(scanned.has_value());
    REQUIRE(scanned->ok());
  }
  child->kill_and_reap();
  const auto killed = std::chrono::steady_clock::now();
  uint64_t i = 50;
  while (w.Write(ping(i))) REQUIRE(++i < 10'000'000);
  const auto noticed = std::chrono::steady_clock::now() - killed;
  CHECK(noticed <= peer_gone_limit());
  MESSAGE("server killed: the writer saw UNAVAILABLE after "
          << std::chrono::duration_cast<std::chrono::milliseconds>(noticed).count() << " ms");
  while (r.Read()) {
  }
  CHECK(r.status().code() == StatusCode::kUnavailable);
  CHECK(w.status().code() == StatusCode::kUnavailable);
  CHECK(w.Finish().status().code() == StatusCode::kUnavailable);
  while (s.Read()) {
  }
  CHECK_FALSE(s.Write(ping(1)));
  CHECK(s.write_status().code() == StatusCode::kUnavailable);
  CHECK(s.Finish().code() == StatusCode::kUnavailable);
}

TEST_CASE(STREAM_CASE_PREFIX "all three kinds: the client process is killed mid-stream: the server goes on") {
  for (const std::string mode : {"client", "bidi", "server"}) {
    CAPTURE(mode);
    Fixture f(8, 2);
    failure_test::TempDir dir;
    const std::string port = std::to_string(f.server.port());
    ::setenv("CS_PORT", port.c_str(), 1);
    ::setenv("CS_MODE", mode.c_str(), 1);
    auto child = spawn_helper(dir, "helper: stream client process");
    // A generous bound: the child is a fresh process that must load and
    // connect first (a sanitized binary in the emulated VM takes seconds).
    REQUIRE_MESSAGE(eventually([&] {
                      return f.server_read.load() + f.server_written.load() >= 100 || !child->running();
                    }, 60s),
                    child->stderr_text());
    REQUIRE_MESSAGE(child->running(), "helper exited early: " << child->stderr_text());
    child->kill_and_reap();
    const auto killed = std::chrono::steady_clock::now();
    // The handler's Read() (or Write()) ends with UNAVAILABLE once the
    // session sees the connection close (TCP) or the peer timeout pass.
    REQUIRE(eventually([&] { return f.handler_done.load(); }));
    CHECK(std::chrono::steady_clock::now() - killed <= peer_gone_limit());
    CHECK(f.server_end_code.load() == static_cast<int>(StatusCode::kUnavailable));
    // The server keeps serving: a unary call and a new stream on another channel.
    f.unary_works();
    auto w = f.load();
    for (uint64_t i = 0; i < 100; ++i) REQUIRE(w.Write(ping(i)));
    auto r = w.Finish();
    REQUIRE(r.ok());
    CHECK(r->seq() == 100);
  }
}
