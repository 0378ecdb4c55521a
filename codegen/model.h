// slotrpc-gen: what the generator knows about a schema's services, read
// from flatc's binary schema (reflection) and checked.
#pragma once

#include <cstdint>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace reflection {
struct Schema;
}

namespace slotrpc_gen {

// A failure to report: one line, printed as "slotrpc-gen: <message>".
struct GenError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Same as slotrpc::method_id (include/slotrpc/service.h): FNV-1a 32 of the
// fully qualified method name, 0 mapped to 1.
constexpr uint32_t method_id(std::string_view full_name) {
  uint32_t h = 2166136261u;
  for (char c : full_name) {
    h ^= static_cast<uint8_t>(c);
    h *= 16777619u;
  }
  return h == 0 ? 1 : h;
}

// "a.b.C" -> {"a", "b", "C"}.
std::vector<std::string> split_name(std::string_view dotted);
// flatc's C++ generator appends '_' to identifiers that are C++ keywords.
std::string escape_keyword(const std::string& name);

// The four call kinds of a FlatBuffers rpc_service (`streaming:` "none",
// "server", "client", "bidi").
enum class MethodKind { kUnary, kServerStream, kClientStream, kBidiStream };

struct Method {
  std::string name;       // as in the schema ("Get")
  std::string cpp_name;   // C++ member name (escape_keyword(name))
  std::string full_name;  // "a.b.Svc.Get"
  uint32_t id = 0;
  MethodKind kind = MethodKind::kUnary;
  bool idempotent = false;
  std::string request;   // fully qualified schema name, "a.b.Req"
  std::string response;  // "a.b.Resp"
  std::vector<std::string> doc;
};

struct Service {
  std::string full_name;          // "a.b.Svc"
  std::string name;               // "Svc"
  std::vector<std::string> ns;    // {"a", "b"}
  std::vector<std::string> doc;
  std::vector<Method> methods;    // in declaration order
};

struct FileModel {
  std::vector<Service> services;  // declared in the input file, sorted by name
  // Every schema file the input depends on (itself and its includes),
  // absolute paths; empty when flatc recorded no file names.
  std::vector<std::string> schema_files;
  // Fully qualified names of every table, struct, enum and union, with the
  // C++ names flatc derives from them ("a.b.T", "a.b.TBuilder").
  std::set<std::string> cpp_type_names;
};

// Reads the services declared in `input` (the schema given to flatc) out of
// `schema`.  `root` is the directory given to flatc --bfbs-filenames; the
// file names flatc recorded ("//x.fbs") are relative to it.  `display` is
// how error messages name the input.  Throws GenError on a schema slotrpc
// cannot serve: unknown streaming mode, method id collision, a
// generated name that clashes with a schema type.
FileModel build_model(const reflection::Schema& schema, const std::string& input,
                      const std::string& root, const std::string& display);

}  // namespace slotrpc_gen
