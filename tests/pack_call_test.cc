// Integration: packing small messages end to end over TCP
// (docs/protocol.md, "PACK").
//
// A burst of calls issued in one loop turn (from a reply callback, so on
// the channel's loop) must go out as a PACK, be answered by a PACK, and
// every call must still get its own reply, status and deadline.  Packing
// is negotiated: neither a Channel nor the server ever sends a PACK to a
// peer that did not announce it, and a raw client speaking the wire by
// hand shows what the server sends with and without the feature.  A PACK
// that is malformed, unannounced, or names a busy slot closes that
// session only.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <slotrpc/slotrpc.h>
#include <string>
#include <vector>

#include "core/pack.h"
#include "process_util.h"
#include "raw_tcp_client.h"
#include "test_messages_generated.h"

namespace {

using namespace std::chrono_literals;
using namespace raw_tcp;
using slotrpc::CallOptions;
using slotrpc::Channel;
using slotrpc::Config;
using slotrpc::RawReply;
using slotrpc::Server;
using slotrpc::ServerCall;
using slotrpc::ServiceDefinition;
using slotrpc::Status;
using slotrpc::StatusCode;
using slotrpc::test::Ping;
using slotrpc::test::Pong;
using test_process::wait_until;
namespace core = slotrpc::core;

constexpr uint32_t kEcho = slotrpc::method_id("slotrpc.test.Pack.Echo");
constexpr uint32_t kFail = slotrpc::method_id("slotrpc.test.Pack.Fail");
constexpr uint32_t kSlow = slotrpc::method_id("slotrpc.test.Pack.Slow");

// What Slow read from its request (in place, in its slot) after sleeping.
std::atomic<int64_t> g_slow_seq{-1};

// Echo answers with the Ping's seq and, as text, whether the call came
// with a deadline; Fail answers INVALID_ARGUMENT naming the seq; Slow
// sleeps sleep_ms in its fiber first, then reads the seq.
struct PackServer {
  Server server;
  explicit PackServer(Config c = {}) : server(c) {
    ServiceDefinition svc("slotrpc.test.Pack");
    svc.add_unary<Ping>("Echo", [](const Ping& req, flatbuffers::FlatBufferBuilder& out, ServerCall& call) {
      auto text = out.CreateString(call.deadline() ? "deadline" : "none");
      out.Finish(slotrpc::test::CreatePong(out, req.seq(), text));
      return Status();
    });
    svc.add_unary<Ping>("Fail", [](const Ping& req, flatbuffers::FlatBufferBuilder&, ServerCall&) {
      return Status(StatusCode::kInvalidArgument, fmt::format("fail {}", req.seq()));
    });
    svc.add_unary<Ping>("Slow", [](const Ping& req, flatbuffers::FlatBufferBuilder& out, ServerCall&) {
      slotrpc::this_fiber::sleep_for(std::chrono::milliseconds(req.sleep_ms()));
      g_slow_seq = static_cast<int64_t>(req.seq());
      out.Finish(slotrpc::test::CreatePong(out, req.seq()));
      return Status();
    });
    REQUIRE(server.add_service(std::move(svc)).ok());
    REQUIRE(server.start("127.0.0.1:0").ok());
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(server.port()); }
  uint64_t packs_sent() const {
    for (const auto& t : server.metrics().transports)
      if (t.transport == "tcp") return t.packs;
    return 0;
  }
};

Config tcp_config(uint32_t pack_small = Config().pack_small) {
  Config c;
  c.transport = slotrpc::TransportKind::kTcp;
  c.pack_small = pack_small;
  c.reactor_threads = 1;
  return c;
}

auto ping(uint64_t seq, uint32_t sleep_ms = 0) {
  return [seq, sleep_ms](flatbuffers::FlatBufferBuilder& fbb) {
    fbb.Finish(slotrpc::test::CreatePing(fbb, seq, 0, 0, sleep_ms));
  };
}

struct Outcome {
  bool done = false;
  StatusCode code = StatusCode::kOk;
  std::string message;
  uint64_t seq = 0;
  std::string text;
};

// Calls one Echo; in its reply callback (the channel's loop) issues
// `burst` calls back to back, which therefore leave in one turn.  Call i
// goes to Fail when i % 3 == 0, else to Echo, with a deadline when i is
// even.  Returns each call's outcome once all are in.
std::vector<Outcome> burst_after_one(Channel& ch, size_t burst) {
  std::mutex mu;
  std::vector<Outcome> out(burst);
  std::atomic<size_t> done{0};
  slotrpc::raw::call(ch, kEcho, ping(1000), {}, [&](RawReply&& first) {
    REQUIRE(first.ok());
    first.release();
    for (size_t i = 0; i < burst; ++i) {
      CallOptions o;
      if (i % 2 == 0) o = CallOptions::with_timeout(30s);
      slotrpc::raw::call(ch, i % 3 == 0 ? kFail : kEcho, ping(i), o, [&, i](RawReply&& r) {
        std::lock_guard<std::mutex> lock(mu);
        Outcome& oc = out[i];
        oc.done = true;
        oc.code = r.status().code();
        oc.message = r.status().message();
        if (r.ok()) {
          flatbuffers::Verifier v(reinterpret_cast<const uint8_t*>(r.data()), r.size());
          if (v.VerifyBuffer<Pong>(nullptr)) {
            const Pong* p = flatbuffers::GetRoot<Pong>(r.data());
            oc.seq = p->seq();
            oc.text = p->text() != nullptr ? p->text()->str() : "";
          }
        }
        r.release();
        ++done;
      });
    }
  });
  REQUIRE(wait_until([&] { return done.load() == burst; }));
  std::lock_guard<std::mutex> lock(mu);
  return out;
}

void check_outcomes(const std::vector<Outcome>& out) {
  for (size_t i = 0; i < out.size(); ++i) {
    CAPTURE(i);
    const Outcome& oc = out[i];
    REQUIRE(oc.done);
    if (i % 3 == 0) {
      CHECK(oc.code == StatusCode::kInvalidArgument);
      CHECK(oc.message == fmt::format("fail {}", i));
    } else {
      REQUIRE(oc.code == StatusCode::kOk);
      CHECK(oc.seq == i);
      CHECK(oc.text == (i % 2 == 0 ? "deadline" : "none"));
    }
  }
}

// ---- the raw client's side -------------------------------------------------

std::vector<std::byte> request_frame(uint32_t method, uint64_t seq, uint16_t slot, uint32_t generation,
                                     uint32_t sleep_ms = 0) {
  flatbuffers::FlatBufferBuilder fbb;
  ping(seq, sleep_ms)(fbb);
  std::vector<std::byte> payload(reinterpret_cast<const std::byte*>(fbb.GetBufferPointer()),
                                 reinterpret_cast<const std::byte*>(fbb.GetBufferPointer()) + fbb.GetSize());
  return frame(false, core::make_imm(slot, generation),
               body_of(request_header(method, seq, slot, generation, payload.size()), payload));
}

// A PACK of Echo requests for `slots` (generation 1, request id = slot),
// built by the library's own write_pack; `edit` may spoil it.
std::vector<std::byte> pack_frame(const std::vector<uint16_t>& slots,
                                  void (*edit)(std::vector<std::byte>&) = nullptr) {
  constexpr uint32_t kSlotSize = 65536;
  std::vector<std::byte> ring(size_t{64} * kSlotSize);
  std::vector<core::PackPiece> pieces;
  for (uint16_t s : slots) {
    flatbuffers::FlatBufferBuilder fbb;
    ping(s)(fbb);
    const auto h = request_header(kEcho, s, s, 1, fbb.GetSize());
    std::byte* msg = ring.data() + size_t{s} * kSlotSize + kSlotSize - core::kHeaderSize - fbb.GetSize();
    core::encode_header(h, msg);
    std::memcpy(msg + core::kHeaderSize, fbb.GetBufferPointer(), fbb.GetSize());
    pieces.push_back(core::PackPiece{msg, static_cast<uint32_t>(core::kHeaderSize + fbb.GetSize())});
  }
  const core::PackOut out = core::write_pack(ring.data(), kSlotSize, slots[0], pieces);
  REQUIRE(out.data != nullptr);
  std::vector<std::byte> body(out.data, out.data + out.length);
  if (edit != nullptr) edit(body);
  return frame(false, core::make_imm(slots[0], 1), body);
}

// Sends Echo requests for slots 0..n-1 (generation g) in one write and
// reads until all n replies are in; returns how many came inside PACKs and
// checks every reply answers its request.
size_t burst_raw(int fd, uint16_t n, uint32_t g, size_t* packs) {
  std::vector<std::byte> all;
  for (uint16_t s = 0; s < n; ++s) {
    const auto f = request_frame(kEcho, s, s, g);
    all.insert(all.end(), f.begin(), f.end());
  }
  send_bytes(fd, all);
  size_t replies = 0, packed = 0;
  std::vector<bool> seen(n, false);
  auto take = [&](const core::Header& h, const std::byte* payload) {
    REQUIRE(h.kind() == core::Kind::kReply);
    REQUIRE(h.slot < n);
    CHECK_FALSE(seen[h.slot]);
    seen[h.slot] = true;
    CHECK(h.generation == g);
    CHECK(h.request_id == h.slot);
    const Pong* p = flatbuffers::GetRoot<Pong>(payload);
    CHECK(p->seq() == h.slot);
    ++replies;
  };
  while (replies < n) {
    const Frame f = read_slot_frame(fd);
    const core::Header h = core::decode_header(f.body.data());
    REQUIRE(core::validate_header(h, f.body.size(), 64, 65536, core::imm_slot(f.imm)) ==
            core::HeaderError::kOk);
    if (h.kind() != core::Kind::kPack) {
      take(h, f.body.data() + core::kHeaderSize);
      continue;
    }
    ++*packs;
    std::vector<std::byte> slot = f.body;
    slot.resize(65536);
    core::PackParser parser(64);
    REQUIRE(parser.parse(slot.data(), h, 64, 65536, core::PackSender::kServer) == "");
    for (const core::PackedEntry& e : parser.entries()) {
      take(e.header, slot.data() + e.offset + core::kHeaderSize);
      ++packed;
    }
  }
  return packed;
}

}  // namespace

TEST_CASE("packing: calls issued in one turn travel in PACKs both ways and keep their own status and deadline") {
  PackServer s(tcp_config());
  auto ch = Channel::connect(s.address(), tcp_config()).value();
  check_outcomes(burst_after_one(*ch, 12));
  const Channel::Stats st = ch->stats();
  // The twelve left in one turn: one PACK (a second only if a flush came
  // between them).  The server's replies came back packed too.
  CHECK(st.packs_sent >= 1);
  CHECK(st.packed_requests >= 6);
  CHECK(st.packs_received >= 1);
  CHECK(s.packs_sent() >= 1);
  // Fewer work requests than messages: that is the point.
  CHECK(st.link_messages > st.work_requests);
  // A call alone goes out alone, as before packing.
  const uint64_t before = st.packs_sent;
  for (int i = 0; i < 5; ++i) {
    auto r = slotrpc::raw::call(*ch, kEcho, ping(7)).get();
    REQUIRE(r.ok());
  }
  CHECK(ch->stats().packs_sent == before);
}

// Early flush (Config::tcp_flush_every, docs/tuning.md "Early flush"): a
// turn that issues 32 calls sends the first 16 as soon as they are built,
// so the server works on them while the client builds the rest; at 0 the
// turn's 32 leave together at its end.
TEST_CASE("early flush: 32 calls of one turn leave as two PACKs of 16 at tcp_flush_every 16, as one at 0") {
  for (const uint32_t every : {16u, 0u}) {
    CAPTURE(every);
    Config c = tcp_config();
    c.tcp_flush_every = every;
    c.keepalive_ms = 600'000;  // no PING among the frames counted
    c.peer_timeout_ms = 1'800'000;
    PackServer s(c);
    auto ch = Channel::connect(s.address(), c).value();
    const Channel::Stats before = ch->stats();
    const uint64_t server_packs = s.packs_sent();
    check_outcomes(burst_after_one(*ch, 32));
    const Channel::Stats after = ch->stats();
    const uint64_t packs = after.packs_sent - before.packs_sent;
    CHECK(after.packed_requests - before.packed_requests == 32);
    // The first call went alone; then one frame per PACK.
    CHECK(after.work_requests - before.work_requests == 1 + packs);
    if (every == 16) {
      CHECK(packs == 2);
      CHECK(s.packs_sent() - server_packs >= 2);  // replies leave 16 at a time too
    } else {
      CHECK(packs == 1);
    }
  }
}

TEST_CASE("packing: never toward a peer that did not announce it") {
  SUBCASE("a server with packing off: the client sends every request alone") {
    PackServer s(tcp_config(0));
    auto ch = Channel::connect(s.address(), tcp_config()).value();
    // A PACK would close the session (the server refuses what it did not
    // announce) and fail these calls.
    check_outcomes(burst_after_one(*ch, 12));
    CHECK(ch->stats().packs_sent == 0);
    CHECK(ch->stats().packs_received == 0);
    CHECK_FALSE(ch->stats().closed);
  }
  SUBCASE("a client with packing off: the server sends every reply alone") {
    PackServer s(tcp_config());
    auto ch = Channel::connect(s.address(), tcp_config(0)).value();
    check_outcomes(burst_after_one(*ch, 12));
    CHECK(ch->stats().packs_received == 0);
    CHECK(ch->stats().packs_sent == 0);
    CHECK(s.packs_sent() == 0);
    CHECK_FALSE(ch->stats().closed);
  }
  SUBCASE("a raw client: PACKs only once its Hello offers them") {
    PackServer s(tcp_config());
    // Offered: eight requests read in one turn are answered in one turn,
    // so a few bursts show PACKs (and every reply intact inside them).
    {
      Fd fd(raw_connect(s.server.port(), 64, 65536, core::kFeaturePack));
      size_t packs = 0;
      for (uint32_t g = 1; g <= 20 && packs == 0; ++g) burst_raw(fd.fd, 8, g, &packs);
      CHECK(packs >= 1);
    }
    // Not offered (a client predating the field): never a PACK.
    {
      Fd fd(raw_connect(s.server.port()));
      size_t packs = 0;
      for (uint32_t g = 1; g <= 20; ++g) CHECK(burst_raw(fd.fd, 8, g, &packs) == 0);
      CHECK(packs == 0);
    }
  }
}

TEST_CASE("packing: a bad PACK closes its session and nothing else") {
  PackServer s(tcp_config());
  auto bystander = Channel::connect(s.address(), tcp_config()).value();
  auto still_serving = [&] {
    auto r = slotrpc::raw::call(*bystander, kEcho, ping(42)).get();
    REQUIRE(r.ok());
  };

  SUBCASE("a well-formed PACK is served") {
    Fd fd(raw_connect(s.server.port(), 64, 65536, core::kFeaturePack));
    send_bytes(fd.fd, pack_frame({4, 9, 2}));
    // Three replies, alone or packed (this client offered PACK).
    uint32_t replies = 0;
    while (replies < 3) {
      const Frame f = read_slot_frame(fd.fd);
      const core::Header h = core::decode_header(f.body.data());
      REQUIRE((h.kind() == core::Kind::kReply || h.kind() == core::Kind::kPack));
      replies += h.kind() == core::Kind::kPack ? h.method_id : 1;
    }
    CHECK(replies == 3);
  }
  SUBCASE("two messages for one slot") {
    Fd fd(raw_connect(s.server.port(), 64, 65536, core::kFeaturePack));
    send_bytes(fd.fd, pack_frame({4, 9}, [](std::vector<std::byte>& b) {
      // The second message's slot (at offset 32 + padded first) becomes 4.
      const core::Header first = core::decode_header(b.data() + core::kHeaderSize);
      const uint32_t at = core::kHeaderSize + core::pack_padded(core::kHeaderSize + first.payload_len);
      core::Header h = core::decode_header(b.data() + at);
      h.slot = 4;
      core::encode_header(h, b.data() + at);
    }));
    CHECK(closed_by_peer(fd.fd, 5000ms));
  }
  SUBCASE("an inner length past the pack") {
    Fd fd(raw_connect(s.server.port(), 64, 65536, core::kFeaturePack));
    send_bytes(fd.fd, pack_frame({4, 9}, [](std::vector<std::byte>& b) {
      core::Header h = core::decode_header(b.data() + core::kHeaderSize);
      h.payload_len += 4096;
      core::encode_header(h, b.data() + core::kHeaderSize);
    }));
    CHECK(closed_by_peer(fd.fd, 5000ms));
  }
  SUBCASE("a PACK to a server that did not announce packing") {
    PackServer off(tcp_config(0));
    Fd fd(raw_connect(off.server.port(), 64, 65536, core::kFeaturePack));
    send_bytes(fd.fd, pack_frame({1, 2}));
    CHECK(closed_by_peer(fd.fd, 5000ms));
  }
  SUBCASE("a PACK naming a slot whose handler still runs") {
    g_slow_seq = -1;
    Fd fd(raw_connect(s.server.port(), 64, 65536, core::kFeaturePack));
    send_bytes(fd.fd, request_frame(kSlow, 1, 3, 1, 1000));
    // Slot 3 is busy; a PACK carried by slot 5 names it (with seq 3).
    // Copying it there would overwrite the request the handler reads in
    // place: the handler must still read its own seq, 1.
    send_bytes(fd.fd, pack_frame({5, 3}));
    CHECK(closed_by_peer(fd.fd, 5000ms));
    REQUIRE(wait_until([] { return g_slow_seq.load() != -1; }));
    CHECK(g_slow_seq.load() == 1);
  }
  still_serving();
}
