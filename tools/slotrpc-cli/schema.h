// slotrpc-cli's view of a service's binary schema (slotrpc.Reflection's
// ServiceSchema): its methods, and JSON to request and reply to JSON
// through FlatBuffers' own reflection and JSON parser/printer (idl.h).
#pragma once

#include <flatbuffers/flatbuffers.h>
#include <flatbuffers/idl.h>
#include <flatbuffers/reflection.h>

#include <memory>
#include <string>
#include <vector>

#include <slotrpc/result.h>

namespace slotrpc_cli {

enum class Kind { kUnary, kServerStream, kClientStream, kBidi };
const char* kind_name(Kind k);

struct Method {
  std::string name;  // "Get"
  Kind kind = Kind::kUnary;
  const reflection::Object* request = nullptr;
  const reflection::Object* response = nullptr;
  std::string doc;
};

// Any table, for the typed channel calls: the real checks are
// Schema::verify_reply's, against the schema.
struct AnyTable : flatbuffers::Table {
  bool Verify(flatbuffers::Verifier& v) const { return VerifyTableStart(v) && v.EndTable(); }
};

class Schema {
 public:
  // Checks the bytes, finds `service` in them; `source` names where they
  // came from in errors.
  static slotrpc::Result<std::unique_ptr<Schema>> load(std::string bfbs, const std::string& service,
                                                      const std::string& source = "the schema the server sent");
  // Whether `bfbs` is a schema that declares `service`.
  static bool declares(const std::string& bfbs, const std::string& service);

  const std::vector<Method>& methods() const { return methods_; }
  const Method* find(const std::string& method) const;
  // A readable listing: the service, its methods, and the tables they use.
  std::string describe() const;

  // One JSON request for `m` in `builder` (a call's send slot); the parser's
  // message on bad JSON, naming the type.  One thread per Schema.
  slotrpc::Result<flatbuffers::Offset<AnyTable>> request(const Method& m, const std::string& json,
                                                         flatbuffers::FlatBufferBuilder& builder);
  // The reply as one line of JSON, after checking it against the schema.
  slotrpc::Result<std::string> reply_json(const Method& m, const uint8_t* data, size_t size);

 private:
  std::string bfbs_;
  const reflection::Schema* schema_ = nullptr;
  const reflection::Service* service_ = nullptr;
  std::vector<Method> methods_;
  // Two parsers: requests are parsed on the main thread while a bidi call's
  // replies print on another.
  std::unique_ptr<flatbuffers::Parser> in_, out_;
  std::mutex out_mu_;
};

}  // namespace slotrpc_cli
