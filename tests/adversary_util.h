// Shared by the adversarial tests (adversarial_test over TCP,
// verbs/verbs_adversarial_test over verbs): the server's log captured line
// by line, the questions the tests ask of it, and the well-behaved client
// that calls throughout an attack and must complete every call.
#pragma once

#include <doctest/doctest.h>
#include <slotrpc/slotrpc.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstddef>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/wire_format.h"
#include "log_capture.h"
#include "process_util.h"
#include "test_messages_generated.h"

namespace adversary {

using namespace std::chrono_literals;
using slotrpc::Future;
using slotrpc::Reply;
using slotrpc::test::Pong;

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// ------------------------------------------------------- the attacked server

inline double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

inline slotrpc::Status write_pong(const slotrpc::test::Ping& req, flatbuffers::FlatBufferBuilder& out) {
  auto text = out.CreateString(req.text() != nullptr ? req.text()->str() : std::string());
  const auto* p = req.payload();
  auto payload = p != nullptr ? out.CreateVector(p->data(), p->size())
                              : out.CreateVector(static_cast<const uint8_t*>(nullptr), 0);
  out.Finish(slotrpc::test::CreatePong(out, req.seq(), text, payload));
  return {};
}

// `name`.Echo answers a Ping with a Pong of its seq, text and payload;
// `name`.Slow does the same after sleep_ms (5 ms steps), early once
// cancelled, and counts its starts in `slow_started` if given.
inline slotrpc::ServiceDefinition make_service(const std::string& name,
                                               std::atomic<int>* slow_started = nullptr) {
  using slotrpc::test::Ping;
  slotrpc::ServiceDefinition svc(name);
  svc.add_unary<Ping>("Echo", [](const Ping& req, flatbuffers::FlatBufferBuilder& out, slotrpc::ServerCall&) {
    return write_pong(req, out);
  });
  svc.add_unary<Ping>("Slow", [slow_started](const Ping& req, flatbuffers::FlatBufferBuilder& out,
                                             slotrpc::ServerCall& call) {
    if (slow_started != nullptr) ++*slow_started;
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(req.sleep_ms());
    while (std::chrono::steady_clock::now() < until && !call.cancelled()) slotrpc::this_fiber::sleep_for(5ms);
    return write_pong(req, out);
  });
  return svc;
}

// A Ping as the bytes of a request payload.
inline std::vector<std::byte> ping_bytes(uint64_t seq, const std::string& text, uint32_t sleep_ms = 0) {
  flatbuffers::FlatBufferBuilder fbb;
  fbb.Finish(slotrpc::test::CreatePing(fbb, seq, fbb.CreateString(text), 0, sleep_ms));
  const auto* p = reinterpret_cast<const std::byte*>(fbb.GetBufferPointer());
  return std::vector<std::byte>(p, p + fbb.GetSize());
}

// Frames only a server sends, sent to a server: each closes the session
// with `reason` in its log line.
struct ReplyTypeCase {
  const char* name;
  bool control;  // on the control lane, else in a slot
  slotrpc::core::Kind kind;
  const char* reason;
};
inline constexpr ReplyTypeCase kReplyTypeCases[] = {
    {"REPLY in a slot", false, slotrpc::core::Kind::kReply, "unexpected message kind"},
    {"ERROR in a slot", false, slotrpc::core::Kind::kError, "unexpected message kind"},
    {"STREAM_MESSAGE in a slot", false, slotrpc::core::Kind::kStreamMessage, "unexpected message kind"},
    {"REPLY on the control lane", true, slotrpc::core::Kind::kReply, "unexpected control kind"},
    {"ERROR on the control lane", true, slotrpc::core::Kind::kError, "unexpected control kind"},
};

// ------------------------------------------------------------- the server's log

using slotrpc::test::CaptureSink;  // log_capture.h

// The well-behaved client: a Channel calling Echo from its own thread, 4
// calls in flight, every reply checked, for as long as the test runs.
class SteadyClient {
 public:
  SteadyClient(const std::string& address, uint32_t echo_method, const slotrpc::Config& cfg = {})
      : echo_(echo_method) {
    auto ch = slotrpc::Channel::connect(address, cfg);
    REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
    channel_ = std::move(ch).value();
    thread_ = std::thread([this] { run(); });
  }
  ~SteadyClient() { stop(); }

  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  slotrpc::Channel& channel() { return *channel_; }
  uint64_t ok() const { return ok_.load(); }
  std::vector<std::string> failures() {
    std::lock_guard<std::mutex> lock(mu_);
    return failures_;
  }
  // Waits until `n` more calls have completed OK: the channel is being
  // served right now.
  bool progresses(uint64_t n = 20) {
    const uint64_t from = ok();
    return test_process::wait_until([&] { return ok() >= from + n || !failures().empty(); }) && failures().empty();
  }

 private:
  void fail(std::string why) {
    std::lock_guard<std::mutex> lock(mu_);
    failures_.push_back(std::move(why));
  }
  void run() {
    uint64_t seq = 0;
    while (!stop_) {
      std::vector<std::pair<uint64_t, Future<Reply<Pong>>>> batch;
      for (int i = 0; i < 4; ++i) {
        ++seq;
        const std::string text = "steady-" + std::to_string(seq);
        batch.emplace_back(seq, channel_->call_typed<Pong>(echo_, [seq, text](flatbuffers::FlatBufferBuilder& fbb) {
          fbb.Finish(slotrpc::test::CreatePing(fbb, seq, fbb.CreateString(text)));
        }));
      }
      for (auto& [s, f] : batch) {
        if (!f.wait_for(10000ms)) {
          fail("call " + std::to_string(s) + " did not complete within 10 s");
          return;
        }
        Reply<Pong> r = f.get();
        if (!r.ok()) {
          fail("call " + std::to_string(s) + ": " + r.status().to_string());
        } else if (r->seq() != s || r->text() == nullptr || r->text()->str() != "steady-" + std::to_string(s)) {
          fail("call " + std::to_string(s) + ": wrong reply");
        } else {
          ++ok_;
        }
      }
    }
  }

  const uint32_t echo_;
  std::unique_ptr<slotrpc::Channel> channel_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> ok_{0};
  std::mutex mu_;
  std::vector<std::string> failures_;
};

// Lines since `from` that name `peer` ("127.0.0.1:PORT") with a close or
// refusal.
inline std::vector<std::string> closes_of(CaptureSink& log, const std::string& peer, size_t from) {
  std::vector<std::string> out;
  const auto lines = log.lines();
  for (size_t i = from; i < lines.size(); ++i) {
    const std::string& l = lines[i];
    if (contains(l, peer + " closed") || contains(l, "with " + peer + ":") || contains(l, "from " + peer + ":") ||
        contains(l, peer + " failed"))
      out.push_back(l);
  }
  return out;
}

// Lines since `from` that report any session closing.
inline size_t close_lines(CaptureSink& log, size_t from) {
  size_t n = 0;
  const auto lines = log.lines();
  for (size_t i = from; i < lines.size(); ++i)
    if (contains(lines[i], "closed") || contains(lines[i], "closing")) ++n;
  return n;
}

}  // namespace adversary
