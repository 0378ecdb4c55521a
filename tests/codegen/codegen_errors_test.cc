// The slotrpc-gen binary on good and bad inputs: exit status, the one-line
// message on stderr, and what is (not) left in the output directory and in
// TMPDIR.  SLOTRPC_GEN, FLATC and CODEGEN_TEST_DIR come from meson.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <slotrpc/service.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

extern char** environ;

namespace {

namespace fs = std::filesystem;

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
}

// Names in a directory, hidden ones included.
std::vector<std::string> listing(const fs::path& dir) {
  std::vector<std::string> names;
  if (!fs::exists(dir)) return names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A scratch directory: schemas in src/, outputs in out/, the generator's
// TMPDIR in tmp/.
struct Scratch {
  fs::path root;
  Scratch() {
    std::string tmpl = (fs::temp_directory_path() / "slotrpc-codegen-test.XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    root = tmpl;
    fs::create_directories(src());
    fs::create_directories(tmp());
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
  fs::path src() const { return root / "src"; }
  fs::path out() const { return root / "out"; }
  fs::path tmp() const { return root / "tmp"; }
  fs::path schema(const std::string& name, const std::string& text) const {
    write(src() / name, text);
    return src() / name;
  }
};

struct Run {
  int status = -1;  // exit status, or -1 if it did not exit normally
  std::string out;
  std::string err;
};

Run run(const Scratch& s, std::vector<std::string> args) {
  const fs::path out_file = s.root / "stdout", err_file = s.root / "stderr";
  std::vector<std::string> argv_s = {SLOTRPC_GEN};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_s;
  for (char** e = environ; *e != nullptr; ++e)
    if (std::string(*e).rfind("TMPDIR=", 0) != 0) env_s.emplace_back(*e);
  env_s.push_back("TMPDIR=" + s.tmp().string());
  std::vector<char*> envp;
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, 2, err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = 0;
  const int err = posix_spawn(&pid, argv_s[0].c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  REQUIRE_MESSAGE(err == 0, "cannot run " << argv_s[0]);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  Run r;
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read(out_file);
  r.err = read(err_file);
  return r;
}

// Runs the generator on one schema the usual way (-o out/, our flatc).
Run generate(const Scratch& s, const fs::path& schema, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"--flatc", FLATC, "-o", s.out().string()};
  args.insert(args.end(), extra.begin(), extra.end());
  args.push_back(schema.string());
  return run(s, args);
}

// A failed run: status 1, one line "slotrpc-gen: ..." holding every part of
// `expect`, no output and no temporary file anywhere.
void check_failed(const Scratch& s, const Run& r, const std::vector<std::string>& expect) {
  INFO("stderr: " << r.err);
  CHECK(r.status == 1);
  CHECK(r.err.rfind("slotrpc-gen: ", 0) == 0);
  CHECK(count(r.err, "\n") == 1);
  CHECK((!r.err.empty() && r.err.back() == '\n'));
  for (const std::string& e : expect) CHECK_MESSAGE(r.err.find(e) != std::string::npos, "missing: " << e);
  CHECK_FALSE(fs::exists(s.out()));  // not even created
  CHECK(listing(s.tmp()).empty());
}

// Two method names whose full names collide under FNV-1a 32: a birthday
// search over "m<N>" (~77,000 names expected; deterministic).
std::pair<std::string, std::string> colliding_methods(const std::string& service) {
  std::unordered_map<uint32_t, uint32_t> seen;
  seen.reserve(1 << 20);
  for (uint32_t n = 0; n < 4'000'000; ++n) {
    const uint32_t id = slotrpc::method_id(service + ".m" + std::to_string(n));
    auto [it, fresh] = seen.emplace(id, n);
    if (!fresh) return {std::string("m").append(std::to_string(it->second)), std::string("m").append(std::to_string(n))};
  }
  FAIL("no FNV-1a collision among 4,000,000 names");
  return {};
}

const char* kGood = R"(namespace cgerr;
table Req { a: int; }
table Resp { b: int; }
/// Documented service.
rpc_service Good {
  /// Documented method.
  Unary(Req):Resp;
  Retry(Req):Resp (idempotent);
  Stream(Req):Resp (streaming: "server");
}
)";

std::string bad_streaming(const std::string& mode) {
  return "namespace cgerr;\ntable Req { a: int; }\n"
         "rpc_service Bad {\n  Fine(Req):Req;\n  Upload(Req):Req (streaming: \"" + mode + "\");\n}\n";
}

}  // namespace

TEST_CASE("codegen errors: a good schema gives both headers and nothing else") {
  Scratch s;
  const Run r = generate(s, s.schema("good.fbs", kGood));
  INFO("stderr: " << r.err);
  REQUIRE(r.status == 0);
  CHECK(r.err.empty());
  CHECK(listing(s.out()) == std::vector<std::string>{"good.slotrpc.h", "good_generated.h"});
  CHECK(listing(s.tmp()).empty());

  const std::string h = read(s.out() / "good.slotrpc.h");
  CHECK(h.find("do not edit") != std::string::npos);
  CHECK(h.find("good.fbs") != std::string::npos);
  CHECK(h.find("#pragma once") != std::string::npos);
  CHECK(h.find("#include <slotrpc/slotrpc.h>") != std::string::npos);
  CHECK(h.find("#include \"good_generated.h\"") != std::string::npos);
  CHECK(h.find("namespace cgerr {") != std::string::npos);
  CHECK(h.find("static constexpr const char* kName = \"cgerr.Good\";") != std::string::npos);
  char id[32];
  std::snprintf(id, sizeof id, "0x%08xu", slotrpc::method_id("cgerr.Good.Unary"));
  CHECK(h.find(std::string("static constexpr uint32_t kUnaryId = ") + id + ";") != std::string::npos);
  CHECK(h.find("static_assert(GoodDescriptor::kUnaryId == ::slotrpc::method_id(\"cgerr.Good.Unary\"));") !=
        std::string::npos);
  CHECK(h.find("class GoodService {") != std::string::npos);
  CHECK(h.find("class GoodClient {") != std::string::npos);
  CHECK(h.find("/// Documented service.") != std::string::npos);
  CHECK(h.find("/// Documented method.") != std::string::npos);
  CHECK(h.find("::slotrpc::ServerWriter<Resp>& writer") != std::string::npos);
  CHECK(h.find("::slotrpc::ClientReader<Resp> Stream(") != std::string::npos);
  CHECK(count(h, "options.idempotent = true;") == 2);  // Retry's two call forms

  // Deterministic: a second run writes the same bytes.
  const Run again = generate(s, s.src() / "good.fbs");
  REQUIRE(again.status == 0);
  CHECK(read(s.out() / "good.slotrpc.h") == h);
}

TEST_CASE("codegen errors: services of included files stay in their own header; depfile") {
  Scratch s;
  const fs::path dir = CODEGEN_TEST_DIR;
  const fs::path dep = s.root / "multi.d";
  const Run r = generate(s, dir / "multi.fbs", {"-I", dir.string(), "--depfile", dep.string()});
  INFO("stderr: " << r.err);
  REQUIRE(r.status == 0);
  const std::string h = read(s.out() / "multi.slotrpc.h");
  CHECK(h.find("class AlphaService") != std::string::npos);
  CHECK(h.find("class GammaClient") != std::string::npos);
  CHECK(h.find("Health") == std::string::npos);     // declared in shared.fbs
  CHECK(h.find("TypesEcho") == std::string::npos);  // declared in types.fbs
  // Three idempotent call forms: Store (Future, callback), WhoAmI (stream).
  CHECK(count(h, "options.idempotent = true;") == 3);
  const std::string d = read(dep);
  CHECK(d.find("multi.slotrpc.h") != std::string::npos);
  CHECK(d.find((fs::canonical(dir) / "multi.fbs").string()) != std::string::npos);
  CHECK(d.find((fs::canonical(dir) / "shared.fbs").string()) != std::string::npos);
  CHECK(d.find((fs::canonical(dir) / "types.fbs").string()) != std::string::npos);
}

TEST_CASE("codegen errors: --no-flatc-cpp; a schema without services") {
  Scratch s;
  Run r = generate(s, s.schema("good.fbs", kGood), {"--no-flatc-cpp"});
  REQUIRE(r.status == 0);
  CHECK(listing(s.out()) == std::vector<std::string>{"good.slotrpc.h"});

  r = generate(s, s.schema("none.fbs", "namespace cgerr;\ntable T { a: int; }\n"));
  REQUIRE(r.status == 0);
  const std::string h = read(s.out() / "none.slotrpc.h");
  CHECK(h.find("#pragma once") != std::string::npos);
  CHECK(h.find("#include \"none_generated.h\"") != std::string::npos);
  CHECK(h.find("class ") == std::string::npos);
  CHECK(fs::exists(s.out() / "none_generated.h"));
}

TEST_CASE("codegen errors: a missing schema") {
  Scratch s;
  const Run r = generate(s, s.src() / "absent.fbs");
  check_failed(s, r, {"absent.fbs", "no such file"});
}

TEST_CASE("codegen errors: a syntax error passes flatc's own message through") {
  Scratch s;
  const Run r = generate(s, s.schema("syntax.fbs", "namespace cgerr;\ntable A { a: int }\n"));
  check_failed(s, r, {"flatc", "syntax.fbs:2", "error: expecting: ; instead got: }"});
}

TEST_CASE("codegen errors: an include that is not there") {
  Scratch s;
  const Run r = generate(s, s.schema("inc.fbs", "include \"nowhere.fbs\";\ntable A { a: int; }\n"));
  check_failed(s, r, {"flatc", "nowhere.fbs"});
}

TEST_CASE("codegen errors: every streaming mode is accepted, an unknown one is a one-line error") {
  for (const char* mode : {"none", "server", "client", "bidi"}) {
    CAPTURE(mode);
    Scratch good;
    const Run ok = generate(good, good.schema(std::string(mode) + ".fbs", bad_streaming(mode)));
    INFO("stderr: " << ok.err);
    CHECK(ok.status == 0);
  }
  Scratch s;
  const Run r = generate(s, s.schema("odd.fbs", bad_streaming("sideways")));
  check_failed(s, r, {"slotrpc-gen: ", "odd.fbs: service cgerr.Bad, method Upload: unknown streaming mode \"sideways\" "
                                       "(slotrpc supports \"none\", \"server\", \"client\" and \"bidi\")"});
}

TEST_CASE("codegen errors: non-table request and response types") {
  Scratch s;
  Run r = generate(s, s.schema("st.fbs", "namespace cgerr;\nstruct S { a: int; }\ntable T { a: int; }\n"
                                         "rpc_service Bad { M(S):T; }\n"));
  check_failed(s, r, {"flatc", "st.fbs", "rpc request and response types must be tables"});
  r = generate(s, s.schema("en.fbs", "namespace cgerr;\nenum E : byte { a }\ntable T { a: int; }\n"
                                     "rpc_service Bad { M(T):E; }\n"));
  check_failed(s, r, {"flatc", "en.fbs", "must be tables"});
}

TEST_CASE("codegen errors: two methods of one service with the same method id") {
  Scratch s;
  const auto [a, b] = colliding_methods("cgerr.Coll");
  REQUIRE(slotrpc::method_id("cgerr.Coll." + a) == slotrpc::method_id("cgerr.Coll." + b));
  const Run r = generate(s, s.schema("coll.fbs", "namespace cgerr;\ntable T { a: int; }\nrpc_service Coll {\n  " +
                                                      a + "(T):T;\n  " + b + "(T):T;\n}\n"));
  check_failed(s, r, {"coll.fbs: service cgerr.Coll, method " + b, "cgerr.Coll." + b, "collides with cgerr.Coll." + a});
}

TEST_CASE("codegen errors: a generated class clashing with a schema type") {
  Scratch s;
  const Run r = generate(s, s.schema("clash.fbs", "namespace cgerr;\ntable BadClient { a: int; }\n"
                                                  "rpc_service Bad { M(BadClient):BadClient; }\n"));
  check_failed(s, r, {"clash.fbs: service cgerr.Bad", "cgerr.BadClient"});
}

TEST_CASE("codegen errors: flatc that cannot be run") {
  Scratch s;
  const Run r = run(s, {"--flatc", (s.root / "no-flatc").string(), "-o", s.out().string(),
                        s.schema("good.fbs", kGood).string()});
  check_failed(s, r, {"cannot run flatc", "no-flatc"});
}

TEST_CASE("codegen errors: a failed run leaves the previous output as it was") {
  Scratch s;
  const fs::path schema = s.schema("x.fbs", kGood);
  REQUIRE(generate(s, schema).status == 0);
  const std::string before = read(s.out() / "x.slotrpc.h");
  write(schema, bad_streaming("sideways"));
  const Run r = generate(s, schema);
  CHECK(r.status == 1);
  CHECK(read(s.out() / "x.slotrpc.h") == before);
  CHECK(listing(s.out()) == std::vector<std::string>{"x.slotrpc.h", "x_generated.h"});
  CHECK(listing(s.tmp()).empty());
}

TEST_CASE("codegen errors: usage errors exit 2 with the usage") {
  Scratch s;
  const std::string schema = s.schema("good.fbs", kGood).string();
  for (const auto& args : std::vector<std::vector<std::string>>{
           {},
           {schema},                                      // no -o
           {"-o", s.out().string()},                      // no schema
           {"-o", s.out().string(), schema, schema},      // two schemas
           {"--frobnicate", "-o", s.out().string(), schema},
           {"-o"}}) {
    const Run r = run(s, args);
    INFO("args: " << args.size() << ", stderr: " << r.err);
    CHECK(r.status == 2);
    CHECK(r.err.rfind("slotrpc-gen: ", 0) == 0);
    CHECK(r.err.find("usage: slotrpc-gen") != std::string::npos);
    CHECK(listing(s.out()).empty());
  }
  const Run help = run(s, {"--help"});
  CHECK(help.status == 0);
  CHECK(help.out.find("usage: slotrpc-gen") != std::string::npos);
}
