// Bulk transfers on verbs links, without sessions: the Link's
// register_bulk / expose / revoke / read / write driven directly on two
// transports over the device.
//
//   * read and write of 64 KiB, 4 MiB and 64 MiB + 1 byte, every byte
//     checked, one kBulkDone per operation (both ring protection modes for
//     the smaller sizes);
//   * slot messages both ways while a 64 MiB read runs; a slot message
//     posted after write() finds every written byte in place;
//   * the exposure rules: a read after revoke (also with the window rebound
//     under a new key), a write into a read-only window, one byte beyond the
//     exposed range, another session's queue pair using the key: each fails
//     with a remote access error (INVALID_ARGUMENT for the transfer, the
//     offending link down) and touches nothing; the other session goes on;
//   * a link that goes down ends pending transfers (UNAVAILABLE) and revokes
//     (OK) before its kLinkDown, and revoke on a down link returns at once;
//   * dma-buf registration (udmabuf when the kernel has it) or its clear
//     error.
//
// Needs an RDMA device: run by the `rxe` suite (tests/rxe/README.md).
#include "verbs_test_util.h"

#include <fcntl.h>
#include <linux/udmabuf.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/wire_format.h"
#include "transport/verbs/exposure_mrs.h"
#include "transport/verbs/verbs_transport.h"

int main(int argc, char** argv) { return verbs_test::main(argc, argv); }

namespace {

using namespace std::chrono_literals;
using slotrpc::Config;
using slotrpc::StatusCode;
using slotrpc::transport::Access;
using slotrpc::transport::BulkAccess;
using slotrpc::transport::BulkRegistration;
using slotrpc::transport::BulkSource;
using slotrpc::transport::Completion;
using slotrpc::transport::Delivery;
using slotrpc::transport::MemoryRegion;
using slotrpc::transport::Outgoing;
using slotrpc::transport::RemoteSegment;
using namespace slotrpc::transport::verbs;
using CKind = Completion::Kind;

constexpr uint16_t kOk = static_cast<uint16_t>(StatusCode::kOk);
constexpr uint16_t kInvalid = static_cast<uint16_t>(StatusCode::kInvalidArgument);
constexpr uint16_t kUnavailable = static_cast<uint16_t>(StatusCode::kUnavailable);

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

Config config(slotrpc::SharedReceiveQueue mode = slotrpc::SharedReceiveQueue::kOn) {
  auto c = Config{}.with_environment();
  REQUIRE_MESSAGE(c.ok(), c.status().to_string());
  c.value().srq = mode;
  return c.value();
}

std::unique_ptr<VerbsTransport> make_transport(const Config& cfg) {
  auto t = VerbsTransport::create(cfg);
  REQUIRE_MESSAGE(t.ok(), t.status().to_string());
  return std::move(t).value();
}

constexpr uint32_t kSlots = 8, kSize = 4096;

// One end of a link pair: link, rings, and the completions it got.
struct End {
  std::unique_ptr<VerbsLink> link;
  std::vector<std::byte> recv, send;
  MemoryRegion recv_mr{}, send_mr{};
  std::vector<Completion> got;
  // Called for each completion as it arrives (before it is stored).
  std::function<void(const Completion&)> on_completion;

  ~End() {
    if (!link) return;
    link->deregister(recv_mr);
    link->deregister(send_mr);
  }
  std::byte* sslot(uint32_t i) { return send.data() + size_t{i} * kSize; }
  std::byte* rslot(uint32_t i) { return recv.data() + size_t{i} * kSize; }
  size_t count(CKind k) const {
    return static_cast<size_t>(std::count_if(got.begin(), got.end(), [k](const Completion& c) { return c.kind == k; }));
  }
  // The kBulkDone of `token`, or nullptr.
  const Completion* done(uint64_t token) const {
    for (const Completion& c : got)
      if (c.kind == CKind::kBulkDone && c.bulk_token == token) return &c;
    return nullptr;
  }
  size_t dones(uint64_t token) const {
    return static_cast<size_t>(std::count_if(got.begin(), got.end(), [token](const Completion& c) {
      return c.kind == CKind::kBulkDone && c.bulk_token == token;
    }));
  }
  // Index in `got` of the first completion of kind k (got.size() if none).
  size_t index_of(CKind k) const {
    for (size_t i = 0; i < got.size(); ++i)
      if (got[i].kind == k) return i;
    return got.size();
  }
};

std::unique_ptr<End> make_end(VerbsTransport& t, const std::string& name) {
  auto e = std::make_unique<End>();
  auto l = t.create_link(name, kSlots);
  REQUIRE_MESSAGE(l.ok(), l.status().to_string());
  e->link = std::move(l).value();
  e->recv.assign(size_t{kSlots} * kSize, std::byte{0});
  e->send.assign(size_t{kSlots} * kSize, std::byte{0});
  auto r = e->link->register_memory(e->recv, Access::kRemoteWrite);
  REQUIRE_MESSAGE(r.ok(), r.status().to_string());
  e->recv_mr = r.value();
  auto s = e->link->register_memory(e->send, Access::kLocalSend);
  REQUIRE_MESSAGE(s.ok(), s.status().to_string());
  e->send_mr = s.value();
  auto st = e->link->attach(e->recv_mr, e->send_mr, kSlots, kSize, e.get());
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  for (uint32_t i = 0; i < kSlots; ++i) e->link->arm(static_cast<uint16_t>(i));
  return e;
}

void connect_pair(End& a, End& b) {
  auto through_wire = [](const QpInfo& info) {
    std::array<std::byte, kQpInfoSize> buf;
    encode_qp_info(info, buf.data());
    auto back = decode_qp_info(buf);
    REQUIRE_MESSAGE(back.ok(), back.status().to_string());
    return back.value();
  };
  const QpInfo ia = through_wire(a.link->local_info());
  const QpInfo ib = through_wire(b.link->local_info());
  auto st = a.link->connect(ib, -1, "b");
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  st = b.link->connect(ia, -1, "a");
  REQUIRE_MESSAGE(st.ok(), st.to_string());
}

// Polls both transports until done() (false after `limit`).
bool pump(std::initializer_list<VerbsTransport*> ts, const std::function<bool()>& done,
          std::chrono::milliseconds limit = 60000ms) {
  const auto until = std::chrono::steady_clock::now() + limit;
  std::array<Completion, 16> buf;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    for (VerbsTransport* t : ts) {
      const size_t n = t->poll(buf);
      for (size_t i = 0; i < n; ++i) {
        End* e = static_cast<End*>(buf[i].context);
        if (e->on_completion) e->on_completion(buf[i]);
        e->got.push_back(buf[i]);
      }
    }
  }
  return true;
}
void settle(std::initializer_list<VerbsTransport*> ts, std::chrono::milliseconds d = 200ms) {
  (void)pump(ts, [] { return false; }, d);
}

uint8_t pattern(uint32_t seed, size_t i) {
  return static_cast<uint8_t>((i * 7 + (i >> 9) * 13 + seed * 131 + 1) & 0xff);
}
// The pattern repeats every 128 KiB (i * 7 wraps every 256 bytes, and
// (i >> 9) * 13 every 256 blocks of 512), so fill and mismatch work a
// period at a time with memcpy / memcmp: a byte loop over the 64 MiB cases
// took seconds in the debug ASan build, inside the VM.
constexpr size_t kPatternPeriod = 128 * 1024;
std::vector<std::byte> period_of(uint32_t seed) {
  std::vector<std::byte> v(kPatternPeriod);
  for (size_t i = 0; i < kPatternPeriod; ++i) v[i] = std::byte{pattern(seed, i)};
  return v;
}
void fill(std::byte* p, size_t n, uint32_t seed) {
  const std::vector<std::byte> per = period_of(seed);
  for (size_t off = 0; off < n; off += kPatternPeriod)
    std::memcpy(p + off, per.data(), std::min(kPatternPeriod, n - off));
}
// The first index where p differs from the pattern, or n.
size_t mismatch(const std::byte* p, size_t n, uint32_t seed) {
  const std::vector<std::byte> per = period_of(seed);
  for (size_t off = 0; off < n; off += kPatternPeriod) {
    const size_t len = std::min(kPatternPeriod, n - off);
    if (std::memcmp(p + off, per.data(), len) == 0) continue;
    for (size_t i = 0; i < len; ++i)
      if (p[off + i] != per[i]) return off + i;
  }
  return n;
}

// Bulk memory of one side: an anonymous mapping, registered through `link`.
struct Bulk {
  VerbsLink* link;
  std::byte* mem = nullptr;
  size_t size = 0;
  BulkRegistration reg{};
  Bulk(VerbsLink& l, size_t n) : link(&l), size(n) {
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(p != MAP_FAILED);
    mem = static_cast<std::byte*>(p);
    auto r = l.register_bulk(BulkSource{mem, n});
    REQUIRE_MESSAGE(r.ok(), r.status().to_string());
    reg = r.value();
    CHECK(reg.domain == l.bulk_domain());
  }
  ~Bulk() {
    link->deregister_bulk(reg);
    ::munmap(mem, size);
  }
};

// Two sessions' worth of transports: client side (exposes) and server side
// (reads and writes).
struct Pair {
  std::unique_ptr<VerbsTransport> tc, ts;
  std::unique_ptr<End> c, s;
  explicit Pair(const Config& cfg = config()) {
    tc = make_transport(cfg);
    ts = make_transport(cfg);
    c = make_end(*tc, "client");
    s = make_end(*ts, "server");
    connect_pair(*c, *s);
    REQUIRE(c->link->supports_bulk());
    REQUIRE(s->link->supports_bulk());
  }
  bool run(const std::function<bool()>& done, std::chrono::milliseconds limit = 60000ms) {
    return pump({tc.get(), ts.get()}, done, limit);
  }
  // expose() queues its bind for the link's next post() or poll(): in a
  // session the key reaches the peer in a message posted after it.  These
  // tests hand the key over directly, so they poll the exposing side once
  // first, as the session's next turn would.
  slotrpc::Result<RemoteSegment> expose(const BulkRegistration& reg, size_t offset, size_t length,
                                        BulkAccess access) {
    auto seg = c->link->expose(reg, offset, length, access);
    poll_once(*tc);
    return seg;
  }
  static void poll_once(VerbsTransport& t) {
    bool polled = false;
    (void)pump({&t}, [&] { return std::exchange(polled, true); });
  }
  void revoke(const RemoteSegment& seg, uint64_t token) {
    if (!c->link->revoke(seg, token)) {
      REQUIRE(run([&] { return c->done(token) != nullptr; }));
      CHECK(c->done(token)->bulk_status == kOk);
    }
  }
};

}  // namespace

TEST_CASE("bulk: read and write of 64 KiB, 4 MiB and 64 MiB + 1, every byte checked") {
  struct Case {
    size_t size;
    slotrpc::SharedReceiveQueue mode;
  };
  const Case cases[] = {{64 * 1024, slotrpc::SharedReceiveQueue::kOn},
                        {4u << 20, slotrpc::SharedReceiveQueue::kOn},
                        {(64u << 20) + 1, slotrpc::SharedReceiveQueue::kOn},
                        {64 * 1024, slotrpc::SharedReceiveQueue::kOff},
                        {4u << 20, slotrpc::SharedReceiveQueue::kOff}};
  for (const Case& k : cases) {
    CAPTURE(k.size);
    CAPTURE(k.mode);
    Pair p(config(k.mode));
    MESSAGE("chunk " << p.s->link->chunk_bytes() << " bytes, " << p.s->link->max_reads_in_flight()
                     << " reads in flight");
    CHECK(p.s->link->max_reads_in_flight() >= 1);
    // Client: request data to be read (offset 3 inside its registration)
    // and a reply destination to be written (offset 5).
    Bulk csrc(*p.c->link, k.size + 3), cdst(*p.c->link, k.size + 5);
    Bulk sbuf(*p.s->link, k.size + 7);
    fill(csrc.mem + 3, k.size, 1);
    fill(sbuf.mem + 7, k.size, 2);
    auto rseg = p.expose(csrc.reg, 3, k.size, BulkAccess::kRemoteRead);
    auto wseg = p.expose(cdst.reg, 5, k.size, BulkAccess::kRemoteWrite);
    REQUIRE_MESSAGE(rseg.ok(), rseg.status().to_string());
    REQUIRE_MESSAGE(wseg.ok(), wseg.status().to_string());
    CHECK(rseg.value().addr == reinterpret_cast<uintptr_t>(csrc.mem) + 3);
    CHECK(rseg.value().length == k.size);
    CHECK(rseg.value().rkey != wseg.value().rkey);

    // Server reads the request data into sbuf (over its own pattern).
    REQUIRE(p.s->link->read(sbuf.reg, 7, rseg.value(), 0, k.size, 11).ok());
    REQUIRE(p.run([&] { return p.s->done(11) != nullptr; }));
    CHECK(p.s->done(11)->bulk_status == kOk);
    CHECK(mismatch(sbuf.mem + 7, k.size, 1) == k.size);
    // Then writes it back with a new pattern into the reply destination.
    fill(sbuf.mem + 7, k.size, 3);
    REQUIRE(p.s->link->write(sbuf.reg, 7, wseg.value(), 0, k.size, 12).ok());
    REQUIRE(p.run([&] { return p.s->done(12) != nullptr; }));
    CHECK(p.s->done(12)->bulk_status == kOk);
    CHECK(mismatch(cdst.mem + 5, k.size, 3) == k.size);
    // Nothing outside the exposed range moved.
    CHECK(std::all_of(cdst.mem, cdst.mem + 5, [](std::byte b) { return b == std::byte{0}; }));
    p.revoke(rseg.value(), 21);
    p.revoke(wseg.value(), 22);
    settle({p.tc.get(), p.ts.get()}, 50ms);
    CHECK(p.s->dones(11) == 1);
    CHECK(p.s->dones(12) == 1);
    CHECK(p.c->count(CKind::kLinkDown) == 0);
    CHECK(p.s->count(CKind::kLinkDown) == 0);
  }
}

TEST_CASE("bulk: slot messages pass a 64 MiB read and an 8 MiB write; one posted after the write's kBulkDone follows its bytes") {
  Pair p;
  constexpr size_t kBig = 64u << 20;
  Bulk csrc(*p.c->link, kBig), sdst(*p.s->link, kBig);
  fill(csrc.mem, kBig, 4);
  auto seg = p.expose(csrc.reg, 0, kBig, BulkAccess::kRemoteRead);
  REQUIRE(seg.ok());
  REQUIRE(p.s->link->read(sdst.reg, 0, seg.value(), 0, kBig, 1).ok());
  // Small messages both ways while the read is queued and running.
  std::vector<Outgoing> to_s, to_c;
  for (uint16_t i = 0; i < 4; ++i) {
    fill(p.c->sslot(i), 100, 50 + i);
    fill(p.s->sslot(i), 100, 60 + i);
    to_s.push_back(Outgoing{p.c->sslot(i), 100, slotrpc::core::make_imm(i, 1), Delivery::kSlot});
    to_c.push_back(Outgoing{p.s->sslot(i), 100, slotrpc::core::make_imm(i, 1), Delivery::kSlot});
  }
  p.s->link->post(to_c);
  p.c->link->post(to_s);
  REQUIRE(p.run([&] { return p.c->count(CKind::kMessage) == 4 && p.s->count(CKind::kMessage) == 4; }));
  MESSAGE("the read had " << std::string(p.s->done(1) ? "finished" : "not finished")
                           << " when all 8 messages had arrived");
  for (uint16_t i = 0; i < 4; ++i) {
    CHECK(mismatch(p.s->rslot(i), 100, 50 + i) == 100);
    CHECK(mismatch(p.c->rslot(i), 100, 60 + i) == 100);
  }
  REQUIRE(p.run([&] { return p.s->done(1) != nullptr; }));
  CHECK(p.s->done(1)->bulk_status == kOk);
  CHECK(mismatch(sdst.mem, kBig, 4) == kBig);

  // Writes: 8 MiB (several chunks, more than fit in flight, so some wait
  // in the link).  A slot message posted right after the write() passes
  // it (a PONG or another call's reply must not wait for a gigabyte: on a
  // slow link that outlived the peer timeout); one posted after the
  // write's kBulkDone (as the core posts a reply) follows every byte.
  constexpr size_t kWrite = 8u << 20;
  Bulk cdst(*p.c->link, kWrite), ssrc(*p.s->link, kWrite);
  fill(ssrc.mem, kWrite, 5);
  auto wseg = p.expose(cdst.reg, 0, kWrite, BulkAccess::kRemoteWrite);
  REQUIRE(wseg.ok());
  size_t early_at = 0, after_at = 0;
  p.c->on_completion = [&](const Completion& c) {
    if (c.kind == CKind::kMessage && c.slot == 5) early_at = mismatch(cdst.mem, kWrite, 5) + 1;
    if (c.kind == CKind::kMessage && c.slot == 6) after_at = mismatch(cdst.mem, kWrite, 5) + 1;
  };
  REQUIRE(p.s->link->write(ssrc.reg, 0, wseg.value(), 0, kWrite, 2).ok());
  fill(p.s->sslot(5), 64, 70);
  p.s->link->post(std::vector<Outgoing>{{p.s->sslot(5), 64, slotrpc::core::make_imm(5, 1), Delivery::kSlot}});
  REQUIRE(p.run([&] { return early_at != 0 && p.s->done(2) != nullptr; }));
  CHECK(p.s->done(2)->bulk_status == kOk);
  CHECK_MESSAGE(early_at < kWrite + 1,
                "the message posted during the write waited for all of it (byte " << early_at - 1 << ")");
  fill(p.s->sslot(6), 64, 71);
  p.s->link->post(std::vector<Outgoing>{{p.s->sslot(6), 64, slotrpc::core::make_imm(6, 1), Delivery::kSlot}});
  REQUIRE(p.run([&] { return after_at != 0; }));
  CHECK_MESSAGE(after_at == kWrite + 1,
                "the message posted after the write's kBulkDone arrived before byte " << after_at - 1);
  p.revoke(seg.value(), 3);
  p.revoke(wseg.value(), 4);
  CHECK(p.c->count(CKind::kLinkDown) == 0);
  CHECK(p.s->count(CKind::kLinkDown) == 0);
}

namespace {

// A transfer the peer refuses: the server's kBulkDone is INVALID_ARGUMENT,
// it comes before the server link's kLinkDown, whose reason is a remote
// access error.
void expect_refused(Pair& p, uint64_t token) {
  REQUIRE(p.run([&] { return p.s->count(CKind::kLinkDown) == 1; }));
  const Completion* d = p.s->done(token);
  REQUIRE(d != nullptr);
  CHECK(d->bulk_status == kInvalid);
  CHECK(p.s->index_of(CKind::kBulkDone) < p.s->index_of(CKind::kLinkDown));
  const std::string why = p.s->link->down_reason();
  MESSAGE("server: " << why);
  CHECK_MESSAGE(contains(why, ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR)), why);
  settle({p.tc.get(), p.ts.get()});
  CHECK(p.s->dones(token) == 1);
  // The client learns of it from the control connection closing (there is
  // none here): close it as that would, which also releases its windows so
  // its registrations can go.
  p.c->link->close("peer's link failed");
}

}  // namespace

TEST_CASE("bulk: the exposure rules; each violation fails with a remote access error and touches nothing") {
  constexpr size_t kLen = 256 * 1024;

  SUBCASE("read after revoke, also once the window is bound again under a new key") {
    for (const bool rebound : {false, true}) {
      CAPTURE(rebound);
      Pair p;
      Bulk csrc(*p.c->link, kLen), sdst(*p.s->link, kLen);
      fill(csrc.mem, kLen, 6);
      auto seg = p.expose(csrc.reg, 0, kLen, BulkAccess::kRemoteRead);
      REQUIRE(seg.ok());
      // It works while exposed...
      REQUIRE(p.s->link->read(sdst.reg, 0, seg.value(), 0, kLen, 1).ok());
      REQUIRE(p.run([&] { return p.s->done(1) != nullptr; }));
      REQUIRE(p.s->done(1)->bulk_status == kOk);
      CHECK(mismatch(sdst.mem, kLen, 6) == kLen);
      // ...and not after the revoke.
      p.revoke(seg.value(), 2);
      if (rebound) {
        auto again = p.expose(csrc.reg, 0, kLen, BulkAccess::kRemoteRead);
        REQUIRE(again.ok());
        CHECK(p.c->link->bulk_windows() == 1);  // the same window from the pool...
        CHECK(again.value().rkey != seg.value().rkey);  // ...under a new key
      }
      std::memset(sdst.mem, 0x5a, kLen);
      REQUIRE(p.s->link->read(sdst.reg, 0, seg.value(), 0, kLen, 3).ok());
      expect_refused(p, 3);
      CHECK(std::all_of(sdst.mem, sdst.mem + kLen, [](std::byte b) { return b == std::byte{0x5a}; }));
      CHECK(mismatch(csrc.mem, kLen, 6) == kLen);
    }
  }

  SUBCASE("a write into a read-only window") {
    Pair p;
    Bulk cmem(*p.c->link, kLen), ssrc(*p.s->link, kLen);
    fill(cmem.mem, kLen, 7);
    fill(ssrc.mem, kLen, 8);
    auto seg = p.expose(cmem.reg, 0, kLen, BulkAccess::kRemoteRead);
    REQUIRE(seg.ok());
    REQUIRE(p.s->link->write(ssrc.reg, 0, seg.value(), 0, kLen, 1).ok());
    expect_refused(p, 1);
    CHECK(mismatch(cmem.mem, kLen, 7) == kLen);
  }

  SUBCASE("one byte beyond the exposed range (write and read)") {
    // inside: the window is [4096, 4096 + kLen) of a larger registration;
    // otherwise it ends where the registration ends.  (rxe checks an access
    // only against the MR under a window: the link binds a window over
    // part of a registration over an MR of its own there, which this case
    // proves.)
    for (const bool inside : {false, true}) {
      for (const bool write : {true, false}) {
        CAPTURE(inside);
        CAPTURE(write);
        Pair p;
        const size_t offset = inside ? 4096 : 0;
        const size_t total = inside ? kLen + 8192 : kLen;
        Bulk cmem(*p.c->link, total), smem(*p.s->link, kLen + 1);
        fill(cmem.mem, total, 9);
        fill(smem.mem, kLen + 1, 10);
        auto seg = p.expose(cmem.reg, offset, kLen,
                                     write ? BulkAccess::kRemoteWrite : BulkAccess::kRemoteRead);
        REQUIRE(seg.ok());
        // A peer that lies about the length (the descriptor says one more).
        RemoteSegment lie = seg.value();
        lie.length += 1;
        if (write) {
          REQUIRE(p.s->link->write(smem.reg, 0, lie, 0, kLen + 1, 1).ok());
        } else {
          REQUIRE(p.s->link->read(smem.reg, 0, lie, 0, kLen + 1, 1).ok());
        }
        expect_refused(p, 1);
        CHECK(mismatch(cmem.mem, total, 9) == total);
        CHECK(mismatch(smem.mem, kLen + 1, 10) == kLen + 1);
      }
    }
  }

  SUBCASE("another session's queue pair using the key; the exposing session goes on") {
    // Client side: sessions 1 and 2 on one transport (one PD in shared
    // mode); server side likewise.  Session 2's server uses the key session
    // 1's client exposed to session 1.
    auto tc = make_transport(config());
    auto ts = make_transport(config());
    auto c1 = make_end(*tc, "c1");
    auto s1 = make_end(*ts, "s1");
    auto c2 = make_end(*tc, "c2");
    auto s2 = make_end(*ts, "s2");
    connect_pair(*c1, *s1);
    connect_pair(*c2, *s2);
    auto run = [&](const std::function<bool()>& done) { return pump({tc.get(), ts.get()}, done); };
    // s2mem through s1's link: the same PD, and s2 is replaced below.
    Bulk cmem(*c1->link, kLen), s1mem(*s1->link, kLen), s2mem(*s1->link, kLen);
    CHECK(cmem.reg.domain == c2->link->bulk_domain());  // one PD: the window is the only guard
    fill(cmem.mem, kLen, 11);
    fill(s2mem.mem, kLen, 12);
    auto rseg = c1->link->expose(cmem.reg, 0, kLen, BulkAccess::kRemoteRead);
    auto wseg = c1->link->expose(cmem.reg, 0, kLen, BulkAccess::kRemoteWrite);
    Pair::poll_once(*tc);  // the binds go out (Pair::expose)
    REQUIRE(rseg.ok());
    REQUIRE(wseg.ok());
    for (const bool write : {true, false}) {
      CAPTURE(write);
      // A fresh session 2 for each attempt (the first one fails its link).
      if (!write) {
        c2.reset();
        s2.reset();
        c2 = make_end(*tc, "c2b");
        s2 = make_end(*ts, "s2b");
        connect_pair(*c2, *s2);
      }
      std::memset(s2mem.mem, 0x33, kLen);
      if (write) {
        fill(s2mem.mem, kLen, 12);
        REQUIRE(s2->link->write(s2mem.reg, 0, wseg.value(), 0, kLen, 1).ok());
      } else {
        REQUIRE(s2->link->read(s2mem.reg, 0, rseg.value(), 0, kLen, 1).ok());
      }
      REQUIRE(run([&] { return s2->count(CKind::kLinkDown) == 1; }));
      REQUIRE(s2->done(1) != nullptr);
      CHECK(s2->done(1)->bulk_status == kInvalid);
      CHECK_MESSAGE(contains(s2->link->down_reason(), ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR)),
                    s2->link->down_reason());
      CHECK(mismatch(cmem.mem, kLen, 11) == kLen);
      if (!write) CHECK(std::all_of(s2mem.mem, s2mem.mem + kLen, [](std::byte b) { return b == std::byte{0x33}; }));
    }
    // Session 1 goes on: its exposure still works, both ways.
    settle({tc.get(), ts.get()});
    CHECK(c1->count(CKind::kLinkDown) == 0);
    CHECK(s1->count(CKind::kLinkDown) == 0);
    REQUIRE(s1->link->read(s1mem.reg, 0, rseg.value(), 0, kLen, 2).ok());
    REQUIRE(run([&] { return s1->done(2) != nullptr; }));
    CHECK(s1->done(2)->bulk_status == kOk);
    CHECK(mismatch(s1mem.mem, kLen, 11) == kLen);
    fill(s1mem.mem, kLen, 13);
    REQUIRE(s1->link->write(s1mem.reg, 0, wseg.value(), 0, kLen, 3).ok());
    REQUIRE(run([&] { return s1->done(3) != nullptr; }));
    CHECK(s1->done(3)->bulk_status == kOk);
    CHECK(mismatch(cmem.mem, kLen, 13) == kLen);
    for (auto [seg, token] : {std::pair{rseg.value(), 4}, std::pair{wseg.value(), 5}}) {
      if (!c1->link->revoke(seg, token)) {
        REQUIRE(run([&] { return c1->done(token) != nullptr; }));
        CHECK(c1->done(token)->bulk_status == kOk);
      }
    }
    CHECK(c1->count(CKind::kLinkDown) == 0);
    CHECK(s1->count(CKind::kLinkDown) == 0);
  }
}

TEST_CASE("bulk: a link that goes down ends its transfers and revokes before kLinkDown") {
  constexpr size_t kBig = 16u << 20;
  SUBCASE("revoke on a down link returns at once") {
    Pair p;
    Bulk cmem(*p.c->link, 4096);
    auto seg = p.expose(cmem.reg, 0, 4096, BulkAccess::kRemoteRead);
    REQUIRE(seg.ok());
    p.c->link->close("test closes the link");
    CHECK(p.c->link->revoke(seg.value(), 1));
    CHECK_FALSE(p.expose(cmem.reg, 0, 4096, BulkAccess::kRemoteRead).ok());
    REQUIRE(p.run([&] { return p.c->count(CKind::kLinkDown) == 1; }));
    settle({p.tc.get(), p.ts.get()});
    CHECK(p.c->dones(1) == 0);
    // The window went with the link: the registration can go now (after
    // the exposure MR kept over it, as deregister_bulk does).
    auto* mr = static_cast<ibv_mr*>(cmem.reg.handle);
    ExposureMrs::instance().drop_parent(mr);
    CHECK(ibv_dereg_mr(mr) == 0);
    cmem.reg = BulkRegistration{};
  }
  SUBCASE("a revoke in progress ends OK, a read and a write in progress UNAVAILABLE, all before kLinkDown") {
    Pair p;
    Bulk cmem(*p.c->link, kBig), smem(*p.s->link, kBig);
    auto rseg = p.expose(cmem.reg, 0, kBig, BulkAccess::kRemoteRead);
    auto wseg = p.expose(cmem.reg, 0, kBig, BulkAccess::kRemoteWrite);
    REQUIRE(rseg.ok());
    REQUIRE(wseg.ok());
    // Client: a revoke queued, then the link fails before it is polled.
    const bool revoked_now = p.c->link->revoke(rseg.value(), 7);
    CHECK_FALSE(revoked_now);
    p.c->link->close("test closes the client");
    REQUIRE(p.run([&] { return p.c->count(CKind::kLinkDown) == 1; }));
    REQUIRE(p.c->dones(7) == 1);
    CHECK(p.c->done(7)->bulk_status == kOk);
    CHECK(p.c->index_of(CKind::kBulkDone) < p.c->index_of(CKind::kLinkDown));
    // Server: a read and a write of 16 MiB each, then its link fails.
    REQUIRE(p.s->link->read(smem.reg, 0, wseg.value(), 0, kBig, 8).ok());
    REQUIRE(p.s->link->write(smem.reg, 0, wseg.value(), 0, kBig, 9).ok());
    p.s->link->close("test closes the server");
    CHECK_FALSE(p.s->link->read(smem.reg, 0, wseg.value(), 0, 1, 10).ok());
    REQUIRE(p.run([&] { return p.s->count(CKind::kLinkDown) == 1; }));
    settle({p.tc.get(), p.ts.get()});
    REQUIRE(p.s->dones(8) == 1);
    REQUIRE(p.s->dones(9) == 1);
    CHECK(p.s->done(8)->bulk_status == kUnavailable);
    CHECK(p.s->done(9)->bulk_status == kUnavailable);
    CHECK(p.s->dones(10) == 0);
    const size_t down = p.s->index_of(CKind::kLinkDown);
    for (size_t i = down; i < p.s->got.size(); ++i) CHECK(p.s->got[i].kind != CKind::kBulkDone);
  }
}

TEST_CASE("bulk: one doorbell per turn: binds with the message after them, a turn's reads, a turn's invalidations") {
  Pair p;
  constexpr size_t kLen = 4096;
  Bulk cmem(*p.c->link, 3 * kLen), smem(*p.s->link, 3 * kLen);
  fill(cmem.mem, 3 * kLen, 18);
  const auto bells = [](const End& e) { return e.link->stats().doorbells; };
  // Client: three exposures, then the message that would carry their keys.
  uint64_t c0 = bells(*p.c);
  std::vector<RemoteSegment> segs;
  for (size_t i = 0; i < 3; ++i) {
    auto seg = p.c->link->expose(cmem.reg, i * kLen, kLen, BulkAccess::kRemoteRead);
    REQUIRE(seg.ok());
    segs.push_back(seg.value());
  }
  CHECK(bells(*p.c) == c0);  // the binds wait for the message...
  fill(p.c->sslot(0), 100, 70);
  const Outgoing msg{p.c->sslot(0), 100, slotrpc::core::make_imm(0, 1), Delivery::kSlot};
  p.c->link->post({&msg, 1});
  CHECK(bells(*p.c) == c0 + 1);  // ...and leave with it
  REQUIRE(p.run([&] { return p.s->count(CKind::kMessage) == 1; }));
  CHECK(mismatch(p.s->rslot(0), 100, 70) == 100);
  // Server: three reads started in one turn (three handlers' read_bulk).
  const uint64_t s0 = bells(*p.s);
  for (size_t i = 0; i < 3; ++i)
    REQUIRE(p.s->link->read(smem.reg, i * kLen, segs[i], 0, kLen, 10 + i).ok());
  CHECK(bells(*p.s) == s0);
  REQUIRE(p.run([&] { return p.s->dones(10) + p.s->dones(11) + p.s->dones(12) == 3; }));
  CHECK(bells(*p.s) == s0 + 1);  // one chain (rxe allows 16 reads in flight)
  CHECK(mismatch(smem.mem, 3 * kLen, 18) == 3 * kLen);
  // Client: three revokes in one turn (a batch of replies).
  c0 = bells(*p.c);
  for (size_t i = 0; i < 3; ++i) CHECK_FALSE(p.c->link->revoke(segs[i], 20 + i));
  REQUIRE(p.run([&] { return p.c->dones(20) + p.c->dones(21) + p.c->dones(22) == 3; }));
  CHECK(bells(*p.c) == c0 + 1);
}

TEST_CASE("bulk: exposure MRs (Soft-RoCE) are kept per range, stay exact when reused, and go with their registration") {
  Pair p;
  if (!p.c->link->uses_exposure_mrs()) {
    MESSAGE("this device bounds windows itself: no exposure MRs (the exposure rules are checked above)");
    return;
  }
  ExposureMrs& mrs = ExposureMrs::instance();
  constexpr size_t kLen = 64 * 1024;
  Bulk cmem(*p.c->link, 3 * kLen), smem(*p.s->link, 3 * kLen + 1);
  const auto* parent = static_cast<const ibv_mr*>(cmem.reg.handle);
  fill(cmem.mem, 3 * kLen, 16);
  uint64_t token = 1;
  // Exposes [offset, offset + len) for reading, reads it all, revokes.
  const auto read_through = [&](size_t offset, size_t len) {
    auto seg = p.expose(cmem.reg, offset, len, BulkAccess::kRemoteRead);
    REQUIRE(seg.ok());
    std::memset(smem.mem, 0, len);
    const uint64_t t = token++;
    REQUIRE(p.s->link->read(smem.reg, 0, seg.value(), 0, len, t).ok());
    REQUIRE(p.run([&] { return p.s->done(t) != nullptr; }));
    REQUIRE(p.s->done(t)->bulk_status == kOk);
    std::vector<std::byte> want(len);
    for (size_t i = 0; i < len; ++i) want[i] = std::byte{pattern(16, offset + i)};
    REQUIRE(std::memcmp(smem.mem, want.data(), len) == 0);
    p.revoke(seg.value(), token++);
  };
  const uint64_t before = mrs.registrations();
  // The same range three times: one MR, kept after each revoke.
  for (int i = 0; i < 3; ++i) read_through(kLen, kLen);
  CHECK(mrs.registrations() == before + 1);
  CHECK(mrs.idle(parent) == 1);
  // The whole registration needs none: the window over all of it is
  // bounded by the registration itself.
  read_through(0, 3 * kLen);
  CHECK(mrs.registrations() == before + 1);
  // 20 other ranges: at most kIdlePerParent stay.
  for (size_t i = 0; i < 20; ++i) read_through(i * 4096, 4096);
  CHECK(mrs.registrations() == before + 21);
  CHECK(mrs.idle(parent) == ExposureMrs::kIdlePerParent);
  {
    // One still under a window when its registration goes is orphaned: it
    // goes when the window's invalidation completes, not before (its
    // deregistration would fail) and not never.
    Bulk other(*p.c->link, 2 * kLen);
    const size_t all = mrs.entries();
    auto seg = p.c->link->expose(other.reg, kLen, kLen, BulkAccess::kRemoteRead);
    REQUIRE(seg.ok());
    CHECK(mrs.entries() == all + 1);
    other.link->deregister_bulk(other.reg);
    CHECK(mrs.entries() == all + 1);  // bound: kept
    CHECK(mrs.idle(nullptr) == all);  // not idle (never handed out again)
    p.revoke(seg.value(), token++);
    CHECK(mrs.entries() == all);
  }
  {
    // A registration's MRs go when it is deregistered.
    Bulk other(*p.c->link, 2 * kLen);
    auto seg = p.expose(other.reg, 0, kLen, BulkAccess::kRemoteWrite);
    REQUIRE(seg.ok());
    p.revoke(seg.value(), token++);
    CHECK(mrs.idle(static_cast<const ibv_mr*>(other.reg.handle)) == 1);
    const size_t all = mrs.idle(nullptr);
    other.link->deregister_bulk(other.reg);
    CHECK(mrs.idle(nullptr) == all - 1);
  }
  // A kept MR (the last of the 20; the least recently used went first) is
  // reused, and a peer that lies about the length of a range exposed over
  // it is refused: nothing touched.
  const uint64_t kept = mrs.registrations();
  read_through(19 * 4096, 4096);
  CHECK(mrs.registrations() == kept);
  read_through(kLen, kLen);  // evicted by the 20: registered again
  CHECK(mrs.registrations() == kept + 1);
  auto seg = p.expose(cmem.reg, 19 * 4096, 4096, BulkAccess::kRemoteRead);
  REQUIRE(seg.ok());
  CHECK(mrs.registrations() == kept + 1);  // reused
  RemoteSegment lie = seg.value();
  lie.length += 1;
  fill(smem.mem, 4097, 17);
  REQUIRE(p.s->link->read(smem.reg, 0, lie, 0, 4097, 999).ok());
  expect_refused(p, 999);
  CHECK(mismatch(smem.mem, 4097, 17) == 4097);
  CHECK(mismatch(cmem.mem, 3 * kLen, 16) == 3 * kLen);
}

TEST_CASE("bulk: the window pool is reused; bad arguments are refused before anything is posted") {
  Pair p;
  constexpr size_t kLen = 64 * 1024;
  Bulk cmem(*p.c->link, kLen), smem(*p.s->link, kLen);
  fill(cmem.mem, kLen, 14);
  for (uint64_t i = 0; i < 50; ++i) {
    auto seg = p.expose(cmem.reg, 0, kLen, BulkAccess::kRemoteRead);
    REQUIRE(seg.ok());
    REQUIRE(p.s->link->read(smem.reg, 0, seg.value(), 0, kLen, 100 + i).ok());
    REQUIRE(p.run([&] { return p.s->done(100 + i) != nullptr; }));
    REQUIRE(p.s->done(100 + i)->bulk_status == kOk);
    p.revoke(seg.value(), 1000 + i);
  }
  CHECK(p.c->link->bulk_windows() == 1);
  CHECK(mismatch(smem.mem, kLen, 14) == kLen);

  auto seg = p.expose(cmem.reg, 0, kLen, BulkAccess::kRemoteRead);
  REQUIRE(seg.ok());
  CHECK(p.expose(cmem.reg, 1, kLen, BulkAccess::kRemoteRead).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(p.expose(cmem.reg, 0, 0, BulkAccess::kRemoteRead).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(p.s->link->read(smem.reg, 1, seg.value(), 0, kLen, 1).code() == StatusCode::kInvalidArgument);
  CHECK(p.s->link->read(smem.reg, 0, seg.value(), 1, kLen, 1).code() == StatusCode::kInvalidArgument);
  // Memory of another protection domain (per-session mode: another link's).
  BulkRegistration foreign = smem.reg;
  foreign.domain = &foreign;
  CHECK(p.s->link->read(foreign, 0, seg.value(), 0, kLen, 1).code() == StatusCode::kInvalidArgument);
  settle({p.tc.get(), p.ts.get()}, 50ms);
  CHECK(p.s->dones(1) == 0);
  CHECK(p.s->count(CKind::kLinkDown) == 0);
  p.revoke(seg.value(), 2);
}

TEST_CASE("bulk: dma-buf registration (udmabuf when the kernel has it), or a clear error") {
  Pair p;
  constexpr size_t kLen = 1u << 20;
  const int dev = ::open("/dev/udmabuf", O_RDWR | O_CLOEXEC);
  if (dev < 0) {
    MESSAGE("no /dev/udmabuf here (" << std::string(std::strerror(errno))
                                     << "): checking that a non-dma-buf fd is refused clearly");
    const int memfd = ::memfd_create("not-a-dmabuf", MFD_CLOEXEC);
    REQUIRE(memfd >= 0);
    REQUIRE(::ftruncate(memfd, kLen) == 0);
    void* mem = ::mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    REQUIRE(mem != MAP_FAILED);
    auto r = p.c->link->register_bulk(BulkSource{static_cast<std::byte*>(mem), kLen, memfd, 0});
    REQUIRE_FALSE(r.ok());
    MESSAGE(r.status().to_string());
    CHECK(contains(r.status().message(), "ibv_reg_dmabuf_mr"));
    CHECK(contains(r.status().message(), "dma-buf fd " + std::to_string(memfd)));
    ::munmap(mem, kLen);
    ::close(memfd);
    return;
  }
  const int memfd = ::memfd_create("udmabuf-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  REQUIRE(memfd >= 0);
  REQUIRE(::ftruncate(memfd, kLen) == 0);
  REQUIRE(::fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK) == 0);
  udmabuf_create create{};
  create.memfd = static_cast<uint32_t>(memfd);
  create.flags = UDMABUF_FLAGS_CLOEXEC;
  create.offset = 0;
  create.size = kLen;
  const int buf = ::ioctl(dev, UDMABUF_CREATE, &create);
  REQUIRE_MESSAGE(buf >= 0, "UDMABUF_CREATE: " << std::strerror(errno));
  void* mem = ::mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  REQUIRE(mem != MAP_FAILED);
  auto* bytes = static_cast<std::byte*>(mem);
  fill(bytes, kLen, 15);
  auto r = p.c->link->register_bulk(BulkSource{bytes, kLen, buf, 0});
  if (!r.ok()) {
    MESSAGE("dma-buf registration refused: " << r.status().to_string());
    CHECK(contains(r.status().message(), "ibv_reg_dmabuf_mr"));
    CHECK(r.status().code() == StatusCode::kUnimplemented);
  } else {
    MESSAGE("dma-buf registration works on this device");
    BulkRegistration reg = r.value();
    Bulk smem(*p.s->link, kLen);
    auto seg = p.expose(reg, 0, kLen, BulkAccess::kRemoteRead);
    REQUIRE(seg.ok());
    REQUIRE(p.s->link->read(smem.reg, 0, seg.value(), 0, kLen, 1).ok());
    REQUIRE(p.run([&] { return p.s->done(1) != nullptr; }));
    CHECK(p.s->done(1)->bulk_status == kOk);
    CHECK(mismatch(smem.mem, kLen, 15) == kLen);
    p.revoke(seg.value(), 2);
    p.c->link->deregister_bulk(reg);
  }
  ::munmap(mem, kLen);
  ::close(buf);
  ::close(memfd);
  ::close(dev);
}
