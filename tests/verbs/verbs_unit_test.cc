// Verbs pieces that need no RDMA device (run on every host, suite `unit`):
// the handshake extension's encoding and validation, the HelloReply's
// transport field, and what Server and Channel say when verbs is forced on
// a host without a device.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "../env_var.h"
#include "core/handshake.h"
#include "slotrpc/channel.h"
#include "slotrpc/server.h"
#include "transport/verbs/device.h"
#include "transport/verbs/verbs_transport.h"

using slotrpc::StatusCode;
using namespace slotrpc::transport::verbs;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

QpInfo sample() {
  QpInfo info;
  info.qpn = 0x123456;
  info.psn = 0xabcdef;
  for (int i = 0; i < 16; ++i) info.gid.raw[i] = static_cast<uint8_t>(0xf0 + i);
  info.lid = 0x1234;
  info.mtu = IBV_MTU_1024;
  info.link_layer = IBV_LINK_LAYER_ETHERNET;
  info.ring_addr = 0x7f00'1234'5678'9000ull;
  info.ring_rkey = 0xdeadbeef;
  info.slot_count = 64;
  info.slot_size = 65536;
  return info;
}

using slotrpc::test::EnvVar;

}  // namespace

TEST_CASE("verbs extension: round trip, little-endian layout") {
  std::vector<std::byte> buf(kQpInfoSize, std::byte{0xff});
  encode_qp_info(sample(), buf.data());
  // Fixed offsets (docs/protocol.md, section 7).
  CHECK(std::to_integer<uint8_t>(buf[0]) == 'S');
  CHECK(std::to_integer<uint8_t>(buf[1]) == 'R');
  CHECK(std::to_integer<uint8_t>(buf[2]) == 'P');
  CHECK(std::to_integer<uint8_t>(buf[3]) == 'V');
  CHECK(std::to_integer<uint8_t>(buf[4]) == 1);
  CHECK(std::to_integer<uint8_t>(buf[6]) == IBV_MTU_1024);
  CHECK(std::to_integer<uint8_t>(buf[8]) == 0x56);  // qpn, low byte first
  CHECK(std::to_integer<uint8_t>(buf[16]) == 0xf0);  // gid
  CHECK(std::to_integer<uint8_t>(buf[36]) == 0xef);  // rkey
  CHECK(std::to_integer<uint8_t>(buf[40]) == 0x00);  // ring address
  CHECK(std::to_integer<uint8_t>(buf[47]) == 0x7f);
  for (size_t i = 56; i < kQpInfoSize; ++i) CHECK(buf[i] == std::byte{0});

  auto back = decode_qp_info(buf);
  REQUIRE_MESSAGE(back.ok(), back.status().to_string());
  const QpInfo a = sample();
  CHECK(back->qpn == a.qpn);
  CHECK(back->psn == a.psn);
  CHECK(std::memcmp(back->gid.raw, a.gid.raw, 16) == 0);
  CHECK(back->lid == a.lid);
  CHECK(back->mtu == a.mtu);
  CHECK(back->link_layer == a.link_layer);
  CHECK(back->ring_addr == a.ring_addr);
  CHECK(back->ring_rkey == a.ring_rkey);
  CHECK(back->slot_count == a.slot_count);
  CHECK(back->slot_size == a.slot_size);
}

TEST_CASE("verbs extension: malformed ones are refused with a reason") {
  std::vector<std::byte> good(kQpInfoSize);
  encode_qp_info(sample(), good.data());
  auto refused = [](std::vector<std::byte> b, const std::string& why) {
    auto r = decode_qp_info(b);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kUnavailable);
    CHECK_MESSAGE(contains(r.status().message(), why), r.status().message());
  };
  refused(std::vector<std::byte>(good.begin(), good.end() - 1), "63 bytes");
  refused({}, "0 bytes");
  auto b = good;
  b[0] = std::byte{0};
  refused(b, "magic");
  b = good;
  b[4] = std::byte{2};
  refused(b, "version 2");
  b = good;
  b[6] = std::byte{9};
  refused(b, "MTU");
  b = good;
  std::memset(b.data() + 8, 0, 4);
  refused(b, "QP number");
  b = good;
  b[15] = std::byte{1};  // PSN above 24 bits
  refused(b, "PSN");
  b = good;
  std::memset(b.data() + 40, 0, 8);
  refused(b, "ring address");
}

TEST_CASE("hello reply carries the chosen transport; 0 means tcp") {
  using namespace slotrpc::core;
  std::byte buf[kHelloSize];
  HelloReply r;
  r.slot_count = 8;
  r.slot_size = 4096;
  r.transport = WireTransport::kVerbs;
  r.extension_len = 64;
  encode_hello_reply(r, buf);
  CHECK(std::to_integer<uint8_t>(buf[24]) == 2);
  auto d = decode_hello_reply(buf);
  REQUIRE(d.ok());
  CHECK(d->transport == WireTransport::kVerbs);
  CHECK(d->extension_len == 64);
  buf[24] = std::byte{0};  // a server that predates the field
  d = decode_hello_reply(buf);
  REQUIRE(d.ok());
  CHECK(d->transport == WireTransport::kTcp);
  buf[24] = std::byte{7};
  CHECK_FALSE(decode_hello_reply(buf).ok());
}

TEST_CASE("mtu_bytes and gid_text") {
  CHECK(mtu_bytes(IBV_MTU_256) == 256);
  CHECK(mtu_bytes(IBV_MTU_4096) == 4096);
  CHECK(mtu_bytes(0) == 0);
  ibv_gid g{};
  g.raw[0] = 0xfe;
  g.raw[1] = 0x80;
  g.raw[15] = 1;
  CHECK(gid_text(g) == "fe80::1");
}

// SLOTRPC_DEVICE names a device no host has, so these run the same with or
// without an RDMA device here (the rxe suite covers a real one).
constexpr const char* kNoSuchDevice = "nosuchdev0";

TEST_CASE("forcing verbs without a usable device is a clear error") {
  EnvVar d("SLOTRPC_DEVICE", kNoSuchDevice);
  EnvVar t("SLOTRPC_TRANSPORT", "verbs");
  auto ch = slotrpc::Channel::connect("127.0.0.1:1");
  REQUIRE_FALSE(ch.ok());
  CHECK(ch.status().code() == StatusCode::kUnavailable);
  CHECK_MESSAGE(contains(ch.status().message(), "no usable RDMA device"), ch.status().message());
  CHECK_MESSAGE(contains(ch.status().message(), "SLOTRPC_TRANSPORT"), ch.status().message());

  slotrpc::Server server;
  const auto st = server.start("127.0.0.1:0");
  REQUIRE_FALSE(st.ok());
  CHECK(st.code() == StatusCode::kUnavailable);
  CHECK_MESSAGE(contains(st.message(), "no usable RDMA device"), st.message());
}

TEST_CASE("auto without a device: tcp, and the device error names the setting") {
  slotrpc::Config cfg;
  cfg.device = kNoSuchDevice;
  auto named = slotrpc::transport::verbs::probe(cfg);
  REQUIRE_FALSE(named.ok());
  CHECK(named.status().code() == StatusCode::kUnavailable);

  EnvVar d("SLOTRPC_DEVICE", kNoSuchDevice);
  slotrpc::Server server;
  REQUIRE(server.start("127.0.0.1:0").ok());
  auto ch = slotrpc::Channel::connect("127.0.0.1:" + std::to_string(server.port()));
  REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
  CHECK((*ch)->transport() == slotrpc::TransportKind::kTcp);
  const auto metrics = (*ch)->metrics();
  const slotrpc::TransportMetrics* verbs = metrics.transport("verbs");
  CHECK((verbs == nullptr || verbs->max_inline == 0));
}

TEST_CASE("relaxed-ordering detection: one answer per device, detected once each") {
  // Two devices with different answers (a PCI NIC and rxe on one host):
  // each keeps its own; a second ask does not detect again.
  int calls_a = 0, calls_b = 0;
  CHECK(cached_per_device("unit-test-dev-a", [&] { ++calls_a; return true; }));
  CHECK_FALSE(cached_per_device("unit-test-dev-b", [&] { ++calls_b; return false; }));
  CHECK(cached_per_device("unit-test-dev-a", [&] { ++calls_a; return false; }));
  CHECK_FALSE(cached_per_device("unit-test-dev-b", [&] { ++calls_b; return true; }));
  CHECK(calls_a == 1);
  CHECK(calls_b == 1);

  // Asked from many threads at once: detected exactly once, every thread
  // sees that answer.
  std::atomic<int> calls{0};
  std::atomic<int> yes{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      if (cached_per_device("unit-test-dev-c", [&] { ++calls; return true; })) ++yes;
    });
  }
  for (auto& th : threads) th.join();
  CHECK(calls.load() == 1);
  CHECK(yes.load() == 8);
}
