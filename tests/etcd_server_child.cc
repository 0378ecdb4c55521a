// A server process for tests/etcd_discovery_test.cc: serves nothing but the
// built-ins, registers itself with an etcd target, writes its port into a
// file once it listens, and on SIGTERM withdraws (stop()) and exits 0.
// The test kills it with SIGKILL to play a server that dies.
//
//   etcd_server_child etcd://127.0.0.1:PORT/prefix PORT_FILE
#include <signal.h>
#include <slotrpc/slotrpc.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: etcd_server_child etcd://HOST:PORT/prefix PORT_FILE\n");
    return 2;
  }
  // Blocked before any thread starts, so that only sigwait() takes it.
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &term, nullptr);

  slotrpc::Server server;
  if (auto st = server.register_with(argv[1]); !st.ok()) {
    std::fprintf(stderr, "register_with: %s\n", st.message().c_str());
    return 1;
  }
  if (auto st = server.start("127.0.0.1:0"); !st.ok()) {
    std::fprintf(stderr, "start: %s\n", st.message().c_str());
    return 1;
  }
  const std::string file = argv[2];
  {
    std::ofstream out(file + ".tmp");
    out << server.port() << "\n";
  }
  std::filesystem::rename(file + ".tmp", file);  // whole, for the reader
  int sig = 0;
  sigwait(&term, &sig);
  server.stop();
  return 0;
}
