// The tuning table in docs/tuning.md must list every setting the code
// accepts, with the code's range, and no setting the code does not have.
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "base/settings.h"

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot open " << path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("docs/tuning.md lists every numeric setting with the code's range") {
  const std::string doc = read_file(std::string(SLOTRPC_SOURCE_ROOT) + "/docs/tuning.md");
  for (const auto& s : slotrpc::base::uint_settings()) {
    const std::string row_start = fmt::format("| `{}` | `{}` |", s.env, s.field);
    const size_t at = doc.find(row_start);
    CHECK_MESSAGE(at != std::string::npos, s.env << " is missing from docs/tuning.md");
    if (at == std::string::npos) continue;
    const std::string row = doc.substr(at, doc.find('\n', at) - at);
    const slotrpc::Config defaults;
    CHECK_MESSAGE(row.find(fmt::format("| {} |", defaults.*s.member)) != std::string::npos,
                  s.env << ": default " << defaults.*s.member << " not in row: " << row);
    CHECK_MESSAGE(row.find(fmt::format("{}..{}", s.min, s.max)) != std::string::npos,
                  s.env << ": range " << s.min << ".." << s.max << " not in row: " << row);
  }
}

TEST_CASE("docs/tuning.md has a row for every named setting") {
  const std::string doc = read_file(std::string(SLOTRPC_SOURCE_ROOT) + "/docs/tuning.md");
  for (std::string_view n : slotrpc::base::named_settings()) {
    CHECK_MESSAGE(doc.find(fmt::format("| `{}` |", n)) != std::string::npos,
                  n << " has no row in docs/tuning.md");
  }
}

TEST_CASE("docs/tuning.md names no setting the code lacks") {
  const std::string doc = read_file(std::string(SLOTRPC_SOURCE_ROOT) + "/docs/tuning.md");
  std::set<std::string> known;
  for (std::string_view n : slotrpc::base::named_settings()) known.insert(std::string(n));
  for (const auto& s : slotrpc::base::uint_settings()) known.insert(std::string(s.env));
  const std::regex var("SLOTRPC_[A-Z_]+");
  std::set<std::string> documented;
  for (auto it = std::sregex_iterator(doc.begin(), doc.end(), var); it != std::sregex_iterator(); ++it) {
    documented.insert(it->str());
  }
  for (const auto& name : documented) CHECK_MESSAGE(known.count(name) == 1, name << " is documented but not a setting");
  for (const auto& name : known) CHECK_MESSAGE(documented.count(name) == 1, name << " is a setting but not documented");
}
