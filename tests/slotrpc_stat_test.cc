// slotrpc-stat --address against an in-process Server: the table shows the
// server's calls and per-method latency columns, --prometheus prints the
// exposition text with its counters, --watch N --count K refreshes K times,
// and an address where nothing listens exits 1 saying why.
#include <doctest/doctest.h>
#include <slotrpc/slotrpc.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace {

using slotrpc::Channel;
using slotrpc::Server;
using slotrpc::ServerCall;
using slotrpc::ServiceDefinition;
using slotrpc::Status;

struct Run {
  int status = -1;
  std::string out;
};

Run run(const std::string& args) {
  const std::string cmd = std::string(SLOTRPC_STAT) + " " + args + " 2>&1";
  Run r;
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("slotrpc-stat --address: a running server's counters and latency") {
  ServiceDefinition svc("slotrpc.test.Stat");
  svc.add_method("Echo", [](ServerCall& call) -> Status {
    call.reply().PushFlatBuffer(reinterpret_cast<const uint8_t*>(call.request().data()), call.request().size());
    return {};
  });
  Server server;
  REQUIRE(server.add_service(std::move(svc)).ok());
  REQUIRE(server.start("127.0.0.1:0").ok());
  const std::string address = "127.0.0.1:" + std::to_string(server.port());
  {
    auto ch = Channel::connect(address).value();
    for (int i = 0; i < 17; ++i) {
      REQUIRE(slotrpc::raw::call(*ch, slotrpc::method_id("slotrpc.test.Stat.Echo"), [](flatbuffers::FlatBufferBuilder& fbb) {
        const uint8_t b[8] = {};
        fbb.PushFlatBuffer(b, sizeof b);
      }).get().ok());
    }
  }

  const Run table = run("--address " + address);
  INFO(table.out);
  CHECK(table.status == 0);
  CHECK(contains(table.out, "p50 us"));
  CHECK(contains(table.out, "p99.9 us"));
  // slotrpc-stat's own Admin call has started (not finished) when counted.
  CHECK(contains(table.out, "server calls: started 18, finished 17 OK=17"));
  // side, name, 17 calls, 0 errors, then the quantiles.
  CHECK(contains(table.out, "server  slotrpc.test.Stat/Echo"));
  const size_t row = table.out.find("slotrpc.test.Stat/Echo");
  REQUIRE(row != std::string::npos);
  const std::string line = table.out.substr(row, table.out.find('\n', row) - row);
  CHECK(contains(line, " 17 "));
  CHECK(contains(table.out, "transport tcp: "));
  // Every method the server runs is shown by name, its built-in services'
  // included, never as a "0x..." id.
  CHECK_FALSE(contains(table.out, "0x"));

  const Run prom = run("--address " + address + " --prometheus");
  INFO(prom.out);
  CHECK(prom.status == 0);
  CHECK(contains(prom.out, "# TYPE slotrpc_method_latency_seconds histogram\n"));
  CHECK(contains(prom.out, "slotrpc_method_calls_finished_total{side=\"server\",method=\"slotrpc.test.Stat/Echo\",code=\"OK\"} 17\n"));
  // The previous slotrpc-stat runs were served too.
  CHECK(contains(prom.out, "slotrpc_method_calls_finished_total{side=\"server\",method=\"slotrpc.Admin/Metrics\",code=\"OK\"} 1\n"));

  const Run watch = run("--address " + address + " --watch 0.05 --count 3");
  INFO(watch.out);
  CHECK(watch.status == 0);
  size_t refreshes = 0;
  for (size_t at = watch.out.find("--- " + address); at != std::string::npos;
       at = watch.out.find("--- " + address, at + 1)) {
    ++refreshes;
  }
  CHECK(refreshes == 3);
  CHECK(contains(watch.out, "server calls/s over the last"));

  server.stop();
  const Run gone = run("--address " + address);
  INFO(gone.out);
  CHECK(gone.status == 1);
  CHECK(contains(gone.out, "slotrpc-stat: UNAVAILABLE"));
  CHECK(run("--address nonsense").status != 0);
  CHECK(run("--address " + address + " --device rxe0").status == 2);  // one mode at a time
}
