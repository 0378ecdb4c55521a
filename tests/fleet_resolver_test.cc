// Resolver targets: a scheme of the test's own (register_resolver) whose
// new endpoint gets calls within a second; dns:///localhost:PORT reaching a
// server on 127.0.0.1 and one on ::1; a dns:/// name that moves to another
// address, followed when the old endpoint fails; and the errors of bad targets and of
// a bad SLOTRPC_LB_POLICY.
#include <doctest/doctest.h>
#include <slotrpc/slotrpc.h>
#include <slotrpc/resolver.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "env_var.h"
#include "fleet_util.h"

namespace {

using namespace fleet_test;
using slotrpc::Channel;
using slotrpc::StatusCode;
using slotrpc::test::Pong;

// The test scheme "testfleet://NAME": every resolver it makes publishes the
// list the test sets with set_list(), now and on each change.
struct TestResolvers {
  std::mutex mu;
  std::vector<std::string> list;
  std::vector<slotrpc::ResolverUpdate> listeners;
  std::atomic<int> made{0}, stopped{0};
  std::string last_rest;

  void set_list(std::vector<std::string> l) {
    std::vector<slotrpc::ResolverUpdate> to_tell;
    {
      std::lock_guard<std::mutex> lock(mu);
      list = l;
      to_tell = listeners;
    }
    for (auto& u : to_tell) u(l);
  }
};

TestResolvers& resolvers() {
  static TestResolvers r;
  return r;
}

class TestResolver final : public slotrpc::Resolver {
 public:
  void start(slotrpc::ResolverUpdate update) override {
    std::vector<std::string> now;
    {
      std::lock_guard<std::mutex> lock(resolvers().mu);
      resolvers().listeners.push_back(update);
      now = resolvers().list;
    }
    update(now);
  }
  void stop() override {
    std::lock_guard<std::mutex> lock(resolvers().mu);
    resolvers().listeners.clear();
    ++resolvers().stopped;
  }
};

std::string addr(const slotrpc::Server& s) { return "127.0.0.1:" + std::to_string(s.port()); }

std::string error_of(const std::string& target) {
  auto ch = Channel::connect(target);
  REQUIRE_MESSAGE(!ch.ok(), target << " connected");
  return ch.status().to_string();
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Runs this binary's `--test-case=HELPER` in a child whose mount namespace
// has `hosts_text` as its /etc/hosts (unshare -rm: an unprivileged user
// namespace; the file is bind-mounted, so FLEET_HOSTS, its path, can be
// rewritten from inside), and reports whether it ran and passed, with its
// log.
struct HostsChild {
  bool ran = false;  // the namespace was made and the helper ran
  bool ok = false;   // ... and passed
  std::string log;
};
HostsChild run_with_hosts(const std::string& hosts_text, const std::string& helper,
                          std::vector<std::string> env) {
  test_process::TempDir dir("slotrpc-fleet-dns");
  const auto hosts = dir.path / "hosts";
  {
    std::ofstream out(hosts);
    out << hosts_text;
  }
  const std::string script =
      "mount --bind " + hosts.string() + " /etc/hosts && exec \"$0\" --no-skip '--test-case=" + helper + "'";
  auto o = test_process::SpawnOptions::to_file(dir.path / "child.log");
  env.push_back("FLEET_HOSTS=" + hosts.string());
  o.env = std::move(env);
  test_process::Child child({"/usr/bin/unshare", "-rm", "/bin/sh", "-c", script, test_process::self_exe()}, o);
  int status = 0;
  REQUIRE_MESSAGE(child.wait(60000ms, &status), "the dns client did not finish");
  HostsChild r;
  r.log = test_process::read_file(dir.path / "child.log");
  const bool passed = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  r.ran = passed || !(has(r.log, "unshare:") || has(r.log, "mount:"));
  r.ok = passed;
  return r;
}

}  // namespace

void register_testfleet() {
  REQUIRE(slotrpc::register_resolver("testfleet", [](std::string_view rest) -> slotrpc::Result<std::unique_ptr<slotrpc::Resolver>> {
            {
              std::lock_guard<std::mutex> lock(resolvers().mu);
              resolvers().last_rest = std::string(rest);
            }
            ++resolvers().made;
            return std::unique_ptr<slotrpc::Resolver>(new TestResolver);
          }).ok());
}

TEST_CASE("a registered scheme's resolver: its new endpoint receives calls within a second") {
  register_testfleet();
  resolvers().made = 0;
  resolvers().stopped = 0;
  auto a = start_who("a");
  REQUIRE(a != nullptr);
  resolvers().set_list({addr(*a)});
  {
    auto ch = Channel::connect("testfleet://my-fleet");
    REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
    CHECK(resolvers().made == 1);
    {
      std::lock_guard<std::mutex> lock(resolvers().mu);
      CHECK(resolvers().last_rest == "my-fleet");
    }
    for (int i = 0; i < 20; ++i) {
      auto r = ch.value()->call_typed<Pong>(kWho, who(i)).get();
      REQUIRE_MESSAGE(r.ok(), r.status().to_string());
      CHECK(r->text()->str() == "a");
    }
    auto b = start_who("b");
    REQUIRE(b != nullptr);
    const auto published = slotrpc::Clock::now();
    resolvers().set_list({addr(*a), addr(*b)});
    bool reached = false;
    while (!reached && slotrpc::Clock::now() < published + 1s) {
      auto r = ch.value()->call_typed<Pong>(kWho, who(1)).get();
      REQUIRE_MESSAGE(r.ok(), r.status().to_string());
      reached = r->text()->str() == "b";
    }
    CHECK_MESSAGE(reached, "b got no call within a second of appearing in the list");

    // Taken out of the list: no more calls there.
    resolvers().set_list({addr(*b)});
    for (int i = 0; i < 50; ++i) {
      auto r = ch.value()->call_typed<Pong>(kWho, who(i)).get();
      REQUIRE_MESSAGE(r.ok(), r.status().to_string());
      CHECK(r->text()->str() == "b");
    }
  }
  CHECK(resolvers().stopped == 1);  // the channel's destruction stopped its resolver
}

TEST_CASE("with no endpoint yet, calls wait for one until their deadline") {
  register_testfleet();
  resolvers().set_list({});
  auto ch = Channel::connect("testfleet://empty");
  REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());  // an empty list is an answer
  auto early = ch.value()->call_typed<Pong>(kWho, who(1), slotrpc::CallOptions::with_timeout(100ms)).get();
  CHECK(early.status().code() == StatusCode::kDeadlineExceeded);
  CHECK(has(early.status().message(), "testfleet://empty"));

  auto waiting = ch.value()->call_typed<Pong>(kWho, who(2), slotrpc::CallOptions::with_timeout(10s));
  auto a = start_who("a");
  REQUIRE(a != nullptr);
  resolvers().set_list({addr(*a)});
  auto r = waiting.get();
  REQUIRE_MESSAGE(r.ok(), r.status().to_string());
  CHECK(r->text()->str() == "a");
}

TEST_CASE("helper: dns client" * doctest::skip()) {
  // In a mount namespace whose /etc/hosts gives localhost both addresses.
  const char* target = std::getenv("FLEET_DNS_TARGET");
  REQUIRE(target != nullptr);
  // TCP: over shm, both addresses would reach whichever server holds the
  // port's Unix socket name.
  slotrpc::Config c;
  c.transport = slotrpc::TransportKind::kTcp;
  auto ch = Channel::connect(target, c);
  REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
  std::map<std::string, int> by_tag;
  for (int i = 0; i < 100; ++i) {
    auto r = ch.value()->call_typed<Pong>(kWho, who(i)).get();
    REQUIRE_MESSAGE(r.ok(), r.status().to_string());
    ++by_tag[r->text()->str()];
  }
  CHECK(by_tag["v4"] == 50);
  CHECK(by_tag["v6"] == 50);
}

TEST_CASE("dns:///localhost:PORT reaches the server on 127.0.0.1 and the one on ::1") {
  // Two servers on one port, one per loopback address.
  std::unique_ptr<slotrpc::Server> v4, v6;
  for (int attempt = 0; attempt < 20 && v6 == nullptr; ++attempt) {
    v4 = start_who("v4");
    REQUIRE(v4 != nullptr);
    v6 = start_who("v6", "[::1]:" + std::to_string(v4->port()));
  }
  REQUIRE_MESSAGE(v6 != nullptr, "no port free on both 127.0.0.1 and ::1");
  const std::string target = "dns:///localhost:" + std::to_string(v4->port());

  // Here, localhost is 127.0.0.1 only (/etc/hosts has no ::1 line), so the
  // two-address case runs in a child with its own /etc/hosts.
  const HostsChild child = run_with_hosts("127.0.0.1 localhost\n::1 localhost\n", "helper: dns client",
                                          {"FLEET_DNS_TARGET=" + target});
  if (!child.ran) {
    // No user or mount namespaces here: say so, and check what can be checked.
    MESSAGE("unshare -rm or the bind mount failed, so the two-address case is not run: " << child.log);
    auto ch = Channel::connect(target);
    REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
    auto r = ch.value()->call_typed<Pong>(kWho, who(1)).get();
    REQUIRE_MESSAGE(r.ok(), r.status().to_string());
    return;
  }
  CHECK_MESSAGE(child.ok, "the dns client failed: " << child.log);
}

TEST_CASE("helper: dns refresh" * doctest::skip()) {
  // In a mount namespace whose /etc/hosts (FLEET_HOSTS, bind-mounted) names
  // svc.test 127.0.0.1 only.  The servers run here, so this process can
  // stop one.
  const char* hosts = std::getenv("FLEET_HOSTS");
  REQUIRE(hosts != nullptr);
  std::unique_ptr<slotrpc::Server> v4, v6;
  for (int attempt = 0; attempt < 20 && v6 == nullptr; ++attempt) {
    v4 = start_who("v4");
    REQUIRE(v4 != nullptr);
    v6 = start_who("v6", "[::1]:" + std::to_string(v4->port()));
  }
  REQUIRE_MESSAGE(v6 != nullptr, "no port free on both 127.0.0.1 and ::1");
  slotrpc::Config c;
  c.transport = slotrpc::TransportKind::kTcp;  // see "helper: dns client"
  auto ch = Channel::connect("dns:///svc.test:" + std::to_string(v4->port()), c);
  REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
  for (int i = 0; i < 10; ++i) {
    auto r = ch.value()->call_typed<Pong>(kWho, who(i)).get();
    REQUIRE_MESSAGE(r.ok(), r.status().to_string());
    CHECK(r->text()->str() == "v4");
  }
  // The name moves to ::1 (as a DNS record changes when a pod is replaced)
  // and the old address's server goes away: the failed session makes the
  // resolver look again at once, not at its 30 s period, and the calls
  // that wait for an endpoint meanwhile reach the new one.
  {
    std::ofstream out(hosts, std::ios::trunc);
    out << "::1 svc.test\n";
  }
  v4->stop();
  const auto started = std::chrono::steady_clock::now();
  for (int i = 0; i < 10; ++i) {
    auto r = ch.value()->call_typed<Pong>(kWho, who(100 + i), slotrpc::CallOptions::with_timeout(10s)).get();
    REQUIRE_MESSAGE(r.ok(), r.status().to_string());
    CHECK(r->text()->str() == "v6");
  }
  CHECK(std::chrono::steady_clock::now() - started < 10s);
}

TEST_CASE("dns:/// looks again when an endpoint fails, and follows the name to its new address") {
  const HostsChild child = run_with_hosts("127.0.0.1 svc.test\n", "helper: dns refresh", {});
  // Without namespaces /etc/hosts cannot be changed for one process: a
  // failure that says so, not a silent pass.
  REQUIRE_MESSAGE(child.ran, "unshare -rm or the bind mount failed, so re-resolution cannot be tested here: "
                                 << child.log);
  CHECK_MESSAGE(child.ok, "the dns client failed: " << child.log);
}

TEST_CASE("bad targets and settings give errors that name them") {
  std::string e = error_of("nope://x:1");
  CHECK(has(e, "INVALID_ARGUMENT"));
  CHECK(has(e, "'nope'"));
  CHECK(has(e, "list://"));
  CHECK(has(e, "dns://"));

  e = error_of("list://");
  CHECK(has(e, "INVALID_ARGUMENT"));
  CHECK(has(e, "HOST:PORT"));
  e = error_of("list://127.0.0.1:1,nocolon");
  CHECK(has(e, "'nocolon'"));
  e = error_of("list://127.0.0.1:0");
  CHECK(has(e, "port from 1 to 65535"));

  e = error_of("dns://8.8.8.8/name:80");
  CHECK(has(e, "INVALID_ARGUMENT"));
  CHECK(has(e, "dns:///NAME:PORT"));
  e = error_of("dns:///localhost");
  CHECK(has(e, "INVALID_ARGUMENT"));
  e = error_of("dns:///no-such-host.invalid:80");
  CHECK(has(e, "UNAVAILABLE"));
  CHECK(has(e, "no-such-host.invalid"));

  // Nobody listens: the error names every endpoint.
  slotrpc::Config quick;
  quick.connect_timeout_ms = 500;
  auto ch = Channel::connect("list://127.0.0.1:1,127.0.0.1:2", quick);
  REQUIRE(!ch.ok());
  CHECK(has(ch.status().message(), "127.0.0.1:1"));
  CHECK(has(ch.status().message(), "127.0.0.1:2"));

  CHECK(slotrpc::register_resolver("bad scheme", [](std::string_view) -> slotrpc::Result<std::unique_ptr<slotrpc::Resolver>> {
          return slotrpc::Status(StatusCode::kInternal, "unused");
        }).code() == StatusCode::kInvalidArgument);
  CHECK(slotrpc::register_resolver("ok", nullptr).code() == StatusCode::kInvalidArgument);

  {
    slotrpc::test::EnvVar env("SLOTRPC_LB_POLICY", "fastest");
    auto cfg = slotrpc::Config{}.with_environment();
    REQUIRE(!cfg.ok());
    CHECK(has(cfg.status().message(), "SLOTRPC_LB_POLICY"));
    CHECK(has(cfg.status().message(), "'fastest'"));
    CHECK(has(cfg.status().message(), "round_robin pick_first p2c"));
  }
  {
    slotrpc::test::EnvVar env("SLOTRPC_LB_POLICY", "p2c");
    auto cfg = slotrpc::Config{}.with_environment();
    REQUIRE(cfg.ok());
    CHECK(cfg.value().lb_policy == slotrpc::LbPolicy::kP2c);
  }
}
