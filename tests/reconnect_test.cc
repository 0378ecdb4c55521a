// Idempotent calls with max_retries survive a server restart: the channel
// reconnects to its address and sends them again.  Others fail with
// UNAVAILABLE.
#include <doctest/doctest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <slotrpc/slotrpc.h>

#include "test_messages_generated.h"

namespace {

using slotrpc::test::Ping;
using slotrpc::test::Pong;
using namespace std::chrono_literals;

const uint32_t kEcho = slotrpc::method_id("test.Retry.Echo");

std::unique_ptr<slotrpc::Server> start_server(const std::string& address, std::string tag) {
  auto server = std::make_unique<slotrpc::Server>();
  slotrpc::ServiceDefinition svc("test.Retry");
  svc.add_typed_unary<Ping, Pong>(
      "Echo", [tag](const Ping& req, slotrpc::ReplyBuilder<Pong>& out, slotrpc::ServerCall&) {
        out.Finish(slotrpc::test::CreatePong(out.fbb(), req.seq(), out.fbb().CreateString(tag)));
        return slotrpc::Status();
      });
  REQUIRE(server->add_service(std::move(svc)).ok());
  auto st = server->start(address);
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  return server;
}

slotrpc::Reply<Pong> echo(slotrpc::Channel& ch, uint64_t seq, slotrpc::CallOptions o) {
  auto f = ch.unary<Ping, Pong>(kEcho, [seq](flatbuffers::FlatBufferBuilder& fbb) {
    return slotrpc::test::CreatePing(fbb, seq);
  }, o);
  REQUIRE(f.wait_for(10s));
  return f.get();
}

slotrpc::CallOptions idempotent(uint32_t retries) {
  slotrpc::CallOptions o;
  o.idempotent = true;
  o.max_retries = retries;
  return o;
}

}  // namespace

TEST_CASE("retry: an idempotent call reconnects after a server restart") {
  auto first = start_server("127.0.0.1:0", "first");
  const std::string address = "127.0.0.1:" + std::to_string(first->port());
  auto ch = slotrpc::Channel::connect(address);
  REQUIRE(ch.ok());
  auto r = echo(**ch, 1, idempotent(2));
  REQUIRE(r.ok());
  CHECK(r->text()->str() == "first");
  r.release();

  first->stop();
  first.reset();
  // The channel notices the closed connection.
  for (int i = 0; i < 200 && !(*ch)->stats().closed; ++i) std::this_thread::sleep_for(10ms);
  REQUIRE((*ch)->stats().closed);

  SUBCASE("without retries the call fails") {
    auto plain = echo(**ch, 2, {});
    CHECK(plain.status().code() == slotrpc::StatusCode::kUnavailable);
    // Retries are for idempotent methods only.
    auto not_idempotent = slotrpc::CallOptions();
    not_idempotent.max_retries = 3;
    CHECK(echo(**ch, 3, not_idempotent).status().code() == slotrpc::StatusCode::kUnavailable);
  }
  SUBCASE("with the server back, the retry succeeds on a new session") {
    auto second = start_server(address, "second");
    auto again = echo(**ch, 4, idempotent(2));
    REQUIRE_MESSAGE(again.ok(), again.status().to_string());
    CHECK(again->seq() == 4);
    CHECK(again->text()->str() == "second");
    again.release();
    CHECK_FALSE((*ch)->stats().closed);
    // Later plain calls use the new session too.
    CHECK(echo(**ch, 5, {}).ok());
  }
  SUBCASE("with the server gone, the retry reports why reconnecting failed") {
    auto failed = echo(**ch, 6, idempotent(1));
    CHECK(failed.status().code() == slotrpc::StatusCode::kUnavailable);
    CHECK_MESSAGE(failed.status().message().find("reconnect failed") != std::string::npos,
                  failed.status().to_string());
  }
}

namespace {

// Listens on 127.0.0.1:`port` and accepts, but never answers: a server
// whose process is frozen, so a reconnect's handshake waits for the whole
// connect_timeout_ms.  Reports how many connections it took.
class SilentListener {
 public:
  explicit SilentListener(uint16_t port) {
    // Non-blocking: the thread polls accept, so that it sees stop_.
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    REQUIRE(fd_ >= 0);
    int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(port);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(fd_, 8) == 0);
    thread_ = std::thread([this] {
      while (!stop_) {
        const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (c >= 0) {
          held_.push_back(c);
          ++accepted_;
        } else {
          std::this_thread::sleep_for(5ms);
        }
      }
    });
  }
  ~SilentListener() {
    stop_ = true;
    thread_.join();
    for (int c : held_) ::close(c);
    ::close(fd_);
  }
  int accepted() const { return accepted_.load(); }

 private:
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<int> accepted_{0};
  std::vector<int> held_;  // the listener thread's
  std::thread thread_;
};

}  // namespace

// Between attempts an idempotent call waits for the channel's reconnect,
// which a frozen server stretches to connect_timeout_ms (20 s here).  Its
// deadline and a cancel end it there and then; before, both waited out the
// reconnect (and the cancelled call was then sent again).
TEST_CASE("retry: a call waiting for a reconnect ends at its deadline, or when cancelled, not when the reconnect gives up") {
  slotrpc::Config cfg;
  cfg.transport = slotrpc::TransportKind::kTcp;
  cfg.connect_timeout_ms = 20'000;
  auto first = std::make_unique<slotrpc::Server>(cfg);
  {
    slotrpc::ServiceDefinition svc("test.Retry");
    svc.add_typed_unary<Ping, Pong>(
        "Echo", [](const Ping& req, slotrpc::ReplyBuilder<Pong>& out, slotrpc::ServerCall&) {
          out.Finish(slotrpc::test::CreatePong(out.fbb(), req.seq(), out.fbb().CreateString("first")));
          return slotrpc::Status();
        });
    REQUIRE(first->add_service(std::move(svc)).ok());
    REQUIRE(first->start("127.0.0.1:0").ok());
  }
  const uint16_t port = first->port();
  auto ch = slotrpc::Channel::connect("127.0.0.1:" + std::to_string(port), cfg);
  REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
  REQUIRE(echo(**ch, 1, idempotent(2)).ok());
  first->stop();
  first.reset();
  for (int i = 0; i < 200 && !(*ch)->stats().closed; ++i) std::this_thread::sleep_for(10ms);
  REQUIRE((*ch)->stats().closed);
  auto frozen = std::make_unique<SilentListener>(port);

  SUBCASE("its deadline") {
    auto o = idempotent(2);
    o.deadline = slotrpc::Clock::now() + 300ms;
    const auto t0 = std::chrono::steady_clock::now();
    auto r = echo(**ch, 2, o);
    const auto took = std::chrono::steady_clock::now() - t0;
    CAPTURE(r.status().to_string());
    CHECK(frozen->accepted() >= 1);  // it was reconnecting
    CHECK(r.status().code() == slotrpc::StatusCode::kDeadlineExceeded);
    CHECK(took < 10s);
  }
  SUBCASE("a cancel") {
    std::atomic<int> replies{0};
    std::promise<slotrpc::Status> got;
    auto handle = slotrpc::raw::call(**ch, kEcho, [](flatbuffers::FlatBufferBuilder& fbb) {
      fbb.Finish(slotrpc::test::CreatePing(fbb, 3));
    }, idempotent(2), [&](slotrpc::RawReply&& reply) {
      if (replies.fetch_add(1) == 0) got.set_value(reply.status());
    });
    // Waits until the retry's reconnect is under way, then cancels.
    for (int i = 0; i < 1000 && frozen->accepted() == 0; ++i) std::this_thread::sleep_for(10ms);
    REQUIRE(frozen->accepted() >= 1);
    const auto t0 = std::chrono::steady_clock::now();
    handle.cancel();
    auto f = got.get_future();
    REQUIRE(f.wait_for(30s) == std::future_status::ready);
    const auto took = std::chrono::steady_clock::now() - t0;
    const slotrpc::Status st = f.get();
    CAPTURE(st.to_string());
    CHECK(st.code() == slotrpc::StatusCode::kCancelled);
    CHECK(took < 10s);
    CHECK(replies.load() == 1);
  }
  // The listener goes first: the reconnect in progress fails at once, and
  // the channel's destructor (which joins it) does not wait out its timeout.
  frozen.reset();
  ch->reset();
}
