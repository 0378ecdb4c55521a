// Integration: every byte a call moves is counted, on both sides, per
// method and in the Prometheus text: unary requests and replies, client-
// stream, server-stream and bidi messages (each with its 32-byte header,
// the stream's opening request and final status included), and bulk
// segments both ways -- over TCP (a 64 MiB segment, which takes the bulk
// lane) and over shared memory.
//
// The expected numbers are measured independently of the library: request
// sizes in the writers (or by building the same message in a plain
// FlatBufferBuilder), reply and message sizes from what the client
// received, bulk sizes from the buffers.
#include <doctest/doctest.h>
#include <slotrpc/slotrpc.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/bulk/descriptors.h"
#include "core/wire_format.h"
#include "env_var.h"
#include "test_messages_generated.h"

namespace {

using namespace std::chrono_literals;
using slotrpc::CallOptions;
using slotrpc::Channel;
using slotrpc::MethodMetrics;
using slotrpc::MetricsSnapshot;
using slotrpc::RawReply;
using slotrpc::Server;
using slotrpc::ServerCall;
using slotrpc::ServiceDefinition;
using slotrpc::Status;
using slotrpc::StatusCode;
using slotrpc::test::Ping;
using slotrpc::test::Pong;

constexpr uint64_t kHeader = slotrpc::core::kHeaderSize;
constexpr const char* kService = "slotrpc.test.Bytes";
const uint32_t kEcho = slotrpc::method_id("slotrpc.test.Bytes.Echo");
const uint32_t kLoad = slotrpc::method_id("slotrpc.test.Bytes.Load");
const uint32_t kScan = slotrpc::method_id("slotrpc.test.Bytes.Scan");
const uint32_t kSync = slotrpc::method_id("slotrpc.test.Bytes.Sync");
const uint32_t kPut = slotrpc::method_id("slotrpc.test.Bytes.Put");
const uint32_t kGet = slotrpc::method_id("slotrpc.test.Bytes.Get");

constexpr uint64_t kScanMessages = 25;
constexpr size_t kScanPayload = 2000;
constexpr uint64_t kGetWritten = 768 * 1024;  // of a 1 MiB receive segment

template <class Pred>
bool wait_until(Pred pred, std::chrono::milliseconds limit = 30s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(1ms);
  }
  return pred();
}

// What one side of one method moved.
struct Bytes {
  uint64_t in = 0, out = 0, bulk_in = 0, bulk_out = 0;
};

// A Ping with `n` payload bytes, as a Write() / request builder.
auto ping(uint64_t seq, size_t n) {
  return [seq, n](flatbuffers::FlatBufferBuilder& fbb) {
    std::vector<uint8_t> payload(n, static_cast<uint8_t>(seq));
    return slotrpc::test::CreatePing(fbb, seq, 0, fbb.CreateVector(payload));
  };
}
// The size of that message, built in a plain builder.
template <class Build>
uint64_t size_of(Build build) {
  flatbuffers::FlatBufferBuilder fbb;
  fbb.Finish(build(fbb));
  return fbb.GetSize();
}

ServiceDefinition service() {
  ServiceDefinition svc(kService);
  svc.add_method("Echo", [](ServerCall& call) -> Status {
    call.reply().PushFlatBuffer(reinterpret_cast<const uint8_t*>(call.request().data()),
                                call.request().size());
    return {};
  });
  svc.add_client_stream<Ping, Pong>(
      "Load", [](slotrpc::ServerReader<Ping>& in, slotrpc::ReplyBuilder<Pong>& out, ServerCall&) -> Status {
        uint64_t n = 0;
        while (in.Read() != nullptr) ++n;
        if (!in.status().ok()) return in.status();
        out.Finish(slotrpc::test::CreatePong(out.fbb(), n, out.fbb().CreateString("read")));
        return {};
      });
  svc.add_server_stream<Ping, Pong>(
      "Scan", [](const Ping& req, slotrpc::ServerWriter<Pong>& out, ServerCall&) -> Status {
        for (uint64_t i = 0; i < req.seq(); ++i) {
          const bool ok = out.Write([i](flatbuffers::FlatBufferBuilder& fbb) {
            std::vector<uint8_t> payload(kScanPayload, static_cast<uint8_t>(i));
            return slotrpc::test::CreatePong(fbb, i, 0, fbb.CreateVector(payload));
          });
          if (!ok) return out.error();
        }
        return {};
      });
  svc.add_bidi_stream<Ping, Pong>(
      "Sync", [](slotrpc::ServerReaderWriter<Ping, Pong>& s, ServerCall&) -> Status {
        while (const Ping* p = s.Read()) {
          std::vector<uint8_t> payload(p->payload()->begin(), p->payload()->end());
          const uint64_t seq = p->seq();
          if (!s.Write([seq, &payload](flatbuffers::FlatBufferBuilder& fbb) {
                return slotrpc::test::CreatePong(fbb, seq, 0, fbb.CreateVector(payload));
              })) {
            return s.write_error();
          }
        }
        return s.read_status();
      });
  // Reads every send_bulk segment whole; replies with their total.
  svc.add_method("Put", [](ServerCall& call) -> Status {
    uint64_t total = 0;
    for (size_t i = 0; i < call.bulk_in_count(); ++i) {
      std::vector<std::byte> into(call.bulk_in(i));
      if (Status st = call.read_bulk(i, into); !st.ok()) return st;
      total += into.size();
    }
    auto& fbb = call.reply();
    fbb.Finish(slotrpc::test::CreatePong(fbb, total));
    return {};
  });
  // Writes kGetWritten bytes into the first receive_bulk segment.
  svc.add_method("Get", [](ServerCall& call) -> Status {
    std::vector<std::byte> data(kGetWritten, std::byte{0x5a});
    if (Status st = call.write_bulk(0, data); !st.ok()) return st;
    auto& fbb = call.reply();
    fbb.Finish(slotrpc::test::CreatePong(fbb, kGetWritten));
    return {};
  });
  return svc;
}

const MethodMetrics* find_method(const MetricsSnapshot& m, const std::string& method, bool server) {
  for (const MethodMetrics& mm : m.methods) {
    if (mm.name == std::string(kService) + "/" + method && mm.server == server) return &mm;
  }
  return nullptr;
}

uint64_t prometheus_value(const std::string& text, const std::string& series) {
  const size_t at = text.find("\n" + series + " ");
  REQUIRE_MESSAGE(at != std::string::npos, series);
  return std::stoull(text.substr(at + series.size() + 2));
}

// Makes the traffic over a channel to `server` and checks both sides.
void run(Server& server, slotrpc::TransportKind transport, uint64_t put_bytes) {
  std::map<std::string, Bytes> client;  // by method, as the client sees it
  auto ch = Channel::connect("127.0.0.1:" + std::to_string(server.port())).value();
  REQUIRE(ch->transport() == transport);

  // Unary: varied sizes.
  for (uint64_t i = 0; i < 20; ++i) {
    uint64_t sent = 0;
    auto r = slotrpc::raw::call(*ch, kEcho, [&sent, i](flatbuffers::FlatBufferBuilder& fbb) {
                    std::vector<uint8_t> body(16 + i * 37, static_cast<uint8_t>(i));
                    fbb.PushFlatBuffer(body.data(), body.size());
                    sent = fbb.GetSize();
                  }).get();
    REQUIRE(r.ok());
    client["Echo"].out += kHeader + sent;
    client["Echo"].in += kHeader + r.size();
  }

  // Client stream: 100 messages of ~4 KB, opened by an empty request.
  {
    auto w = ch->client_stream<Ping, Pong>(kLoad);
    client["Load"].out += kHeader;
    for (uint64_t i = 0; i < 100; ++i) {
      REQUIRE(w.Write(ping(i, 4000 + i)));
      client["Load"].out += kHeader + size_of(ping(i, 4000 + i));
    }
    auto reply = w.Finish();
    REQUIRE(reply.ok());
    CHECK(reply->seq() == 100);
    client["Load"].in += kHeader + reply.raw().size();
  }

  // Server stream: its messages, then the final status (a header alone).
  {
    std::atomic<uint64_t> in{0};
    std::atomic<bool> ended{false};
    std::atomic<bool> ok{false};
    uint64_t sent = 0;
    slotrpc::raw::call_stream(*ch,
        kScan,
        [&sent](flatbuffers::FlatBufferBuilder& fbb) {
          fbb.Finish(ping(kScanMessages, 0)(fbb));
          sent = fbb.GetSize();
        },
        {}, [&in](RawReply&& m) { in += kHeader + m.size(); },
        [&](Status s) {
          ok = s.ok();
          ended = true;
        });
    REQUIRE(wait_until([&] { return ended.load(); }));
    REQUIRE(ok.load());
    client["Scan"].out += kHeader + sent;
    client["Scan"].in += in.load() + kHeader;
  }

  // Bidi: 10 echoes, opened by an empty request, ended by a final status.
  {
    auto s = ch->bidi_stream<Ping, Pong>(kSync);
    client["Sync"].out += kHeader;
    for (uint64_t i = 0; i < 10; ++i) {
      REQUIRE(s.Write(ping(i, 300 * i)));
      client["Sync"].out += kHeader + size_of(ping(i, 300 * i));
      auto m = s.Read();
      REQUIRE(m.has_value());
      client["Sync"].in += kHeader + m->raw().size();
    }
    REQUIRE(s.Finish().ok());
    client["Sync"].in += kHeader;
  }

  // Bulk in: one large send segment, read whole by the handler.
  {
    std::vector<std::byte> tensor(put_bytes, std::byte{0x11});
    uint64_t sent = 0;
    CallOptions o;
    o.send_bulk(std::span<const std::byte>(tensor));
    auto r = slotrpc::raw::call(*ch, kPut, [&sent](flatbuffers::FlatBufferBuilder& fbb) {
                    fbb.Finish(ping(1, 0)(fbb));
                    sent = fbb.GetSize();
                  }, o).get();
    REQUIRE_MESSAGE(r.ok(), r.status().message());
    // A bulk call's request carries its segments' descriptors before the
    // FlatBuffer.
    client["Put"].out += kHeader + slotrpc::bulk::request_block_bytes(1, 0) + sent;
    // Its reply carries a bulk block too, for no receive segments.
    client["Put"].in += kHeader + slotrpc::bulk::reply_block_bytes(0) + r.size();
    client["Put"].bulk_out += put_bytes;
  }
  // The server started the transfers of the Put (it read): they count
  // under the channel's transport -- over TCP on the session's bulk lane.
  const std::string kind = transport == slotrpc::TransportKind::kShm ? "shm" : "tcp";
  const std::string tlabel = "{transport=\"" + kind + "\"}";
  CHECK(prometheus_value(slotrpc::to_prometheus(server.metrics()),
                         "slotrpc_transport_bulk_requests_total" + tlabel) >= 1);

  // Bulk out: the handler fills part of a receive segment.
  {
    std::vector<std::byte> into(1 << 20);
    uint64_t sent = 0;
    CallOptions o;
    o.receive_bulk(std::span<std::byte>(into));
    auto r = slotrpc::raw::call(*ch, kGet, [&sent](flatbuffers::FlatBufferBuilder& fbb) {
                    fbb.Finish(ping(2, 0)(fbb));
                    sent = fbb.GetSize();
                  }, o).get();
    REQUIRE_MESSAGE(r.ok(), r.status().message());
    REQUIRE(r.bulk_received(0) == kGetWritten);
    client["Get"].out += kHeader + slotrpc::bulk::request_block_bytes(0, 1) + sent;
    // The reply's payload is its bulk block (what was written into each
    // segment), then the FlatBuffer.
    client["Get"].in += kHeader + slotrpc::bulk::reply_block_bytes(1) + r.size();
    client["Get"].bulk_in += kGetWritten;
  }

  const MetricsSnapshot c = ch->metrics();
  const MetricsSnapshot s = server.metrics();
  const std::string ct = slotrpc::to_prometheus(c);
  const std::string st = slotrpc::to_prometheus(s);
  Bytes total;
  for (const auto& [method, b] : client) {
    CAPTURE(method);
    const MethodMetrics* cm = find_method(c, method, false);
    const MethodMetrics* sm = find_method(s, method, true);
    REQUIRE(cm != nullptr);
    REQUIRE(sm != nullptr);
    CHECK(cm->bytes_out == b.out);
    CHECK(cm->bytes_in == b.in);
    CHECK(cm->bulk_bytes_out == b.bulk_out);
    CHECK(cm->bulk_bytes_in == b.bulk_in);
    // The server sees the same bytes the other way round.
    CHECK(sm->bytes_in == b.out);
    CHECK(sm->bytes_out == b.in);
    CHECK(sm->bulk_bytes_in == b.bulk_out);
    CHECK(sm->bulk_bytes_out == b.bulk_in);
    const std::string label = "{side=\"client\",method=\"" + std::string(kService) + "/" + method + "\"}";
    const std::string slabel = "{side=\"server\",method=\"" + std::string(kService) + "/" + method + "\"}";
    CHECK(prometheus_value(ct, "slotrpc_method_sent_bytes_total" + label) == b.out);
    CHECK(prometheus_value(ct, "slotrpc_method_received_bytes_total" + label) == b.in);
    CHECK(prometheus_value(ct, "slotrpc_method_bulk_sent_bytes_total" + label) == b.bulk_out);
    CHECK(prometheus_value(ct, "slotrpc_method_bulk_received_bytes_total" + label) == b.bulk_in);
    CHECK(prometheus_value(st, "slotrpc_method_received_bytes_total" + slabel) == b.out);
    CHECK(prometheus_value(st, "slotrpc_method_sent_bytes_total" + slabel) == b.in);
    CHECK(prometheus_value(st, "slotrpc_method_bulk_received_bytes_total" + slabel) == b.bulk_out);
    CHECK(prometheus_value(st, "slotrpc_method_bulk_sent_bytes_total" + slabel) == b.bulk_in);
    total.in += b.in;
    total.out += b.out;
    total.bulk_in += b.bulk_in;
    total.bulk_out += b.bulk_out;
  }
  CHECK(total.bulk_out == put_bytes);
  CHECK(c.client.bytes_out == total.out);
  CHECK(c.client.bytes_in == total.in);
  CHECK(c.client.bulk_bytes_out == total.bulk_out);
  CHECK(c.client.bulk_bytes_in == total.bulk_in);
  CHECK(s.server.bytes_in == total.out);
  CHECK(s.server.bytes_out == total.in);
  CHECK(s.server.bulk_bytes_in == total.bulk_out);
  CHECK(s.server.bulk_bytes_out == total.bulk_in);
  CHECK(prometheus_value(ct, "slotrpc_sent_bytes_total{side=\"client\"}") == total.out);
  CHECK(prometheus_value(ct, "slotrpc_received_bytes_total{side=\"client\"}") == total.in);
  CHECK(prometheus_value(ct, "slotrpc_bulk_sent_bytes_total{side=\"client\"}") == total.bulk_out);
  CHECK(prometheus_value(ct, "slotrpc_bulk_received_bytes_total{side=\"client\"}") == total.bulk_in);
  CHECK(prometheus_value(st, "slotrpc_received_bytes_total{side=\"server\"}") == total.out);
  CHECK(prometheus_value(st, "slotrpc_sent_bytes_total{side=\"server\"}") == total.in);
  CHECK(prometheus_value(st, "slotrpc_bulk_received_bytes_total{side=\"server\"}") == total.bulk_out);
  CHECK(prometheus_value(st, "slotrpc_bulk_sent_bytes_total{side=\"server\"}") == total.bulk_in);

  // The Put's transfers and the Get's.
  const uint64_t requests = prometheus_value(st, "slotrpc_transport_bulk_requests_total" + tlabel);
  CHECK(requests >= 2);
  ch.reset();
  // Closed: the session's transfers still count.
  REQUIRE(wait_until([&] { return server.session_count() == 0; }));
  CHECK(prometheus_value(slotrpc::to_prometheus(server.metrics()),
                         "slotrpc_transport_bulk_requests_total" + tlabel) == requests);
}

}  // namespace

TEST_CASE("metrics bytes: unary, stream and bulk traffic over tcp, both sides, per method") {
  slotrpc::test::EnvVar transport("SLOTRPC_TRANSPORT", std::string("tcp"));
  Server server;
  REQUIRE(server.add_service(service()).ok());
  REQUIRE(server.start("127.0.0.1:0").ok());
  // 64 MiB: over SLOTRPC_TCP_BULK_LANE's 16 MiB, so it runs on the
  // session's bulk lane.
  run(server, slotrpc::TransportKind::kTcp, 64ull << 20);
}

TEST_CASE("metrics bytes: unary, stream and bulk traffic over shm, both sides, per method") {
  // The suite runs with SLOTRPC_UNIX_PATH=off (tcp); here the server also
  // listens on its Unix socket and the channel must take shm.
  slotrpc::test::EnvVar unix_path("SLOTRPC_UNIX_PATH", std::nullopt);
  slotrpc::test::EnvVar transport("SLOTRPC_TRANSPORT", std::string("shm"));
  Server server;
  REQUIRE(server.add_service(service()).ok());
  REQUIRE(server.start("127.0.0.1:0").ok());
  run(server, slotrpc::TransportKind::kShm, 8ull << 20);
}
