// slotrpc-gen: the slotrpc IDL compiler.
//
//   slotrpc-gen [-I DIR]... [--flatc PATH] [--no-flatc-cpp] [--depfile FILE]
//               [--python] -o OUTDIR SCHEMA.fbs
//
// Compiles SCHEMA.fbs with flatc to a binary schema (--binary --schema
// --bfbs-builtins, so that the `streaming` and `idempotent` attributes
// survive), reads its rpc_service declarations through the reflection API
// and writes OUTDIR/<name>.slotrpc.h: per service a descriptor (names,
// method ids), an abstract <Svc>Service to implement and a <Svc>Client over
// a slotrpc::Channel.  Unless --no-flatc-cpp it also runs flatc --cpp, so
// OUTDIR/<name>_generated.h (the message types) sits next to it.  With
// --python it writes OUTDIR/<name>_slotrpc.py instead (emit_python.h), with
// flatc --python's message classes next to it.
//
// Exit status 0 on success, 1 on an error (one line on stderr, starting with
// "slotrpc-gen: "), 2 on a usage error.  Outputs are written under a
// temporary name and renamed: a failed run leaves no partial file.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <set>
#include <system_error>
#include <vector>

#include <flatbuffers/reflection_generated.h>

#include "emit.h"
#include "emit_python.h"
#include "model.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using slotrpc_gen::GenError;

#ifndef SLOTRPC_FLATC
#define SLOTRPC_FLATC ""
#endif
#ifndef SLOTRPC_VERSION
#define SLOTRPC_VERSION "unknown"
#endif

constexpr const char* kUsage =
    "usage: slotrpc-gen [-I DIR]... [--flatc PATH] [--no-flatc-cpp] [--depfile FILE]\n"
    "                   [--python] -o OUTDIR SCHEMA.fbs\n"
    "\n"
    "Writes OUTDIR/<name>.slotrpc.h (service descriptors, <Svc>Service and\n"
    "<Svc>Client classes for every rpc_service declared in SCHEMA.fbs) and, with\n"
    "flatc --cpp, OUTDIR/<name>_generated.h (the message types).\n"
    "\n"
    "  -I DIR          where flatc looks for included schemas (repeatable)\n"
    "  --flatc PATH    the flatc to run (default: " SLOTRPC_FLATC
    ", else flatc on PATH)\n"
    "  --no-flatc-cpp  do not write <name>_generated.h\n"
    "  --depfile FILE  write a Make-style dependency file (the schema and its includes)\n"
    "  --python        write OUTDIR/<name>_slotrpc.py (<Svc>Servicer, <Svc>Stub) and flatc\n"
    "                  --python's message classes instead of the C++ headers\n"
    "  -o OUTDIR       output directory (created if missing)\n";

struct UsageError {
  std::string message;
};

struct Options {
  std::vector<std::string> includes;
  std::string flatc;
  bool flatc_cpp = true;
  bool python = false;
  std::string depfile;
  std::string outdir;
  std::string schema;
};

Options parse_args(int argc, char** argv) {
  Options o;
  bool have_out = false;
  std::vector<std::string> inputs;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* what) -> std::string {
      if (i + 1 >= argc) throw UsageError{a + " needs " + what};
      return argv[++i];
    };
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (a == "--version") {
      std::printf("slotrpc-gen %s\n", SLOTRPC_VERSION);
      std::exit(0);
    } else if (a == "-I") {
      o.includes.push_back(value("a directory"));
    } else if (a.size() > 2 && a.rfind("-I", 0) == 0) {
      o.includes.push_back(a.substr(2));
    } else if (a == "--flatc") {
      o.flatc = value("a path");
    } else if (a == "--no-flatc-cpp") {
      o.flatc_cpp = false;
    } else if (a == "--python") {
      o.python = true;
    } else if (a == "--depfile") {
      o.depfile = value("a file name");
    } else if (a == "-o") {
      o.outdir = value("a directory");
      have_out = true;
    } else if (a == "--") {
      for (++i; i < argc; ++i) inputs.push_back(argv[i]);
    } else if (a.size() > 1 && a[0] == '-') {
      throw UsageError{"unknown option " + a};
    } else {
      inputs.push_back(a);
    }
  }
  if (!have_out || o.outdir.empty()) throw UsageError{"no output directory (-o OUTDIR)"};
  if (inputs.empty()) throw UsageError{"no schema given"};
  if (inputs.size() > 1) throw UsageError{"one schema per run (got " + std::to_string(inputs.size()) + ")"};
  o.schema = inputs.front();
  return o;
}

// ---------------------------------------------------------------- cleanup

// Temporary files and directories to remove on any exit, also from SIGINT
// and SIGTERM (hence fixed storage, and only unlink/rmdir in the handler).
constexpr int kMaxTemps = 16;
char g_temps[kMaxTemps][4096];
bool g_temp_is_dir[kMaxTemps];
std::atomic<int> g_temp_count{0};

int register_temp(const std::string& path, bool dir) {
  const int n = g_temp_count.load();
  if (n >= kMaxTemps || path.size() >= sizeof g_temps[0]) throw GenError("internal error: too many temporary files");
  std::memcpy(g_temps[n], path.c_str(), path.size() + 1);
  g_temp_is_dir[n] = dir;
  g_temp_count.store(n + 1);
  return n;
}

void forget_temp(int n) { g_temps[n][0] = '\0'; }

// Newest first, so files go before the directories holding them.
void remove_temps() {
  for (int i = g_temp_count.load() - 1; i >= 0; --i) {
    if (g_temps[i][0] == '\0') continue;
    if (g_temp_is_dir[i]) {
      ::rmdir(g_temps[i]);
    } else {
      ::unlink(g_temps[i]);
    }
    g_temps[i][0] = '\0';
  }
}

// The flatc running now, if any: stopped first, or it would write into the
// work directory after it was cleaned.
volatile pid_t g_child = 0;

void on_signal(int sig) {
  if (const pid_t child = g_child; child > 0) {
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
  }
  remove_temps();
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

// The work directory, removed whole on a normal exit (whatever flatc left).
std::string g_workdir;

struct TempCleanup {
  ~TempCleanup() {
    remove_temps();
    std::error_code ec;
    if (!g_workdir.empty()) fs::remove_all(g_workdir, ec);
  }
};

// ---------------------------------------------------------------- files

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw GenError("cannot read " + path + ": " + std::strerror(errno));
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) throw GenError("cannot read " + path);
  return s.str();
}

void write_file(const std::string& path, const std::string& text) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) throw GenError("cannot write " + path + ": " + std::strerror(errno));
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const int err = errno;
  if (std::fclose(f) != 0 || !ok)
    throw GenError("cannot write " + path + ": " + std::strerror(ok ? errno : err));
}

// Writes every output under a hidden temporary name first, then renames
// them all into place.
class Outputs {
 public:
  void add(std::string path, std::string text) { files_.push_back({std::move(path), std::move(text)}); }
  void commit() {
    std::vector<std::pair<int, std::string>> temps;
    for (const auto& [path, text] : files_) {
      const fs::path p(path);
      std::string hidden = ".";
      hidden += p.filename().string();
      hidden += ".tmp";
      const std::string tmp = (p.parent_path() / hidden).string();
      temps.emplace_back(register_temp(tmp, false), tmp);
      write_file(tmp, text);
    }
    for (size_t i = 0; i < files_.size(); ++i) {
      if (std::rename(temps[i].second.c_str(), files_[i].first.c_str()) != 0)
        throw GenError("cannot rename " + temps[i].second + " to " + files_[i].first + ": " +
                       std::strerror(errno));
      forget_temp(temps[i].first);
    }
  }

 private:
  std::vector<std::pair<std::string, std::string>> files_;
};

// ---------------------------------------------------------------- flatc

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    line = trim(line);
    if (!line.empty()) out.push_back(line);
  }
  return out;
}

// flatc reports "error:" on a line of its own (after its usage text, for
// bad arguments), then the message indented: keep just the message.
std::string flatc_message(const std::string& log) {
  const std::vector<std::string> lines = lines_of(log);
  size_t start = 0;
  for (size_t i = 0; i < lines.size(); ++i)
    if (lines[i] == "error:") start = i + 1;
  std::string msg;
  for (size_t i = start; i < lines.size(); ++i) msg += (msg.empty() ? "" : " ") + lines[i];
  return msg;
}

std::string find_flatc(const Options& o) {
  if (!o.flatc.empty()) return o.flatc;
  const std::string baked = SLOTRPC_FLATC;
  if (!baked.empty() && ::access(baked.c_str(), X_OK) == 0) return baked;
  return "flatc";  // on PATH
}

// Runs flatc with stdout and stderr in `log`; throws with flatc's own
// message when it fails.
void run_flatc(const std::string& flatc, const std::vector<std::string>& args,
               const std::string& log) {
  std::vector<std::string> argv_s = {flatc};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = 0;
  const int err = posix_spawnp(&pid, flatc.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (err != 0) throw GenError("cannot run flatc (" + flatc + "): " + std::strerror(err));
  g_child = pid;

  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      g_child = 0;
      throw GenError(std::string("waiting for flatc: ") + std::strerror(errno));
    }
  }
  g_child = 0;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;

  std::string msg;
  try {
    msg = flatc_message(read_file(log));
  } catch (const GenError&) {
  }
  if (WIFSIGNALED(status)) {
    throw GenError("flatc (" + flatc + ") was killed by signal " + std::to_string(WTERMSIG(status)) +
                   (msg.empty() ? "" : ": " + msg));
  }
  if (msg.empty()) msg = "exit status " + std::to_string(WEXITSTATUS(status)) + ", no message";
  throw GenError("flatc failed: " + msg);
}

// flatc's warnings ("warning:" then the indented messages), passed on.
void pass_warnings(const std::string& log) {
  for (const std::string& line : lines_of(log)) {
    if (line == "warning:") continue;
    std::fprintf(stderr, "slotrpc-gen: flatc: %s\n", line.c_str());
  }
}

// ---------------------------------------------------------------- depfile

std::string make_escape(const std::string& path) {
  std::string out;
  for (char c : path) {
    if (c == ' ' || c == '#' || c == '\\') out += '\\';
    if (c == '$') out += '$';
    out += c;
  }
  return out;
}

// ---------------------------------------------------------------- main

int run(const Options& o) {
  const std::string& input = o.schema;
  std::error_code ec;
  const fs::file_status st = fs::status(input, ec);
  if (!fs::exists(st)) throw GenError(input + ": no such file");
  if (!fs::is_regular_file(st)) throw GenError(input + ": not a regular file");
  if (::access(input.c_str(), R_OK) != 0) throw GenError(input + ": " + std::strerror(errno));
  const fs::path input_path(input);
  if (input_path.extension() != ".fbs") throw GenError(input + ": not a FlatBuffers schema (.fbs)");
  const std::string stem = input_path.stem().string();

  // A private work directory for flatc's outputs.
  const char* tmp_env = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp_env != nullptr && *tmp_env != '\0' ? tmp_env : "/tmp") +
                     "/slotrpc-gen.XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr)
    throw GenError("cannot create a temporary directory (" + tmpl + "): " + std::strerror(errno));
  const std::string work = tmpl;
  register_temp(work, true);
  g_workdir = work;
  const std::string log = work + "/flatc.log";
  const std::string bfbs = work + "/" + stem + ".bfbs";
  const std::string cpp_dir = work + "/cpp";
  const std::string cpp_out = cpp_dir + "/" + stem + "_generated.h";
  register_temp(log, false);
  register_temp(bfbs, false);
  register_temp(cpp_dir, true);
  register_temp(cpp_out, false);

  const std::string flatc = find_flatc(o);
  std::vector<std::string> includes;
  for (const std::string& dir : o.includes) {
    includes.push_back("-I");
    includes.push_back(dir);
  }
  // File names in the binary schema are recorded relative to this root
  // ("//kv.fbs"); flatc 2.0.8 records none without --bfbs-filenames.
  const std::string root =
      input_path.has_parent_path() ? input_path.parent_path().string() : std::string(".");

  std::vector<std::string> args = {"--binary", "--schema", "--bfbs-builtins", "--bfbs-comments",
                                   "--bfbs-filenames", root};
  args.insert(args.end(), includes.begin(), includes.end());
  args.insert(args.end(), {"-o", work, input});
  run_flatc(flatc, args, log);
  pass_warnings(read_file(log));

  std::string buf = read_file(bfbs);
  flatbuffers::Verifier verifier(reinterpret_cast<const uint8_t*>(buf.data()), buf.size());
  if (!reflection::VerifySchemaBuffer(verifier))
    throw GenError(input + ": flatc wrote a binary schema that does not verify");
  const reflection::Schema* schema = reflection::GetSchema(buf.data());

  const slotrpc_gen::FileModel model = slotrpc_gen::build_model(*schema, input, root, input);
  const std::string header =
      slotrpc_gen::emit_header(model, input_path.filename().string(), stem, buf);

  Outputs outputs;
  const std::string out_header = (fs::path(o.outdir) / (stem + ".slotrpc.h")).string();
  std::vector<std::string> targets;
  std::set<std::string> out_dirs;  // flatc --python's package directories
  if (o.python) {
    const std::string py_dir = work + "/py";
    args = {"--python"};
    args.insert(args.end(), includes.begin(), includes.end());
    args.insert(args.end(), {"-o", py_dir, input});
    run_flatc(flatc, args, log);
    for (const auto& entry : fs::recursive_directory_iterator(py_dir)) {
      if (!entry.is_regular_file()) continue;
      const fs::path rel = fs::relative(entry.path(), py_dir);
      // A schema in namespace slotrpc.* (the examples'): flatc's empty
      // slotrpc/__init__.py would shadow the slotrpc package.  Without it
      // the directory is a portion the package adds to its own __path__.
      if (rel == fs::path("slotrpc") / "__init__.py") continue;
      const fs::path out = fs::path(o.outdir) / rel;
      out_dirs.insert(out.parent_path().string());
      outputs.add(out.string(), read_file(entry.path().string()));
      targets.push_back(out.string());
    }
    const std::string out_py = (fs::path(o.outdir) / (stem + "_slotrpc.py")).string();
    outputs.add(out_py, slotrpc_gen::emit_python(model, input_path.filename().string()));
    targets.push_back(out_py);
  } else if (o.flatc_cpp) {
    args = {"--cpp"};
    args.insert(args.end(), includes.begin(), includes.end());
    args.insert(args.end(), {"-o", cpp_dir, input});
    run_flatc(flatc, args, log);
    const std::string out_cpp = (fs::path(o.outdir) / (stem + "_generated.h")).string();
    outputs.add(out_cpp, read_file(cpp_out));
    targets.push_back(out_cpp);
  }
  if (!o.python) {
    outputs.add(out_header, header);
    targets.push_back(out_header);
  }
  if (!o.depfile.empty()) {
    std::string dep;
    for (const std::string& t : targets) {
      if (!dep.empty()) dep += ' ';
      dep += make_escape(t);
    }
    dep += ":";
    for (const std::string& f : model.schema_files) dep += " \\\n  " + make_escape(f);
    outputs.add(o.depfile, dep + "\n");
  }
  // Only now: a failed run does not even leave an empty OUTDIR.
  fs::create_directories(o.outdir, ec);
  if (!fs::is_directory(o.outdir)) {
    throw GenError("cannot create output directory " + o.outdir +
                   (ec ? ": " + ec.message() : std::string()));
  }
  for (const std::string& dir : out_dirs) fs::create_directories(dir, ec);
  outputs.commit();
  return 0;
}

// One line, whatever the message holds.
std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  try {
    options = parse_args(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "slotrpc-gen: %s\n%s", e.message.c_str(), kUsage);
    return 2;
  }
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) std::signal(sig, on_signal);
  TempCleanup cleanup;
  try {
    return run(options);
  } catch (const GenError& e) {
    remove_temps();
    std::fprintf(stderr, "slotrpc-gen: %s\n", one_line(e.what()).c_str());
  } catch (const std::exception& e) {
    remove_temps();
    std::fprintf(stderr, "slotrpc-gen: internal error: %s\n", one_line(e.what()).c_str());
  }
  return 1;
}
