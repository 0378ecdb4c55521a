// echo_server [--listen HOST:PORT] [--port-file FILE] [--register etcd://HOST:PORT/prefix]
// (--help lists them)
// Serves slotrpc.examples.Echo until SIGINT or SIGTERM.
#include <CLI/CLI.hpp>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "echo_service.h"

int main(int argc, char** argv) {
  std::string listen = "127.0.0.1:7000";
  std::string port_file;
  std::string registry;
  CLI::App app("Serves slotrpc.examples.Echo (examples/echo/echo.fbs) until SIGINT or SIGTERM.",
               "echo_server");
  app.add_option("--listen", listen, "Address to listen on; port 0 picks a free one")
      ->capture_default_str();
  app.add_option("--port-file", port_file,
                 "Once listening, write the port to this file (whole, via a rename)");
  app.add_option("--register", registry,
                 "Register in etcd while serving, e.g. etcd://127.0.0.1:2379/services/echo "
                 "(clients connect to the same target; examples/fleet)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help exits 0; a bad option 2, the usual usage-error status.
    return app.exit(e) == 0 ? 0 : 2;
  }

  // Block the signals before any thread starts, then wait for them here.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  echo::EchoHandler echo_handler;  // outlives the server, which calls it
  slotrpc::Server server;
  if (auto st = server.add_service(echo_handler.definition()); !st.ok()) {
    std::fprintf(stderr, "echo_server: %s\n", st.to_string().c_str());
    return 1;
  }
  if (!registry.empty()) {
    if (auto st = server.register_with(registry); !st.ok()) {
      std::fprintf(stderr, "echo_server: %s\n", st.to_string().c_str());
      return 1;
    }
  }
  if (auto st = server.start(listen); !st.ok()) {
    std::fprintf(stderr, "echo_server: %s\n", st.to_string().c_str());
    return 1;
  }
  std::printf("echo_server: listening on port %u\n", server.port());
  std::fflush(stdout);
  if (!port_file.empty()) {
    // Written whole under a temporary name, so a reader never sees half of it.
    const std::string tmp = port_file + ".tmp";
    std::ofstream(tmp) << server.port() << "\n";
    std::rename(tmp.c_str(), port_file.c_str());
  }
  int sig = 0;
  sigwait(&signals, &sig);
  std::printf("echo_server: %s, stopping\n", strsignal(sig));
  server.stop();
  return 0;
}
