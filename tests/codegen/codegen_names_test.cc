// A generated client's statuses and metrics name the method
// ("pkg.Service/Method"), raw calls keep the method id, and a handler's own
// status is passed on as it was written.
//
// A binary of its own: no server in this process registers the methods the
// client calls unless a case does so, so the names can only come from the
// generated code (CallOptions::method_name), not from a registered service.
#include <doctest/doctest.h>

#include <chrono>
#include <string>

#include "impls.h"

namespace {

using namespace cgtest_util;
using namespace std::chrono_literals;
using slotrpc::StatusCode;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A server with one raw service: `service`.`method` holds every call 2 s
// (in its fiber) unless cancelled.
struct SlowServer {
  slotrpc::Server server;
  SlowServer(const char* service, const char* method) {
    slotrpc::ServiceDefinition svc(service);
    svc.add_method(method, [](slotrpc::ServerCall& call) -> slotrpc::Status {
      const auto end = std::chrono::steady_clock::now() + 2s;
      while (!call.cancelled() && std::chrono::steady_clock::now() < end) slotrpc::this_fiber::sleep_for(1ms);
      return slotrpc::Status(StatusCode::kAborted, "gave up");
    });
    REQUIRE(server.add_service(std::move(svc)).ok());
    REQUIRE(server.start("127.0.0.1:0").ok());
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(server.port()); }
};

}  // namespace

TEST_CASE("codegen names: DEADLINE_EXCEEDED and UNIMPLEMENTED name pkg.Service/Method") {
  // The server has cgtest.multi.alpha.Alpha.Lookup (slow), and no Gamma.
  SlowServer slow("cgtest.multi.alpha.Alpha", "Lookup");
  auto ch = slotrpc::Channel::connect(slow.address()).value();

  alpha::AlphaClient alpha_client(*ch);
  auto late = get_within(alpha_client.Lookup([](auto& fbb) { return shared::CreateKey(fbb, fbb.CreateString("k")); },
                                             slotrpc::CallOptions::with_timeout(50ms)));
  CHECK(late.status().code() == StatusCode::kDeadlineExceeded);
  INFO(late.status().to_string());
  CHECK(contains(late.status().message(), "call to cgtest.multi.alpha.Alpha/Lookup exceeded its deadline of "));
  CHECK(contains(late.status().message(), " ms (request "));
  CHECK(contains(late.status().message(), " to " + slow.address() + ")"));
  CHECK_FALSE(contains(late.status().message(), "0x"));

  gamma_ns::GammaClient gamma_client(*ch);
  auto missing = get_within(gamma_client.delete_([](auto& fbb) { return shared::CreateKey(fbb, fbb.CreateString("x")); }));
  CHECK(missing.status().code() == StatusCode::kUnimplemented);
  INFO(missing.status().to_string());
  CHECK(contains(missing.status().message(), "cgtest.multi.gamma.Gamma/delete: no method with id 0x"));

  // A server stream of a method the server lacks: its final status too.
  alpha::BetaClient beta_client(*ch);
  auto reader = beta_client.Count([](auto& fbb) { return alpha::CreateRange(fbb, 1, 3); });
  while (reader.Read()) {
  }
  CHECK(reader.status().code() == StatusCode::kUnimplemented);
  CHECK(contains(reader.status().message(), "cgtest.multi.alpha.Beta/Count: "));

  // A deadline that passed before the call was sent.
  auto past = get_within(alpha_client.Lookup([](auto& fbb) { return shared::CreateKey(fbb, fbb.CreateString("k")); },
                                             slotrpc::CallOptions::with_timeout(-1ms)));
  CHECK(past.status().code() == StatusCode::kDeadlineExceeded);
  CHECK(contains(past.status().message(), "cgtest.multi.alpha.Alpha/Lookup"));

  // The client's metrics name its methods, Gamma/delete too, which no
  // server of this process registers: the name is the generated client's.
  const slotrpc::MetricsSnapshot m = ch->metrics();
  bool gamma_named = false;
  for (const auto& mm : m.methods) {
    CHECK_FALSE(contains(mm.name, "0x"));
    gamma_named |= !mm.server && mm.name == "cgtest.multi.gamma.Gamma/delete";
  }
  CHECK(gamma_named);

  // Raw calls have no name: the id, as before.
  auto raw = slotrpc::raw::call(*ch, alpha::AlphaDescriptor::kLookupId,
                      [](flatbuffers::FlatBufferBuilder& fbb) { fbb.Finish(shared::CreateKey(fbb)); },
                      slotrpc::CallOptions::with_timeout(50ms));
  REQUIRE(raw.wait_for(30s));
  const slotrpc::RawReply r = raw.get();
  CHECK(r.status().code() == StatusCode::kDeadlineExceeded);
  CHECK(contains(r.status().message(), "call to method id 0x"));
  auto raw_missing = slotrpc::raw::call(*ch, gamma_ns::GammaDescriptor::kdeleteId,
                              [](flatbuffers::FlatBufferBuilder& fbb) { fbb.Finish(shared::CreateKey(fbb)); });
  REQUIRE(raw_missing.wait_for(30s));
  const slotrpc::RawReply rm = raw_missing.get();
  CHECK(rm.status().code() == StatusCode::kUnimplemented);
  CHECK(rm.status().message().rfind("no method with id 0x", 0) == 0);
}

TEST_CASE("codegen names: a lost session and a cancel name the method; a handler's status is its own") {
  Fixture fx(/*with_gamma=*/false);
  PlainClient plain(*fx.channel);
  auto failed = get_within(plain.Say([](flatbuffers::FlatBufferBuilder& fbb) {
    return CreatePlainMsg(fbb, fbb.CreateString("fail"));
  }));
  CHECK(failed.status().code() == StatusCode::kInvalidArgument);
  CHECK(failed.status().message() == "asked to fail");

  SlowServer slow("cgtest.multi.alpha.Alpha", "Lookup");
  auto ch = slotrpc::Channel::connect(slow.address()).value();
  alpha::AlphaClient client(*ch);
  auto cancelled = client.Lookup([](auto& fbb) { return shared::CreateKey(fbb, fbb.CreateString("c")); });
  cancelled.cancel();
  const auto c = get_within(cancelled);
  CHECK(c.status().code() == StatusCode::kCancelled);
  CHECK(contains(c.status().message(), "cgtest.multi.alpha.Alpha/Lookup: "));

  auto lost = client.Lookup([](auto& fbb) { return shared::CreateKey(fbb, fbb.CreateString("l")); });
  slow.server.stop();
  const auto l = get_within(lost);
  CHECK(l.status().code() == StatusCode::kUnavailable);
  INFO(l.status().to_string());
  CHECK(contains(l.status().message(), "cgtest.multi.alpha.Alpha/Lookup: "));
}
