// Result<T>::value() on an error throws StatusError with the status, in
// every build type (include/slotrpc/result.h).  This file is compiled with
// NDEBUG whatever the build type (tests/meson.build), so an assert() could
// not be what catches it: a release build behaves exactly like this.
#ifndef NDEBUG
#error "result_test must be compiled with NDEBUG (tests/meson.build): it checks release behaviour"
#endif
#include <doctest/doctest.h>
#include <slotrpc/slotrpc.h>

#include <memory>
#include <string>

using slotrpc::Result;
using slotrpc::Status;
using slotrpc::StatusCode;
using slotrpc::StatusError;

namespace {

Result<std::string> failing() { return Status(StatusCode::kUnavailable, "no server at 127.0.0.1:1"); }

}  // namespace

TEST_CASE("value(), -> and * on an error throw StatusError carrying the status") {
  Result<std::string> r = failing();
  CHECK_FALSE(r.ok());
  const std::string text = "UNAVAILABLE: no server at 127.0.0.1:1";
  try {
    (void)r.value();
    FAIL("value() on an error returned");
  } catch (const StatusError& e) {
    CHECK(std::string(e.what()) == text);
    CHECK(e.status().code() == StatusCode::kUnavailable);
    CHECK(e.status().message() == "no server at 127.0.0.1:1");
  }
  const Result<std::string>& cr = r;
  CHECK_THROWS_WITH_AS((void)cr.value(), text.c_str(), StatusError);
  CHECK_THROWS_WITH_AS((void)failing().value(), text.c_str(), StatusError);
  CHECK_THROWS_WITH_AS((void)r->size(), text.c_str(), StatusError);
  CHECK_THROWS_WITH_AS((void)*r, text.c_str(), StatusError);
  CHECK_THROWS_WITH_AS((void)*cr, text.c_str(), StatusError);
}

TEST_CASE("a Result made from an OK status is an INTERNAL error, not an empty value") {
  Result<int> r = Status();
  CHECK_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kInternal);
  CHECK_THROWS_AS((void)r.value(), StatusError);
}

TEST_CASE("a value is returned as it is") {
  Result<std::unique_ptr<int>> r = std::make_unique<int>(7);
  REQUIRE(r.ok());
  CHECK(*r.value() == 7);
  CHECK(**r == 7);
  std::unique_ptr<int> moved = std::move(r).value();
  CHECK(*moved == 7);
}

TEST_CASE("README's first client line with no server: connect(...).value() throws UNAVAILABLE, never a null channel") {
  // Port 1 on loopback: nothing listens there (connect is refused at once).
  slotrpc::Config cfg;
  cfg.connect_timeout_ms = 2000;
  try {
    auto channel = slotrpc::Channel::connect("127.0.0.1:1", cfg).value();
    FAIL("connect to a port nobody listens on returned a channel: " << (channel ? "non-null" : "null"));
  } catch (const StatusError& e) {
    CHECK(e.status().code() == StatusCode::kUnavailable);
    CHECK(std::string(e.what()).rfind("UNAVAILABLE: ", 0) == 0);
  }
}
