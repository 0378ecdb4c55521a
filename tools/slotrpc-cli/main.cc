// slotrpc-cli: lists a server's services, describes one, and calls its
// methods with JSON, through the server's slotrpc.Reflection (the schemas
// slotrpc-gen embeds) and FlatBuffers' reflection: no compiled client.
//
//   slotrpc-cli HOST:PORT list
//   slotrpc-cli HOST:PORT describe SERVICE
//   slotrpc-cli HOST:PORT call SERVICE/METHOD ['{json}']
//   slotrpc-cli --schema echo.bfbs HOST:PORT call demo.Echo/Echo '{...}'
//
// --schema gives a service's binary schema (flatc --binary --schema F.fbs)
// for a server that cannot send it: one without slotrpc.Reflection, or a
// service registered without slotrpc-gen's code.
// A unary call prints its reply as one line of JSON; a server stream one
// line per message.  Client and bidi streams read their messages from
// stdin, one JSON object per line (a bidi call prints replies as they come).
// Exit status: 0 OK, 1 the call or the server failed, 2 usage.
#include <fmt/format.h>
#include <slotrpc/slotrpc.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <thread>

#include "reflection_service.slotrpc.h"
#include "schema.h"

namespace {

using slotrpc::Status;
using slotrpc::StatusCode;
using slotrpc_cli::AnyTable;
using slotrpc_cli::Kind;

constexpr const char* kUsage =
    "usage: slotrpc-cli [--timeout MS] HOST:PORT list\n"
    "       slotrpc-cli [--timeout MS] HOST:PORT describe SERVICE\n"
    "       slotrpc-cli [--timeout MS] HOST:PORT call SERVICE/METHOD ['{json}']\n"
    "  call: a unary or server-streaming method takes one JSON request (default {});\n"
    "        client and bidi streams read one JSON request per line from stdin.\n"
    "  --timeout MS  deadline of list, describe and unary calls (default 10000)\n"
    "  --schema FILE.bfbs  a binary schema (flatc --binary --schema F.fbs) for describe and\n"
    "        call, used before asking the server's slotrpc.Reflection; may be repeated\n";

int fail(const std::string& what) {
  std::fprintf(stderr, "slotrpc-cli: %s\n", what.c_str());
  return 1;
}

int fail(const Status& st) {
  return fail(fmt::format("{}: {}", slotrpc::status_code_name(st.code()), st.message()));
}

struct Cli {
  std::unique_ptr<slotrpc::Channel> channel;
  std::string address;
  std::chrono::milliseconds timeout{10000};

  slotrpc::CallOptions options() const {
    slotrpc::CallOptions o;
    o.deadline = slotrpc::Clock::now() + timeout;
    return o;
  }

  std::vector<std::string> schema_files;  // --schema, in order

  // A status that says the server has no reflection, when that is why, and
  // what to do: `service` is the one the command needs (empty for list).
  Status explain(const Status& st, const std::string& service) const {
    if (st.code() != StatusCode::kUnimplemented) return st;
    const std::string todo =
        service.empty()
            ? "list needs it; describe and call work without it when given the service's schema: "
              "--schema FILE.bfbs (flatc --binary --schema FILE.fbs)"
            : fmt::format("give the schema of {} with --schema FILE.bfbs (flatc --binary --schema on the .fbs "
                          "that declares it)",
                          service);
    return Status(st.code(), fmt::format("the server at {} does not run slotrpc.Reflection (built before "
                                         "slotrpc 0.2, or it refuses the service), so it cannot send its "
                                         "schemas; {}. The server said: {}",
                                         address, todo, st.message()));
  }

  // The first --schema file that declares `service`; null if none does.
  slotrpc::Result<std::unique_ptr<slotrpc_cli::Schema>> local_schema(const std::string& service) const {
    for (const std::string& file : schema_files) {
      std::ifstream in(file, std::ios::binary);
      if (!in) return Status(StatusCode::kNotFound, fmt::format("--schema {}: cannot read it", file));
      std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (slotrpc_cli::Schema::declares(bytes, service))
        return slotrpc_cli::Schema::load(std::move(bytes), service, "--schema " + file);
    }
    return std::unique_ptr<slotrpc_cli::Schema>();
  }

  slotrpc::Result<std::vector<std::string>> services(const std::string& wanted = "") {
    slotrpc::ReflectionClient client(*channel);
    auto r = client.ListServices([](auto& b) { return slotrpc::CreateListServicesRequest(b); }, options()).get();
    if (!r.ok()) return explain(r.status(), wanted);
    std::vector<std::string> out;
    if (r->services() != nullptr)
      for (const auto* s : *r->services()) out.push_back(s->str());
    return out;
  }

  slotrpc::Result<std::unique_ptr<slotrpc_cli::Schema>> schema(const std::string& service) {
    auto local = local_schema(service);
    if (!local.ok() || *local != nullptr) return local;
    auto names = services(service);
    if (!names.ok()) return names.status();
    if (std::find(names->begin(), names->end(), service) == names->end()) {
      std::string all;
      for (const auto& n : *names) all += (all.empty() ? "" : ", ") + n;
      return Status(StatusCode::kNotFound,
                    fmt::format("the server at {} runs no service '{}'; it runs: {}", address, service, all));
    }
    slotrpc::ReflectionClient client(*channel);
    auto r = client
                 .ServiceSchema([service](auto& b) {
                   return slotrpc::CreateServiceSchemaRequest(b, b.CreateString(service));
                 }, options())
                 .get();
    if (!r.ok()) {
      if (r.status().code() == StatusCode::kNotFound && r.status().message().find("has no schema") != std::string::npos)
        return Status(r.status().code(),
                      fmt::format("{}; give its schema with --schema FILE.bfbs (flatc --binary --schema on the "
                                  ".fbs that declares {})",
                                  r.status().message(), service));
      return explain(r.status(), service);
    }
    std::string bfbs;
    if (r->bfbs() != nullptr) bfbs.assign(reinterpret_cast<const char*>(r->bfbs()->data()), r->bfbs()->size());
    return slotrpc_cli::Schema::load(std::move(bfbs), service);
  }

  int call(const std::string& target, const std::vector<std::string>& args);
};

int print_reply(slotrpc_cli::Schema& schema, const slotrpc_cli::Method& m, const slotrpc::Reply<AnyTable>& r) {
  if (!r.ok()) return fail(r.status());
  auto json = schema.reply_json(m, r.raw().data(), r.raw().size());
  if (!json.ok()) return fail(json.status());
  std::printf("%s\n", json.value().c_str());
  std::fflush(stdout);
  return 0;
}

int Cli::call(const std::string& target, const std::vector<std::string>& args) {
  // SERVICE/METHOD, or SERVICE.METHOD as the method's full name.
  size_t cut = target.rfind('/');
  if (cut == std::string::npos) cut = target.rfind('.');
  if (cut == std::string::npos || cut == 0 || cut + 1 == target.size()) {
    std::fprintf(stderr, "slotrpc-cli: '%s' is not SERVICE/METHOD\n%s", target.c_str(), kUsage);
    return 2;
  }
  const std::string service = target.substr(0, cut);
  const std::string method = target.substr(cut + 1);
  auto loaded = schema(service);
  if (!loaded.ok()) return fail(loaded.status());
  slotrpc_cli::Schema& s = **loaded;
  const slotrpc_cli::Method* m = s.find(method);
  if (m == nullptr) {
    std::string all;
    for (const auto& x : s.methods()) all += (all.empty() ? "" : ", ") + x.name;
    return fail(fmt::format("service {} has no method '{}'; its methods: {}", service, method, all));
  }
  const uint32_t id = slotrpc::method_id(service + "." + method);
  const bool reads_stdin = m->kind == Kind::kClientStream || m->kind == Kind::kBidi;
  if (reads_stdin && !args.empty())
    return fail(fmt::format("{} is a {}: it reads its requests from stdin, one JSON object per line", target,
                            slotrpc_cli::kind_name(m->kind)));
  if (args.size() > 1) {
    std::fprintf(stderr, "slotrpc-cli: call takes one JSON request\n%s", kUsage);
    return 2;
  }
  const std::string json = args.empty() ? "{}" : args[0];

  if (!reads_stdin) {
    // Parsed before the call: bad JSON fails here, with the parser's words.
    flatbuffers::FlatBufferBuilder probe;
    if (auto r = s.request(*m, json, probe); !r.ok()) return fail(r.status());
    const slotrpc::Build<AnyTable> build = [&s, m, json](flatbuffers::FlatBufferBuilder& b) {
      return s.request(*m, json, b).value();
    };
    if (m->kind == Kind::kUnary) {
      auto reply = channel->unary<AnyTable, AnyTable>(id, build, options()).get();
      return print_reply(s, *m, reply);
    }
    auto reader = channel->server_stream<AnyTable, AnyTable>(id, build, {});
    while (auto msg = reader.Read())
      if (int rc = print_reply(s, *m, *msg); rc != 0) return rc;
    const Status end = reader.status();
    return end.ok() ? 0 : fail(end);
  }

  // Client and bidi streams: one request per line of stdin.
  const auto write_lines = [&](auto& stream) -> int {
    std::string line;
    while (std::getline(std::cin, line)) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      if (auto r = [&] {
            flatbuffers::FlatBufferBuilder probe;
            return s.request(*m, line, probe);
          }();
          !r.ok()) {
        stream.Cancel();
        return fail(r.status());
      }
      if (!stream.Write([&](flatbuffers::FlatBufferBuilder& b) { return s.request(*m, line, b).value(); }))
        return -1;  // the call ended: its status says why
    }
    stream.WritesDone();
    return 0;
  };
  if (m->kind == Kind::kClientStream) {
    auto writer = channel->client_stream<AnyTable, AnyTable>(id, {});
    if (int rc = write_lines(writer); rc > 0) return rc;
    auto reply = writer.Finish();
    return print_reply(s, *m, reply);
  }
  auto stream = channel->bidi_stream<AnyTable, AnyTable>(id, {});
  int printed = 0;
  std::thread printer([&] {
    while (auto msg = stream.Read())
      if ((printed = print_reply(s, *m, *msg)) != 0) break;
  });
  const int wrote = write_lines(stream);
  printer.join();
  if (wrote > 0) return wrote;
  if (printed != 0) return printed;
  const Status end = stream.Finish();
  return end.ok() ? 0 : fail(end);
}

}  // namespace

int main(int argc, char** argv) {
  // The channel's info lines (which transport it took) are noise around a
  // reply; SLOTRPC_LOG_LEVEL set by the user still wins.
  ::setenv("SLOTRPC_LOG_LEVEL", "warn", 0);
  std::vector<std::string> args(argv + 1, argv + argc);
  Cli cli;
  while (!args.empty() && args.front().rfind("--", 0) == 0) {
    if (args.front() == "--help" || args.front() == "-h") {
      std::printf("%s", kUsage);
      return 0;
    }
    if (args.front() == "--schema" && args.size() > 1) {
      cli.schema_files.push_back(args[1]);
      args.erase(args.begin(), args.begin() + 2);
      continue;
    }
    if (args.front() == "--timeout" && args.size() > 1) {
      const long ms = std::strtol(args[1].c_str(), nullptr, 10);
      if (ms <= 0 || ms > 3600000) {
        std::fprintf(stderr, "slotrpc-cli: --timeout %s: give milliseconds, 1 to 3600000\n", args[1].c_str());
        return 2;
      }
      cli.timeout = std::chrono::milliseconds(ms);
      args.erase(args.begin(), args.begin() + 2);
      continue;
    }
    std::fprintf(stderr, "slotrpc-cli: unknown option %s\n%s", args.front().c_str(), kUsage);
    return 2;
  }
  if (args.size() < 2) {
    std::fprintf(stderr, "%s", kUsage);
    return 2;
  }
  cli.address = args[0];
  const std::string command = args[1];
  std::vector<std::string> rest(args.begin() + 2, args.end());
  if (command != "list" && command != "describe" && command != "call") {
    std::fprintf(stderr, "slotrpc-cli: unknown command '%s'\n%s", command.c_str(), kUsage);
    return 2;
  }
  if ((command == "list" && !rest.empty()) || (command == "describe" && rest.size() != 1) ||
      (command == "call" && rest.empty())) {
    std::fprintf(stderr, "%s", kUsage);
    return 2;
  }
  auto channel = slotrpc::Channel::connect(cli.address);
  if (!channel.ok()) return fail(channel.status());
  cli.channel = std::move(channel).value();

  if (command == "list") {
    auto names = cli.services();
    if (!names.ok()) return fail(names.status());
    for (const auto& n : *names) std::printf("%s\n", n.c_str());
    return 0;
  }
  if (command == "describe") {
    auto s = cli.schema(rest[0]);
    if (!s.ok()) return fail(s.status());
    std::printf("%s", (*s)->describe().c_str());
    return 0;
  }
  const std::string target = rest[0];
  rest.erase(rest.begin());
  return cli.call(target, rest);
}
