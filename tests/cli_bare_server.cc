// A server for tests/cli_test.sh that cannot send slotrpc-cli a schema:
// it serves examples/echo's slotrpc.examples.Echo and
//   reflection  refuses slotrpc.Reflection as a server built before it
//               does (UNIMPLEMENTED, "no method with id ... on this server");
//   schema      runs it, but registers Echo without its schema, as a
//               service written without slotrpc-gen's code is.
// It writes its port to PORT_FILE and serves until killed.
//
//   cli_bare_server reflection|schema PORT_FILE
#include <fmt/format.h>
#include <signal.h>
#include <slotrpc/slotrpc.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "echo.slotrpc.h"

namespace {

class EchoImpl final : public slotrpc::examples::EchoService {
  slotrpc::Status Echo(const slotrpc::examples::EchoRequest& req,
                       slotrpc::ReplyBuilder<slotrpc::examples::EchoReply>& reply, slotrpc::ServerCall&) override {
    auto& fbb = reply.fbb();
    reply.Finish(slotrpc::examples::CreateEchoReply(
        fbb, req.seq(), req.payload() ? fbb.CreateVector(req.payload()->data(), req.payload()->size()) : 0));
    return {};
  }
};

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc == 3 ? argv[1] : "";
  if (mode != "reflection" && mode != "schema") {
    std::fprintf(stderr, "usage: cli_bare_server reflection|schema PORT_FILE\n");
    return 2;
  }
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &term, nullptr);

  EchoImpl impl;
  slotrpc::Server server;
  slotrpc::ServiceDefinition echo = impl.definition();
  if (mode == "schema") echo.set_schema({});
  if (auto st = server.add_service(std::move(echo)); !st.ok()) return std::puts(st.to_string().c_str()), 1;
  if (mode == "reflection") {
    (void)server.add_interceptor([](const slotrpc::ServerCall& call) {
      if (call.method_name().rfind("slotrpc.Reflection", 0) != 0) return slotrpc::Status();
      return slotrpc::Status(slotrpc::StatusCode::kUnimplemented,
                             fmt::format("no method with id 0x{:08x} on this server", call.method_id()));
    });
  }
  if (auto st = server.start("127.0.0.1:0"); !st.ok()) return std::puts(st.to_string().c_str()), 1;
  const std::string file = argv[2];
  {
    std::ofstream out(file + ".tmp");
    out << server.port() << "\n";
  }
  std::filesystem::rename(file + ".tmp", file);
  int sig = 0;
  sigwait(&term, &sig);
  server.stop();
  return 0;
}
