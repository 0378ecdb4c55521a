// The library's layers run one way (docs/design.md, "Layers"): every
// `#include "..."` in lib/ and include/ is read and checked against the
// rules below, and the test fails naming the file, the line and the edge
// it crosses.  No tool beyond the include lines themselves.
//
// Bottom first: base, transport, core, reactor, metrics, rpc.  A folder may
// include its own files, the folders below it, the public headers
// (slotrpc/...) and the generated headers of the build.  On top of that:
//   * transport/tcp, transport/verbs, transport/shm and transport/memory do
//     not include one another: each transport depends on transport/'s own
//     files and base/; transport/tls (TLS contexts and connections) is no
//     transport: any of them, and rpc/, may use it, and it includes only
//     base/;
//   * core/ sees only the transport interface (transport/transport.h,
//     transport/frame.h), never a concrete transport;
//   * the reactor names no concrete transport either, and metrics/ neither:
//     only rpc/ picks transports;
//   * core/bulk/ does not include the sessions that use it;
//   * include/slotrpc/ (the public API) includes nothing of lib/.
// And transports keep their own business: rpc/ and core/ never say "lane"
// (TCP's bulk lanes live in transport/tcp; the layers above see only the
// transport interface's attached connections), in code, comments or file
// names.
#include <doctest/doctest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#ifndef SLOTRPC_SOURCE_ROOT
#error "SLOTRPC_SOURCE_ROOT must be defined"
#endif

namespace fs = std::filesystem;

namespace {

// The layers of lib/, bottom first.
const std::vector<std::string> kLayers = {"base", "transport", "core", "reactor", "metrics", "rpc"};

// Headers the build generates (no folder): allowed everywhere.
const std::vector<std::string> kGenerated = {"slotrpc_verbs_config.h", "admin.slotrpc.h", "health.slotrpc.h",
                                              "reflection_service.slotrpc.h"};

const std::vector<std::string> kTransports = {"tcp", "verbs", "shm", "memory"};

int layer_of(const std::string& folder) {
  auto it = std::find(kLayers.begin(), kLayers.end(), folder);
  return it == kLayers.end() ? -1 : static_cast<int>(it - kLayers.begin());
}

std::string first_part(const std::string& path) { return path.substr(0, path.find('/')); }

// "transport/tcp/x.h" -> "tcp"; "transport/transport.h" -> "".
std::string transport_of(const std::string& path) {
  if (path.rfind("transport/", 0) != 0) return "";
  const std::string rest = path.substr(10);
  const size_t slash = rest.find('/');
  return slash == std::string::npos ? "" : rest.substr(0, slash);
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// Why `from` (a path under lib/, or "include/slotrpc/...") may not include
// `included` (as written between the quotes), or nothing when it may.
// `from`'s own folder is taken for relative includes of generated files.
std::optional<std::string> forbidden_edge(const std::string& from, const std::string& included) {
  if (std::find(kGenerated.begin(), kGenerated.end(), included) != kGenerated.end()) return std::nullopt;
  if (starts_with(from, "include/")) {
    if (starts_with(included, "slotrpc/")) return std::nullopt;
    return "public header -> " + first_part(included) + " (include/slotrpc includes only slotrpc/)";
  }
  if (starts_with(included, "slotrpc/")) return std::nullopt;  // the public API's types
  const std::string from_folder = first_part(from);
  const std::string to_folder = first_part(included);
  const int from_layer = layer_of(from_folder);
  const int to_layer = layer_of(to_folder);
  if (from_layer < 0) return "file outside the layers: " + from_folder;
  if (to_layer < 0) return from_folder + " -> " + to_folder + " (not a layer of lib/)";
  if (to_layer > from_layer) return from_folder + " -> " + to_folder + " (upward)";
  const std::string to_transport = transport_of(included);
  if (transport_of(from) == "tls" && to_folder != "base" && to_transport != "tls")
    return "transport/tls -> " + included + " (TLS depends on base/ only)";
  if (to_transport == "tls") {
    if (from_folder == "core" || from_folder == "reactor" || from_folder == "metrics")
      return from_folder + " -> transport/tls (only transports and rpc/ use TLS)";
    return std::nullopt;
  }
  if (!to_transport.empty()) {
    const std::string from_transport = transport_of(from);
    if (from_folder == "transport" && from_transport != to_transport)
      return "transport/" + (from_transport.empty() ? std::string("(interface)") : from_transport) +
             " -> transport/" + to_transport + " (transports do not include one another)";
    if (from_folder == "core" || from_folder == "reactor" || from_folder == "metrics")
      return from_folder + " -> transport/" + to_transport + " (only rpc/ names a concrete transport)";
  }
  if (starts_with(from, "core/bulk/") && starts_with(included, "core/") && !starts_with(included, "core/bulk/")) {
    const std::string name = included.substr(5);
    if (name.find("session") != std::string::npos || starts_with(name, "out_stream"))
      return "core/bulk -> " + included + " (bulk sits below the sessions that use it)";
  }
  return std::nullopt;
}

struct Violation {
  std::string file;
  int line;
  std::string included;
  std::string why;
};

// Every `#include "..."` of `text`, checked as if it were the file `from`.
void check_text(const std::string& from, const std::string& text, std::vector<Violation>& out) {
  std::istringstream in(text);
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    size_t i = line.find_first_not_of(" \t");
    if (i == std::string::npos || line[i] != '#') continue;
    i = line.find_first_not_of(" \t", i + 1);
    if (i == std::string::npos || line.compare(i, 7, "include") != 0) continue;
    const size_t open = line.find('"', i + 7);
    if (open == std::string::npos) continue;  // <...>: a system or library header
    const size_t close = line.find('"', open + 1);
    if (close == std::string::npos) continue;
    const std::string included = line.substr(open + 1, close - open - 1);
    if (auto why = forbidden_edge(from, included)) out.push_back({from, number, included, *why});
  }
}

std::string describe(const std::vector<Violation>& v) {
  std::string s;
  for (const auto& x : v)
    s += x.file + ":" + std::to_string(x.line) + ": includes \"" + x.included + "\": " + x.why + "\n";
  return s;
}

std::vector<Violation> check_tree(const fs::path& root, const std::string& label) {
  std::vector<Violation> out;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    if (!entry.is_regular_file()) continue;
    const std::string ext = entry.path().extension().string();
    if (ext != ".h" && ext != ".cc" && ext != ".hpp" && ext != ".cpp") continue;
    std::ifstream f(entry.path());
    std::stringstream text;
    text << f.rdbuf();
    const std::string rel = fs::relative(entry.path(), root).generic_string();
    check_text(label.empty() ? rel : label + "/" + rel, text.str(), out);
  }
  std::sort(out.begin(), out.end(), [](const Violation& a, const Violation& b) {
    return a.file != b.file ? a.file < b.file : a.line < b.line;
  });
  return out;
}

// Transport-private words that rpc/ and core/ may not use (case-insensitive).
const std::vector<std::string> kTransportWords = {"lane"};

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// Every line of `text` (the file `from`) that uses a word of kTransportWords,
// and the file's name if it does.
void check_words(const std::string& from, const std::string& text, std::vector<Violation>& out) {
  for (const std::string& w : kTransportWords) {
    if (lower(from).find(w) != std::string::npos)
      out.push_back({from, 0, "", "the file's name says \"" + w + "\" (a transport's business)"});
  }
  std::istringstream in(text);
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    const std::string l = lower(line);
    for (const std::string& w : kTransportWords)
      if (l.find(w) != std::string::npos)
        out.push_back({from, number, "", "says \"" + w + "\" (a transport's business): " + line});
  }
}

std::vector<Violation> check_words_tree(const fs::path& root, const std::string& label) {
  std::vector<Violation> out;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream f(entry.path());
    std::stringstream text;
    text << f.rdbuf();
    check_words(label + "/" + fs::relative(entry.path(), root).generic_string(), text.str(), out);
  }
  return out;
}

}  // namespace

TEST_CASE("rpc/ and core/ name no transport's private mechanisms (no \"lane\")") {
  for (const char* folder : {"rpc", "core"}) {
    const fs::path dir = fs::path(SLOTRPC_SOURCE_ROOT) / "lib" / folder;
    REQUIRE(fs::is_directory(dir));
    const auto v = check_words_tree(dir, folder);
    INFO(describe(v));
    CHECK(v.empty());
  }
  // The checker itself: it finds the word in code, comments and names.
  std::vector<Violation> v;
  check_words("rpc/channel.cc", "int x;\n  uint64_t lane_token = 0;\n// the Bulk Lane\n", v);
  REQUIRE(v.size() == 2);
  CHECK(v[0].line == 2);
  CHECK(v[1].line == 3);
  v.clear();
  check_words("rpc/channel_lanes.cc", "int x;\n", v);
  CHECK(v.size() == 1);
}

TEST_CASE("every include in lib/ runs down the layers") {
  const fs::path lib = fs::path(SLOTRPC_SOURCE_ROOT) / "lib";
  REQUIRE(fs::is_directory(lib));
  const auto v = check_tree(lib, "");
  INFO(describe(v));
  CHECK(v.empty());
}

TEST_CASE("the public headers include only public headers") {
  const fs::path inc = fs::path(SLOTRPC_SOURCE_ROOT) / "include";
  REQUIRE(fs::is_directory(inc));
  const auto v = check_tree(inc, "include");
  INFO(describe(v));
  CHECK(v.empty());
}

TEST_CASE("every folder of lib/ is a known layer") {
  const fs::path lib = fs::path(SLOTRPC_SOURCE_ROOT) / "lib";
  for (const auto& entry : fs::directory_iterator(lib)) {
    if (!entry.is_directory()) continue;
    INFO(entry.path().filename().string());
    CHECK(layer_of(entry.path().filename().string()) >= 0);
  }
}

// The checker itself, on includes written for the purpose: each bad one
// must be reported with its file, line and edge, so the checks above can
// fail by what the tree holds, not only pass.
TEST_CASE("the checker reports what crosses a forbidden edge") {
  std::vector<Violation> v;
  check_text("core/client_session.h",
             "#pragma once\n"
             "#include \"core/pack.h\"\n"
             "#include \"reactor/reactor.h\"\n"
             "  #  include \"transport/tcp/tcp_transport.h\"  // a comment\n"
             "#include <vector>\n",
             v);
  REQUIRE(v.size() == 2);
  CHECK(v[0].line == 3);
  CHECK(v[0].included == "reactor/reactor.h");
  CHECK(v[0].why == "core -> reactor (upward)");
  CHECK(v[1].line == 4);
  CHECK(v[1].why == "core -> transport/tcp (only rpc/ names a concrete transport)");
  CHECK(describe(v).find("core/client_session.h:3: includes \"reactor/reactor.h\"") != std::string::npos);

  CHECK(forbidden_edge("metrics/http_server.cc", "rpc/connector.h").value() == "metrics -> rpc (upward)");
  CHECK(forbidden_edge("transport/transport.h", "core/wire_format.h").value() == "transport -> core (upward)");
  CHECK(forbidden_edge("base/logging.cc", "transport/frame.h").value() == "base -> transport (upward)");
  CHECK(forbidden_edge("reactor/reactor.cc", "transport/verbs/verbs_transport.h").has_value());
  CHECK(forbidden_edge("transport/tcp/tcp_bulk.cc", "transport/shm/shm_segment.h").has_value());
  CHECK(forbidden_edge("transport/transport.h", "transport/tcp/tcp_transport.h").has_value());
  CHECK(forbidden_edge("core/bulk/server_bulk.h", "core/server_session.h").has_value());
  CHECK(forbidden_edge("include/slotrpc/stream.h", "core/out_stream.h").has_value());
  CHECK(forbidden_edge("monitor/monitor.cc", "base/logging.h").has_value());  // not a layer

  // And what is allowed.
  CHECK_FALSE(forbidden_edge("rpc/channel.cc", "transport/tcp/tcp_transport.h").has_value());
  CHECK_FALSE(forbidden_edge("transport/tcp/tcp_bulk.cc", "transport/tcp/bulk_lanes.h").has_value());
  CHECK_FALSE(forbidden_edge("transport/tcp/tcp_bulk.cc", "transport/host_bulk.h").has_value());
  CHECK_FALSE(forbidden_edge("core/pack.h", "transport/transport.h").has_value());
  CHECK_FALSE(forbidden_edge("core/bulk/server_bulk.h", "core/loop.h").has_value());
  CHECK_FALSE(forbidden_edge("reactor/reactor.h", "core/loop.h").has_value());
  CHECK_FALSE(forbidden_edge("transport/verbs/device.h", "slotrpc_verbs_config.h").has_value());
  CHECK_FALSE(forbidden_edge("base/config.cc", "slotrpc/config.h").has_value());
}
