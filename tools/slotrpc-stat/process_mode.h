// slotrpc-stat --address HOST:PORT: a running Server's metrics, fetched over
// its ordinary RPC port through the built-in slotrpc.Admin/Metrics method
// (lib/rpc/admin/), once or every --watch seconds; --prometheus prints the
// exposition text instead of the table.
#pragma once

#include <iosfwd>
#include <string>

namespace slotrpc::stat {

struct ProcessOptions {
  std::string address;
  bool prometheus = false;
  double watch_seconds = 0;  // 0: print once
  unsigned count = 0;        // with watch: samples before exiting (0 = until interrupted)
};

// Exit codes as in device_mode.h: 1 when the server cannot be reached or
// the call fails (the status is printed on `err`), 2 for a bad address.
int run_process_mode(const ProcessOptions& opts, std::ostream& out, std::ostream& err);

}  // namespace slotrpc::stat
