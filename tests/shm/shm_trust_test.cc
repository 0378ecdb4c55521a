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
//   * the peer-uid policy (SLOTRPC_SHM_PEER_UIDS): an impostor bound to a
//     server's default shm name first gets no client (its uid is refused:
//     the tests run as one uid, so the policies here list another one),
//     the client reaches the server over TCP or fails with
//     PERMISSION_DENIED; a server refuses a client of a uid it leaves out.
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
#include <netinet/in.h>
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
#include "../log_capture.h"
#include "../ping_payloads.h"
#include "../process_util.h"
#include "base/uid_policy.h"
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
    if (::send(c.get(), reply.data(), reply.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(reply.size()))
      return;
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


// ---------------------------------------------------------------- uids

namespace {

// A uid that is not this process's: the tests cannot change uid, so a
// policy that lists only this one leaves the test's own processes out.
std::string other_uid() { return std::to_string(::geteuid() == 4242 ? 4243 : 4242); }

// A TCP port free a moment ago.
uint16_t free_port() {
  Fd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(s.get(), reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(s.get(), reinterpret_cast<sockaddr*>(&a), &len) == 0);
  return ntohs(a.sin_port);
}

// What arrived at a listener that must not have been talked to: every
// connection waiting there is taken, and each must be closed without a
// byte.  Returns the bytes received in all (0 is right).
size_t bytes_received_by(const Fd& listener, size_t* connections) {
  *connections = 0;
  size_t bytes = 0;
  for (;;) {
    pollfd lp{listener.get(), POLLIN, 0};
    if (::poll(&lp, 1, 0) != 1) break;
    Fd c(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (c.get() < 0) break;
    ++*connections;
    std::array<char, 256> buf;
    for (;;) {
      pollfd pfd{c.get(), POLLIN, 0};
      if (::poll(&pfd, 1, 2000) != 1) break;
      const ssize_t n = ::recv(c.get(), buf.data(), buf.size(), MSG_DONTWAIT);
      if (n <= 0) break;
      bytes += static_cast<size_t>(n);
    }
  }
  return bytes;
}

void check_echo(Channel& ch) {
  auto f = ch.call_typed<Pong>(kEcho, ping_bytes(1, 100), CallOptions::with_timeout(5s));
  REQUIRE(f.wait_for(10s));
  const std::string err = pong_error(f.get(), 1, 100);
  CHECK_MESSAGE(err.empty(), err);
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("SLOTRPC_SHM_PEER_UIDS: self by default, uid lists, any; a bad value names the setting") {
  using slotrpc::base::allows;
  using slotrpc::base::parse_uid_policy;
  const uint32_t me = ::geteuid();
  const uint32_t other = static_cast<uint32_t>(std::stoul(other_uid()));
  for (const char* self : {"", "self"}) {
    auto p = parse_uid_policy("S", self);
    REQUIRE(p.ok());
    CHECK(allows(p.value(), me));
    CHECK_FALSE(allows(p.value(), other));
  }
  auto any = parse_uid_policy("S", "any");
  REQUIRE(any.ok());
  CHECK(allows(any.value(), me));
  CHECK(allows(any.value(), other));
  auto list = parse_uid_policy("S", other_uid() + ",self");
  REQUIRE(list.ok());
  CHECK(allows(list.value(), me));
  CHECK(allows(list.value(), other));
  CHECK_FALSE(allows(list.value(), other + 1 == me ? other + 2 : other + 1));
  auto only = parse_uid_policy("S", other_uid());
  REQUIRE(only.ok());
  CHECK_FALSE(allows(only.value(), me));
  CHECK(contains(slotrpc::base::describe(only.value()), "SLOTRPC_SHM_PEER_UIDS"));

  for (const char* bad : {"me", "1,,2", "-1", "4294967295", " 1", "1,", ",", "any,1", "0x10"}) {
    CAPTURE(bad);
    auto r = parse_uid_policy("Config.shm_peer_uids (SLOTRPC_SHM_PEER_UIDS)", bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK_MESSAGE(contains(r.status().message(), std::string("invalid setting Config.shm_peer_uids "
                                                             "(SLOTRPC_SHM_PEER_UIDS)='") + bad + "'"),
                  r.status().message());
    CHECK_MESSAGE(contains(r.status().message(), "self,1001"), r.status().message());
  }
  // Through Config and the environment.
  DefaultTransportEnv env;
  Config c;
  c.shm_peer_uids = "nobody";
  CHECK(contains(c.validate().message(), "Config.shm_peer_uids (SLOTRPC_SHM_PEER_UIDS)='nobody'"));
  {
    EnvVar v("SLOTRPC_SHM_PEER_UIDS", std::string("nobody"));
    auto r = Config{}.with_environment();
    REQUIRE_FALSE(r.ok());
    CHECK_MESSAGE(contains(r.status().message(), "SLOTRPC_SHM_PEER_UIDS"), r.status().message());
  }
  {
    EnvVar v("SLOTRPC_SHM_PEER_UIDS", "self," + other_uid());
    auto r = Config{}.with_environment();
    REQUIRE(r.ok());
    CHECK(r.value().shm_peer_uids == "self," + other_uid());
  }
}

TEST_CASE("an impostor bound to a server's shm name first gets no client: its uid is refused") {
  DefaultTransportEnv env;
  const uint16_t port = free_port();
  const std::string name = "@slotrpc-" + std::to_string(port);
  Fd impostor = listen_abstract(name);
  slotrpc::test::LogCapture log;
  Server server;
  REQUIRE(server.add_service(echo_service()).ok());
  const slotrpc::Status st = server.start("127.0.0.1:" + std::to_string(port));
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  // The server names who holds its name.
  CHECK(log.matching({"serves no shm sessions", "held by pid " + std::to_string(::getpid()) +
                                                    " uid " + std::to_string(::geteuid())})
            .size() == 1);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  // The impostor runs as this test's uid; the client trusts another one
  // only, as a client of the default policy trusts only its own user and
  // the impostor is someone else.
  Config cfg;
  cfg.shm_peer_uids = other_uid();
  const std::string me = "uid " + std::to_string(::geteuid());

  SUBCASE("transport auto: the client reaches the real server over TCP") {
    auto ch = Channel::connect(address, cfg);
    REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
    CHECK((*ch)->transport() == TransportKind::kTcp);
    check_echo(**ch);
  }
  SUBCASE("transport shm: PERMISSION_DENIED naming the uid and the setting") {
    cfg.transport = TransportKind::kShm;
    auto ch = Channel::connect(address, cfg);
    REQUIRE_FALSE(ch.ok());
    CHECK(ch.status().code() == StatusCode::kPermissionDenied);
    const std::string m = ch.status().message();
    CHECK_MESSAGE(contains(m, me), m);
    CHECK_MESSAGE(contains(m, "SLOTRPC_SHM_PEER_UIDS"), m);
    CHECK_MESSAGE(contains(m, "unix:" + name), m);
  }
  size_t connections = 0;
  CHECK(bytes_received_by(impostor, &connections) == 0);
  CHECK(connections == 2);  // the server's probe and the client: told nothing
  server.stop();
}

TEST_CASE("a server refuses an shm client of a uid its SLOTRPC_SHM_PEER_UIDS leaves out") {
  DefaultTransportEnv env;
  Config scfg;
  scfg.shm_peer_uids = other_uid();
  Server server(scfg);
  REQUIRE(server.add_service(echo_service()).ok());
  const slotrpc::Status st = server.start("127.0.0.1:0");
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  const std::string address = "127.0.0.1:" + std::to_string(server.port());
  const std::string me = "uid " + std::to_string(::geteuid());
  Config cfg;
  SUBCASE("transport shm: PERMISSION_DENIED from the server, naming the uid and the setting") {
    cfg.transport = TransportKind::kShm;
    auto ch = Channel::connect(address, cfg);
    REQUIRE_FALSE(ch.ok());
    CHECK(ch.status().code() == StatusCode::kPermissionDenied);
    const std::string m = ch.status().message();
    CHECK_MESSAGE(contains(m, "server refused the session"), m);
    CHECK_MESSAGE(contains(m, me), m);
    CHECK_MESSAGE(contains(m, "this server's Config.shm_peer_uids (SLOTRPC_SHM_PEER_UIDS)"), m);
  }
  SUBCASE("transport auto: the client goes on to TCP") {
    auto ch = Channel::connect(address, cfg);
    REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
    CHECK((*ch)->transport() == TransportKind::kTcp);
    check_echo(**ch);
  }
  SUBCASE("a unix: address: PERMISSION_DENIED") {
    auto ch = Channel::connect("unix:@slotrpc-" + std::to_string(server.port()), cfg);
    REQUIRE_FALSE(ch.ok());
    CHECK(ch.status().code() == StatusCode::kPermissionDenied);
  }
  server.stop();
}
