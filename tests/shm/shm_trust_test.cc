// Trust between the two processes of an shm session (docs/design.md,
// "Trust and security" -> "Shared memory"):
//
//   * a hostile client on the server's Unix socket cannot freeze the
//     server's loop through its wake-up path: it offers a blocking eventfd
//     filled to 2^64-2 (the wake descriptor of the earlier protocol), or a
//     valid offer whose socket it never reads, and says it sleeps; the
//     server serves another client all along and stops on request;
//   * a hostile server cannot freeze a Channel the same way: the call fails
//     with a status within its deadline, and the channel closes;
//
// Every wait is bounded.  A loop that did block (the bug) is released at
// the end by the test itself, which holds the hostile eventfd: the failure
// is reported, the process does not hang.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <slotrpc/slotrpc.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "../env_var.h"
#include "../ping_payloads.h"
#include "../process_util.h"
#include "core/handshake.h"
#include "transport/shm/shm_segment.h"
#include "test_messages_generated.h"

namespace {

using namespace std::chrono_literals;
using namespace slotrpc::test_payloads;
using slotrpc::CallOptions;
using slotrpc::Config;
using slotrpc::transport::shm::compute_layout;
using slotrpc::transport::shm::ControlBlock;
using slotrpc::transport::shm::Fd;
using slotrpc::transport::shm::Geometry;
using slotrpc::transport::shm::Layout;
using slotrpc::transport::shm::Mapping;
using slotrpc::transport::shm::Offer;
using Clock = std::chrono::steady_clock;
namespace core = slotrpc::core;
using slotrpc::Channel;
using slotrpc::Server;
using slotrpc::ServerCall;
using slotrpc::ServiceDefinition;
using slotrpc::StatusCode;
using slotrpc::TransportKind;
using slotrpc::test::EnvVar;
using slotrpc::test::Ping;
using slotrpc::test::Pong;

constexpr uint32_t kEcho = slotrpc::method_id("slotrpc.test.ShmTrust.Echo");
constexpr Geometry kGeo{8, 1024};

ServiceDefinition echo_service() {
  ServiceDefinition svc("slotrpc.test.ShmTrust");
  svc.add_unary<Ping>("Echo", [](const Ping& req, flatbuffers::FlatBufferBuilder& out,
                                 ServerCall&) -> slotrpc::Status {
    auto text = out.CreateString(req.text() != nullptr ? req.text()->str() : std::string());
    static const uint8_t kNone = 0;
    const auto* p = req.payload();
    auto payload = p != nullptr ? out.CreateVector(p->data(), p->size()) : out.CreateVector(&kNone, 0);
    out.Finish(slotrpc::test::CreatePong(out, req.seq(), text, payload));
    return {};
  });
  return svc;
}

// The tests decide the transport themselves, not the suite's environment.
struct DefaultTransportEnv {
  EnvVar transport{"SLOTRPC_TRANSPORT", std::nullopt};
  EnvVar unix_path{"SLOTRPC_UNIX_PATH", std::nullopt};
  EnvVar uids{"SLOTRPC_SHM_PEER_UIDS", std::nullopt};
};

// Short keepalives: a session pings its idle peer (and so wakes it, if it
// says it sleeps) every 50 ms.
Config hostile_timing() {
  Config c;
  c.keepalive_ms = 50;
  c.peer_timeout_ms = 3000;
  c.connect_timeout_ms = 2000;
  return c;
}

// A segment as a hostile peer makes it: the right size, sealed only
// against shrinking and growing (all the receiver checks), and writable by
// its maker for good.
struct HostileSegment {
  Layout layout;
  Fd memfd;
  Mapping map;
  explicit HostileSegment(Geometry g) {
    layout = compute_layout(g).value();
    memfd = Fd(::memfd_create("hostile", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    REQUIRE(memfd.get() >= 0);
    REQUIRE(::ftruncate(memfd.get(), static_cast<off_t>(layout.total)) == 0);
    void* p = ::mmap(nullptr, layout.total, PROT_READ | PROT_WRITE, MAP_SHARED, memfd.get(), 0);
    REQUIRE(p != MAP_FAILED);
    map = Mapping(static_cast<std::byte*>(p), layout.total);
    REQUIRE(::fcntl(memfd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0);
  }
  // "I am asleep: wake me", for good.
  void claim_sleep() {
    auto* ctl = reinterpret_cast<ControlBlock*>(map.base());
    std::atomic_ref<uint32_t>(ctl->sleeping).store(1, std::memory_order_seq_cst);
  }
};

// A blocking eventfd whose counter is one below its limit: the next write
// of 1 blocks (for a writer whose description lacks O_NONBLOCK).
Fd saturated_blocking_eventfd() {
  Fd fd(::eventfd(0, EFD_CLOEXEC));
  REQUIRE(fd.get() >= 0);
  const uint64_t v = 0xfffffffffffffffeull;
  REQUIRE(::write(fd.get(), &v, sizeof v) == static_cast<ssize_t>(sizeof v));
  return fd;
}

// Frees a writer blocked on `fd` (the test holds it too): the description
// turns non-blocking for every holder, and the counter is emptied.
void release(const Fd& fd) {
  if (fd.get() < 0) return;
  ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) | O_NONBLOCK);
  uint64_t v;
  [[maybe_unused]] const ssize_t n = ::read(fd.get(), &v, sizeof v);
}

// An offer in this build's format, with the fds the test chooses: the
// segment alone, or the segment and an extra descriptor (the earlier
// protocol's wake eventfd).
void send_raw_offer(int sock, const HostileSegment& seg, int extra_fd) {
  Offer o;
  o.slot_count = seg.layout.geometry.slot_count;
  o.slot_size = seg.layout.geometry.slot_size;
  o.desc_count = seg.layout.desc_count;
  o.segment_bytes = seg.layout.total;
  iovec iov{&o, sizeof o};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 2)] = {};
  const int fds[2] = {seg.memfd.get(), extra_fd};
  const size_t nfds = extra_fd >= 0 ? 2 : 1;
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
  std::memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
  REQUIRE(::sendmsg(sock, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof o));
}

sockaddr_un abstract_addr(const std::string& name, socklen_t* len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, name.data(), name.size());
  a.sun_path[0] = '\0';  // "@x": abstract
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
  return a;
}

Fd connect_abstract(const std::string& name) {
  socklen_t len;
  const sockaddr_un a = abstract_addr(name, &len);
  Fd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(::connect(s.get(), reinterpret_cast<const sockaddr*>(&a), len) == 0);
  return s;
}

Fd listen_abstract(const std::string& name) {
  socklen_t len;
  const sockaddr_un a = abstract_addr(name, &len);
  Fd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(::bind(s.get(), reinterpret_cast<const sockaddr*>(&a), len) == 0);
  REQUIRE(::listen(s.get(), 16) == 0);
  return s;
}

void send_bytes(int sock, const void* data, size_t n) {
  REQUIRE(::send(sock, data, n, MSG_NOSIGNAL) == static_cast<ssize_t>(n));
}

// Reads exactly n bytes within `limit`; false on EOF or time-out.
bool read_bytes(int sock, void* data, size_t n, std::chrono::milliseconds limit = 5000ms) {
  auto* p = static_cast<std::byte*>(data);
  const auto until = Clock::now() + limit;
  size_t got = 0;
  while (got < n) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    if (left.count() <= 0) return false;
    pollfd pfd{sock, POLLIN, 0};
    if (::poll(&pfd, 1, static_cast<int>(left.count())) <= 0) continue;
    const ssize_t r = ::recv(sock, p + got, n - got, MSG_DONTWAIT);
    if (r == 0) return false;
    if (r > 0) got += static_cast<size_t>(r);
  }
  return true;
}

void send_shm_hello(int sock, Geometry g) {
  core::Hello h;
  h.transport = core::WireTransport::kShm;
  h.slot_count = g.slot_count;
  h.slot_size = g.slot_size;
  h.features = core::kFeatureStatusCodes;
  std::array<std::byte, core::kHelloSize> buf{};
  core::encode_hello(h, buf.data());
  send_bytes(sock, buf.data(), buf.size());
}

// Runs `fn` on a thread of its own (detached), so that the test can wait
// for it with a bound, and again after releasing what blocked it.
class Background {
 public:
  explicit Background(std::function<void()> fn) {
    auto done = std::make_shared<std::promise<void>>();
    future_ = done->get_future();
    std::thread([fn = std::move(fn), done] {
      fn();
      done->set_value();
    }).detach();
  }
  bool wait(std::chrono::milliseconds limit) {
    return future_.wait_for(limit) == std::future_status::ready;
  }

 private:
  std::future<void> future_;
};

enum class Hostility { kBlockingEventfd, kNeverReads };

const char* describe(Hostility h) {
  return h == Hostility::kBlockingEventfd
             ? "offers a blocking eventfd filled to 2^64-2 and claims to sleep"
             : "offers its segment, claims to sleep and never reads its socket";
}

}  // namespace

TEST_CASE("a hostile shm client cannot freeze the server: others are served, stop() returns") {
  DefaultTransportEnv env;
  Hostility hostility = Hostility::kBlockingEventfd;
  SUBCASE("blocking eventfd") { hostility = Hostility::kBlockingEventfd; }
  SUBCASE("never reads") { hostility = Hostility::kNeverReads; }
  INFO("the hostile client " << std::string(describe(hostility)));

  auto server = std::make_unique<Server>(hostile_timing());
  REQUIRE(server->add_service(echo_service()).ok());
  const slotrpc::Status started = server->start("127.0.0.1:0");
  REQUIRE_MESSAGE(started.ok(), started.to_string());
  const std::string address = "127.0.0.1:" + std::to_string(server->port());

  // The hostile client: Hello, offer, "asleep"; it reads nothing.
  Fd evfd = saturated_blocking_eventfd();
  HostileSegment seg(kGeo);
  Fd hostile = connect_abstract("@slotrpc-" + std::to_string(server->port()));
  send_shm_hello(hostile.get(), kGeo);
  send_raw_offer(hostile.get(), seg, hostility == Hostility::kBlockingEventfd ? evfd.get() : -1);
  seg.claim_sleep();

  // A loop that blocked on the eventfd is released when the test ends
  // (declared after the server: destroyed first).
  struct Releaser {
    const Fd& fd;
    ~Releaser() { release(fd); }
  } releaser{evfd};

  // Meanwhile another client is served, call after call, across many of
  // the hostile session's keepalive periods (each one a wake-up of it).
  Config client_cfg = hostile_timing();
  auto ch = Channel::connect(address, client_cfg);
  REQUIRE_MESSAGE(ch.ok(), "a client could not connect beside the hostile one: " << ch.status().to_string());
  CHECK((*ch)->transport() == TransportKind::kShm);
  const auto until = Clock::now() + 1500ms;
  uint64_t seq = 0;
  bool all_ok = true;
  while (Clock::now() < until && all_ok) {
    ++seq;
    auto f = (*ch)->call_typed<Pong>(kEcho, ping_bytes(seq, 100), CallOptions::with_timeout(1s));
    if (!f.wait_for(3s)) {
      all_ok = false;
      FAIL_CHECK("call " << seq << " did not complete within 3 s: the server's loop is stuck");
      break;
    }
    const std::string err = pong_error(f.get(), seq, 100);
    if (!err.empty()) {
      all_ok = false;
      FAIL_CHECK("call " << seq << ": " << err);
    }
  }
  CHECK(seq >= 10);
  ch->reset();

  // The server stops on request.
  Server* s = server.get();
  Background stop([s] { s->stop(); });
  const bool stopped = stop.wait(5000ms);
  CHECK_MESSAGE(stopped, "Server::stop() did not return within 5 s");
  if (!stopped) {
    release(evfd);
    REQUIRE(stop.wait(10000ms));
  }
  server.reset();
}

TEST_CASE("a hostile shm server cannot freeze a Channel: the call fails in time, the channel closes") {
  DefaultTransportEnv env;
  Hostility hostility = Hostility::kBlockingEventfd;
  SUBCASE("blocking eventfd") { hostility = Hostility::kBlockingEventfd; }
  SUBCASE("never reads") { hostility = Hostility::kNeverReads; }
  INFO("the hostile server " << std::string(describe(hostility)));

  static std::atomic<int> counter{0};
  const std::string name =
      "@slotrpc-trust-" + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1));
  Fd listener = listen_abstract(name);
  Fd evfd = saturated_blocking_eventfd();
  HostileSegment seg(kGeo);

  // The fake server: takes the Hello and the offer, answers like a server,
  // offers its own segment (with the eventfd, in that case), claims to
  // sleep, and then reads nothing.
  Fd conn;
  std::atomic<bool> answered{false};
  std::thread fake([&] {
    pollfd pfd{listener.get(), POLLIN, 0};
    if (::poll(&pfd, 1, 5000) != 1) return;
    Fd c(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (c.get() < 0) return;
    std::array<std::byte, core::kHelloSize> head{};
    if (!read_bytes(c.get(), head.data(), head.size())) return;
    auto hello = core::decode_hello(head.data());
    if (!hello.ok()) return;
    // The client's offer: taken, its descriptors closed.
    pollfd cp{c.get(), POLLIN, 0};
    if (::poll(&cp, 1, 5000) != 1) return;
    Offer o{};
    iovec iov{&o, sizeof o};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    if (::recvmsg(c.get(), &msg, MSG_CMSG_CLOEXEC) <= 0) return;
    for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
      const size_t n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < n; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
        ::close(fd);
      }
    }
    core::HelloReply r;
    r.status = 0;
    r.slot_count = hello->slot_count;
    r.slot_size = hello->slot_size;
    r.transport = core::WireTransport::kShm;
    r.features = core::kKnownFeatures;
    std::array<std::byte, core::kHelloSize> reply{};
    core::encode_hello_reply(r, reply.data());
    if (::send(c.get(), reply.data(), reply.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(reply.size())) return;
    // The segment must match the client's geometry.
    HostileSegment own(Geometry{hello->slot_count, hello->slot_size});
    send_raw_offer(c.get(), own, hostility == Hostility::kBlockingEventfd ? evfd.get() : -1);
    own.claim_sleep();
    seg = std::move(own);
    conn = std::move(c);
    answered.store(true);
  });
  struct Joiner {
    std::thread& t;
    ~Joiner() {
      if (t.joinable()) t.join();
    }
  } joiner{fake};

  Config cfg = hostile_timing();
  cfg.transport = TransportKind::kShm;
  cfg.peer_timeout_ms = 2000;
  auto ch = Channel::connect("unix:" + name, cfg);
  // Declared after the channel: destroyed first, so a client loop that
  // blocked on the eventfd is freed before the channel is torn down.
  struct Releaser {
    const Fd& fd;
    ~Releaser() { release(fd); }
  } releaser{evfd};
  if (!ch.ok()) {
    // Refusing the offer outright is one good answer; it must say why.
    MESSAGE("connect refused: " << ch.status().to_string());
    CHECK(ch.status().message().find("shm") != std::string::npos);
    return;
  }
  REQUIRE(test_process::wait_until([&] { return answered.load(); }, 5000ms));
  // The call fails within its deadline (or sooner, when the silent peer
  // is declared dead): the client's loop is alive.
  const auto start = Clock::now();
  auto f = (*ch)->call_typed<Pong>(kEcho, ping_bytes(1, 100), CallOptions::with_timeout(1s));
  const bool done = f.wait_for(4s);
  CHECK_MESSAGE(done, "the call did not complete within 4 s (deadline 1 s): the client's loop is stuck");
  if (done) {
    auto reply = f.get();
    CHECK_FALSE(reply.ok());
    CHECK_MESSAGE((reply.status().code() == StatusCode::kDeadlineExceeded ||
                   reply.status().code() == StatusCode::kUnavailable),
                  reply.status().to_string());
    CHECK(Clock::now() - start < 3500ms);
  } else {
    release(evfd);
  }
  // The process can shut the channel down.
  auto* held = &ch.value();
  Background close([held] { held->reset(); });
  const bool closed = close.wait(5000ms);
  CHECK_MESSAGE(closed, "the channel could not be closed within 5 s");
  if (!closed) {
    release(evfd);
    REQUIRE(close.wait(10000ms));
  }
}

