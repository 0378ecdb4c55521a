// Call metadata (slotrpc/metadata.h, docs/protocol.md "Call metadata"):
// headers a client sends with a call, trailers a server sends with its
// final reply; their limits; and the wire block's checks.
#include <doctest/doctest.h>
#include <slotrpc/slotrpc.h>

#include <atomic>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "core/metadata.h"
#include "core/wire_format.h"
#include "ping_payloads.h"
#include "test_messages_generated.h"

namespace {

using namespace slotrpc::test_payloads;  // ping
using slotrpc::CallOptions;
using slotrpc::Channel;
using slotrpc::Config;
using slotrpc::Server;
using slotrpc::ServerCall;
using slotrpc::ServiceDefinition;
using slotrpc::Status;
using slotrpc::StatusCode;
using slotrpc::TransportKind;
using slotrpc::test::Ping;
using slotrpc::test::Pong;

constexpr uint32_t kShow = slotrpc::method_id("slotrpc.test.Meta.Show");
constexpr uint32_t kFail = slotrpc::method_id("slotrpc.test.Meta.Fail");
constexpr uint32_t kBig = slotrpc::method_id("slotrpc.test.Meta.BigTrailer");
constexpr uint32_t kCount = slotrpc::method_id("slotrpc.test.Meta.Count");
constexpr uint32_t kBulk = slotrpc::method_id("slotrpc.test.Meta.Bulk");
constexpr uint32_t kPlain = slotrpc::method_id("slotrpc.test.Meta.Plain");

struct Overlay {
  Overlay() { slotrpc::set_environment_overlay(false); }
};
const Overlay overlay_off;

// "k=v;k=v;" of every entry, in order.
std::string all_metadata(const ServerCall& call) {
  std::string out;
  for (size_t i = 0; i < call.metadata_count(); ++i) {
    auto [k, v] = call.metadata_at(i);
    out += std::string(k) + "=" + std::string(v) + ";";
  }
  return out;
}

ServiceDefinition make_service(std::atomic<int>* runs) {
  ServiceDefinition svc("slotrpc.test.Meta");
  // Show: answers with the metadata it saw, adds two trailers.
  svc.add_unary<Ping>("Show", [runs](const Ping& req, flatbuffers::FlatBufferBuilder& out,
                                     ServerCall& call) -> Status {
    ++*runs;
    call.add_trailer("served-by", "show");
    call.add_trailer("seq", std::to_string(req.seq()));
    out.Finish(slotrpc::test::CreatePong(out, req.seq(), out.CreateString(all_metadata(call))));
    return {};
  });
  // Plain: no trailers.
  svc.add_unary<Ping>("Plain", [runs](const Ping& req, flatbuffers::FlatBufferBuilder& out,
                                      ServerCall& call) -> Status {
    ++*runs;
    out.Finish(slotrpc::test::CreatePong(out, req.seq(), out.CreateString(all_metadata(call))));
    return {};
  });
  // Fail: NOT_FOUND, with a trailer saying why.
  svc.add_unary<Ping>("Fail", [runs](const Ping&, flatbuffers::FlatBufferBuilder&, ServerCall& call) -> Status {
    ++*runs;
    call.add_trailer("retry-after-ms", "250");
    return Status(StatusCode::kNotFound, "no such key");
  });
  // BigTrailer: a trailer over the 8 KiB a message may carry.
  svc.add_unary<Ping>("BigTrailer", [runs](const Ping& req, flatbuffers::FlatBufferBuilder& out,
                                           ServerCall& call) -> Status {
    ++*runs;
    call.add_trailer("big", std::string(9000, 'x'));
    out.Finish(slotrpc::test::CreatePong(out, req.seq(), out.CreateString("big")));
    return {};
  });
  // Count: a server stream of one message that carries the metadata it saw.
  svc.add_server_stream<Ping, Pong>("Count", [runs](const Ping& req, slotrpc::ServerWriter<Pong>& w,
                                                   ServerCall& call) -> Status {
    ++*runs;
    const std::string text = all_metadata(call);
    w.Write([&](flatbuffers::FlatBufferBuilder& b) {
      return slotrpc::test::CreatePong(b, req.seq(), b.CreateString(text));
    });
    return {};
  });
  // Bulk: reads its send segment; answers with the metadata and the bytes' sum.
  svc.add_unary<Ping>("Bulk", [runs](const Ping& req, flatbuffers::FlatBufferBuilder& out,
                                     ServerCall& call) -> Status {
    ++*runs;
    std::vector<std::byte> in(call.bulk_in(0));
    if (Status st = call.read_bulk(0, in); !st.ok()) return st;
    uint64_t sum = 0;
    for (std::byte b : in) sum += static_cast<uint8_t>(b);
    call.add_trailer("sum", std::to_string(sum));
    out.Finish(slotrpc::test::CreatePong(out, req.seq(), out.CreateString(all_metadata(call))));
    return {};
  });
  return svc;
}

std::unique_ptr<Server> start(std::atomic<int>* runs, Config c = {}) {
  auto server = std::make_unique<Server>(c);
  REQUIRE(server->add_service(make_service(runs)).ok());
  REQUIRE(server->start("127.0.0.1:0").ok());
  return server;
}

std::unique_ptr<Channel> connect(const Server& s, TransportKind t, Config c = {}) {
  c.transport = t;
  auto ch = Channel::connect("127.0.0.1:" + std::to_string(s.port()), c);
  REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
  return std::move(ch.value());
}

}  // namespace

TEST_CASE("call metadata reaches the handler and trailers come back, over tcp and shm") {
  std::atomic<int> runs{0};
  auto server = start(&runs);
  for (TransportKind t : {TransportKind::kTcp, TransportKind::kShm}) {
    INFO("transport ", slotrpc::to_string(t));
    auto ch = connect(*server, t);

    CallOptions o;
    o.add_metadata("authorization", "Bearer abc").add_metadata("trace-id", "7f3a").add_metadata("empty", "");
    auto r = ch->call_typed<Pong>(kShow, ping(5, "x"), o).get();
    REQUIRE_MESSAGE(r.ok(), r.status().to_string());
    CHECK(r->text()->str() == "authorization=Bearer abc;trace-id=7f3a;empty=;");
    REQUIRE(r.trailers().size() == 2);
    CHECK(*r.trailer("served-by") == "show");
    CHECK(*r.trailer("seq") == "5");
    CHECK(r.trailer("absent") == nullptr);

    // None sent: the handler sees none (and trailers still come).
    auto plain = ch->call_typed<Pong>(kShow, ping(6, "x")).get();
    REQUIRE(plain.ok());
    CHECK(plain->text()->str().empty());
    CHECK(*plain.trailer("seq") == "6");

    // An error carries its trailers too.
    auto failed = ch->call_typed<Pong>(kFail, ping(7, "x")).get();
    REQUIRE_FALSE(failed.ok());
    CHECK(failed.status().code() == StatusCode::kNotFound);
    CHECK(failed.status().message() == "no such key");
    REQUIRE(failed.trailer("retry-after-ms") != nullptr);
    CHECK(*failed.trailer("retry-after-ms") == "250");

    // A server stream's handler reads them as well.
    std::promise<std::string> first;
    std::promise<Status> ended;
    CallOptions so;
    so.add_metadata("stream-key", "v");
    slotrpc::raw::call_stream(*ch, kCount, ping(8, "x"), so,
                    [&first](slotrpc::RawReply&& m) {
                      flatbuffers::Verifier v(m.data(), m.size());
                      REQUIRE(v.VerifyBuffer<Pong>(nullptr));
                      first.set_value(flatbuffers::GetRoot<Pong>(m.data())->text()->str());
                    },
                    [&ended](Status st) { ended.set_value(st); });
    auto f = first.get_future();
    REQUIRE(f.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
    CHECK(f.get() == "stream-key=v;");
    auto e = ended.get_future();
    REQUIRE(e.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
    CHECK(e.get().ok());
  }
}

// The server keeps a slot's trailers until the reply that sends them, and
// a call without metadata reads none: nothing of one call reaches the next
// in the same slot (one call at a time reuses the slot).
TEST_CASE("metadata and trailers belong to their call: the next call in the slot sees none") {
  std::atomic<int> runs{0};
  auto server = start(&runs);
  for (TransportKind t : {TransportKind::kTcp, TransportKind::kShm}) {
    INFO("transport ", slotrpc::to_string(t));
    auto ch = connect(*server, t);
    for (int round = 0; round < 3; ++round) {
      CallOptions o;
      o.add_metadata("trace-id", "r" + std::to_string(round));
      auto with = ch->call_typed<Pong>(kShow, ping(10 + round, "x"), o).get();
      REQUIRE_MESSAGE(with.ok(), with.status().to_string());
      CHECK(with.trailers().size() == 2);
      auto failed = ch->call_typed<Pong>(kFail, ping(20 + round, "x")).get();
      REQUIRE(failed.trailer("retry-after-ms") != nullptr);

      auto plain = ch->call_typed<Pong>(kPlain, ping(30 + round, "x")).get();
      REQUIRE_MESSAGE(plain.ok(), plain.status().to_string());
      CHECK(plain->text()->str().empty());       // no metadata left from the call before
      CHECK(plain.trailers().empty());           // no trailers left from the calls before
      CHECK(plain.trailer("served-by") == nullptr);
      CHECK(plain.raw().trailers().empty());
      CHECK(plain.bulk_received(0) == 0);
    }
  }
}

TEST_CASE("metadata with bulk segments: metadata, then the bulk block, then the request") {
  std::atomic<int> runs{0};
  auto server = start(&runs);
  auto ch = connect(*server, TransportKind::kTcp);
  std::vector<std::byte> data(100000);
  uint64_t sum = 0;
  for (size_t i = 0; i < data.size(); ++i) {
    data[i] = static_cast<std::byte>(i * 7);
    sum += static_cast<uint8_t>(data[i]);
  }
  CallOptions o;
  o.send_bulk(std::span<const std::byte>(data));
  o.add_metadata("k", "v");
  auto r = ch->call_typed<Pong>(kBulk, ping(1, "x"), o).get();
  REQUIRE_MESSAGE(r.ok(), r.status().to_string());
  CHECK(r->text()->str() == "k=v;");
  CHECK(*r.trailer("sum") == std::to_string(sum));
}

TEST_CASE("a client interceptor adds a token and a server interceptor checks it") {
  std::atomic<int> runs{0};
  Server server;
  REQUIRE(server.add_service(make_service(&runs)).ok());
  REQUIRE(server.add_interceptor([](const ServerCall& call) -> Status {
    auto token = call.metadata("authorization");
    if (!token) return Status(StatusCode::kUnauthenticated, "no authorization metadata");
    if (*token != "Bearer good") return Status(StatusCode::kPermissionDenied, "bad token");
    call.add_trailer("checked-by", "interceptor");
    return {};
  }).ok());
  REQUIRE(server.start("127.0.0.1:0").ok());

  auto bare = connect(server, TransportKind::kTcp);
  auto denied = bare->call_typed<Pong>(kShow, ping(1, "x")).get();
  CHECK(denied.status().code() == StatusCode::kUnauthenticated);

  auto ch = connect(server, TransportKind::kTcp);
  REQUIRE(ch->add_interceptor([](slotrpc::ClientCallInfo& info) -> Status {
    info.metadata->emplace_back("authorization", "Bearer good");
    return {};
  }).ok());
  auto ok = ch->call_typed<Pong>(kShow, ping(2, "x")).get();
  REQUIRE_MESSAGE(ok.ok(), ok.status().to_string());
  CHECK(ok->text()->str() == "authorization=Bearer good;");
  CHECK(*ok.trailer("checked-by") == "interceptor");
  CHECK(runs.load() == 1);
}

TEST_CASE("metadata limits are refused clearly, before anything is sent") {
  std::atomic<int> runs{0};
  Config small;
  small.slot_size = 4096;
  auto server = start(&runs, small);
  auto ch = connect(*server, TransportKind::kTcp, small);

  SUBCASE("over 8 KiB") {
    CallOptions o;
    o.add_metadata("big", std::string(9000, 'x'));
    auto r = ch->call_typed<Pong>(kShow, ping(1, "x"), o).get();
    CHECK(r.status().code() == StatusCode::kResourceExhausted);
    CHECK(r.status().message().find("8192") != std::string::npos);
  }
  SUBCASE("a bad key") {
    CallOptions o;
    o.add_metadata("Bad Key", "v");
    auto r = ch->call_typed<Pong>(kShow, ping(1, "x"), o).get();
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK(r.status().message().find("'Bad Key'") != std::string::npos);
  }
  SUBCASE("under 8 KiB but not beside the request in a 4 KiB slot") {
    CallOptions o;
    o.add_metadata("k", std::string(3000, 'x'));
    auto r = ch->call_typed<Pong>(kShow, ping(1, "x", 1500), o).get();
    CHECK(r.status().code() == StatusCode::kResourceExhausted);
    CHECK(r.status().message().find("call metadata does not fit a slot") != std::string::npos);
    CHECK(r.status().message().find("SLOTRPC_SLOT_SIZE") != std::string::npos);
  }
  SUBCASE("the server's trailers over 8 KiB: the call fails naming the method") {
    auto r = ch->call_typed<Pong>(kBig, ping(1, "x")).get();
    CHECK(r.status().code() == StatusCode::kResourceExhausted);
    CHECK(r.status().message().find("trailers of slotrpc.test.Meta.BigTrailer") != std::string::npos);
  }
  // The session is fine afterwards.
  auto after = ch->call_typed<Pong>(kShow, ping(9, "x")).get();
  CHECK_MESSAGE(after.ok(), after.status().to_string());
}

TEST_CASE("the metadata block: encoding round trip and every malformed form refused") {
  using namespace slotrpc::core;
  slotrpc::Metadata list{{"a", "1"}, {"b-c.d_e", std::string(300, 'z')}, {"e", ""}};
  auto bytes = metadata_block_bytes(list, "call metadata");
  REQUIRE(bytes.ok());
  CHECK(bytes.value() % 8 == 0);
  std::vector<std::byte> block(bytes.value());
  encode_metadata(list, block.data(), block.size());
  auto len = check_metadata_block(block);
  REQUIRE(len.ok());
  CHECK(len.value() == block.size());
  MetadataView view(block);
  REQUIRE(view.size() == 3);
  CHECK(view.at(1).first == "b-c.d_e");
  CHECK(view.at(1).second.size() == 300);
  CHECK(view.find("e").value().empty());
  CHECK_FALSE(view.find("f").has_value());

  auto broken = [&](auto&& mutate) {
    std::vector<std::byte> b = block;
    mutate(b);
    return check_metadata_block(b);
  };
  CHECK_FALSE(broken([](auto& b) { store_le<uint32_t>(b.data(), 12); }).ok());          // not a multiple of 8
  CHECK_FALSE(broken([&](auto& b) { store_le<uint32_t>(b.data(), 16384); }).ok());      // over the limit
  CHECK_FALSE(broken([&](auto& b) { store_le<uint16_t>(b.data() + 4, 9); }).ok());      // entries past the end
  CHECK_FALSE(broken([](auto& b) { b[8 + 4] = std::byte{'A'}; }).ok());                // key not lower case
  CHECK_FALSE(broken([](auto& b) { store_le<uint8_t>(b.data() + 8, 0); }).ok());       // empty key
  CHECK_FALSE(check_metadata_block(std::span<const std::byte>(block).first(4)).ok());  // no head
  const auto msg = broken([](auto& b) { store_le<uint16_t>(b.data() + 4, 9); }).status().message();
  CHECK(msg.find("malformed metadata block") != std::string::npos);

  // The flag: on requests, replies and errors only.
  Header h;
  h.payload_len = 0;
  h.flags = static_cast<uint8_t>(Kind::kError) | kFlagMetadata;
  CHECK(validate_header(h, kHeaderSize, 4, 4096, 0) == HeaderError::kOk);
  h.flags = static_cast<uint8_t>(Kind::kReply) | kFlagMetadata | kFlagBulk;
  CHECK(validate_header(h, kHeaderSize, 4, 4096, 0) == HeaderError::kOk);
  h.flags = static_cast<uint8_t>(Kind::kPing) | kFlagMetadata;
  CHECK(validate_header(h, kHeaderSize, 4, 4096, 0) == HeaderError::kBadKind);
  h.flags = static_cast<uint8_t>(Kind::kError) | kFlagBulk;
  CHECK(validate_header(h, kHeaderSize, 4, 4096, 0) == HeaderError::kBadKind);
}
