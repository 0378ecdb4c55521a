// EnvVar: sets (or, with std::nullopt, unsets) one environment variable for
// the lifetime of the guard, then puts the previous value back (unset if
// there was none).  Shared by the tests that drive SLOTRPC_* settings.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace slotrpc::test {

class EnvVar {
 public:
  EnvVar(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~EnvVar() {
    if (old_) {
      ::setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  EnvVar(const EnvVar&) = delete;
  EnvVar& operator=(const EnvVar&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

}  // namespace slotrpc::test
