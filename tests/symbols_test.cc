// The installed shared library's interface: its SONAME carries the ABI
// version, and its dynamic symbol table holds the public API and nothing
// else (include/slotrpc/export.h says why and how a name gets there).
//
// The allow-list rule, applied to every defined dynamic symbol as
// `nm -D --defined-only -C` prints it, after dropping a "typeinfo for ",
// "vtable for ", "non-virtual thunk to " (...) prefix:
//   * the name starts with "slotrpc::" (a template function's return type
//     may come first: "void slotrpc::...");
//   * its scope is not an internal one: slotrpc::core, transport, reactor,
//     metrics, monitor, rpc, admin, and not a class's pimpl
//     (slotrpc::Channel::Impl, slotrpc::Server::Impl).
// Everything else fails: Boost, fmt, spdlog, FlatBuffers, std:: template
// instantiations, and C symbols.
#include <doctest/doctest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace {

std::string run(const std::string& command) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  REQUIRE_MESSAGE(pipe != nullptr, "cannot run " << command);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe.get())) > 0) out.append(buf, n);
  return out;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    if (end > start) out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// The entity a demangled symbol names, without the special-symbol prefix
// and a template function's return type.
std::string entity(std::string name) {
  static const char* const kPrefixes[] = {
      "typeinfo for ",       "typeinfo name for ",     "vtable for ",
      "VTT for ",            "construction vtable for ", "non-virtual thunk to ",
      "virtual thunk to ",   "covariant return thunk to ", "guard variable for ",
      "TLS init function for ", "TLS wrapper function for ",
  };
  for (bool again = true; again;) {
    again = false;
    for (const char* p : kPrefixes) {
      if (starts_with(name, p)) {
        name.erase(0, std::string(p).size());
        again = true;
      }
    }
  }
  // A return type ends at the first space outside <...> and (...).
  int depth = 0;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    if (c == '<' || c == '(') ++depth;
    if (c == '>' || c == ')') --depth;
    if (c == '(' && depth == 1) break;  // the parameter list: no return type
    if (c == ' ' && depth == 0) return name.substr(i + 1);
  }
  return name;
}

// Empty when `symbol` may be exported, else why not.
std::string violation(const std::string& symbol) {
  const std::string e = entity(symbol);
  if (!starts_with(e, "slotrpc::")) return "not in namespace slotrpc";
  static const char* const kInternal[] = {
      "slotrpc::core::",    "slotrpc::transport::", "slotrpc::reactor::",
      "slotrpc::metrics::", "slotrpc::monitor::",   "slotrpc::rpc::",
      "slotrpc::admin::",   "slotrpc::Channel::Impl", "slotrpc::Server::Impl",
      "slotrpc::bulk::",    "slotrpc::base::",
  };
  for (const char* scope : kInternal) {
    if (starts_with(e, scope)) return std::string("internal scope ") + scope;
  }
  return {};
}

}  // namespace

TEST_CASE("the allow-list rule tells public names from the rest") {
  // The rule itself, on names the library must not export: a test of the
  // library below is only as good as this.
  CHECK(violation("slotrpc::Channel::connect(std::string const&, slotrpc::Config)").empty());
  CHECK(violation("typeinfo for slotrpc::Status").empty());
  CHECK(violation("slotrpc::Result<int> slotrpc::detail::f<int>(int)").empty());
  CHECK_FALSE(violation("slotrpc::core::ClientSession::poll()").empty());
  CHECK_FALSE(violation("vtable for slotrpc::transport::tcp::TcpLink").empty());
  CHECK_FALSE(violation("slotrpc::Server::Impl::accept()").empty());
  CHECK_FALSE(violation("boost::asio::detail::scheduler::run()").empty());
  CHECK_FALSE(violation("fmt::v9::detail::vformat_to()").empty());
  CHECK_FALSE(violation("std::_Sp_counted_ptr_inplace<slotrpc::Server::Impl>::_M_dispose()").empty());
  CHECK_FALSE(violation("void std::vector<slotrpc::Status>::_M_realloc_insert<>()").empty());
  CHECK_FALSE(violation("_init").empty());
}

TEST_CASE("libslotrpc.so has the versioned SONAME") {
  const std::string dynamic = run(std::string("readelf -d '") + SLOTRPC_SHARED_LIB + "'");
  CHECK_MESSAGE(dynamic.find("Library soname: [libslotrpc.so.1]") != std::string::npos,
                "readelf -d " << SLOTRPC_SHARED_LIB << ":\n" << dynamic);
}

TEST_CASE("libslotrpc.so exports only public slotrpc:: names") {
  const std::string out =
      run(std::string("nm -D --defined-only -C '") + SLOTRPC_SHARED_LIB + "' 2>&1");
  std::vector<std::string> symbols;
  for (const std::string& line : lines(out)) {
    // "0000000000012340 T slotrpc::Status::to_string[abi:cxx11]() const"
    const size_t type_end = line.find(' ', line.find(' ') + 1);
    REQUIRE_MESSAGE(type_end != std::string::npos, "unexpected nm output: " << line);
    symbols.push_back(line.substr(type_end + 1));
  }
  // The public API is there (the examples link it too): an empty table
  // would pass the rule below.
  CHECK_MESSAGE(symbols.size() > 20, "only " << symbols.size() << " symbols:\n" << out);
  int bad = 0;
  for (const std::string& s : symbols) {
    const std::string why = violation(s);
    if (why.empty()) continue;
    if (++bad <= 40) MESSAGE("exported, not public (" << why << "): " << s);
  }
  CHECK_MESSAGE(bad == 0, bad << " of " << symbols.size() << " exported symbols are not public API");
}
