// The little JSON that etcd's v3 gateway answers with (lib/rpc/discovery):
// a reader into a tree, and base64, which the gateway uses for every key
// and value.  Not a general JSON library: the library has none (Boost 1.74
// predates Boost.JSON), and the gateway's answers are small objects whose
// 64-bit integers arrive as strings.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "slotrpc/result.h"

namespace slotrpc::rpc::discovery {

struct Json {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  std::string text;  // a string's value, or a number as written
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> members;

  // The member `key` of an object, or nullptr.
  const Json* get(std::string_view key) const;
  // A number, or a string holding one (how the gateway writes int64s).
  std::optional<int64_t> as_int() const;
};

// Parses one JSON document; INVALID_ARGUMENT says where it went wrong.
Result<Json> parse_json(std::string_view text);

// `s` as a JSON string literal, quotes included.
std::string json_quote(std::string_view s);

std::string base64_encode(std::string_view bytes);
// nullopt for text that is not base64.
std::optional<std::string> base64_decode(std::string_view text);

}  // namespace slotrpc::rpc::discovery
