// TCP pushes (PUSH_DATA, docs/protocol.md "TCP bulk frames", docs/design.md
// "TCP: pushes"): a range the owner offers for reading follows its request
// unasked.  On TcpLinks over loopback (tcp_world.h): the reader's read()
// claims a parked push and gets every byte with no READ_REQ; a push nobody
// claims in time is dropped and the read asks as usual; a revoke in the
// middle ends the claimed read; a side that did not announce pushes, and
// every malformed PUSH_DATA, fails that link only.  End to end (Channel,
// Server): a send_bulk segment of at most tcp_bulk_push costs the server
// no READ_REQ; a handler that reads late still gets every byte; a server
// or client with pushes off sees none.
#include <sys/socket.h>

// First: its inline code names transport::MemoryRegion unqualified, which
// slotrpc::MemoryRegion (slotrpc.h) would make ambiguous.
#include "tcp_world.h"

#include <slotrpc/fiber.h>
#include <slotrpc/slotrpc.h>

namespace {

using namespace tcp_world;

constexpr uint32_t kMiB = 1024 * 1024;

// owner (on a) pushes to reader (on b).
struct PushPair {
  World w;
  End* owner = nullptr;
  End* reader = nullptr;
  explicit PushPair(uint64_t limit = kMiB, bool accept = true, bool small_buffers = false) {
    std::tie(owner, reader) = w.connect(small_buffers);
    owner->link->set_push_limit(limit);
    reader->link->accept_pushes(accept);
  }
  // The "request": a slot frame posted after the exposure, as a call does.
  void post_request(uint16_t slot) {
    reader->link->arm(slot);
    msg.assign(64, std::byte{0x42});
    Outgoing o{msg.data(), 64, core::make_imm(slot, 1), Delivery::kSlot};
    owner->link->post({&o, 1});
  }
  // A range of `size` bytes (pattern `seed`) exposed for reading by the
  // owner, its request posted, and the push parked at the reader; dst has
  // `size + dst_extra` bytes of 0x77.
  struct Offer {
    std::vector<std::byte> src, dst;
    BulkRegistration dreg;
    RemoteSegment seg;
  };
  std::unique_ptr<Offer> offer(size_t size, uint32_t seed, size_t dst_extra = 0) {
    auto o = std::make_unique<Offer>();
    o->src = pattern(size, seed);
    o->dst.assign(size + dst_extra, std::byte{0x77});
    BulkRegistration sreg = reg(*owner->link, o->src);
    o->dreg = reg(*reader->link, o->dst);
    auto seg = owner->link->expose(sreg, 0, size, BulkAccess::kRemoteRead);
    REQUIRE(seg.ok());
    o->seg = seg.value();
    post_request(1);
    REQUIRE(w.pump_until([&] { return reader->link->push_parked() || reader->down(); }));
    return o;
  }
  size_t messages(const End& e) const {
    return static_cast<size_t>(std::count_if(e.got.begin(), e.got.end(),
                                             [](const Completion& c) { return c.kind == CKind::kMessage; }));
  }
  std::vector<std::byte> msg;
};

TEST_CASE("a pushed range follows its request and goes straight into the read that claims it") {
  for (const size_t size : {size_t{100}, size_t{256} * 1024 + 3, size_t{kMiB}}) {
    CAPTURE(size);
    PushPair p;
    auto o = p.offer(size, 11, 64);
    const std::vector<std::byte>& src = o->src;
    const std::vector<std::byte>& dst = o->dst;
    // The request arrived, and the push's first frame waits behind it.
    REQUIRE(p.messages(*p.reader) == 1);
    REQUIRE(p.reader->link->read(o->dreg, 32, o->seg, 0, size, 7).ok());
    CHECK_FALSE(p.reader->link->push_parked());
    REQUIRE(p.w.pump_until([&] { return p.reader->find(CKind::kBulkDone, 7) || p.reader->down(); }));
    ok_done(*p.reader, 7);
    std::vector<std::byte> mid(dst.begin() + 32, dst.begin() + 32 + static_cast<ptrdiff_t>(size));
    check_equal(mid, src);
    CHECK(std::all_of(dst.begin(), dst.begin() + 32, [](std::byte b) { return b == std::byte{0x77}; }));
    CHECK(std::all_of(dst.begin() + 32 + static_cast<ptrdiff_t>(size), dst.end(),
                      [](std::byte b) { return b == std::byte{0x77}; }));
    // No READ_REQ: the reader asked for nothing.
    CHECK(p.reader->link->stats().bulk_requests == 0);
    CHECK(p.owner->link->push_counts().sent == 1);
    CHECK(p.owner->link->stats().bulk_pushes == 1);
    CHECK(p.reader->link->push_counts().claimed == 1);
    CHECK(p.reader->link->push_counts().dropped == 0);
    CHECK(p.owner->link->revoke(o->seg, 8));
    CHECK_FALSE(p.owner->down());
    CHECK(p.owner->link->bulk_serving() == 0);
  }
}

TEST_CASE("a push nobody claims is dropped after a turn; the read then asks for the range as usual") {
  SUBCASE("no read in time") {
    PushPair p;
    const size_t size = 300000;
    auto o = p.offer(size, 12);
    // The handler did not read before the loop went round: dropped, and
    // reading goes on (a second request behind the push arrives).
    p.post_request(2);
    REQUIRE(p.w.pump_until([&] { return p.messages(*p.reader) == 2 || p.reader->down(); }));
    CHECK(p.reader->link->push_counts().dropped == 1);
    CHECK(p.reader->link->stats().bulk_pushes_dropped == 1);
    CHECK(p.reader->link->push_counts().claimed == 0);
    REQUIRE(p.reader->link->read(o->dreg, 0, o->seg, 0, size, 7).ok());
    REQUIRE(p.w.pump_until([&] { return p.reader->find(CKind::kBulkDone, 7) || p.reader->down(); }));
    ok_done(*p.reader, 7);
    check_equal(o->dst, o->src);
    CHECK(p.reader->link->stats().bulk_requests == 1);  // the READ_REQ
  }
  SUBCASE("a read of part of the range does not claim it") {
    PushPair p;
    const size_t size = 200000;
    auto o = p.offer(size, 13);
    REQUIRE(p.reader->link->read(o->dreg, 1000, o->seg, 1000, size - 1000, 7).ok());
    CHECK(p.reader->link->push_parked());
    REQUIRE(p.w.pump_until([&] { return p.reader->find(CKind::kBulkDone, 7) || p.reader->down(); }));
    ok_done(*p.reader, 7);
    std::vector<std::byte> want(o->src.begin() + 1000, o->src.end()), got(o->dst.begin() + 1000, o->dst.end());
    check_equal(got, want);
    CHECK(p.reader->link->push_counts().dropped == 1);
    CHECK_FALSE(p.reader->down());
  }
}

TEST_CASE("a push read in pieces from its first byte goes straight into each piece's read") {
  // Pieces that end inside a frame (10000, 4097) and on frame boundaries
  // (65536: the frames are one 64 KiB slice at first); each read issued
  // once the one before is done, as a handler reading page by page does.
  for (const size_t piece : {size_t{10000}, size_t{65536}, size_t{4097}}) {
    CAPTURE(piece);
    PushPair p;
    const size_t size = 300000;
    auto o = p.offer(size, 14);
    uint64_t token = 10, pieces = 0;
    for (size_t at = 0; at < size; at += piece, ++token, ++pieces) {
      const size_t n = std::min(piece, size - at);
      REQUIRE(p.reader->link->read(o->dreg, at, o->seg, at, n, token).ok());
      REQUIRE(p.w.pump_until([&] { return p.reader->find(CKind::kBulkDone, token) || p.reader->down(); }));
      ok_done(*p.reader, token);
    }
    check_equal(o->dst, o->src);
    CHECK(p.reader->link->stats().bulk_requests == 0);  // no READ_REQ
    CHECK(p.reader->link->push_counts().claimed == pieces);
    CHECK(p.reader->link->push_counts().dropped == 0);
    CHECK_FALSE(p.reader->link->push_parked());
    CHECK(p.owner->link->revoke(o->seg, 99));
    CHECK_FALSE(p.reader->down());
    CHECK_FALSE(p.owner->down());
  }
}

TEST_CASE("a push whose next piece nobody reads in time is dropped there; the rest is asked for as usual") {
  for (const size_t first : {size_t{10000}, size_t{65536}}) {
    CAPTURE(first);
    PushPair p;
    const size_t size = 300000;
    auto o = p.offer(size, 15);
    REQUIRE(p.reader->link->read(o->dreg, 0, o->seg, 0, first, 7).ok());
    REQUIRE(p.w.pump_until([&] { return p.reader->find(CKind::kBulkDone, 7) || p.reader->down(); }));
    ok_done(*p.reader, 7);
    // The handler does something else; a second request arrives behind
    // the push, so the push was dropped (parsing went on).
    p.post_request(2);
    REQUIRE(p.w.pump_until([&] { return p.messages(*p.reader) == 2 || p.reader->down(); }));
    CHECK(p.reader->link->push_counts().dropped == 1);
    // A read of the next piece now, from where the first ended: asked for.
    REQUIRE(p.reader->link->read(o->dreg, first, o->seg, first, size - first, 8).ok());
    REQUIRE(p.w.pump_until([&] { return p.reader->find(CKind::kBulkDone, 8) || p.reader->down(); }));
    ok_done(*p.reader, 8);
    check_equal(o->dst, o->src);
    CHECK(p.reader->link->stats().bulk_requests == 1);
    CHECK(p.reader->link->push_counts().claimed == 1);
    CHECK_FALSE(p.reader->down());
  }
}

TEST_CASE("which ranges are pushed: read ranges up to the limit, after the next slot frame") {
  PushPair p(64 * 1024);
  std::vector<std::byte> mem = pattern(256 * 1024, 14);
  BulkRegistration sreg = reg(*p.owner->link, mem);
  auto big = p.owner->link->expose(sreg, 0, 64 * 1024 + 1, BulkAccess::kRemoteRead);
  auto write_only = p.owner->link->expose(sreg, 0, 4096, BulkAccess::kRemoteWrite);
  auto revoked = p.owner->link->expose(sreg, 0, 4096, BulkAccess::kRemoteRead);
  REQUIRE((big.ok() && write_only.ok() && revoked.ok()));
  CHECK(p.owner->link->revoke(revoked.value(), 1));
  auto pushed = p.owner->link->expose(sreg, 8192, 64 * 1024, BulkAccess::kRemoteRead);
  REQUIRE(pushed.ok());
  // Nothing goes before the request.
  p.w.poll_one(p.w.a);
  p.w.poll_one(p.w.b);
  CHECK(p.owner->link->push_counts().sent == 0);
  CHECK(p.owner->link->bulk_serving() == 0);
  p.post_request(1);
  CHECK(p.owner->link->push_counts().sent == 1);
  REQUIRE(p.w.pump_until([&] { return p.reader->link->push_parked() || p.reader->down(); }));
  // A link whose peer did not announce pushes (limit 0) sends none.
  PushPair off(0);
  std::vector<std::byte> m2 = pattern(4096, 15);
  BulkRegistration r2 = reg(*off.owner->link, m2);
  REQUIRE(off.owner->link->expose(r2, 0, 4096, BulkAccess::kRemoteRead).ok());
  off.post_request(1);
  CHECK(off.owner->link->push_counts().sent == 0);
}

TEST_CASE("revoke during a claimed push: the read fails with UNAVAILABLE, the link goes on") {
  // 64 KiB socket buffers: the 4 MiB push cannot be in the kernel yet.
  PushPair p(4 * kMiB, true, /*small_buffers=*/true);
  const size_t size = 4 * kMiB;
  auto o = p.offer(size, 16);
  REQUIRE(p.reader->link->read(o->dreg, 0, o->seg, 0, size, 7).ok());
  if (!p.owner->link->revoke(o->seg, 8))
    REQUIRE(p.w.pump_until([&] { return p.owner->find(CKind::kBulkDone, 8) || p.owner->down(); }));
  REQUIRE(p.w.pump_until([&] { return p.reader->find(CKind::kBulkDone, 7) || p.reader->down(); }));
  const Completion* d = p.reader->find(CKind::kBulkDone, 7);
  REQUIRE(d != nullptr);
  CHECK(d->bulk_status == static_cast<uint16_t>(StatusCode::kUnavailable));
  CHECK_FALSE(p.owner->down());
  CHECK_FALSE(p.reader->down());
  CHECK(p.owner->link->bulk_serving() == 0);
  p.post_request(2);
  REQUIRE(p.w.pump_until([&] { return p.messages(*p.reader) == 2 || p.reader->down(); }));
  CHECK_FALSE(p.reader->down());
}

// ---- hostile PUSH_DATA, written raw into a socket whose other end is a link

struct Raw {
  TcpTransport t;
  End end;
  int fd = -1;
  explicit Raw(bool accept = true) {
    auto [c, s] = loopback_pair();
    fd = c;
    end.start(t, s, "reader");
    end.link->accept_pushes(accept);
  }
  ~Raw() { ::close(fd); }
  void push(uint32_t rkey, uint32_t status, uint64_t total, uint64_t addr, uint64_t length,
            size_t data_bytes) {
    std::vector<std::byte> f(8 + 32 + data_bytes, std::byte{0x5c});
    auto put = [&](size_t at, uint64_t v, int n) {
      for (int i = 0; i < n; ++i) f[at + static_cast<size_t>(i)] = static_cast<std::byte>(v >> (8 * i));
    };
    put(0, TcpTransport::kBulkMarker | TcpTransport::kBulkPushData, 4);
    put(4, 0, 4);
    put(8, rkey, 4);
    put(12, status, 4);
    put(16, total, 8);
    put(24, addr, 8);
    put(32, length, 8);
    REQUIRE(::send(fd, f.data(), f.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(f.size()));
  }
  // Polls until the link is down; its reason must contain `part`.
  void expect_down(const char* part) {
    const auto deadline = Clock::now() + kTimeout;
    while (!end.down() && Clock::now() < deadline) {
      std::array<Completion, 16> buf;
      const size_t n = t.poll(buf);
      for (size_t i = 0; i < n; ++i) end.got.push_back(buf[i]);
    }
    REQUIRE(end.down());
    CHECK_MESSAGE(end.link->down_reason().find(part) != std::string::npos, end.link->down_reason());
  }
};

TEST_CASE("malformed PUSH_DATA, or any to a side that did not announce pushes, fails that link") {
  SUBCASE("not announced") {
    Raw r(false);
    r.push(1, 0, 4096, 0, 4096, 4096);
    r.expect_down("did not announce pushes");
  }
  SUBCASE("a first frame not at offset 0") {
    Raw r;
    r.push(1, 0, 8192, 4096, 4096, 4096);
    r.expect_down("a push starts at 0");
  }
  SUBCASE("more than the largest push") {
    Raw r;
    r.push(1, 0, TcpTransport::kMaxPushBytes + 1, 0, 4096, 4096);
    r.expect_down("a push starts at 0");
  }
  SUBCASE("a frame above 1 MiB") {
    Raw r;
    r.push(1, 0, 4 * kMiB, 0, 2 * kMiB, 0);
    r.expect_down("with a frame of 2097152 bytes");
  }
  SUBCASE("frames out of order") {
    Raw r;
    r.push(1, 0, 8192, 0, 4096, 4096);  // parks, then is dropped
    r.push(1, 0, 8192, 0, 4096, 4096);
    r.expect_down("out of order");
  }
  SUBCASE("an end for a push never started") {
    Raw r;
    r.push(9, static_cast<uint32_t>(StatusCode::kUnavailable), 8192, 0, 0, 0);
    r.expect_down("never started");
  }
  SUBCASE("more pushes under way than reads allowed") {
    Raw r;
    for (uint32_t k = 1; k <= TcpTransport::kMaxBulkReads + 1; ++k) r.push(k, 0, 8192, 0, 4096, 4096);
    r.expect_down("pushes are under way");
  }
}

// ---- end to end

constexpr uint32_t kEcho = slotrpc::method_id("slotrpc.test.Push.Echo");

// Echo(wait_ms): optionally waits, then reads incoming segment 0 whole
// and writes it back into outgoing segment 0.
slotrpc::ServiceDefinition push_service() {
  slotrpc::ServiceDefinition svc("slotrpc.test.Push");
  svc.add_method("Echo", [](slotrpc::ServerCall& call) -> Status {
    const auto req = call.request();
    if (req.size() >= 8) {
      auto* v = flatbuffers::GetRoot<flatbuffers::Vector<uint64_t>>(req.data());
      if (v->size() > 0 && v->Get(0) != 0) slotrpc::this_fiber::sleep_for(std::chrono::milliseconds(v->Get(0)));
    }
    std::vector<std::byte> buf(call.bulk_in(0));
    if (Status st = call.read_bulk(0, buf); !st.ok()) return st;
    if (Status st = call.write_bulk(0, buf); !st.ok()) return st;
    auto& out = call.reply();
    out.Finish(out.CreateVector(std::vector<uint64_t>{buf.size()}));
    return {};
  });
  return svc;
}

struct Metrics {
  uint64_t pushes = 0, dropped = 0, requests = 0;
};
Metrics tcp_metrics(const slotrpc::MetricsSnapshot& m) {
  for (const auto& t : m.transports)
    if (t.transport == "tcp") return {t.bulk_pushes, t.bulk_pushes_dropped, t.bulk_requests};
  return {};
}

// `calls` echoes of `size` bytes, each handler waiting `wait_ms` first.
// Every byte is checked.  Returns the server's and the client's metrics
// differences.
std::pair<Metrics, Metrics> echo(const Config& server_config, const Config& client_config,
                                 size_t size, int calls, uint64_t wait_ms) {
  slotrpc::Server server(server_config);
  REQUIRE(server.add_service(push_service()).ok());
  REQUIRE(server.start("127.0.0.1:0").ok());
  Config cc = client_config;
  cc.transport = slotrpc::TransportKind::kTcp;
  auto ch = slotrpc::Channel::connect("127.0.0.1:" + std::to_string(server.port()), cc);
  REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
  // The client's loop is the default runtime's, shared with earlier tests.
  const Metrics server_before = tcp_metrics(server.metrics()), client_before = tcp_metrics((*ch)->metrics());
  for (int i = 0; i < calls; ++i) {
    std::vector<std::byte> src = pattern(size, 100 + static_cast<uint32_t>(i)), dst(size);
    slotrpc::CallOptions o;
    o.send_bulk(std::span<const std::byte>(src)).receive_bulk(std::span<std::byte>(dst));
    auto f = slotrpc::raw::call(**ch,
        kEcho,
        [wait_ms](flatbuffers::FlatBufferBuilder& fbb) { fbb.Finish(fbb.CreateVector(std::vector<uint64_t>{wait_ms})); },
        std::move(o));
    REQUIRE(f.wait_for(60s));
    slotrpc::RawReply r = f.get();
    REQUIRE_MESSAGE(r.ok(), r.status().to_string());
    check_equal(dst, src);
  }
  auto minus = [](Metrics a, const Metrics& b) {
    a.pushes -= b.pushes;
    a.dropped -= b.dropped;
    a.requests -= b.requests;
    return a;
  };
  return {minus(tcp_metrics(server.metrics()), server_before), minus(tcp_metrics((*ch)->metrics()), client_before)};
}

TEST_CASE("calls: a send_bulk segment up to tcp_bulk_push follows its request; the server asks for nothing") {
  Config c;
  c.tcp_bulk_lane = 0;
  const auto [server, client] = echo(c, c, 512 * 1024, 5, 0);
  CHECK(client.pushes == 5);
  CHECK(server.dropped == 0);
  // The server's bulk requests are its WRITE_DATA frames only: no READ_REQ.
  const auto [server_off, client_off] = [] {
    Config off;
    off.tcp_bulk_lane = 0;
    off.tcp_bulk_push = 0;
    Config on;
    on.tcp_bulk_lane = 0;
    return echo(on, off, 512 * 1024, 5, 0);
  }();
  CHECK(client_off.pushes == 0);
  CHECK(server_off.requests == server.requests + 5);  // one READ_REQ a call
}

TEST_CASE("calls: 32 calls in flight with pushed segments all succeed (at most 16 pushes under way, the rest asked for)") {
  // The receiver refuses a 17th push under way at once (it fails the
  // connection), and the client used to push every segment of every call
  // in flight: 17 or more calls with send_bulk segments lost the session.
  Config c;
  c.tcp_bulk_lane = 0;
  slotrpc::Server server(c);
  REQUIRE(server.add_service(push_service()).ok());
  REQUIRE(server.start("127.0.0.1:0").ok());
  Config cc = c;
  cc.transport = slotrpc::TransportKind::kTcp;
  auto ch = slotrpc::Channel::connect("127.0.0.1:" + std::to_string(server.port()), cc);
  REQUIRE_MESSAGE(ch.ok(), ch.status().to_string());
  constexpr int kCalls = 32;
  constexpr size_t kSize = 200000;
  std::vector<std::vector<std::byte>> src, dst;
  std::vector<slotrpc::Future<slotrpc::RawReply>> replies;
  for (int i = 0; i < kCalls; ++i) {
    src.push_back(pattern(kSize, 300 + static_cast<uint32_t>(i)));
    dst.emplace_back(kSize);
  }
  for (int i = 0; i < kCalls; ++i) {
    slotrpc::CallOptions o;
    o.send_bulk(std::span<const std::byte>(src[i])).receive_bulk(std::span<std::byte>(dst[i]));
    replies.push_back(slotrpc::raw::call(**ch,
        kEcho, [](flatbuffers::FlatBufferBuilder& fbb) { fbb.Finish(fbb.CreateVector(std::vector<uint64_t>{0})); },
        std::move(o)));
  }
  for (int i = 0; i < kCalls; ++i) {
    CAPTURE(i);
    REQUIRE(replies[i].wait_for(60s));
    slotrpc::RawReply r = replies[i].get();
    REQUIRE_MESSAGE(r.ok(), r.status().to_string());
    check_equal(dst[i], src[i]);
  }
  // The session survived: still the one tcp session open on the server.
  uint64_t open_sessions = 0;
  for (const auto& t : server.metrics().transports)
    if (t.transport == "tcp") open_sessions = t.sessions;
  CHECK(open_sessions == 1);
}

TEST_CASE("calls: a handler that reads after a wait still gets every byte (the push is dropped)") {
  Config c;
  c.tcp_bulk_lane = 0;
  const auto [server, client] = echo(c, c, 300000, 3, 20);
  CHECK(client.pushes == 3);
  CHECK(server.dropped == 3);
}

TEST_CASE("calls: a server with tcp_bulk_push 0 does not announce pushes, and receives none") {
  Config server_config;
  server_config.tcp_bulk_push = 0;
  server_config.tcp_bulk_lane = 0;
  Config client_config;
  client_config.tcp_bulk_lane = 0;
  const auto [server, client] = echo(server_config, client_config, 100000, 3, 0);
  CHECK(client.pushes == 0);
  CHECK(server.dropped == 0);
  CHECK(server.requests >= 3);  // READ_REQs (and WRITE_DATA frames)
}

}  // namespace
