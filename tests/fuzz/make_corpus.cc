// Writes the seed corpora of the fuzz targets: small valid and near-valid
// inputs built with the library's own encoders, so they follow the wire
// format as it is.  Rerun after a protocol change and commit the result:
//
//   build/tests/fuzz/fuzz_make_corpus tests/fuzz/corpus
//
// Each file's name says what it is.  Existing files of the same name are
// overwritten; others are left alone.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/handshake.h"
#include "core/pack.h"
#include "core/wire_format.h"
#include "echo_generated.h"
#include "slotrpc/service.h"
#include "test_messages_generated.h"
#include "transport/verbs/verbs_transport.h"
#include "types_generated.h"

namespace {

using namespace slotrpc;
using namespace slotrpc::core;
namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

fs::path out_root;
int written = 0;

void write(const std::string& target, const std::string& name, const Bytes& b) {
  const fs::path dir = out_root / target;
  fs::create_directories(dir);
  std::ofstream f(dir / name, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  if (!f) {
    std::fprintf(stderr, "fuzz_make_corpus: cannot write %s\n", (dir / name).c_str());
    std::exit(1);
  }
  ++written;
}

void put(Bytes& b, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

Bytes header_bytes(const Header& h) {
  Bytes b(kHeaderSize);
  encode_header(h, reinterpret_cast<std::byte*>(b.data()));
  return b;
}

Header make(Kind kind, uint16_t slot = 0, uint32_t generation = 1, uint64_t request_id = 1) {
  Header h;
  h.flags = static_cast<uint8_t>(kind);
  h.slot = slot;
  h.generation = generation;
  h.request_id = request_id;
  return h;
}

// ---------------------------------------------------------------- header

void header_corpus() {
  const Kind kinds[] = {Kind::kRequest, Kind::kReply,  Kind::kError,         Kind::kCancel,
                        Kind::kPing,    Kind::kPong,   Kind::kStreamMessage, Kind::kStreamGrant};
  for (Kind k : kinds) {
    Header h = make(k, 3, 7, 42);
    h.payload_len = k == Kind::kRequest || k == Kind::kReply ? 100 : 0;
    if (k == Kind::kError) h.status = 13;
    write("header", "kind" + std::to_string(static_cast<int>(k)), header_bytes(h));
  }
  Header stream = make(Kind::kRequest);
  stream.flags |= kFlagServerStream;
  stream.method_id = method_id("slotrpc.test.Fuzz.Stream");
  write("header", "request_server_stream", header_bytes(stream));
  // With the receiver's view appended: received, slot_count, slot_size, placed.
  auto with_ring = [](Header h, uint32_t received, uint32_t count, uint32_t size, uint16_t placed) {
    Bytes b = header_bytes(h);
    put(b, received, 4);
    put(b, count, 4);
    put(b, size, 4);
    put(b, placed, 2);
    return b;
  };
  Header req = make(Kind::kRequest, 2);
  req.payload_len = 224;
  write("header", "ring_ok", with_ring(req, 256, 4, 256, 2));
  write("header", "ring_too_short", with_ring(req, 31, 4, 256, 2));
  write("header", "ring_length_mismatch", with_ring(req, 255, 4, 256, 2));
  write("header", "ring_exceeds_slot", with_ring(req, 256, 4, 255, 2));
  write("header", "ring_bad_slot", with_ring(req, 256, 2, 256, 2));
  write("header", "ring_slot_mismatch", with_ring(req, 256, 4, 256, 1));
  Header huge = req;
  huge.payload_len = 0xffffffe0u;  // 32 + len wraps in 32 bits
  write("header", "ring_length_wraps", with_ring(huge, 0, 4, 0xffffffffu, 2));
  Header bad = req;
  bad.magic = 0x5352;
  write("header", "bad_magic", header_bytes(bad));
  bad = req;
  bad.version = 2;
  write("header", "bad_version", header_bytes(bad));
  bad = req;
  bad.flags = 9;
  write("header", "bad_kind", header_bytes(bad));
  bad = make(Kind::kReply);
  bad.flags |= kFlagServerStream;
  write("header", "stream_flag_on_reply", header_bytes(bad));
  bad = req;
  bad.flags |= 0x20;
  write("header", "undefined_flag", header_bytes(bad));
}

// ------------------------------------------------------------- handshake

void handshake_corpus() {
  Bytes b(kHelloSize);
  Hello hello;
  hello.slot_count = 64;
  hello.slot_size = 65536;
  encode_hello(hello, reinterpret_cast<std::byte*>(b.data()));
  write("handshake", "hello_tcp", b);
  hello.transport = WireTransport::kVerbs;
  hello.extension_len = transport::verbs::kQpInfoSize;
  encode_hello(hello, reinterpret_cast<std::byte*>(b.data()));
  write("handshake", "hello_verbs", b);
  hello.extension_len = kMaxHandshakeExtension + 1;
  encode_hello(hello, reinterpret_cast<std::byte*>(b.data()));
  write("handshake", "hello_extension_too_long", b);

  HelloReply reply;
  reply.slot_count = 64;
  reply.slot_size = 65536;
  encode_hello_reply(reply, reinterpret_cast<std::byte*>(b.data()));
  write("handshake", "reply_tcp", b);
  reply.transport = WireTransport::kVerbs;
  reply.extension_len = transport::verbs::kQpInfoSize;
  encode_hello_reply(reply, reinterpret_cast<std::byte*>(b.data()));
  write("handshake", "reply_verbs", b);
  reply = HelloReply{};
  reply.status = static_cast<uint16_t>(StatusCode::kResourceExhausted);
  reply.message_len = 80;
  encode_hello_reply(reply, reinterpret_cast<std::byte*>(b.data()));
  write("handshake", "reply_refused", b);
  b[24] = 0;  // a server predating the transport field
  write("handshake", "reply_no_transport_field", b);

  transport::verbs::QpInfo q;
  q.qpn = 0x11;
  q.psn = 0xabcdef;
  q.gid.raw[10] = 0xff;
  q.gid.raw[11] = 0xff;
  q.gid.raw[12] = 10;
  q.gid.raw[15] = 1;
  q.mtu = 3;
  q.link_layer = 2;
  q.ring_addr = 0x7f0000001000;
  q.ring_rkey = 0x1234;
  q.slot_count = 64;
  q.slot_size = 65536;
  Bytes ext(transport::verbs::kQpInfoSize);
  transport::verbs::encode_qp_info(q, reinterpret_cast<std::byte*>(ext.data()));
  write("handshake", "qp_info", ext);
  Bytes longer = ext;
  longer.push_back(0);
  write("handshake", "qp_info_65_bytes", longer);
  Bytes bad_mtu = ext;
  bad_mtu[6] = 6;
  write("handshake", "qp_info_bad_mtu", bad_mtu);
}

// ---------------------------------------------------------- tcp_session

struct Stream {
  uint8_t slot_count_code = 3;  // 4 slots
  uint8_t slot_size_code = 4;   // 512 bytes
  std::vector<uint8_t> cuts;    // chunk sizes - 1
  Bytes bytes;
  size_t cut_at = 0;

  // Ends a chunk here (the reactor runs a turn before the next is written).
  void cut() {
    while (bytes.size() - cut_at > 0) {
      const size_t n = std::min<size_t>(bytes.size() - cut_at, 256);
      cuts.push_back(static_cast<uint8_t>(n - 1));
      cut_at += n;
    }
  }

  void frame(bool control, uint32_t imm, const Bytes& body) {
    put(bytes, body.size() | (control ? 0x80000000u : 0u), 4);
    put(bytes, imm, 4);
    bytes.insert(bytes.end(), body.begin(), body.end());
  }
  void request(uint16_t slot, uint32_t generation, uint64_t rid, uint32_t method,
               const Bytes& payload, bool stream = false) {
    Header h = make(Kind::kRequest, slot, generation, rid);
    if (stream) h.flags |= kFlagServerStream;
    h.method_id = method;
    h.payload_len = static_cast<uint32_t>(payload.size());
    Bytes body = header_bytes(h);
    body.insert(body.end(), payload.begin(), payload.end());
    frame(false, make_imm(slot, generation), body);
  }
  // A PUSH_DATA frame (docs/protocol.md, "TCP pushes") with `length`
  // bytes of data.
  void push(uint32_t rkey, uint32_t status, uint64_t total, uint64_t addr, uint64_t length) {
    put(bytes, 0xC0000005u, 4);
    put(bytes, 0, 4);
    put(bytes, rkey, 4);
    put(bytes, status, 4);
    put(bytes, total, 8);
    put(bytes, addr, 8);
    put(bytes, length, 8);
    bytes.insert(bytes.end(), length, 0x5c);
  }
  void control(Kind kind, uint16_t slot, uint32_t generation, uint64_t rid, uint32_t method = 0) {
    Header h = make(kind, slot, generation, rid);
    h.method_id = method;
    frame(true, 0, header_bytes(h));
  }
  Bytes input() const {
    Bytes b{slot_count_code, slot_size_code, static_cast<uint8_t>(cuts.size())};
    b.insert(b.end(), cuts.begin(), cuts.end());
    b.insert(b.end(), bytes.begin(), bytes.end());
    return b;
  }
};

Bytes fb(flatbuffers::FlatBufferBuilder& fbb) {
  return Bytes(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
}
Bytes echo_request(uint64_t seq, size_t n) {
  flatbuffers::FlatBufferBuilder fbb;
  Bytes payload(n);
  for (size_t i = 0; i < n; ++i) payload[i] = static_cast<uint8_t>(i * 7);
  fbb.Finish(examples::CreateEchoRequest(fbb, seq, fbb.CreateVector(payload)));
  return fb(fbb);
}
Bytes ping(uint64_t seq, const char* text = "hi") {
  flatbuffers::FlatBufferBuilder fbb;
  fbb.Finish(test::CreatePing(fbb, seq, fbb.CreateString(text)));
  return fb(fbb);
}

const uint32_t kEcho = method_id("slotrpc.examples.Echo.Echo");
uint32_t fuzz_method(const char* name) { return method_id(std::string("slotrpc.test.Fuzz.") + name); }

void tcp_session_corpus() {
  {
    Stream s;
    s.request(0, 1, 1, kEcho, echo_request(1, 16));
    write("tcp_session", "echo_one", s.input());
    s.cuts = {3, 0, 5, 30};  // prefix split, then the header, then the payload
    write("tcp_session", "echo_one_split", s.input());
  }
  {
    Stream s;
    for (uint16_t slot = 0; slot < 4; ++slot) s.request(slot, 1, slot + 1, kEcho, echo_request(slot, 40));
    s.cuts = {7, 7, 60, 1, 100, 2};
    for (uint8_t c : s.cuts) s.cut_at += c + 1u;
    s.cut();
    s.request(0, 2, 5, kEcho, echo_request(5, 8));  // slot 0 again, once its reply went out
    write("tcp_session", "echo_all_slots", s.input());
  }
  {
    Stream s;
    s.control(Kind::kPing, 0, 0, 9);
    s.request(1, 1, 1, fuzz_method("Fail"), ping(13));
    s.request(2, 1, 2, fuzz_method("Big"), ping(1000));
    s.request(3, 1, 3, fuzz_method("Throw"), ping(0));
    s.control(Kind::kPong, 0, 0, 0);
    write("tcp_session", "ping_fail_big_throw", s.input());
  }
  {
    Stream s;
    s.request(0, 1, 1, fuzz_method("Raw"), Bytes{2, 3, 4});
    s.request(1, 1, 2, fuzz_method("Raw"), Bytes{1});
    s.request(2, 1, 3, 0x12345678, Bytes{});               // unknown method
    s.request(3, 1, 4, kEcho, Bytes{1, 2, 3, 4, 5, 6, 7, 8});  // fails verification
    write("tcp_session", "raw_unknown_unverified", s.input());
  }
  {
    Stream s;  // a push behind a request that does not read it: parked, dropped
    s.request(0, 1, 1, kEcho, echo_request(1, 16));
    s.push(1, 0, 600, 0, 300);
    s.cut();
    s.push(1, 0, 600, 300, 300);
    s.request(1, 1, 2, kEcho, echo_request(2, 16));
    s.push(2, 0, 100, 0, 50);
    s.push(2, 14, 100, 50, 0);  // ended early by its owner
    write("tcp_session", "push_dropped", s.input());
    Stream b;  // frames out of order: the session closes
    b.push(3, 0, 800, 0, 400);
    b.cut();
    b.push(3, 0, 800, 0, 400);
    write("tcp_session", "push_out_of_order", b.input());
  }
  {
    Stream s;  // a server stream of 3 messages into slots 1..3, lent by grants
    s.request(0, 1, 1, fuzz_method("Stream"), ping(3), true);
    s.cut();
    for (uint16_t slot = 1; slot < 4; ++slot) {
      s.control(Kind::kStreamGrant, slot, 1, 1, 0);
      s.cut();
    }
    write("tcp_session", "stream_grants", s.input());
    Stream c;  // cancelled after one message; a grant of a slot in use
    c.request(0, 1, 1, fuzz_method("Stream"), ping(5), true);
    c.cut();
    c.control(Kind::kStreamGrant, 1, 1, 1, 0);
    c.cut();
    c.control(Kind::kCancel, 0, 1, 1);
    c.cut();
    c.control(Kind::kStreamGrant, 2, 1, 1, 0);
    c.control(Kind::kStreamGrant, 0, 1, 1, 1);  // lends the call's own slot: protocol error
    write("tcp_session", "stream_cancel", c.input());
  }
  {
    Stream s;
    s.request(0, 1, 1, fuzz_method("Stream"), ping(2), false);  // a stream called as unary
    s.request(1, 1, 2, kEcho, echo_request(1, 1), true);        // and the reverse
    s.control(Kind::kCancel, 1, 1, 2);
    write("tcp_session", "stream_kind_mismatch", s.input());
  }
  {
    Stream s;  // protocol errors: each closes the session
    s.request(0, 1, 1, kEcho, echo_request(1, 1));
    s.request(0, 1, 2, kEcho, echo_request(2, 1));  // slot 0 still busy or not armed
    write("tcp_session", "slot_reuse", s.input());
    Stream t;
    Header h = make(Kind::kReply, 0, 1, 1);
    t.frame(false, make_imm(0, 1), header_bytes(h));
    write("tcp_session", "reply_to_server", t.input());
    Stream u;
    u.request(0, 7, 1, kEcho, echo_request(1, 1));
    u.bytes[4 + 2] = 8;  // the immediate's generation disagrees with the header's
    write("tcp_session", "stale_generation", u.input());
    Stream v;
    v.request(5, 1, 1, kEcho, echo_request(1, 1));  // slot outside a 4-slot ring
    write("tcp_session", "slot_outside_ring", v.input());
    Stream w;
    w.request(0, 1, 1, kEcho, echo_request(1, 1));
    w.bytes.resize(w.bytes.size() - 10);  // a frame that never completes
    write("tcp_session", "truncated", w.input());
    Stream x;
    x.frame(true, 0, Bytes(16, 0));  // short control frame
    write("tcp_session", "short_control", x.input());
  }
}

// -------------------------------------------------------- method_verify

void method_verify_corpus() {
  // Byte 0 picks the method in the table's registration order: 0 Echo,
  // 1 TypesEcho.Mirror, 2 Fuzz.Ping; 3 is "the id in bytes 1..5".
  auto with = [](uint8_t pick, Bytes payload) {
    payload.insert(payload.begin(), pick);
    return payload;
  };
  write("method_verify", "echo", with(0, echo_request(7, 24)));
  write("method_verify", "echo_empty", with(0, Bytes{}));
  Bytes cut = echo_request(7, 24);
  cut.resize(cut.size() - 5);
  write("method_verify", "echo_truncated", with(0, cut));
  write("method_verify", "ping", with(2, ping(3, "text")));

  namespace t = cgtest::types::v1;
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<flatbuffers::Offset<flatbuffers::String>> strings = {fbb.CreateString("a"),
                                                                    fbb.CreateString("bc")};
  std::vector<flatbuffers::Offset<t::Inner>> inners = {t::CreateInner(fbb, fbb.CreateString("x"), 1),
                                                       t::CreateInner(fbb, 0, 2)};
  std::vector<t::Vec3> vecs = {t::Vec3(1, 2, 3), t::Vec3(4, 5, 6)};
  std::vector<int8_t> colors = {t::Color_Red, t::Color_Blue};
  t::Vec3 v(1, 2, 3);
  t::Pair p(9, t::Vec3(7, 8, 9));
  auto all = t::CreateAllKinds(
      fbb, true, -1, 2, -3, 4, -5, 6, -7, 8, 1.5f, 2.5, fbb.CreateString("all"),
      fbb.CreateVector(std::vector<int32_t>{1, 2, 3}), fbb.CreateVector(std::vector<double>{0.5}),
      fbb.CreateVector(std::vector<uint8_t>{9, 8}), fbb.CreateVector(strings),
      fbb.CreateVector(inners), &v, &p, fbb.CreateVectorOfStructs(vecs), t::Color_Blue,
      fbb.CreateVector(colors), t::Shape_Circle, t::CreateCircle(fbb, 2.0f).Union(),
      t::CreateInner(fbb, fbb.CreateString("inner"), 3));
  fbb.Finish(all);
  write("method_verify", "all_kinds", with(1, fb(fbb)));
  Bytes unknown = {3};
  put(unknown, kEcho ^ 1, 4);
  write("method_verify", "unknown_id", unknown);
  Bytes known = {3};
  put(known, kEcho, 4);
  Bytes req = echo_request(1, 4);
  known.insert(known.end(), req.begin(), req.end());
  write("method_verify", "echo_by_id", known);
}

}  // namespace

// PACKs (fuzz_pack.cc): byte 0 is the mode (bit 0: server sends, bit 1:
// round trip), then a slot as received, or the round trip's messages.
void pack_corpus() {
  constexpr uint32_t kSlots = 16, kSlotSize = 4096;
  auto pack_of = [&](bool server, std::vector<std::pair<uint16_t, uint32_t>> msgs) {
    std::vector<std::byte> ring(size_t{kSlots} * kSlotSize);
    std::vector<PackPiece> pieces;
    uint32_t gen = 5;
    for (auto [slot, len] : msgs) {
      Header h;
      h.flags = static_cast<uint8_t>(server ? Kind::kReply : Kind::kRequest);
      h.method_id = 1;
      h.request_id = slot + 100;
      h.payload_len = len;
      h.slot = slot;
      h.generation = gen++;
      std::byte* msg = ring.data() + size_t{slot} * kSlotSize + kSlotSize - kHeaderSize - len;
      encode_header(h, msg);
      for (uint32_t k = 0; k < len; ++k) msg[kHeaderSize + k] = static_cast<std::byte>(k);
      pieces.push_back(PackPiece{msg, static_cast<uint32_t>(kHeaderSize + len)});
    }
    const PackOut out = write_pack(ring.data(), kSlotSize, msgs[0].first, pieces);
    Bytes b{static_cast<uint8_t>(server ? 1 : 0)};
    const auto* p = reinterpret_cast<const uint8_t*>(out.data);
    b.insert(b.end(), p, p + out.length);
    return b;
  };
  write("pack", "client-two-requests", pack_of(false, {{3, 12}, {7, 20}}));
  write("pack", "server-three-replies", pack_of(true, {{0, 0}, {1, 5}, {15, 64}}));
  Bytes bad = pack_of(false, {{2, 8}, {2, 8}});
  write("pack", "bad-duplicate-slot", bad);
  write("pack", "round-trip-client", Bytes{2, 3, 4, 1, 2, 3, 4, 9, 0, 12, 2, 7, 7});
  write("pack", "round-trip-server", Bytes{3, 0, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 5, 3, 1, 2, 3});
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_make_corpus DIR   (writes DIR/<target>/...)\n");
    return 2;
  }
  out_root = argv[1];
  header_corpus();
  handshake_corpus();
  tcp_session_corpus();
  method_verify_corpus();
  pack_corpus();
  std::printf("wrote %d files under %s\n", written, out_root.c_str());
  return 0;
}
