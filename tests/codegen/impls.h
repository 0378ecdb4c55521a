// Implementations of the test schemas' generated services, and a server
// with all of them on 127.0.0.1:0 plus a channel to it.
//
// Every generated header is included into one translation unit: a service
// generated twice (e.g. Health, declared in shared.fbs, which multi.fbs
// includes) would not compile.
#pragma once

#include <doctest/doctest.h>
#include <slotrpc/slotrpc.h>

#include <atomic>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "all_kinds.h"
#include "edge.slotrpc.h"  // first: declares namespace cgtest::slotrpc
#include "multi.slotrpc.h"
#include "noservice.slotrpc.h"
#include "plain.slotrpc.h"
#include "shared.slotrpc.h"
#include "types.slotrpc.h"

namespace cgtest_util {

namespace alpha = cgtest::multi::alpha;
namespace gamma_ns = cgtest::multi::gamma;
namespace shared = cgtest::shared;

inline std::string str(const flatbuffers::String* s) { return s == nullptr ? "<null>" : s->str(); }

inline slotrpc::Status mirror(const v1::AllKinds& request, slotrpc::ReplyBuilder<v1::AllKinds>& reply) {
  const uint64_t seed = std::numeric_limits<uint64_t>::max() - request.f_ulong();
  if (const std::string e = check_all_kinds(&request, seed); !e.empty())
    return slotrpc::Status(slotrpc::StatusCode::kInvalidArgument, "request differs: " + e);
  reply.Finish(build_all_kinds(reply.fbb(), seed + 1));
  return {};
}

inline uint64_t seed_of(const v1::AllKinds& m) { return std::numeric_limits<uint64_t>::max() - m.f_ulong(); }

class TypesEchoImpl final : public v1::TypesEchoService {
 public:
  slotrpc::Status Mirror(const v1::AllKinds& request, slotrpc::ReplyBuilder<v1::AllKinds>& reply,
                         slotrpc::ServerCall&) override {
    return mirror(request, reply);
  }
  slotrpc::Status Spread(const v1::AllKinds& request, slotrpc::ServerWriter<v1::AllKinds>& writer,
                         slotrpc::ServerCall&) override {
    const uint64_t seed = seed_of(request);
    if (const std::string e = check_all_kinds(&request, seed); !e.empty())
      return slotrpc::Status(slotrpc::StatusCode::kInvalidArgument, "request differs: " + e);
    for (uint64_t i = 1; i <= 3; ++i) {
      if (!writer.Write([seed, i](flatbuffers::FlatBufferBuilder& fbb) { return build_all_kinds(fbb, seed + i); }))
        return writer.error();
    }
    return {};
  }
  slotrpc::Status Gather(slotrpc::ServerReader<v1::AllKinds>& reader,
                         slotrpc::ReplyBuilder<v1::AllKinds>& reply, slotrpc::ServerCall&) override {
    std::optional<uint64_t> next;
    while (const v1::AllKinds* m = reader.Read()) {
      const uint64_t seed = seed_of(*m);
      if (next && seed != *next)
        return slotrpc::Status(slotrpc::StatusCode::kInvalidArgument, "seed out of order");
      if (const std::string e = check_all_kinds(m, seed); !e.empty())
        return slotrpc::Status(slotrpc::StatusCode::kInvalidArgument, "message differs: " + e);
      next = seed + 1;
    }
    if (!reader.status().ok()) return reader.status();
    if (!next) return slotrpc::Status(slotrpc::StatusCode::kInvalidArgument, "no messages");
    reply.Finish(build_all_kinds(reply.fbb(), *next));
    return {};
  }
  slotrpc::Status Chat(slotrpc::ServerReaderWriter<v1::AllKinds, v1::AllKinds>& stream,
                       slotrpc::ServerCall&) override {
    while (const v1::AllKinds* m = stream.Read()) {
      const uint64_t seed = seed_of(*m);
      if (const std::string e = check_all_kinds(m, seed); !e.empty())
        return slotrpc::Status(slotrpc::StatusCode::kInvalidArgument, "message differs: " + e);
      if (!stream.Write([seed](flatbuffers::FlatBufferBuilder& fbb) { return build_all_kinds(fbb, seed + 1); }))
        return stream.write_error();
    }
    return stream.read_status();
  }
};

class AlphaImpl final : public alpha::AlphaService {
 public:
  slotrpc::Status Lookup(const shared::Key& request, slotrpc::ReplyBuilder<shared::Blob>& reply,
                         slotrpc::ServerCall&) override {
    const std::string name = str(request.name());
    auto& fbb = reply.fbb();
    reply.Finish(shared::CreateBlob(fbb, fbb.CreateString(name),
                                    fbb.CreateVector(reinterpret_cast<const uint8_t*>(name.data()), name.size())));
    return {};
  }
  slotrpc::Status Store(const shared::Blob& request, slotrpc::ReplyBuilder<shared::Key>& reply,
                        slotrpc::ServerCall&) override {
    ++stores;
    const size_t n = request.data() == nullptr ? 0 : request.data()->size();
    auto& fbb = reply.fbb();
    reply.Finish(shared::CreateKey(fbb, fbb.CreateString(str(request.key()) + ":" + std::to_string(n))));
    return {};
  }
  slotrpc::Status Item(const alpha::Range& request, slotrpc::ReplyBuilder<alpha::Item>& reply,
                       slotrpc::ServerCall& call) override {
    auto& fbb = reply.fbb();
    reply.Finish(alpha::CreateItem(fbb, request.from(), fbb.CreateString(call.method_name())));
    return {};
  }
  std::atomic<int> stores{0};
};

// Count streams Items from..from+count-1 labelled "item <i>", then ends
// with fail_with (INVALID_ARGUMENT) if set.
class BetaImpl final : public alpha::BetaService {
 public:
  slotrpc::Status Count(const alpha::Range& request, slotrpc::ServerWriter<alpha::Item>& writer,
                        slotrpc::ServerCall&) override {
    for (uint64_t i = request.from(); i < request.from() + request.count(); ++i) {
      const bool ok = writer.Write([i](flatbuffers::FlatBufferBuilder& fbb) {
        return alpha::CreateItem(fbb, i, fbb.CreateString("item " + std::to_string(i)));
      });
      if (!ok) {
        writer_stopped = true;
        return writer.error();
      }
    }
    if (request.fail_with() != nullptr && request.fail_with()->size() != 0)
      return slotrpc::Status(slotrpc::StatusCode::kInvalidArgument, request.fail_with()->str());
    return {};
  }
  slotrpc::Status Mirror(const v1::AllKinds& request, slotrpc::ReplyBuilder<v1::AllKinds>& reply,
                         slotrpc::ServerCall&) override {
    return mirror(request, reply);
  }
  std::atomic<bool> writer_stopped{false};
};

class GammaImpl final : public gamma_ns::GammaService {
 public:
  slotrpc::Status delete_(const shared::Key& request, slotrpc::ReplyBuilder<shared::Key>& reply,
                          slotrpc::ServerCall&) override {
    auto& fbb = reply.fbb();
    reply.Finish(shared::CreateKey(fbb, fbb.CreateString("deleted " + str(request.name()))));
    return {};
  }
  slotrpc::Status WhoAmI(const alpha::Range& request, slotrpc::ServerWriter<alpha::Item>& writer,
                         slotrpc::ServerCall& call) override {
    for (uint64_t i = 0; i < request.count(); ++i) {
      const std::string name = call.method_name();
      if (!writer.Write([&](flatbuffers::FlatBufferBuilder& fbb) {
            return alpha::CreateItem(fbb, i, fbb.CreateString(name));
          }))
        return writer.error();
    }
    return {};
  }
};

class HealthImpl final : public shared::HealthService {
 public:
  slotrpc::Status Check(const shared::Key& request, slotrpc::ReplyBuilder<shared::Key>& reply,
                        slotrpc::ServerCall&) override {
    auto& fbb = reply.fbb();
    reply.Finish(shared::CreateKey(fbb, fbb.CreateString("healthy " + str(request.name()))));
    return {};
  }
};

// Say: replies text + "!"; text "fail" gets INVALID_ARGUMENT.
class PlainImpl final : public PlainService {
 public:
  slotrpc::Status Say(const PlainMsg& request, slotrpc::ReplyBuilder<PlainMsg>& reply,
                      slotrpc::ServerCall&) override {
    if (str(request.text()) == "fail")
      return slotrpc::Status(slotrpc::StatusCode::kInvalidArgument, "asked to fail");
    auto& fbb = reply.fbb();
    reply.Finish(CreatePlainMsg(fbb, fbb.CreateString(str(request.text()) + "!")));
    return {};
  }
};

namespace edge = cgtest::slotrpc;

class EdgeImpl final : public edge::EdgeService {
 public:
  ::slotrpc::Status new_(const edge::EdgeClient2& request, ::slotrpc::ReplyBuilder<edge::slotrpc>& reply,
                         ::slotrpc::ServerCall&) override {
    auto& fbb = reply.fbb();
    reply.Finish(edge::CreateslotrpcDirect(fbb, ("new " + std::to_string(request.n())).c_str()));
    return {};
  }
  ::slotrpc::Status definition_(const edge::slotrpc& request, ::slotrpc::ReplyBuilder<edge::EdgeClient2>& reply,
                                ::slotrpc::ServerCall&) override {
    reply.Finish(edge::CreateEdgeClient2(reply.fbb(), static_cast<int32_t>(str(request.text()).size())));
    return {};
  }
};

// All services (Gamma optional) on 127.0.0.1:0, and a channel to them.
struct Fixture {
  TypesEchoImpl types;
  AlphaImpl alpha_impl;
  BetaImpl beta;
  GammaImpl gamma_impl;
  HealthImpl health;
  PlainImpl plain;
  EdgeImpl edge_impl;
  std::unique_ptr<slotrpc::Server> server;
  std::unique_ptr<slotrpc::Channel> channel;

  explicit Fixture(bool with_gamma = true, const std::string& listen = "127.0.0.1:0") {
    start(with_gamma, listen);
    auto ch = slotrpc::Channel::connect(address());
    REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
    channel = std::move(*ch);
  }
  void start(bool with_gamma, const std::string& listen) {
    server = std::make_unique<slotrpc::Server>();
    std::vector<slotrpc::ServiceDefinition> defs;
    defs.push_back(types.definition());
    defs.push_back(alpha_impl.definition());
    defs.push_back(beta.definition());
    if (with_gamma) defs.push_back(gamma_impl.definition());
    defs.push_back(health.definition());
    defs.push_back(plain.definition());
    defs.push_back(edge_impl.definition());
    for (auto& def : defs) {
      const slotrpc::Status st = server->add_service(std::move(def));
      REQUIRE_MESSAGE(st.ok(), st.to_string());
    }
    const slotrpc::Status st = server->start(listen);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(server->port()); }
};

// Future::get() with a bound: a hang fails the test instead of stalling it.
template <class T>
T get_within(slotrpc::Future<T>& f) {
  REQUIRE_MESSAGE(f.wait_for(std::chrono::seconds(30)), "no reply within 30 s");
  return f.get();
}
template <class T>
T get_within(slotrpc::Future<T>&& f) {
  return get_within(f);
}

}  // namespace cgtest_util
