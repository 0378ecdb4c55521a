// Who may call (docs/design.md, "Trust and security"): what a handler knows
// of its peer (ServerCall::peer_info), server interceptors, and the rule for
// the built-in Admin service (Config::admin_access).  The environment
// overlay is off: each case sets what it tests.
#include <doctest/doctest.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <slotrpc/slotrpc.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "ping_payloads.h"
#include "base/peer_credentials.h"
#include "rpc/admin/admin.h"
#include "rpc/peer_info.h"
#include "test_messages_generated.h"

#ifndef ADMIN_PROBE
#error "ADMIN_PROBE must name the admin_probe binary"
#endif

namespace {

using namespace slotrpc::test_payloads;  // ping
using slotrpc::AdminAccess;
using slotrpc::Channel;
using slotrpc::Config;
using slotrpc::PeerInfo;
using slotrpc::Server;
using slotrpc::ServerCall;
using slotrpc::ServiceDefinition;
using slotrpc::Status;
using slotrpc::StatusCode;
using slotrpc::TransportKind;
using slotrpc::test::Ping;
using slotrpc::test::Pong;

constexpr uint32_t kWho = slotrpc::method_id("slotrpc.test.Authz.Who");
constexpr uint32_t kSecret = slotrpc::method_id("slotrpc.test.Authz.Secret");

struct Overlay {
  Overlay() { slotrpc::set_environment_overlay(false); }
};
const Overlay overlay_off;

// Who answers with what its handler saw of the peer; Secret counts the
// times its handler ran.
ServiceDefinition make_service(std::atomic<int>* secret_runs) {
  ServiceDefinition svc("slotrpc.test.Authz");
  svc.add_unary<Ping>("Who", [](const Ping& req, flatbuffers::FlatBufferBuilder& out,
                               ServerCall& call) -> Status {
    const PeerInfo& p = call.peer_info();
    const std::string text = p.transport + "|" + p.address + "|" + (p.same_host ? "local" : "remote") +
                             "|" + (p.uid ? std::to_string(*p.uid) : "-") + "|" +
                             (p.gid ? std::to_string(*p.gid) : "-") + "|" +
                             (p.pid ? std::to_string(*p.pid) : "-");
    out.Finish(slotrpc::test::CreatePong(out, req.seq(), out.CreateString(text)));
    return {};
  });
  svc.add_unary<Ping>("Secret", [secret_runs](const Ping& req, flatbuffers::FlatBufferBuilder& out,
                                              ServerCall&) -> Status {
    ++*secret_runs;
    out.Finish(slotrpc::test::CreatePong(out, req.seq(), out.CreateString("secret")));
    return {};
  });
  return svc;
}

Config with_transport(TransportKind t) {
  Config c;
  c.transport = t;
  return c;
}

std::string address_of(const Server& s) { return "127.0.0.1:" + std::to_string(s.port()); }

std::unique_ptr<Channel> connect(const Server& s, TransportKind t) {
  auto ch = Channel::connect(address_of(s), with_transport(t));
  REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
  return std::move(ch.value());
}

std::string who(Channel& ch) {
  auto r = ch.call_typed<Pong>(kWho, ping(1, "who")).get();
  REQUIRE_MESSAGE(r.ok(), r.status().to_string());
  return r->text()->str();
}

}  // namespace

TEST_CASE("a handler sees who its peer is: transport, address and the kernel's credentials") {
  std::atomic<int> runs{0};
  Server server;
  REQUIRE(server.add_service(make_service(&runs)).ok());
  REQUIRE(server.start("127.0.0.1:0").ok());
  const std::string uid = std::to_string(::getuid());
  const std::string gid = std::to_string(::getgid());
  const std::string pid = std::to_string(::getpid());

  SUBCASE("tcp from loopback: the uid from the kernel's socket table") {
    auto ch = connect(server, TransportKind::kTcp);
    const std::string w = who(*ch);
    CHECK(w.rfind("tcp|127.0.0.1:", 0) == 0);
    CHECK(w.find("|local|" + uid + "|-|-") != std::string::npos);
  }
  SUBCASE("tcp to one of this host's own addresses: still this host, still the uid") {
    // Served on every address: the client dials an interface address, not
    // loopback, as a verbs session's handshake does.
    Server any_addr;
    REQUIRE(any_addr.add_service(make_service(&runs)).ok());
    REQUIRE(any_addr.start("0.0.0.0:0").ok());
    std::string own;
    ifaddrs* list = nullptr;
    REQUIRE(::getifaddrs(&list) == 0);
    for (ifaddrs* i = list; i != nullptr && own.empty(); i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
      char text[INET_ADDRSTRLEN] = {};
      ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof text);
      if (std::string(text).rfind("127.", 0) != 0) own = text;
    }
    ::freeifaddrs(list);
    if (own.empty()) {
      WARN_MESSAGE(false, "this host has no IPv4 address but loopback: case not run");
    } else {
      auto ch = Channel::connect(own + ":" + std::to_string(any_addr.port()),
                                 with_transport(TransportKind::kTcp));
      REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
      const std::string w = who(*ch.value());
      CHECK(w.rfind("tcp|" + own + ":", 0) == 0);
      CHECK(w.find("|local|" + uid + "|-|-") != std::string::npos);
    }
  }
  SUBCASE("shm over the Unix socket: uid, gid and pid from SO_PEERCRED") {
    auto ch = connect(server, TransportKind::kShm);
    CHECK(who(*ch) == "shm|unix:@slotrpc-" + std::to_string(server.port()) + "|local|" + uid + "|" +
                          gid + "|" + pid);
  }
}

TEST_CASE("server interceptors run in order before the handler, and a refusal is the answer") {
  std::atomic<int> runs{0};
  std::vector<std::string> seen;  // method|transport, appended on the loop
  std::atomic<int> second_runs{0};
  Server server;
  REQUIRE(server.add_service(make_service(&runs)).ok());
  REQUIRE(server.add_interceptor([&seen](const ServerCall& call) -> Status {
    seen.push_back(call.method_name() + "|" + call.peer_info().transport);
    if (call.method_id() == kSecret && call.peer_info().transport == "tcp")
      return Status(StatusCode::kPermissionDenied, "Secret is for shm peers");
    return {};
  }).ok());
  REQUIRE(server.add_interceptor([&second_runs](const ServerCall&) -> Status {
    ++second_runs;
    return {};
  }).ok());
  CHECK(server.add_interceptor(nullptr).code() == StatusCode::kInvalidArgument);
  REQUIRE(server.start("127.0.0.1:0").ok());
  CHECK(server.add_interceptor([](const ServerCall&) { return Status(); }).code() ==
        StatusCode::kInvalidArgument);

  auto tcp = connect(server, TransportKind::kTcp);
  auto denied = tcp->call_typed<Pong>(kSecret, ping(1, "x")).get();
  REQUIRE_FALSE(denied.ok());
  CHECK(denied.status().code() == StatusCode::kPermissionDenied);
  CHECK(denied.status().message() == "Secret is for shm peers");
  CHECK(runs.load() == 0);         // the handler never saw it
  CHECK(second_runs.load() == 0);  // nor did the next interceptor
  CHECK(who(*tcp).rfind("tcp|", 0) == 0);
  CHECK(second_runs.load() == 1);

  auto shm = connect(server, TransportKind::kShm);
  auto allowed = shm->call_typed<Pong>(kSecret, ping(2, "x")).get();
  REQUIRE_MESSAGE(allowed.ok(), allowed.status().to_string());
  CHECK(allowed->text()->str() == "secret");
  CHECK(runs.load() == 1);
  server.stop();
  CHECK(seen == std::vector<std::string>{"slotrpc.test.Authz.Secret|tcp", "slotrpc.test.Authz.Who|tcp",
                                         "slotrpc.test.Authz.Secret|shm"});
}

TEST_CASE("an interceptor's unknown status code reaches the client as INTERNAL naming the method") {
  std::atomic<int> runs{0};
  Server server;
  REQUIRE(server.add_service(make_service(&runs)).ok());
  REQUIRE(server.add_interceptor([](const ServerCall&) {
    return Status(static_cast<StatusCode>(77), "made up");
  }).ok());
  REQUIRE(server.start("127.0.0.1:0").ok());
  auto ch = connect(server, TransportKind::kTcp);
  auto r = ch->call_typed<Pong>(kSecret, ping(1, "x")).get();
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kInternal);
  CHECK(r.status().message().find("interceptor refused slotrpc.test.Authz.Secret with unknown status "
                                  "code 77") != std::string::npos);
  CHECK(runs.load() == 0);
}

TEST_CASE("Admin answers the server's own user on this host by default, and nobody when off") {
  std::atomic<int> runs{0};
  SUBCASE("same-user (default): tcp from loopback and shm both answered") {
    Server server;
    REQUIRE(server.add_service(make_service(&runs)).ok());
    REQUIRE(server.start("127.0.0.1:0").ok());
    CHECK(server.config().admin_access == AdminAccess::kSameUser);
    for (TransportKind t : {TransportKind::kTcp, TransportKind::kShm}) {
      auto ch = connect(server, t);
      auto m = slotrpc::admin::fetch_metrics(*ch);
      CHECK_MESSAGE(m.ok(), m.status().to_string());
    }
  }
  SUBCASE("off: PERMISSION_DENIED naming the setting; other methods still served") {
    Config c;
    c.admin_access = AdminAccess::kOff;
    Server server(c);
    REQUIRE(server.add_service(make_service(&runs)).ok());
    REQUIRE(server.start("127.0.0.1:0").ok());
    auto ch = connect(server, TransportKind::kTcp);
    auto m = slotrpc::admin::fetch_metrics(*ch);
    REQUIRE_FALSE(m.ok());
    CHECK(m.status().code() == StatusCode::kPermissionDenied);
    CHECK(m.status().message().find("SLOTRPC_ADMIN_ACCESS") != std::string::npos);
    CHECK(who(*ch).rfind("tcp|", 0) == 0);
  }
}

TEST_CASE("the metrics port: 403 naming the setting when admin_access = off") {
  std::atomic<int> runs{0};
  Config c;
  c.metrics_address = "127.0.0.1:0";
  c.admin_access = AdminAccess::kOff;
  Server server(c);
  REQUIRE(server.add_service(make_service(&runs)).ok());
  REQUIRE(server.start("127.0.0.1:0").ok());
  const std::string http = "127.0.0.1:" + std::to_string(server.metrics_port());
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    const int devnull = ::open("/dev/null", O_WRONLY);
    if (devnull >= 0) ::dup2(devnull, 1);
    ::execl(ADMIN_PROBE, ADMIN_PROBE, http.c_str(), "http", static_cast<char*>(nullptr));
    ::_exit(6);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 3);
}

TEST_CASE("a TCP peer's uid: from sock_diag, and from /proc/net/tcp where sock_diag has no answer") {
  for (int family : {AF_INET, AF_INET6}) {
    INFO("family ", family);
    const int ls = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(ls >= 0);
    sockaddr_storage a{};
    socklen_t alen;
    if (family == AF_INET) {
      auto& in = reinterpret_cast<sockaddr_in&>(a);
      in.sin_family = AF_INET;
      in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      alen = sizeof in;
    } else {
      auto& in6 = reinterpret_cast<sockaddr_in6&>(a);
      in6.sin6_family = AF_INET6;
      in6.sin6_addr = in6addr_loopback;
      alen = sizeof in6;
    }
    if (::bind(ls, reinterpret_cast<sockaddr*>(&a), alen) != 0) {
      ::close(ls);
      WARN_MESSAGE(family == AF_INET6, "no IPv6 loopback here: that family not checked");
      REQUIRE(family == AF_INET6);
      continue;
    }
    REQUIRE(::listen(ls, 1) == 0);
    REQUIRE(::getsockname(ls, reinterpret_cast<sockaddr*>(&a), &alen) == 0);
    const int c = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(::connect(c, reinterpret_cast<sockaddr*>(&a), alen) == 0);
    const int s = ::accept4(ls, nullptr, nullptr, SOCK_CLOEXEC);
    REQUIRE(s >= 0);
    CHECK(slotrpc::base::tcp_peer_is_loopback(s));
    CHECK(slotrpc::base::same_host_tcp_peer_uid(s) == std::optional<uint32_t>(::geteuid()));
    CHECK(slotrpc::base::proc_tcp_peer_uid(s) == std::optional<uint32_t>(::geteuid()));
    ::close(s);
    ::close(c);
    ::close(ls);
  }
}

TEST_CASE("the Admin rule: same host and same uid, unless any or off") {
  using slotrpc::rpc::admin_allows;
  PeerInfo remote;
  remote.transport = "tcp";
  remote.address = "10.0.0.2:4000";
  PeerInfo mine;
  mine.transport = "shm";
  mine.same_host = true;
  mine.uid = 1000;
  PeerInfo other = mine;
  other.uid = 1001;
  PeerInfo unknown = mine;
  unknown.uid.reset();
  CHECK(admin_allows(mine, AdminAccess::kSameUser, 1000).ok());
  CHECK(admin_allows(remote, AdminAccess::kSameUser, 1000).code() == StatusCode::kPermissionDenied);
  CHECK(admin_allows(remote, AdminAccess::kSameUser, 1000).message().find("not on this host") !=
        std::string::npos);
  CHECK(admin_allows(other, AdminAccess::kSameUser, 1000).message().find("not uid 1001") !=
        std::string::npos);
  CHECK(admin_allows(unknown, AdminAccess::kSameUser, 1000).message().find("uid of") != std::string::npos);
  CHECK(admin_allows(remote, AdminAccess::kAny, 1000).ok());
  CHECK(admin_allows(mine, AdminAccess::kOff, 1000).code() == StatusCode::kPermissionDenied);
}

TEST_CASE("SLOTRPC_ADMIN_ACCESS: a bad value is refused naming the setting and the choices") {
  slotrpc::set_environment_overlay(true);
  ::setenv("SLOTRPC_ADMIN_ACCESS", "everyone", 1);
  auto c = Config{}.with_environment();
  ::unsetenv("SLOTRPC_ADMIN_ACCESS");
  ::setenv("SLOTRPC_ADMIN_ACCESS", "off", 1);
  auto off = Config{}.with_environment();
  ::unsetenv("SLOTRPC_ADMIN_ACCESS");
  slotrpc::set_environment_overlay(false);
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().message().find("SLOTRPC_ADMIN_ACCESS") != std::string::npos);
  CHECK(c.status().message().find("same-user any off") != std::string::npos);
  REQUIRE(off.ok());
  CHECK(off->admin_access == AdminAccess::kOff);
}

// A process of another user: as root, the probe runs as nobody (65534) and
// is refused over both transports and on the metrics port; the server's own
// uid is answered.
TEST_CASE("Admin and the metrics port refuse a process of another uid") {
  std::atomic<int> runs{0};
  Config c;
  c.metrics_address = "127.0.0.1:0";
  Server server(c);
  REQUIRE(server.add_service(make_service(&runs)).ok());
  REQUIRE(server.start("127.0.0.1:0").ok());
  const std::string address = address_of(server);
  const std::string http = "127.0.0.1:" + std::to_string(server.metrics_port());
  auto probe = [&](const char* transport, uid_t as) {
    const std::string& target = std::string(transport) == "http" ? http : address;
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      // Only async-signal-safe calls before exec: this process has threads.
      const int devnull = ::open("/dev/null", O_WRONLY);
      if (devnull >= 0) ::dup2(devnull, 1);
      if (as != ::geteuid() && (::setgid(as) != 0 || ::setuid(as) != 0)) ::_exit(5);
      ::execl(ADMIN_PROBE, ADMIN_PROBE, target.c_str(), transport, static_cast<char*>(nullptr));
      ::_exit(6);
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    REQUIRE(WIFEXITED(status));
    return WEXITSTATUS(status);
  };
  for (const char* t : {"tcp", "shm", "http"}) {
    INFO("transport ", t);
    CHECK(probe(t, ::geteuid()) == 0);
    if (::geteuid() == 0) {
      CHECK(probe(t, 65534) == 3);
    } else {
      WARN_MESSAGE(false, "not root: another uid's refusal is checked by the rule's own case only");
    }
  }
}

TEST_CASE("client interceptors run before a call is sent: a refusal completes it, a deadline applies") {
  std::atomic<int> runs{0};
  Server server;
  REQUIRE(server.add_service(make_service(&runs)).ok());
  REQUIRE(server.start("127.0.0.1:0").ok());
  auto ch = connect(server, TransportKind::kTcp);
  std::vector<std::string> seen;  // the calling thread's: read after each call
  REQUIRE(ch->add_interceptor([&seen, &server](slotrpc::ClientCallInfo& info) -> Status {
    seen.push_back(std::string(info.target));
    CHECK(info.target == "127.0.0.1:" + std::to_string(server.port()));
    if (info.method_id == kSecret) return Status(StatusCode::kUnauthenticated, "no token for Secret");
    return {};
  }).ok());
  REQUIRE(ch->add_interceptor([](slotrpc::ClientCallInfo& info) -> Status {
    // Calls to Who get a deadline already passed.
    if (info.method_id == kWho && !info.deadline) info.deadline = slotrpc::Clock::now();
    return {};
  }).ok());

  auto r = ch->call_typed<Pong>(kSecret, ping(1, "x")).get();
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kUnauthenticated);
  CHECK(r.status().message() == "no token for Secret");
  CHECK(seen.size() == 1);

  // The callback form and a server stream's end see the same refusal.
  std::promise<Status> ended;
  slotrpc::raw::call_stream(*ch, kSecret, ping(2, "x"), {}, [](slotrpc::RawReply&&) {},
                  [&ended](Status st) { ended.set_value(std::move(st)); });
  auto end = ended.get_future();
  REQUIRE(end.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(end.get().code() == StatusCode::kUnauthenticated);

  auto late = ch->call_typed<Pong>(kWho, ping(3, "x")).get();
  REQUIRE_FALSE(late.ok());
  CHECK(late.status().code() == StatusCode::kDeadlineExceeded);
  // An explicit deadline is left alone by the second interceptor.
  auto who_ok = ch->call_typed<Pong>(kWho, ping(4, "x"),
                                     slotrpc::CallOptions::with_timeout(std::chrono::seconds(10)))
                    .get();
  CHECK_MESSAGE(who_ok.ok(), who_ok.status().to_string());
  CHECK(runs.load() == 0);
  CHECK(seen.size() == 4);
  CHECK(ch->add_interceptor([](slotrpc::ClientCallInfo&) { return Status(); }).code() ==
        StatusCode::kInvalidArgument);
}
