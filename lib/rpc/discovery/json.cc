#include "rpc/discovery/json.h"

#include <fmt/format.h>

#include <cctype>
#include <charconv>

namespace slotrpc::rpc::discovery {

namespace {

// Deep enough for any gateway answer; bounds the recursion on bad input.
constexpr int kMaxDepth = 32;

class Reader {
 public:
  explicit Reader(std::string_view s) : s_(s) {}

  Result<Json> document() {
    Json v;
    if (!value(v, 0)) return error();
    skip_space();
    if (pos_ != s_.size()) {
      why_ = "text after the value";
      return error();
    }
    return v;
  }

 private:
  Status error() const {
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("bad JSON at byte {}: {}", pos_, why_.empty() ? "unexpected input" : why_));
  }
  void skip_space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\r' || s_[pos_] == '\t'))
      ++pos_;
  }
  bool literal(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }
  bool value(Json& out, int depth) {
    if (depth > kMaxDepth) {
      why_ = "nested too deeply";
      return false;
    }
    skip_space();
    if (pos_ >= s_.size()) {
      why_ = "the text ends early";
      return false;
    }
    const char c = s_[pos_];
    if (c == '{') return object(out, depth);
    if (c == '[') return array(out, depth);
    if (c == '"') {
      out.kind = Json::Kind::kString;
      return string(out.text);
    }
    if (literal("true")) {
      out.kind = Json::Kind::kBool;
      out.boolean = true;
      return true;
    }
    if (literal("false")) {
      out.kind = Json::Kind::kBool;
      return true;
    }
    if (literal("null")) return true;
    const size_t start = pos_;
    while (pos_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '-' ||
                                s_[pos_] == '+' || s_[pos_] == '.' || s_[pos_] == 'e' || s_[pos_] == 'E'))
      ++pos_;
    if (pos_ == start) return false;
    out.kind = Json::Kind::kNumber;
    out.text = std::string(s_.substr(start, pos_ - start));
    return true;
  }
  bool object(Json& out, int depth) {
    out.kind = Json::Kind::kObject;
    ++pos_;
    skip_space();
    if (pos_ < s_.size() && s_[pos_] == '}') {
      ++pos_;
      return true;
    }
    for (;;) {
      skip_space();
      std::string key;
      if (pos_ >= s_.size() || s_[pos_] != '"' || !string(key)) {
        if (why_.empty()) why_ = "expected a member name";
        return false;
      }
      skip_space();
      if (pos_ >= s_.size() || s_[pos_] != ':') {
        why_ = "expected ':'";
        return false;
      }
      ++pos_;
      Json v;
      if (!value(v, depth + 1)) return false;
      out.members.emplace_back(std::move(key), std::move(v));
      skip_space();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == '}') {
        ++pos_;
        return true;
      }
      why_ = "expected ',' or '}'";
      return false;
    }
  }
  bool array(Json& out, int depth) {
    out.kind = Json::Kind::kArray;
    ++pos_;
    skip_space();
    if (pos_ < s_.size() && s_[pos_] == ']') {
      ++pos_;
      return true;
    }
    for (;;) {
      Json v;
      if (!value(v, depth + 1)) return false;
      out.items.push_back(std::move(v));
      skip_space();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == ']') {
        ++pos_;
        return true;
      }
      why_ = "expected ',' or ']'";
      return false;
    }
  }
  static void put_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  bool string(std::string& out) {
    ++pos_;  // the opening quote
    while (pos_ < s_.size()) {
      const char c = s_[pos_++];
      if (c == '"') return true;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) break;
      const char e = s_[pos_++];
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'u': {
          uint32_t cp = 0;
          if (pos_ + 4 > s_.size() ||
              std::from_chars(s_.data() + pos_, s_.data() + pos_ + 4, cp, 16).ptr != s_.data() + pos_ + 4) {
            why_ = "bad \\u escape";
            return false;
          }
          pos_ += 4;
          put_utf8(out, cp);  // surrogate pairs: the gateway sends none (keys are base64)
          break;
        }
        default: out += e;  // '"', '\\', '/'
      }
    }
    why_ = "unterminated string";
    return false;
  }

  std::string_view s_;
  size_t pos_ = 0;
  std::string why_;
};

}  // namespace

const Json* Json::get(std::string_view key) const {
  for (const auto& [k, v] : members)
    if (k == key) return &v;
  return nullptr;
}

std::optional<int64_t> Json::as_int() const {
  if (kind != Kind::kNumber && kind != Kind::kString) return std::nullopt;
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr != text.data() + text.size()) return std::nullopt;
  return v;
}

Result<Json> parse_json(std::string_view text) { return Reader(text).document(); }

std::string json_quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

namespace {
constexpr std::string_view kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
}

std::string base64_encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t v = (static_cast<uint8_t>(bytes[i]) << 16) | (static_cast<uint8_t>(bytes[i + 1]) << 8) |
                       static_cast<uint8_t>(bytes[i + 2]);
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  const size_t rest = bytes.size() - i;
  if (rest > 0) {
    uint32_t v = static_cast<uint8_t>(bytes[i]) << 16;
    if (rest == 2) v |= static_cast<uint8_t>(bytes[i + 1]) << 8;
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += rest == 2 ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::optional<std::string> base64_decode(std::string_view text) {
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : text) {
    if (c == '=') break;
    const size_t d = kAlphabet.find(c);
    if (d == std::string_view::npos) return std::nullopt;
    acc = (acc << 6) | static_cast<uint32_t>(d);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xFF);
    }
  }
  return out;
}

}  // namespace slotrpc::rpc::discovery
