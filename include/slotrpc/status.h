// Status: the outcome of a call or an operation, carried on the wire in replies.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "slotrpc/export.h"

namespace slotrpc {

// gRPC's status codes, with gRPC's numbers, so that logs, dashboards and
// code ported from gRPC read the same.  A handler may return any of them;
// a peer that predates the full set receives the codes it does not know as
// INTERNAL, with the code's name leading the message (docs/protocol.md,
// "Status codes").
enum class StatusCode : uint16_t {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kUnauthenticated = 16,
};

// Name of a code ("OK", "DEADLINE_EXCEEDED", ...); "UNKNOWN" for a number
// that is not one.
SLOTRPC_API std::string_view status_code_name(StatusCode code);
// True when `raw` is one of the codes above, 0..16 (used when decoding).
SLOTRPC_API bool is_known_status_code(uint16_t raw);

class [[nodiscard]] SLOTRPC_API Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return {}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "DEADLINE_EXCEEDED: call to echo.Echo/Echo exceeded its deadline of
  // 10 ms (request 4 to 127.0.0.1:7100)".  The statuses a client makes up
  // itself (deadline, cancel, lost session, a server without the method, a
  // request that does not fit) name the method when the call came from
  // generated code (CallOptions::method_name), else its id; a status a
  // handler returned reaches the caller as the handler wrote it.
  std::string to_string() const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

}  // namespace slotrpc
