// slotrpc-gen output for server-streaming methods (streaming: "server"),
// called end to end over loopback TCP: order and count, the final status,
// an idempotent stream, cancellation, an empty stream.
#include <doctest/doctest.h>

#include <chrono>
#include <optional>
#include <string>
#include <thread>

#include "impls.h"

namespace {

using namespace cgtest_util;
using namespace std::chrono_literals;
using slotrpc::StatusCode;

slotrpc::Build<alpha::Range> range(uint64_t from, uint64_t count, std::string fail_with = "") {
  return [from, count, fail_with](flatbuffers::FlatBufferBuilder& fbb) {
    return alpha::CreateRangeDirect(fbb, from, count, fail_with.empty() ? nullptr : fail_with.c_str());
  };
}

// Reads the stream to its end (bounded: a hang fails instead of stalling).
struct Drained {
  uint64_t count = 0;
  std::string first_error;
  slotrpc::Status status;
};
Drained drain(slotrpc::ClientReader<alpha::Item>& reader, uint64_t from) {
  Drained d;
  const auto until = std::chrono::steady_clock::now() + 60s;
  while (std::optional<slotrpc::Reply<alpha::Item>> item = reader.Read()) {
    const uint64_t expect = from + d.count;
    if (d.first_error.empty()) {
      if (!item->ok()) {
        d.first_error = item->status().to_string();
      } else if ((*item)->index() != expect || str((*item)->label()) != "item " + std::to_string(expect)) {
        d.first_error = "message " + std::to_string(d.count) + " is item " + std::to_string((*item)->index());
      }
    }
    ++d.count;
    REQUIRE(std::chrono::steady_clock::now() < until);
  }
  d.status = reader.status();
  return d;
}

}  // namespace

TEST_CASE("codegen stream: 10,000 messages in order through a generated reader, then OK") {
  Fixture fx;
  alpha::BetaClient beta(*fx.channel);
  slotrpc::ClientReader<alpha::Item> reader = beta.Count(range(1000, 10000));
  const Drained d = drain(reader, 1000);
  CHECK(d.first_error == "");
  CHECK(d.count == 10000);
  CHECK_MESSAGE(d.status.ok(), d.status.to_string());
}

TEST_CASE("codegen stream: a wider window via CallOptions, and an empty stream") {
  Fixture fx;
  alpha::BetaClient beta(*fx.channel);
  slotrpc::CallOptions options;
  options.stream_window = 32;
  slotrpc::ClientReader<alpha::Item> reader = beta.Count(range(0, 2000), options);
  const Drained d = drain(reader, 0);
  CHECK(d.first_error == "");
  CHECK(d.count == 2000);
  CHECK(d.status.ok());

  slotrpc::ClientReader<alpha::Item> empty = beta.Count(range(5, 0));
  const Drained e = drain(empty, 5);
  CHECK(e.count == 0);
  CHECK(e.status.ok());
}

TEST_CASE("codegen stream: the handler's status ends the stream after its messages") {
  Fixture fx;
  alpha::BetaClient beta(*fx.channel);
  slotrpc::ClientReader<alpha::Item> reader = beta.Count(range(0, 25, "enough"));
  const Drained d = drain(reader, 0);
  CHECK(d.first_error == "");
  CHECK(d.count == 25);
  CHECK(d.status.code() == StatusCode::kInvalidArgument);
  CHECK(d.status.message() == "enough");
}

TEST_CASE("codegen stream: an (idempotent) streaming method in another namespace") {
  Fixture fx;
  gamma_ns::GammaClient gamma_client(*fx.channel);
  slotrpc::ClientReader<alpha::Item> reader = gamma_client.WhoAmI(range(0, 3));
  uint64_t n = 0;
  while (std::optional<slotrpc::Reply<alpha::Item>> item = reader.Read()) {
    REQUIRE(item->ok());
    CHECK((*item)->index() == n);
    CHECK(str((*item)->label()) == gamma_ns::GammaDescriptor::kWhoAmIName);
    ++n;
  }
  CHECK(n == 3);
  CHECK(reader.status().ok());
}

TEST_CASE("codegen stream: Cancel() ends a long stream; the server's writer stops") {
  Fixture fx;
  alpha::BetaClient beta(*fx.channel);
  slotrpc::ClientReader<alpha::Item> reader = beta.Count(range(0, 100'000'000));
  for (int i = 0; i < 10; ++i) {
    auto item = reader.Read();
    REQUIRE(item.has_value());
    CHECK((*item)->index() == static_cast<uint64_t>(i));
  }
  reader.Cancel();
  uint64_t extra = 0;
  while (reader.Read()) ++extra;  // what was already on its way
  INFO("messages after Cancel(): " << extra);
  CHECK(reader.status().code() == StatusCode::kCancelled);
  for (int i = 0; i < 1000 && !fx.beta.writer_stopped; ++i) std::this_thread::sleep_for(10ms);
  CHECK(fx.beta.writer_stopped);
}
