#include "model.h"

#include <flatbuffers/reflection_generated.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <map>
#include <system_error>

namespace slotrpc_gen {

namespace fs = std::filesystem;

namespace {

// The keywords flatc's C++ generator escapes, plus C++20's.
constexpr std::string_view kKeywords[] = {
    "alignas", "alignof", "and", "and_eq", "asm", "atomic_cancel", "atomic_commit",
    "atomic_noexcept", "auto", "bitand", "bitor", "bool", "break", "case", "catch", "char",
    "char8_t", "char16_t", "char32_t", "class", "compl", "concept", "const", "consteval",
    "constexpr", "constinit", "const_cast", "continue", "co_await", "co_return", "co_yield",
    "decltype", "default", "delete", "do", "double", "dynamic_cast", "else", "enum", "explicit",
    "export", "extern", "false", "float", "for", "friend", "goto", "if", "import", "inline", "int",
    "long", "module", "mutable", "namespace", "new", "noexcept", "not", "not_eq", "nullptr",
    "operator", "or", "or_eq", "private", "protected", "public", "reflexpr", "register",
    "reinterpret_cast", "requires", "return", "short", "signed", "sizeof", "static",
    "static_assert", "static_cast", "struct", "switch", "synchronized", "template", "this",
    "thread_local", "throw", "true", "try", "typedef", "typeid", "typename", "union", "unsigned",
    "using", "virtual", "void", "volatile", "wchar_t", "while", "xor", "xor_eq"};

std::string str(const flatbuffers::String* s) { return s == nullptr ? std::string() : s->str(); }

std::vector<std::string> doc_lines(
    const flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>* doc) {
  std::vector<std::string> lines;
  if (doc == nullptr) return lines;
  for (const flatbuffers::String* line : *doc) lines.push_back(str(line));
  return lines;
}

// Where a file name recorded by flatc ("//sub/x.fbs", relative to the
// --bfbs-filenames root) is on disk, in a form comparable across spellings.
std::string resolve_recorded(const std::string& root, const std::string& recorded) {
  fs::path p = recorded.rfind("//", 0) == 0 ? fs::path(root) / recorded.substr(2) : fs::path(recorded);
  std::error_code ec;
  fs::path canonical = fs::weakly_canonical(p, ec);
  return ec ? fs::absolute(p).lexically_normal().string() : canonical.string();
}

std::string hex_id(uint32_t id) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", id);
  return buf;
}

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i != 0) out += sep;
    out += parts[i];
  }
  return out;
}

}  // namespace

std::vector<std::string> split_name(std::string_view dotted) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (;;) {
    const size_t dot = dotted.find('.', start);
    parts.emplace_back(dotted.substr(start, dot == std::string_view::npos ? dotted.npos : dot - start));
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return parts;
}

std::string escape_keyword(const std::string& name) {
  return std::find(std::begin(kKeywords), std::end(kKeywords), name) != std::end(kKeywords) ? name + "_" : name;
}

FileModel build_model(const reflection::Schema& schema, const std::string& input,
                      const std::string& root, const std::string& display) {
  FileModel model;

  std::error_code ec;
  fs::path input_path = fs::weakly_canonical(input, ec);
  if (ec) input_path = fs::absolute(input).lexically_normal();
  const std::string input_key = input_path.string();

  // Which file declared what.  flatc (2.0.8) records it only when given
  // --bfbs-filenames; without any record (another flatc), every service is
  // taken to be the input's.
  std::map<std::string, std::string> resolved;  // recorded name -> path
  auto declared_in_input = [&](const flatbuffers::String* recorded) {
    if (recorded == nullptr || recorded->size() == 0) return true;
    auto it = resolved.find(recorded->str());
    if (it == resolved.end())
      it = resolved.emplace(recorded->str(), resolve_recorded(root, recorded->str())).first;
    return it->second == input_key;
  };

  if (schema.fbs_files() != nullptr) {
    for (const reflection::SchemaFile* f : *schema.fbs_files())
      model.schema_files.push_back(resolve_recorded(root, str(f->filename())));
  }
  if (model.schema_files.empty()) model.schema_files.push_back(input_key);

  // C++ names the flatc-generated header declares in each namespace.
  if (schema.objects() != nullptr) {
    for (const reflection::Object* o : *schema.objects()) {
      std::vector<std::string> parts = split_name(str(o->name()));
      const std::string cpp = escape_keyword(parts.back());
      parts.pop_back();
      const std::string prefix = parts.empty() ? "" : join(parts, ".") + ".";
      model.cpp_type_names.insert(prefix + cpp);
      model.cpp_type_names.insert(prefix + cpp + "Builder");
    }
  }
  if (schema.enums() != nullptr) {
    for (const reflection::Enum* e : *schema.enums()) {
      std::vector<std::string> parts = split_name(str(e->name()));
      const std::string cpp = escape_keyword(parts.back());
      parts.pop_back();
      model.cpp_type_names.insert((parts.empty() ? "" : join(parts, ".") + ".") + cpp);
    }
  }

  if (schema.services() == nullptr) return model;

  std::map<uint32_t, std::string> ids;  // across the file: one server may serve them all
  for (const reflection::Service* s : *schema.services()) {
    if (!declared_in_input(s->declaration_file())) continue;
    Service svc;
    svc.full_name = str(s->name());
    svc.ns = split_name(svc.full_name);
    svc.name = svc.ns.back();
    svc.ns.pop_back();
    svc.doc = doc_lines(s->documentation());
    const std::string where = display + ": service " + svc.full_name;
    const std::string ns_prefix = svc.ns.empty() ? "" : join(svc.ns, ".") + ".";

    const std::array<std::string, 3> classes = {svc.name + "Descriptor", svc.name + "Service",
                                                svc.name + "Client"};
    for (const std::string& cls : classes) {
      if (model.cpp_type_names.count(ns_prefix + cls) != 0)
        throw GenError(where + ": generated class " + ns_prefix + cls +
                       " would clash with a type of the same name in the schema; rename one");
    }

    std::set<std::string> cpp_names;
    if (s->calls() != nullptr) {
      for (const reflection::RPCCall* c : *s->calls()) {
        Method m;
        m.name = str(c->name());
        m.full_name = svc.full_name + "." + m.name;
        m.id = method_id(m.full_name);
        m.request = str(c->request()->name());
        m.response = str(c->response()->name());
        m.doc = doc_lines(c->documentation());
        const std::string at = where + ", method " + m.name;

        // Member names the generated classes use themselves get a '_' too.
        m.cpp_name = escape_keyword(m.name);
        if (m.cpp_name == "definition" || m.cpp_name == "channel_" ||
            std::find(classes.begin(), classes.end(), m.cpp_name) != classes.end())
          m.cpp_name += "_";
        if (!cpp_names.insert(m.cpp_name).second)
          throw GenError(at + ": its C++ name " + m.cpp_name + " is taken by another method");

        if (c->attributes() != nullptr) {
          for (const reflection::KeyValue* kv : *c->attributes()) {
            const std::string key = str(kv->key());
            const std::string value = str(kv->value());
            if (key == "idempotent") {
              m.idempotent = true;
            } else if (key == "streaming") {
              if (value == "server") {
                m.kind = MethodKind::kServerStream;
              } else if (value == "none") {
                m.kind = MethodKind::kUnary;
              } else if (value == "client") {
                m.kind = MethodKind::kClientStream;
              } else if (value == "bidi") {
                m.kind = MethodKind::kBidiStream;
              } else {
                throw GenError(at + ": unknown streaming mode \"" + value +
                               "\" (slotrpc supports \"none\", \"server\", \"client\" and \"bidi\")");
              }
            }
          }
        }

        auto [it, fresh] = ids.emplace(m.id, m.full_name);
        if (!fresh)
          throw GenError(at + ": method id " + hex_id(m.id) + " of " + m.full_name +
                         " collides with " + it->second +
                         " (FNV-1a 32 of the full names); rename one of them");
        svc.methods.push_back(std::move(m));
      }
    }
    model.services.push_back(std::move(svc));
  }
  return model;
}

}  // namespace slotrpc_gen
