// Discovery through a real etcd (lib/rpc/discovery): servers in child
// processes register with Server::register_with, and the etcd:// resolver
// (make_etcd_resolver, what Channel::connect("etcd://...") uses) sees them
// come, die and withdraw.  Also: the resolver rides out etcd going away.
#include <doctest/doctest.h>
#include <signal.h>
#include <slotrpc/slotrpc.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "etcd_util.h"
#include "ping_payloads.h"
#include "test_messages_generated.h"
#include "process_util.h"
#include "rpc/discovery/etcd_resolver.h"
#include "rpc/discovery/registration.h"

#ifndef ETCD_SERVER_CHILD
#error "ETCD_SERVER_CHILD must be defined"
#endif

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using slotrpc::rpc::discovery::kLeaseTtl;
using slotrpc::rpc::discovery::make_etcd_resolver;

// What the resolver reported, for waiting on.
struct Updates {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> list;
  int answers = 0;
  int errors = 0;
  std::string last_error;

  void on(slotrpc::Result<std::vector<std::string>> r) {
    std::lock_guard<std::mutex> lock(mu);
    if (r.ok()) {
      list = r.value();
      ++answers;
    } else {
      ++errors;
      last_error = r.status().message();
    }
    cv.notify_all();
  }
  // Waits up to `limit` for `pred(list)`; the time it took, or nullopt.
  template <class Pred>
  std::optional<std::chrono::milliseconds> wait(Pred pred, std::chrono::milliseconds limit) {
    const auto t0 = Clock::now();
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, limit, [&] { return pred(list); })) return std::nullopt;
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
  }
  std::vector<std::string> snapshot() {
    std::lock_guard<std::mutex> lock(mu);
    return list;
  }
};

bool has(const std::vector<std::string>& list, const std::string& s) {
  return std::find(list.begin(), list.end(), s) != list.end();
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
  return "[" + s + "]";
}

// A registered server process.
struct ServerChild {
  std::unique_ptr<test_process::Child> child;
  std::string address;  // "127.0.0.1:PORT", as it registered
  Clock::time_point listening;
};

ServerChild start_server(const std::filesystem::path& dir, const std::string& target, const std::string& name) {
  ServerChild s;
  const auto port_file = dir / (name + ".port");
  s.child = std::make_unique<test_process::Child>(std::vector<std::string>{ETCD_SERVER_CHILD, target, port_file.string()},
                                                  test_process::SpawnOptions::to_file(dir / (name + ".log")));
  const auto up = test_process::wait_for_port_file(port_file, *s.child, 20s);
  s.listening = Clock::now();
  REQUIRE_MESSAGE(up.port != 0, name << " did not start: " << test_process::read_file(dir / (name + ".log")));
  s.address = "127.0.0.1:" + std::to_string(up.port);
  return s;
}

}  // namespace

TEST_CASE("servers register in etcd; the resolver sees them come, die and withdraw") {
  test_process::TempDir dir("slotrpc-etcd");
  etcd_test::Etcd etcd(dir.path);
  REQUIRE_MESSAGE(etcd.error().empty(), etcd.error());
  const std::string target = "etcd://" + etcd.rest("fleet/echo");

  Updates updates;
  auto resolver = make_etcd_resolver(etcd.rest("fleet/echo"));
  REQUIRE(resolver.ok());
  (*resolver)->start([&](auto r) { updates.on(std::move(r)); });
  // The first answer: nobody registered yet.
  REQUIRE(updates.wait([&](auto&) { return updates.answers > 0; }, 10s));
  CHECK(updates.snapshot().empty());

  std::vector<ServerChild> servers;
  for (int i = 0; i < 3; ++i) servers.push_back(start_server(dir.path, target, "server" + std::to_string(i)));
  const auto all3 = updates.wait(
      [&](auto& l) { return l.size() == 3 && has(l, servers[0].address) && has(l, servers[1].address) &&
                            has(l, servers[2].address); },
      10s);
  REQUIRE_MESSAGE(all3, "the resolver's list: " << join(updates.snapshot()));

  SUBCASE("a server killed with SIGKILL leaves when its lease expires") {
    const auto t0 = Clock::now();
    servers[0].child->kill_and_reap();
    const auto gone = updates.wait([&](auto& l) { return !has(l, servers[0].address); }, kLeaseTtl + 10s);
    REQUIRE_MESSAGE(gone, "still listed: " << join(updates.snapshot()));
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
    MESSAGE("a killed server left the list after " << took.count() << " ms (lease TTL " << kLeaseTtl.count() << " s)");
    CHECK(updates.snapshot().size() == 2);

    // A fourth appears within a second of listening (it registers as it starts).
    servers.push_back(start_server(dir.path, target, "server3"));
    const auto fourth = updates.wait([&](auto& l) { return has(l, servers[3].address); }, 10s);
    REQUIRE_MESSAGE(fourth, "the fourth never appeared: " << join(updates.snapshot()));
    const auto since = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - servers[3].listening);
    MESSAGE("the fourth server appeared " << since.count() << " ms after it listened");
    CHECK(since < 1000ms);
    CHECK(updates.snapshot().size() == 3);
  }

  SUBCASE("a stopped server withdraws at once, well before its lease would expire") {
    REQUIRE(servers[1].child->signal(SIGTERM));  // stop(): withdraws
    const auto gone = updates.wait([&](auto& l) { return !has(l, servers[1].address); }, 10s);
    REQUIRE_MESSAGE(gone, "still listed: " << join(updates.snapshot()));
    MESSAGE("a stopped server left the list after " << gone->count() << " ms");
    CHECK(*gone < std::chrono::milliseconds(1000));
    int status = -1;
    REQUIRE(servers[1].child->wait(10s, &status));
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    CHECK(updates.snapshot().size() == 2);
  }

  SUBCASE("etcd goes away and comes back: the resolver reports it, lists again, and the servers are back") {
    const int errors_before = updates.errors;
    etcd.stop();
    const auto reported = updates.wait([&](auto&) { return updates.errors > errors_before; }, 20s);
    REQUIRE_MESSAGE(reported, "no error while etcd was down");
    MESSAGE("while etcd was down: " << updates.last_error);
    const int answers = updates.answers;  // before: the resolver may list as soon as etcd is up
    REQUIRE_MESSAGE(etcd.start(), etcd.error());
    const auto back = updates.wait(
        [&](auto& l) { return updates.answers > answers && l.size() == 3; }, 20s);
    REQUIRE_MESSAGE(back, "after etcd came back: " << join(updates.snapshot()));
  }


  SUBCASE("a lease revoked behind the servers' backs: they notice and register again") {
    slotrpc::rpc::discovery::Interrupt never;
    slotrpc::rpc::discovery::EtcdClient client(etcd.endpoint(), never);
    auto listed = client.range_prefix("/fleet/echo/");
    REQUIRE(listed.ok());
    REQUIRE(listed->kvs.size() == 3);
    for (const auto& kv : listed->kvs) {
      CHECK(kv.lease != 0);
      REQUIRE(client.revoke(kv.lease).ok());
    }
    const auto emptied = updates.wait([&](auto& l) { return l.size() < 3; }, 10s);
    REQUIRE_MESSAGE(emptied, "revoking the leases deleted no key");
    const auto back = updates.wait(
        [&](auto& l) {
          return l.size() == 3 && has(l, servers[0].address) && has(l, servers[1].address) &&
                 has(l, servers[2].address);
        },
        10s);
    REQUIRE_MESSAGE(back, "after the leases were revoked: " << join(updates.snapshot()));
    MESSAGE("the servers registered again " << back->count() << " ms after their keys went");
    CHECK(*back < 3000ms);  // each notices at its next keep-alive (every TTL/3)
  }

  SUBCASE("etcd comes back empty: the servers' leases are lost and they register again") {
    etcd.stop();
    etcd.wipe();
    REQUIRE_MESSAGE(etcd.start(), etcd.error());
    const auto back = updates.wait(
        [&](auto& l) {
          return l.size() == 3 && has(l, servers[0].address) && has(l, servers[1].address) &&
                 has(l, servers[2].address);
        },
        20s);
    REQUIRE_MESSAGE(back, "after etcd lost its data: " << join(updates.snapshot()));
    MESSAGE("the servers were back " << back->count() << " ms after the empty etcd answered");
  }

  (*resolver)->stop();
}

TEST_CASE("shutdown(grace) withdraws at its start, while calls in flight still drain") {
  test_process::TempDir dir("slotrpc-etcd");
  etcd_test::Etcd etcd(dir.path);
  REQUIRE_MESSAGE(etcd.error().empty(), etcd.error());

  std::atomic<int> started{0};
  slotrpc::ServiceDefinition svc("slotrpc.test.Draining");
  svc.add_unary<slotrpc::test::Ping>(
      "Slow", [&started](const slotrpc::test::Ping& req, flatbuffers::FlatBufferBuilder& out,
                         slotrpc::ServerCall&) -> slotrpc::Status {
        ++started;
        slotrpc::this_fiber::sleep_for(std::chrono::milliseconds(req.seq()));
        out.Finish(slotrpc::test::CreatePong(out, req.seq(), out.CreateString("done")));
        return {};
      });
  slotrpc::Server server;
  REQUIRE(server.add_service(std::move(svc)).ok());
  REQUIRE(server.register_with("etcd://" + etcd.rest("fleet/drain")).ok());
  REQUIRE(server.start("127.0.0.1:0").ok());
  const std::string address = "127.0.0.1:" + std::to_string(server.port());

  Updates updates;
  auto resolver = make_etcd_resolver(etcd.rest("fleet/drain"));
  REQUIRE(resolver.ok());
  (*resolver)->start([&](auto r) { updates.on(std::move(r)); });
  REQUIRE(updates.wait([&](auto& l) { return has(l, address); }, 10s));

  slotrpc::Config c;
  c.transport = slotrpc::TransportKind::kTcp;
  auto ch = slotrpc::Channel::connect(address, c);
  REQUIRE(ch.ok());
  // A call of 2 s in flight when the drain starts.
  auto call = (*ch)->call_typed<slotrpc::test::Pong>(slotrpc::method_id("slotrpc.test.Draining.Slow"),
                                                     slotrpc::test_payloads::ping(2000, "x"));
  REQUIRE(test_process::wait_until([&] { return started.load() == 1; }));
  std::thread drain([&server] { server.shutdown(std::chrono::seconds(10)); });
  const auto gone = updates.wait([&](auto& l) { return !has(l, address); }, 10s);
  CHECK_MESSAGE(gone, "still listed: " << join(updates.snapshot()));
  CHECK_FALSE(call.wait_for(std::chrono::milliseconds(0)));  // withdrawn while the call still runs
  auto r = call.get();
  CHECK_MESSAGE(r.ok(), r.status().to_string());
  drain.join();
  (*resolver)->stop();
}

TEST_CASE("a server on an IPv6 address registers it in brackets") {
  test_process::TempDir dir("slotrpc-etcd");
  etcd_test::Etcd etcd(dir.path);
  REQUIRE_MESSAGE(etcd.error().empty(), etcd.error());
  slotrpc::Server server;
  REQUIRE(server.register_with("etcd://" + etcd.rest("fleet/v6")).ok());
  if (auto st = server.start("[::1]:0"); !st.ok()) {
    // Not every host has IPv6 loopback (a container without it): said, not hidden.
    MESSAGE("not checked: this host cannot listen on [::1]: " << st.to_string());
    return;
  }
  Updates updates;
  auto resolver = make_etcd_resolver(etcd.rest("fleet/v6"));
  REQUIRE(resolver.ok());
  (*resolver)->start([&](auto r) { updates.on(std::move(r)); });
  const std::string address = "[::1]:" + std::to_string(server.port());
  CHECK_MESSAGE(updates.wait([&](auto& l) { return has(l, address); }, 10s),
                "wanted " << address << ", listed: " << join(updates.snapshot()));
  server.stop();
  CHECK(updates.wait([&](auto& l) { return l.empty(); }, 10s));
  (*resolver)->stop();
}

TEST_CASE("register_with and the etcd resolver refuse targets they cannot use, naming them") {
  slotrpc::Server server;
  auto st = server.register_with("dns:///x:1");
  CHECK(st.code() == slotrpc::StatusCode::kInvalidArgument);
  CHECK(st.message().find("etcd://HOST:PORT/prefix") != std::string::npos);
  st = server.register_with("etcd://127.0.0.1:2379");
  CHECK(st.code() == slotrpc::StatusCode::kInvalidArgument);
  CHECK(st.message().find("no /prefix") != std::string::npos);
  st = server.register_with("etcd://127.0.0.1:2379/p", "0.0.0.0:80");
  CHECK(st.code() == slotrpc::StatusCode::kInvalidArgument);
  CHECK(st.message().find("0.0.0.0:80") != std::string::npos);
  CHECK(server.register_with("etcd://127.0.0.1:2379/p", "10.0.0.1:80").ok());

  CHECK(make_etcd_resolver("127.0.0.1:2379/").status().message().find("prefix is empty") != std::string::npos);
  CHECK(make_etcd_resolver("nohost/p").status().code() == slotrpc::StatusCode::kInvalidArgument);
}

TEST_CASE("a resolver without etcd reports UNAVAILABLE, and stop() returns at once") {
  Updates updates;
  auto resolver = make_etcd_resolver("127.0.0.1:" + std::to_string(etcd_test::free_port()) + "/nobody");
  REQUIRE(resolver.ok());
  (*resolver)->start([&](auto r) { updates.on(std::move(r)); });
  REQUIRE(updates.wait([&](auto&) { return updates.errors > 0; }, 10s));
  CHECK(updates.last_error.find("cannot connect") != std::string::npos);
  const auto t0 = Clock::now();
  (*resolver)->stop();
  CHECK(Clock::now() - t0 < 1s);
}

TEST_CASE("stop() withdraws promptly: the key is gone when it returns; with etcd hung it still returns") {
  test_process::TempDir dir("slotrpc-etcd");
  etcd_test::Etcd etcd(dir.path);
  REQUIRE_MESSAGE(etcd.error().empty(), etcd.error());
  slotrpc::rpc::discovery::Interrupt never;
  slotrpc::rpc::discovery::EtcdClient client(etcd.endpoint(), never, 2s);
  const auto listed = [&](const std::string& address) {
    auto r = client.range_prefix("/fleet/stop/");
    REQUIRE_MESSAGE(r.ok(), r.status().to_string());
    for (const auto& kv : r->kvs)
      if (kv.value == address) return true;
    return false;
  };
  // Within kWithdrawWait and what a loaded host adds to it; before, one
  // second per request (two of them) against a hung etcd.
  constexpr auto kBound = 1500ms;
  slotrpc::Server healthy;
  REQUIRE(healthy.register_with("etcd://" + etcd.rest("fleet/stop")).ok());
  REQUIRE(healthy.start("127.0.0.1:0").ok());
  const std::string a = "127.0.0.1:" + std::to_string(healthy.port());
  REQUIRE(test_process::wait_until([&] { return listed(a); }));
  auto t0 = Clock::now();
  healthy.stop();
  auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
  MESSAGE("stop() with etcd up took " << took.count() << " ms");
  CHECK(took < kBound);
  CHECK_MESSAGE(!listed(a), a << " is still registered after stop() returned");

  slotrpc::Server hung;
  REQUIRE(hung.register_with("etcd://" + etcd.rest("fleet/stop")).ok());
  REQUIRE(hung.start("127.0.0.1:0").ok());
  const std::string b = "127.0.0.1:" + std::to_string(hung.port());
  REQUIRE(test_process::wait_until([&] { return listed(b); }));
  REQUIRE(etcd.signal(SIGSTOP));
  t0 = Clock::now();
  hung.stop();
  took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
  MESSAGE("stop() with etcd hung took " << took.count() << " ms");
  CHECK(took < kBound);
  REQUIRE(etcd.signal(SIGCONT));
  // No keep-alive since: the lease takes the key.
  CHECK(test_process::wait_until([&] { return !listed(b); }, kLeaseTtl + 10s, 50ms));
}
