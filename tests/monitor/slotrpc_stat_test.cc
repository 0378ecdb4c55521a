// slotrpc-stat --device against fake sysfs trees: every counter of every
// port with its value and kind, the absent known names, --watch deltas, and
// the errors (unknown device: exit 2 naming the devices that exist).
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <regex>
#include <string>

#include "fake_sysfs.h"

using slotrpc::test::FakeSysfs;

namespace {

struct Run {
  int status = -1;
  std::string out;
  std::string err;
};

// Runs slotrpc-stat with `args` (shell words), capturing stdout and stderr.
Run stat(const std::string& args, const FakeSysfs& fs) {
  const std::string err_file = fs.scratch() + "/stderr.txt";
  const std::string cmd = std::string(SLOTRPC_STAT) + " " + args + " 2>" + err_file;
  Run r;
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  if (FILE* e = std::fopen(err_file.c_str(), "r")) {
    while ((n = std::fread(buf.data(), 1, buf.size(), e)) > 0) r.err.append(buf.data(), n);
    std::fclose(e);
  }
  return r;
}

bool has_line(const std::string& text, const std::string& pattern) {
  return std::regex_search(text, std::regex(pattern, std::regex::multiline));
}

}  // namespace

TEST_CASE("slotrpc-stat --device prints every counter of every port, then the absent names") {
  FakeSysfs fs;
  fs.set("rxe0", 1, "rcvd_rnr_err", 12);
  fs.set("rxe0", 1, "retry_exceeded_err", 3);
  fs.set("rxe0", 1, "sent_pkts", 123456789);
  fs.set("rxe0", 1, "counters", "port_xmit_data", "777\n");
  fs.set("rxe0", 2, "duplicate_request", 1);
  fs.set("mlx5_0", 1, "out_of_buffer", 0);
  const Run r = stat("--device rxe0 --sysfs " + fs.root(), fs);
  INFO(r.out, r.err);
  CHECK(r.status == 0);
  CHECK(has_line(r.out, "^device rxe0 \\(rxe\\)$"));
  CHECK(has_line(r.out, "^1 +rcvd_rnr_err +12 rnr$"));
  CHECK(has_line(r.out, "^1 +retry_exceeded_err +3 retry$"));
  CHECK(has_line(r.out, "^1 +sent_pkts +123456789 other$"));
  CHECK(has_line(r.out, "^1 +port_xmit_data +777 other$"));
  CHECK(has_line(r.out, "^2 +duplicate_request +1 sequence$"));
  CHECK_FALSE(has_line(r.out, "out_of_buffer"));  // another device's
  // Absent: port 1 lacks 4 of the 6 rxe names, port 2 lacks 5.
  CHECK(has_line(r.out, "^absent known counters \\(9\\):$"));
  CHECK(has_line(r.out, "^  rxe0/1: send_rnr_err$"));
  CHECK(has_line(r.out, "^  rxe0/2: rcvd_rnr_err$"));
  CHECK_FALSE(has_line(r.out, "rxe0/1: rcvd_rnr_err"));
  CHECK(r.err.empty());
}

TEST_CASE("slotrpc-stat: a file it cannot read is a warning, the rest is printed") {
  FakeSysfs fs;
  fs.set("rxe0", 1, "rcvd_rnr_err", 4);
  fs.set("rxe0", 1, "hw_counters", "broken", "N/A\n");
  const Run r = stat("--device rxe0 --sysfs " + fs.root(), fs);
  INFO(r.out, r.err);
  CHECK(r.status == 0);
  CHECK(has_line(r.out, "^1 +rcvd_rnr_err +4 rnr$"));
  CHECK(has_line(r.err, "^slotrpc-stat: warning: rxe0/1: cannot read counter broken .*not a number: 'N/A\\\\n'$"));
}

TEST_CASE("slotrpc-stat: an unknown device exits 2 naming the devices that exist") {
  FakeSysfs fs;
  fs.set("rxe0", 1, "rcvd_rnr_err", 0);
  fs.set("mlx5_0", 1, "out_of_buffer", 0);
  const Run r = stat("--device mlx5_9 --sysfs " + fs.root(), fs);
  INFO(r.out, r.err);
  CHECK(r.status == 2);
  CHECK(r.out.empty());
  CHECK(r.err == "slotrpc-stat: unknown RDMA device 'mlx5_9' (devices under " + fs.root() +
                     ": mlx5_0, rxe0)\n");

  const Run none = stat("--device rxe0 --sysfs " + fs.root() + "/nothing", fs);
  CHECK(none.status == 2);
  CHECK(none.err.find("no RDMA devices under " + fs.root() + "/nothing") != std::string::npos);
  // The same for --watch, before any waiting.
  CHECK(stat("--device mlx5_9 --watch 1 --sysfs " + fs.root(), fs).status == 2);
  // Usage errors are 2 as well.
  CHECK(stat("--device rxe0 --watch -1 --sysfs " + fs.root(), fs).status == 2);
  CHECK(stat("--bogus", fs).status == 2);
  CHECK(stat("", fs).status == 2);
}

TEST_CASE("slotrpc-stat --watch re-reads the files and prints deltas") {
  FakeSysfs fs;
  fs.set("rxe0", 1, "rcvd_rnr_err", 100);
  // The counter grows once the baseline is out: the shell waits for the
  // tool's first sample (or its end), then rewrites the file in place.
  const std::string file = fs.dir("rxe0", 1, "hw_counters") + "/rcvd_rnr_err";
  const std::string out = fs.scratch() + "/watch.txt";
  const Run r = stat("--device rxe0 --sysfs " + fs.root() + " --watch 0.2 --count 4 > " + out +
                         " & PID=$!; until grep -q 'sample 1' " + out +
                         " || ! kill -0 $PID 2>/dev/null; do sleep 0.01; done; echo 250 > " + file +
                         "; wait $PID; RC=$?; cat " + out + "; exit $RC",
                     fs);
  INFO(r.out, r.err);
  CHECK(r.status == 0);
  CHECK(has_line(r.out, "^device rxe0, sample 1 \\(baseline\\)$"));
  CHECK(has_line(r.out, "^device rxe0, sample 4 \\(0.2 s since the previous\\)$"));
  CHECK(has_line(r.out, "^1 +rcvd_rnr_err +100 +0 +0.0 rnr$"));  // the baseline
  // The growth is seen once, whichever sample it fell into, and the other
  // samples show none: the deltas add up to it.
  const std::regex line("^1 +rcvd_rnr_err +([0-9]+) +([0-9]+) +[0-9.]+ rnr$", std::regex::multiline);
  uint64_t sum = 0;
  int samples = 0;
  int growing = 0;
  for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), line); it != std::sregex_iterator(); ++it) {
    ++samples;
    const uint64_t d = std::stoull((*it)[2]);
    sum += d;
    if (d != 0) {
      ++growing;
      CHECK((*it)[1] == "250");
    }
  }
  CHECK(samples == 4);
  CHECK(growing == 1);
  CHECK(sum == 150);
  CHECK(has_line(r.out, "^  rxe0/1: send_rnr_err$"));
}

TEST_CASE("slotrpc-stat --help leads with a running server's view, then the device's") {
  FakeSysfs fs;
  const Run r = stat("--help", fs);
  INFO(r.out, r.err);
  CHECK(r.status == 0);
  const size_t server = r.out.find("a running slotrpc Server's calls");
  const size_t device = r.out.find("RDMA hardware counters of a device");
  REQUIRE(server != std::string::npos);
  REQUIRE(device != std::string::npos);
  CHECK(server < device);
  CHECK(r.out.rfind("slotrpc-stat: a running slotrpc Server's", 0) == 0);
}
