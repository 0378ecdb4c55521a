// Result<T>: a value or a non-OK Status (std::expected arrives only in C++23).
//
// value() (and -> and *) on a Result that holds an error throws
// slotrpc::StatusError with the status, in every build type: a program
// that writes `Channel::connect(addr).value()` and finds no server learns
// why at once, instead of running on with a null channel.  Check ok()
// first, or catch StatusError, to handle the error yourself.
#pragma once

#include <optional>
#include <stdexcept>
#include <utility>

#include "slotrpc/status.h"

namespace slotrpc {

// What value() throws for a Result that holds an error; what() is
// status().to_string(), e.g. "UNAVAILABLE: cannot connect to ...".
class SLOTRPC_API StatusError : public std::runtime_error {
 public:
  explicit StatusError(Status status) : std::runtime_error(status.to_string()), status_(std::move(status)) {}
  const Status& status() const noexcept { return status_; }

 private:
  Status status_;
};

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  // An OK status carries no value, so it becomes INTERNAL rather than a
  // Result that is neither a value nor an error.
  Result(Status status)  // NOLINT: implicit by design
      : status_(status.ok() ? Status(StatusCode::kInternal, "Result made from an OK status without a value")
                            : std::move(status)) {}

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  T& value() & { check(); return *value_; }
  const T& value() const& { check(); return *value_; }
  T&& value() && { check(); return std::move(*value_); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  void check() const {
    if (!value_.has_value()) [[unlikely]] throw StatusError(status_);
  }

  std::optional<T> value_;
  Status status_;
};

}  // namespace slotrpc
