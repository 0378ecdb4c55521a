// slotrpc-gen output, compiled and called end to end over loopback TCP:
// descriptors, every field kind both ways, several services from one file
// with types from included files and other namespaces, both unary call
// forms, status propagation, idempotent retries.
#include <doctest/doctest.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <type_traits>

#include "impls.h"

namespace {

using namespace cgtest_util;
using namespace std::chrono_literals;
using slotrpc::StatusCode;

flatbuffers::Offset<shared::Key> key(flatbuffers::FlatBufferBuilder& fbb, const std::string& name) {
  return shared::CreateKey(fbb, fbb.CreateString(name));
}

// ------------------------------------------------------------ compile time

static_assert(std::is_abstract_v<alpha::AlphaService>);
static_assert(std::has_virtual_destructor_v<alpha::AlphaService>);
static_assert(std::is_abstract_v<PlainService>);  // no namespace: global
static_assert(std::is_same_v<decltype(std::declval<alpha::AlphaClient&>().Lookup(nullptr)),
                             slotrpc::Future<slotrpc::Reply<shared::Blob>>>);
static_assert(std::is_same_v<decltype(std::declval<alpha::BetaClient&>().Count(nullptr)),
                             slotrpc::ClientReader<alpha::Item>>);
// A keyword method gets a trailing '_' in C++ (like flatc's fields).
static_assert(std::is_same_v<decltype(std::declval<gamma_ns::GammaClient&>().delete_(nullptr)),
                             slotrpc::Future<slotrpc::Reply<shared::Key>>>);
static_assert(std::string_view(alpha::AlphaDescriptor::kName) == "cgtest.multi.alpha.Alpha");
static_assert(std::string_view(gamma_ns::GammaDescriptor::kdeleteName) == "cgtest.multi.gamma.Gamma.delete");
static_assert(std::string_view(PlainDescriptor::kSayName) == "Plain.Say");

}  // namespace

TEST_CASE("codegen: descriptors and definition() agree with slotrpc::method_id") {
  CHECK(alpha::AlphaDescriptor::kLookupId == slotrpc::method_id("cgtest.multi.alpha.Alpha.Lookup"));
  CHECK(std::string(alpha::AlphaDescriptor::kStoreName) == "cgtest.multi.alpha.Alpha.Store");
  CHECK(PlainDescriptor::kSayId == slotrpc::method_id("Plain.Say"));

  AlphaImpl a;
  const slotrpc::ServiceDefinition def = a.definition();
  CHECK(def.name() == "cgtest.multi.alpha.Alpha");
  REQUIRE(def.methods().size() == 3);  // declaration order
  CHECK(def.methods()[0].full_name == alpha::AlphaDescriptor::kLookupName);
  CHECK(def.methods()[0].id == alpha::AlphaDescriptor::kLookupId);
  CHECK(def.methods()[1].id == alpha::AlphaDescriptor::kStoreId);
  CHECK(def.methods()[2].full_name == alpha::AlphaDescriptor::kItemName);
  for (const auto& m : def.methods()) {
    CHECK(m.kind == slotrpc::MethodKind::kUnary);
    CHECK((m.verify != nullptr));  // typed methods verify their requests
  }

  BetaImpl b;
  const slotrpc::ServiceDefinition beta = b.definition();
  REQUIRE(beta.methods().size() == 2);
  CHECK(beta.methods()[0].kind == slotrpc::MethodKind::kServerStream);  // streaming: "server"
  CHECK(beta.methods()[1].kind == slotrpc::MethodKind::kUnary);         // streaming: "none"
}

TEST_CASE("codegen: the four call kinds get their descriptors and ids") {
  TypesEchoImpl impl;
  const slotrpc::ServiceDefinition def = impl.definition();
  REQUIRE(def.methods().size() == 4);
  CHECK(def.methods()[0].kind == slotrpc::MethodKind::kUnary);
  CHECK(def.methods()[1].kind == slotrpc::MethodKind::kServerStream);
  CHECK(def.methods()[2].kind == slotrpc::MethodKind::kClientStream);
  CHECK(def.methods()[3].kind == slotrpc::MethodKind::kBidiStream);
  CHECK(def.methods()[2].full_name == "cgtest.types.v1.TypesEcho.Gather");
  CHECK(def.methods()[2].id == v1::TypesEchoDescriptor::kGatherId);
  CHECK(v1::TypesEchoDescriptor::kGatherId == slotrpc::method_id("cgtest.types.v1.TypesEcho.Gather"));
  CHECK(def.methods()[3].id == slotrpc::method_id("cgtest.types.v1.TypesEcho.Chat"));
  // Adding methods leaves the existing one's id as it was.
  CHECK(def.methods()[0].id == slotrpc::method_id("cgtest.types.v1.TypesEcho.Mirror"));
}

TEST_CASE("codegen: every field kind through all four call kinds of a generated service") {
  Fixture fx;
  v1::TypesEchoClient types(*fx.channel);
  // Server streaming.
  slotrpc::ClientReader<v1::AllKinds> spread =
      types.Spread([](flatbuffers::FlatBufferBuilder& fbb) { return build_all_kinds(fbb, 10); });
  uint64_t expect = 11;
  while (auto m = spread.Read()) {
    REQUIRE(m->ok());
    CHECK(check_all_kinds(m->message(), expect) == "");
    ++expect;
  }
  CHECK(expect == 14);
  CHECK(spread.status().ok());
  // Client streaming.
  slotrpc::ClientWriter<v1::AllKinds, v1::AllKinds> gather = types.Gather();
  for (uint64_t seed = 20; seed < 120; ++seed) {
    REQUIRE(gather.Write([seed](flatbuffers::FlatBufferBuilder& fbb) { return build_all_kinds(fbb, seed); }));
  }
  auto gathered = gather.Finish();
  REQUIRE_MESSAGE(gathered.ok(), gathered.status().to_string());
  CHECK(check_all_kinds(gathered.message(), 120) == "");
  gathered.release();
  // Bidi.
  slotrpc::ClientReaderWriter<v1::AllKinds, v1::AllKinds> chat = types.Chat();
  std::thread writer([&] {
    for (uint64_t seed = 200; seed < 300; ++seed) {
      if (!chat.Write([seed](flatbuffers::FlatBufferBuilder& fbb) { return build_all_kinds(fbb, seed); })) return;
    }
    chat.WritesDone();
  });
  expect = 201;
  while (auto m = chat.Read()) {
    REQUIRE(m->ok());
    CHECK(check_all_kinds(m->message(), expect) == "");
    ++expect;
  }
  writer.join();
  CHECK(expect == 301);
  CHECK(chat.Finish().ok());
  // The server checks what it reads: a client stream whose second message
  // is not the next seed is refused.
  slotrpc::ClientWriter<v1::AllKinds, v1::AllKinds> bad = types.Gather();
  REQUIRE(bad.Write([](flatbuffers::FlatBufferBuilder& fbb) { return build_all_kinds(fbb, 1); }));
  REQUIRE(bad.Write([](flatbuffers::FlatBufferBuilder& fbb) { return build_all_kinds(fbb, 5); }));
  CHECK(bad.Finish().status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("codegen: every field kind round-trips through a generated client and service") {
  Fixture fx;
  v1::TypesEchoClient types(*fx.channel);
  alpha::BetaClient beta(*fx.channel);
  for (uint64_t seed = 0; seed < 20; ++seed) {
    CAPTURE(seed);
    // Nested namespace cgtest.types.v1, declared in types.fbs.
    auto reply = get_within(types.Mirror([seed](flatbuffers::FlatBufferBuilder& fbb) {
      return build_all_kinds(fbb, seed);
    }));
    REQUIRE_MESSAGE(reply.ok(), reply.status().to_string());
    CHECK(check_all_kinds(reply.message(), seed + 1) == "");
    // The same types used by a service of another file and namespace.
    auto again = get_within(beta.Mirror([seed](flatbuffers::FlatBufferBuilder& fbb) {
      return build_all_kinds(fbb, seed + 100);
    }));
    REQUIRE_MESSAGE(again.ok(), again.status().to_string());
    CHECK(check_all_kinds(again.message(), seed + 101) == "");
  }
  // The server really checks what it received: a request that is not
  // build_all_kinds(7) (only its f_ulong is) is refused.
  auto wrong = get_within(types.Mirror([](flatbuffers::FlatBufferBuilder& fbb) {
    v1::AllKindsBuilder b(fbb);
    b.add_f_ulong(std::numeric_limits<uint64_t>::max() - 7);
    return b.Finish();
  }));
  CHECK(wrong.status().code() == StatusCode::kInvalidArgument);
  CHECK(wrong.status().message().find("request differs") != std::string::npos);
}

TEST_CASE("codegen: several services from one file, types from included files") {
  Fixture fx;
  alpha::AlphaClient alpha_client(*fx.channel);
  gamma_ns::GammaClient gamma_client(*fx.channel);
  shared::HealthClient health(*fx.channel);
  PlainClient plain(*fx.channel);

  auto blob = get_within(alpha_client.Lookup([](auto& fbb) { return key(fbb, "k1"); }));
  REQUIRE_MESSAGE(blob.ok(), blob.status().to_string());
  CHECK(str(blob->key()) == "k1");
  REQUIRE(blob->data() != nullptr);
  CHECK(std::string(blob->data()->begin(), blob->data()->end()) == "k1");

  auto stored = get_within(alpha_client.Store([](flatbuffers::FlatBufferBuilder& fbb) {
    const std::vector<uint8_t> data(1000, 7);
    return shared::CreateBlob(fbb, fbb.CreateString("blob"), fbb.CreateVector(data));
  }));
  REQUIRE(stored.ok());
  CHECK(str(stored->name()) == "blob:1000");

  // A method named like its response type; the handler sees its full name.
  auto item = get_within(alpha_client.Item([](flatbuffers::FlatBufferBuilder& fbb) {
    return alpha::CreateRange(fbb, 41);
  }));
  REQUIRE(item.ok());
  CHECK(item->index() == 41);
  CHECK(str(item->label()) == alpha::AlphaDescriptor::kItemName);

  // Second namespace of multi.fbs; a C++ keyword as method name.
  auto deleted = get_within(gamma_client.delete_([](auto& fbb) { return key(fbb, "x"); }));
  REQUIRE(deleted.ok());
  CHECK(str(deleted->name()) == "deleted x");

  // The included file's own service, from its own header.
  auto healthy = get_within(health.Check([](auto& fbb) { return key(fbb, "me"); }));
  REQUIRE(healthy.ok());
  CHECK(str(healthy->name()) == "healthy me");

  // No namespace at all.
  auto said = get_within(plain.Say([](flatbuffers::FlatBufferBuilder& fbb) {
    return CreatePlainMsg(fbb, fbb.CreateString("hi"));
  }));
  REQUIRE(said.ok());
  CHECK(str(said->text()) == "hi!");
}

TEST_CASE("codegen: names that need escaping or qualifying") {
  Fixture fx;
  edge::EdgeClient client(*fx.channel);
  // `new` is new_ in C++, `definition` (a member of EdgeService) definition_;
  // on the wire they keep their schema names.
  static_assert(std::string_view(edge::EdgeDescriptor::knewName) == "cgtest.slotrpc.Edge.new");
  static_assert(edge::EdgeDescriptor::kdefinitionId == ::slotrpc::method_id("cgtest.slotrpc.Edge.definition"));
  auto made = get_within(client.new_([](auto& fbb) { return edge::CreateEdgeClient2(fbb, 5); }));
  REQUIRE_MESSAGE(made.ok(), made.status().to_string());
  CHECK(str(made->text()) == "new 5");
  auto counted = get_within(client.definition_([](auto& fbb) { return edge::CreateslotrpcDirect(fbb, "four"); }));
  REQUIRE_MESSAGE(counted.ok(), counted.status().to_string());
  CHECK(counted->n() == 4);
}

TEST_CASE("codegen: the callback form, and many calls in flight") {
  Fixture fx;
  alpha::AlphaClient client(*fx.channel);
  constexpr int kCalls = 500;
  std::vector<std::promise<std::string>> results(kCalls);
  for (int i = 0; i < kCalls; ++i) {
    const std::string name = "key" + std::to_string(i);
    slotrpc::CallHandle h = client.Lookup(
        [name](auto& fbb) { return key(fbb, name); }, {},
        [&results, i](slotrpc::Reply<shared::Blob>&& reply) {
          results[static_cast<size_t>(i)].set_value(reply.ok() ? str(reply->key()) : reply.status().to_string());
        });
    (void)h;
  }
  for (int i = 0; i < kCalls; ++i) {
    auto f = results[static_cast<size_t>(i)].get_future();
    REQUIRE(f.wait_for(30s) == std::future_status::ready);
    CHECK(f.get() == "key" + std::to_string(i));
  }
}

TEST_CASE("codegen: statuses reach the generated client") {
  Fixture fx(/*with_gamma=*/false);
  PlainClient plain(*fx.channel);
  auto failed = get_within(plain.Say([](flatbuffers::FlatBufferBuilder& fbb) {
    return CreatePlainMsg(fbb, fbb.CreateString("fail"));
  }));
  CHECK(failed.status().code() == StatusCode::kInvalidArgument);
  CHECK(failed.status().message() == "asked to fail");
  CHECK(failed.message() == nullptr);

  // Gamma is not served here.
  gamma_ns::GammaClient gamma_client(*fx.channel);
  auto missing = get_within(gamma_client.delete_([](auto& fbb) { return key(fbb, "x"); }));
  CHECK(missing.status().code() == StatusCode::kUnimplemented);

  // CallOptions go through: a deadline already passed.
  auto late = get_within(plain.Say([](flatbuffers::FlatBufferBuilder& fbb) { return CreatePlainMsg(fbb); },
                                   slotrpc::CallOptions::with_timeout(-1ms)));
  CHECK(late.status().code() == StatusCode::kDeadlineExceeded);
}

TEST_CASE("codegen: (idempotent) methods are retried across a server restart, others are not") {
  Fixture fx;
  const std::string address = fx.address();
  alpha::AlphaClient client(*fx.channel);
  slotrpc::CallOptions retry;
  retry.max_retries = 3;  // the caller does not set `idempotent`: the schema does

  auto first = get_within(client.Store([](auto& fbb) { return shared::CreateBlob(fbb, fbb.CreateString("a")); }, retry));
  REQUIRE(first.ok());
  first.release();

  fx.server->stop();
  for (int i = 0; i < 500 && !fx.channel->stats().closed; ++i) std::this_thread::sleep_for(10ms);
  REQUIRE(fx.channel->stats().closed);
  fx.start(true, address);  // same port

  // Lookup is not idempotent: max_retries does not apply.
  auto lookup = get_within(client.Lookup([](auto& fbb) { return key(fbb, "k"); }, retry));
  CHECK(lookup.status().code() == StatusCode::kUnavailable);
  // Store is: the channel reconnects and sends it again.
  auto again = get_within(client.Store([](auto& fbb) { return shared::CreateBlob(fbb, fbb.CreateString("b")); }, retry));
  REQUIRE_MESSAGE(again.ok(), again.status().to_string());
  CHECK(str(again->name()) == "b:0");
  CHECK(fx.alpha_impl.stores.load() == 2);
}
