// What every benchmark binary of bench/ shares: server processes (the
// binary re-executed in a serve role, as a user runs a client and a server),
// port files, the termination wait, and the JSON pieces of the result files
// (bench/plot reads them; docs/benchmarks.md describes them).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace bench {

// Writes `port` to `path` atomically (a temporary file renamed over it): the
// parent polls for the file and must never read half a number.
bool write_port_file(const std::string& path, uint16_t port);

// Blocks SIGTERM and SIGINT in the calling thread (call it before any thread
// starts, so every thread inherits the mask).  The serve roles do.
void block_termination_signals();
// Returns once SIGTERM or SIGINT arrives (blocked beforehand).
void wait_for_termination();

// A child process running this binary in a serve role.  Destroying it
// sends SIGTERM and reaps the child; the child also gets SIGTERM if this
// process dies first (PR_SET_PDEATHSIG), however it ends.
class ChildProcess {
 public:
  ChildProcess() = default;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess();

  // Runs /proc/self/exe with `args` (argv[1]...) plus `--port-file F`, and
  // waits (at most 30 s) for the child to write its port to F.  Empty: it
  // listens on port(); otherwise why not.
  std::string start(const std::vector<std::string>& args);
  uint16_t port() const { return port_; }

 private:
  pid_t pid_ = -1;
  uint16_t port_ = 0;
  std::string port_file_;
};

// JSON text of a string (quoted, escaped) and of a number (4 significant
// digits; the figures are measurements, not identities).
std::string json_string(const std::string& s);
std::string json_number(double v);
// Ends a result file's "results" array and its document (the rows were
// written after `"results": [`) and writes the whole text to `path`; false
// when it cannot be written.
bool finish_results_file(std::string text, const std::string& path);

// The machine a result came from, as a JSON object: cpu, hardware_threads,
// kernel, loadavg.  And the same facts on one line for a terminal.
std::string machine_json();
std::string machine_line();

}  // namespace bench
