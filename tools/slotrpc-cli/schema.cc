#include "schema.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <mutex>
#include <set>

namespace slotrpc_cli {

using slotrpc::Status;
using slotrpc::StatusCode;

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kUnary: return "unary";
    case Kind::kServerStream: return "server stream";
    case Kind::kClientStream: return "client stream";
    case Kind::kBidi: return "bidi stream";
  }
  return "?";
}

namespace {

std::string docs(const flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>* doc) {
  std::string s;
  if (doc == nullptr) return s;
  for (const auto* line : *doc) {
    std::string_view l = line->string_view();
    while (!l.empty() && l.front() == ' ') l.remove_prefix(1);
    while (!l.empty() && l.back() == ' ') l.remove_suffix(1);
    if (l.empty()) continue;
    if (!s.empty()) s += ' ';
    s.append(l);
  }
  return s;
}

std::unique_ptr<flatbuffers::Parser> make_parser(const std::string& bfbs, std::string* error) {
  flatbuffers::IDLOptions opts;
  opts.strict_json = true;  // quoted names out, as JSON tools expect
  opts.indent_step = -1;    // one message, one line
  // Every field, defaults too: a reply that says "kind": "Current" (0)
  // reads better than one that leaves it out.
  opts.output_default_scalars_in_json = true;
  auto p = std::make_unique<flatbuffers::Parser>(opts);
  if (!p->Deserialize(reinterpret_cast<const uint8_t*>(bfbs.data()), bfbs.size())) {
    *error = p->error_;
    return nullptr;
  }
  return p;
}

// "string", "[ubyte]", "slotrpc.examples.kv.Entry", ...
std::string one_type(const reflection::Schema& s, reflection::BaseType b, int index) {
  if (b == reflection::Obj) return s.objects()->Get(index)->name()->str();
  if (index >= 0) return s.enums()->Get(index)->name()->str();  // an enum or a union
  std::string n = reflection::EnumNameBaseType(b);
  for (char& c : n) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return n;
}

std::string type_name(const reflection::Schema& s, const reflection::Type& t) {
  if (t.base_type() == reflection::Vector) return fmt::format("[{}]", one_type(s, t.element(), t.index()));
  if (t.base_type() == reflection::Array)
    return fmt::format("[{}:{}]", one_type(s, t.element(), t.index()), t.fixed_length());
  return one_type(s, t.base_type(), t.index());
}

}  // namespace

bool Schema::declares(const std::string& bfbs, const std::string& service) {
  flatbuffers::Verifier v(reinterpret_cast<const uint8_t*>(bfbs.data()), bfbs.size());
  if (!reflection::VerifySchemaBuffer(v)) return false;
  const reflection::Schema* schema = reflection::GetSchema(bfbs.data());
  if (schema->services() == nullptr) return false;
  for (const reflection::Service* sv : *schema->services())
    if (sv->name()->str() == service) return true;
  return false;
}

slotrpc::Result<std::unique_ptr<Schema>> Schema::load(std::string bfbs, const std::string& service,
                                                      const std::string& source) {
  flatbuffers::Verifier v(reinterpret_cast<const uint8_t*>(bfbs.data()), bfbs.size());
  if (!reflection::VerifySchemaBuffer(v))
    return Status(StatusCode::kDataLoss, fmt::format("{} for {} is not a binary schema (.bfbs) that verifies",
                                                     source, service));
  auto s = std::unique_ptr<Schema>(new Schema);
  s->bfbs_ = std::move(bfbs);
  s->schema_ = reflection::GetSchema(s->bfbs_.data());
  if (s->schema_->services() != nullptr) {
    for (const reflection::Service* sv : *s->schema_->services())
      if (sv->name()->str() == service) s->service_ = sv;
  }
  if (s->service_ == nullptr)
    return Status(StatusCode::kDataLoss, fmt::format("{} does not declare {}", source, service));
  if (s->service_->calls() != nullptr) {
    for (const reflection::RPCCall* c : *s->service_->calls()) {
      Method m;
      m.name = c->name()->str();
      m.request = c->request();
      m.response = c->response();
      m.doc = docs(c->documentation());
      if (c->attributes() != nullptr) {
        if (const auto* a = c->attributes()->LookupByKey("streaming"); a != nullptr && a->value() != nullptr) {
          const std::string how = a->value()->str();
          m.kind = how == "server" ? Kind::kServerStream : how == "client" ? Kind::kClientStream
                   : how == "bidi" ? Kind::kBidi
                                   : Kind::kUnary;
        }
      }
      s->methods_.push_back(std::move(m));
    }
  }
  std::string error;
  s->in_ = make_parser(s->bfbs_, &error);
  if (s->in_ != nullptr) s->out_ = make_parser(s->bfbs_, &error);
  if (s->out_ == nullptr)
    return Status(StatusCode::kDataLoss, fmt::format("FlatBuffers cannot read the schema of {}: {}", service, error));
  return s;
}

const Method* Schema::find(const std::string& method) const {
  for (const Method& m : methods_)
    if (m.name == method) return &m;
  return nullptr;
}

std::string Schema::describe() const {
  std::string out = fmt::format("service {} {{\n", service_->name()->str());
  std::vector<const reflection::Object*> tables;
  std::set<const reflection::Object*> seen;
  const auto use = [&](const reflection::Object* o) {
    if (seen.insert(o).second) tables.push_back(o);
  };
  for (const Method& m : methods_) {
    if (!m.doc.empty()) out += "  // " + m.doc + "\n";
    const bool in_stream = m.kind == Kind::kClientStream || m.kind == Kind::kBidi;
    const bool out_stream = m.kind == Kind::kServerStream || m.kind == Kind::kBidi;
    out += fmt::format("  rpc {}({}{}) returns ({}{});  // {}\n", m.name, in_stream ? "stream " : "",
                       m.request->name()->str(), out_stream ? "stream " : "", m.response->name()->str(),
                       kind_name(m.kind));
    use(m.request);
    use(m.response);
  }
  out += "}\n";
  // The tables the methods take and return, and the tables inside them.
  for (size_t i = 0; i < tables.size(); ++i) {
    const reflection::Object* o = tables[i];
    out += fmt::format("\n{} {} {{\n", o->is_struct() ? "struct" : "table", o->name()->str());
    std::vector<const reflection::Field*> fields(o->fields()->begin(), o->fields()->end());
    std::sort(fields.begin(), fields.end(), [](auto* a, auto* b) { return a->id() < b->id(); });
    for (const reflection::Field* f : fields) {
      if (f->type()->base_type() == reflection::UType) continue;  // a union's hidden type field
      out += fmt::format("  {}: {};\n", f->name()->str(), type_name(*schema_, *f->type()));
      const auto bt = f->type()->base_type() == reflection::Vector ? f->type()->element() : f->type()->base_type();
      if (bt == reflection::Obj) use(schema_->objects()->Get(f->type()->index()));
      if (bt == reflection::Union) {
        const reflection::Enum* u = schema_->enums()->Get(f->type()->index());
        for (const reflection::EnumVal* v : *u->values())
          if (v->union_type() != nullptr && v->union_type()->base_type() == reflection::Obj)
            use(schema_->objects()->Get(v->union_type()->index()));
      }
    }
    out += "}\n";
  }
  return out;
}

slotrpc::Result<flatbuffers::Offset<AnyTable>> Schema::request(const Method& m, const std::string& json,
                                                               flatbuffers::FlatBufferBuilder& builder) {
  const std::string type = m.request->name()->str();
  if (!in_->SetRootType(type.c_str()))
    return Status(StatusCode::kInternal, fmt::format("the schema has no type {}", type));
  if (!in_->ParseJson(json.c_str())) {
    std::string why = in_->error_;
    while (!why.empty() && why.back() == '\n') why.pop_back();
    return Status(StatusCode::kInvalidArgument, fmt::format("bad JSON for {}: {}", type, why));
  }
  const uint8_t* parsed = in_->builder_.GetBufferPointer();
  auto copied = flatbuffers::CopyTable(builder, *schema_, *m.request, *flatbuffers::GetAnyRoot(parsed));
  return flatbuffers::Offset<AnyTable>(copied.o);
}

slotrpc::Result<std::string> Schema::reply_json(const Method& m, const uint8_t* data, size_t size) {
  if (!flatbuffers::Verify(*schema_, *m.response, data, size))
    return Status(StatusCode::kDataLoss, fmt::format("the reply is not a valid {}", m.response->name()->str()));
  std::lock_guard<std::mutex> lock(out_mu_);
  const std::string type = m.response->name()->str();
  out_->SetRootType(type.c_str());
  std::string text;
  if (!flatbuffers::GenerateText(*out_, data, &text))
    return Status(StatusCode::kInternal, fmt::format("FlatBuffers cannot print a {} as JSON", type));
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

}  // namespace slotrpc_cli
