// slotrpc.Reflection (lib/rpc/reflection): every server lists its services,
// built-ins included, and serves the binary schema slotrpc-gen embedded;
// a service registered by hand has none, and says so.
#include <doctest/doctest.h>
#include <flatbuffers/reflection.h>
#include <slotrpc/slotrpc.h>

#include <string>
#include <vector>

#include "reflection_service.slotrpc.h"

namespace {

std::unique_ptr<slotrpc::Channel> connect(const slotrpc::Server& s) {
  slotrpc::Config c;
  c.transport = slotrpc::TransportKind::kTcp;
  auto ch = slotrpc::Channel::connect("127.0.0.1:" + std::to_string(s.port()), c);
  REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
  return std::move(ch.value());
}

}  // namespace

TEST_CASE("Reflection lists the services and serves the schemas slotrpc-gen embedded") {
  slotrpc::Server server;
  slotrpc::ServiceDefinition by_hand("slotrpc.test.ByHand");
  by_hand.add_method("Nothing", [](slotrpc::ServerCall&) { return slotrpc::Status(); });
  REQUIRE(server.add_service(std::move(by_hand)).ok());
  REQUIRE(server.start("127.0.0.1:0").ok());
  auto ch = connect(server);
  slotrpc::ReflectionClient client(*ch);

  auto list = client.ListServices([](auto& b) { return slotrpc::CreateListServicesRequest(b); }).get();
  REQUIRE_MESSAGE(list.ok(), list.status().to_string());
  std::vector<std::string> names;
  for (const auto* s : *list->services()) names.push_back(s->str());
  CHECK(names == std::vector<std::string>{"slotrpc.Admin", "slotrpc.Health", "slotrpc.Reflection",
                                          "slotrpc.test.ByHand"});

  const auto schema_of = [&](const std::string& service) {
    return client
        .ServiceSchema([service](auto& b) { return slotrpc::CreateServiceSchemaRequest(b, b.CreateString(service)); })
        .get();
  };
  // A built-in from slotrpc-gen: a schema that verifies and declares it.
  auto health = schema_of("slotrpc.Health");
  REQUIRE_MESSAGE(health.ok(), health.status().to_string());
  CHECK(health->service()->str() == "slotrpc.Health");
  flatbuffers::Verifier v(health->bfbs()->data(), health->bfbs()->size());
  REQUIRE(v.VerifyBuffer<reflection::Schema>(nullptr));
  const reflection::Schema* schema = reflection::GetSchema(health->bfbs()->data());
  REQUIRE(schema->services() != nullptr);
  CHECK(schema->services()->LookupByKey("slotrpc.Health") != nullptr);
  CHECK(schema->objects()->LookupByKey("slotrpc.HealthCheckRequest") != nullptr);

  auto none = schema_of("slotrpc.test.ByHand");
  CHECK(none.status().code() == slotrpc::StatusCode::kNotFound);
  CHECK(none.status().message().find("has no schema") != std::string::npos);
  auto unknown = schema_of("no.Such");
  CHECK(unknown.status().code() == slotrpc::StatusCode::kNotFound);
  CHECK(unknown.status().message().find("runs no service 'no.Such'") != std::string::npos);
  server.stop();
}
