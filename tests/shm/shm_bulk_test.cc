// ShmLink's bulk transfers (lib/transport/shm/shm_bulk.cc) in one process:
// both ends (or a hand-written raw peer) in this thread over a socketpair,
// pumped with bounded loops.  "a" plays the client (it exposes), "b" the
// server (it reads and writes), as in slotrpc's calls.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "shm_test_util.h"

using namespace shm_test;

namespace {

constexpr Geometry kGeo{8, 256};

void fill(std::vector<std::byte>& v, uint32_t seed) {
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::byte>((i * 131 + seed * 7 + (i >> 12)) & 0xff);
}
// The first index where v differs from fill(seed), or -1.
long mismatch(const std::vector<std::byte>& v, uint32_t seed, size_t from = 0, size_t to = SIZE_MAX) {
  to = std::min(to, v.size());
  for (size_t i = from; i < to; ++i)
    if (v[i] != static_cast<std::byte>((i * 131 + seed * 7 + (i >> 12)) & 0xff)) return static_cast<long>(i);
  return -1;
}

BulkRegistration reg(End& e, std::vector<std::byte>& m) {
  auto r = e.link->register_bulk(BulkSource{m.data(), m.size()});
  REQUIRE_MESSAGE(r.ok(), r.status().to_string());
  return r.value();
}
RemoteSegment expose(End& e, const BulkRegistration& r, size_t offset, size_t length, BulkAccess access) {
  auto s = e.link->expose(r, offset, length, access);
  REQUIRE_MESSAGE(s.ok(), s.status().to_string());
  return s.value();
}
const Completion* find_done(const End& e, uint64_t token) {
  for (const auto& c : e.got)
    if (c.kind == CKind::kBulkDone && c.bulk_token == token) return &c;
  return nullptr;
}
// Index in e.got of the first completion of `kind`, or SIZE_MAX.
size_t index_of(const End& e, CKind kind, uint64_t token = 0) {
  for (size_t i = 0; i < e.got.size(); ++i)
    if (e.got[i].kind == kind && (kind != CKind::kBulkDone || e.got[i].bulk_token == token)) return i;
  return SIZE_MAX;
}

struct Pair {
  End a, b;
  explicit Pair(const Config& config = {}) : a(config), b(config) {
    connect(a, b, kGeo);
    a.attach(kGeo);
    b.attach(kGeo);
  }
  bool pump(const std::function<bool()>& done) { return pump_until({&a, &b}, done); }
  // Posts a control message from `from` carrying `seq`.
  static void control(End& from, uint64_t seq) {
    const auto h = control_bytes(seq);
    const Outgoing o{h.data(), static_cast<uint32_t>(h.size()), 0, Delivery::kControl};
    from.link->post({&o, 1});
  }
};

// b writes `bytes` of fill(seed) into `dst`, a range a exposes for
// writing, with token `token` (a server's write_bulk into its client's
// receive_bulk); both buffers live as long as this.
struct WriteFromB {
  std::vector<std::byte> dst, server;
  WriteFromB(Pair& p, size_t bytes, uint32_t seed, uint64_t token) : dst(bytes, std::byte{0}), server(bytes) {
    fill(server, seed);
    const RemoteSegment out = expose(p.a, reg(p.a, dst), 0, bytes, BulkAccess::kRemoteWrite);
    REQUIRE(p.b.link->write(reg(p.b, server), 0, out, 0, bytes, token).ok());
  }
};

bool has_control(const End& e, uint64_t seq) {
  for (const auto& c : e.got) {
    if (c.kind != CKind::kControl) continue;
    uint64_t got;
    std::memcpy(&got, c.control.data(), sizeof got);
    if (got == seq) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("shm bulk: reads and writes move every byte, across chunks and the staging ring's wrap") {
  Pair p;
  const size_t sizes[] = {1, 4095, kBulkChunkBytes - 1, kBulkChunkBytes, kBulkChunkBytes + 1,
                          3 * kStagingBytes + 12345};
  uint64_t token = 100;
  uint64_t moved = 0;
  for (const size_t n : sizes) {
    CAPTURE(n);
    std::vector<std::byte> src(n), dst(n, std::byte{0}), server(n, std::byte{0});
    fill(src, static_cast<uint32_t>(n));
    const RemoteSegment in = expose(p.a, reg(p.a, src), 0, n, BulkAccess::kRemoteRead);
    const RemoteSegment out = expose(p.a, reg(p.a, dst), 0, n, BulkAccess::kRemoteWrite);
    const BulkRegistration sreg = reg(p.b, server);
    const uint64_t rt = ++token;
    REQUIRE(p.b.link->read(sreg, 0, in, 0, n, rt).ok());
    REQUIRE(p.pump([&] { return find_done(p.b, rt) != nullptr; }));
    CHECK(find_done(p.b, rt)->bulk_status == 0);
    CHECK(find_done(p.b, rt)->context == &p.b);
    CHECK(mismatch(server, static_cast<uint32_t>(n)) == -1);
    // Back the other way, a different pattern.
    fill(server, static_cast<uint32_t>(n) + 1);
    const uint64_t wt = ++token;
    REQUIRE(p.b.link->write(sreg, 0, out, 0, n, wt).ok());
    REQUIRE(p.pump([&] { return find_done(p.b, wt) != nullptr && mismatch(dst, static_cast<uint32_t>(n) + 1) == -1; }));
    CHECK(find_done(p.b, wt)->bulk_status == 0);
    REQUIRE(p.a.link->revoke(in, 1));
    REQUIRE(p.a.link->revoke(out, 2));
    moved += n;
  }
  // Both directions went through staging: a copied the reads in, b the writes.
  CHECK(p.a.link->shm_stats().bulk_bytes_sent == moved);
  CHECK(p.b.link->shm_stats().bulk_bytes_received == moved);
  CHECK(p.b.link->shm_stats().bulk_bytes_sent == moved);
  CHECK(p.a.link->shm_stats().bulk_bytes_received == moved);
  CHECK_FALSE(p.a.link->down());
  CHECK_FALSE(p.b.link->down());
}

TEST_CASE("shm bulk: 40 reads at once (more than kMaxBulkReads) each complete with their own bytes") {
  Pair p;
  constexpr size_t kReads = 40, kEach = 300 * 1024 + 7;
  static_assert(kReads > ShmLink::kMaxBulkReads);
  std::vector<std::vector<std::byte>> src(kReads), dst(kReads);
  std::vector<RemoteSegment> segs;
  for (size_t i = 0; i < kReads; ++i) {
    src[i].resize(kEach);
    fill(src[i], static_cast<uint32_t>(i));
    dst[i].assign(kEach, std::byte{0});
    segs.push_back(expose(p.a, reg(p.a, src[i]), 0, kEach, BulkAccess::kRemoteRead));
  }
  for (size_t i = 0; i < kReads; ++i) REQUIRE(p.b.link->read(reg(p.b, dst[i]), 0, segs[i], 0, kEach, 1000 + i).ok());
  REQUIRE(p.pump([&] {
    size_t n = 0;
    for (const auto& c : p.b.got) n += c.kind == CKind::kBulkDone;
    return n == kReads;
  }));
  for (size_t i = 0; i < kReads; ++i) {
    CAPTURE(i);
    REQUIRE(find_done(p.b, 1000 + i) != nullptr);
    CHECK(find_done(p.b, 1000 + i)->bulk_status == 0);
    CHECK(mismatch(dst[i], static_cast<uint32_t>(i)) == -1);
  }
  CHECK(p.b.link->stats().bulk_requests == kReads);  // one READ_REQ each
  // Then many small reads, one after the other: the reader's bulk ring
  // holds only read requests and goes round several times (the ring's room
  // is not tied to staged chunks).
  std::vector<std::byte> one(1);
  const BulkRegistration oreg = reg(p.b, one);
  for (uint64_t i = 0; i < 3 * kBulkDescCount; ++i) {
    CAPTURE(i);
    REQUIRE(p.b.link->read(oreg, 0, segs[0], i, 1, 5000 + i).ok());
    REQUIRE(p.pump([&] { return find_done(p.b, 5000 + i) != nullptr; }));
    CHECK(one[0] == src[0][i]);
  }
}

TEST_CASE("shm bulk: a message posted while a large transfer runs is not held behind it") {
  Pair p;
  constexpr size_t kBytes = 32 << 20;
  const WriteFromB w(p, kBytes, 5, 77);
  // The writer fills its staging area (256 chunks) while the receiver
  // waits; then one poll of the receiver copies one chunk (with no time
  // budget beyond it), not all: a message behind them waits for one
  // chunk's copy per poll, at most.
  p.a.link->set_receive_budget(std::chrono::nanoseconds{0});
  REQUIRE(pump_until({&p.b}, [&] { return p.b.link->shm_stats().bulk_stalls > 0; }));
  CHECK(p.b.link->shm_stats().bulk_bytes_sent == kStagingBytes);
  // A message posted now, behind 4 MiB of staged chunks, is delivered by
  // the receiver's very next poll: bulk descriptors have a ring of their
  // own, and a poll takes slot messages first, then one chunk.
  Pair::control(p.b, 4241);
  p.a.poll_once();
  CHECK(has_control(p.a, 4241));
  CHECK(p.a.link->shm_stats().bulk_bytes_received == kBulkChunkBytes);
  // The transfer in full flow: the receiver has copied some chunks.
  REQUIRE(p.pump([&] { return p.a.link->shm_stats().bulk_bytes_received >= 4 * kBulkChunkBytes; }));
  Pair::control(p.b, 4242);
  REQUIRE(p.pump([&] { return has_control(p.a, 4242); }));
  // It arrived while most of the 32 MiB were still to come.
  CHECK(p.a.link->shm_stats().bulk_bytes_received < kBytes / 2);
  REQUIRE(p.pump([&] { return find_done(p.b, 77) != nullptr && mismatch(w.dst, 5) == -1; }));
}

TEST_CASE("shm bulk: a poll stages at most kBulkPumpBytes and copies out one chunk, more within its time budget") {
  // What bounds a small call's wait behind a transfer on each loop
  // (shm_segment.h): the sender stages several chunks a poll; the
  // receiver copies one, and more only while they fit its time budget,
  // never more than kBulkReceiveMaxBytes.
  static_assert(kBulkPumpBytes > kBulkChunkBytes && kBulkReceiveMaxBytes > kBulkChunkBytes);
  Pair p;
  constexpr size_t kBytes = 1 << 20;
  const WriteFromB w(p, kBytes, 9, 4);
  p.b.poll_once();
  CHECK(p.b.link->shm_stats().bulk_bytes_sent == kBulkPumpBytes);
  CHECK(p.b.link->shm_stats().bulk_chunks_sent == kBulkPumpBytes / kBulkChunkBytes);
  // No budget: exactly one chunk, whatever is staged.
  p.a.link->set_receive_budget(std::chrono::nanoseconds{0});
  p.a.poll_once();
  CHECK(p.a.link->shm_stats().bulk_bytes_received == kBulkChunkBytes);
  p.b.poll_once();
  CHECK(p.b.link->shm_stats().bulk_bytes_sent == 2 * kBulkPumpBytes);
  // A budget no copy reaches: kBulkReceiveMaxBytes, though more is staged.
  static_assert(2 * kBulkPumpBytes - kBulkChunkBytes > kBulkReceiveMaxBytes);
  p.a.link->set_receive_budget(std::chrono::seconds{10});
  p.a.poll_once();
  CHECK(p.a.link->shm_stats().bulk_bytes_received == kBulkChunkBytes + kBulkReceiveMaxBytes);
  // The default budget: one chunk at least, kBulkReceiveMaxBytes at most.
  p.a.link->set_receive_budget(kBulkReceiveBudget);
  p.b.poll_once();
  const uint64_t got = p.a.link->shm_stats().bulk_bytes_received;
  p.a.poll_once();
  CHECK(p.a.link->shm_stats().bulk_bytes_received - got >= kBulkChunkBytes);
  CHECK(p.a.link->shm_stats().bulk_bytes_received - got <= kBulkReceiveMaxBytes);
  REQUIRE(p.pump([&] { return find_done(p.b, 4) != nullptr; }));
  CHECK(find_done(p.b, 4)->bulk_status == 0);
  CHECK(mismatch(w.dst, 9) == -1);
}

TEST_CASE("shm bulk: a write completes only once the peer has copied its last chunk out") {
  Pair p;
  constexpr size_t kBytes = (1 << 20) + 5;
  const WriteFromB w(p, kBytes, 8, 3);
  // Everything fits in staging: the writer stages it all, yet it does not
  // complete while the peer has not consumed it.
  for (int i = 0; i < 200; ++i) p.b.poll_once();
  CHECK(p.b.link->shm_stats().bulk_bytes_sent == kBytes);
  CHECK(find_done(p.b, 3) == nullptr);
  REQUIRE(p.pump([&] { return find_done(p.b, 3) != nullptr; }));
  CHECK(find_done(p.b, 3)->bulk_status == 0);
  CHECK(mismatch(w.dst, 8) == -1);
}

TEST_CASE("shm bulk: a message posted after a write's completion arrives after every written byte") {
  // What a reply after write_bulk relies on: the handler's reply must not
  // overtake its data.
  Pair p;
  constexpr size_t kBytes = (2 << 20) + 999;
  const WriteFromB w(p, kBytes, 9, 5);
  // Only b runs until its write completes (a consumes meanwhile only as
  // the pump below lets it), then the "reply".
  REQUIRE(p.pump([&] { return find_done(p.b, 5) != nullptr; }));
  Pair::control(p.b, 1);
  REQUIRE(pump_until({&p.a}, [&] { return has_control(p.a, 1); }));
  CHECK(mismatch(w.dst, 9) == -1);
}

TEST_CASE("shm bulk: an access outside what the peer exposed fails the exposing link and touches nothing") {
  struct Case {
    const char* name;
    bool write;            // b writes (else reads)
    BulkAccess access;     // how a exposes the range
    bool revoke_first;     // a revokes before b's access
    uint32_t forge_rkey;   // != 0: b uses this key instead
    uint64_t forge_extra;  // b claims the range is this much longer
    const char* reason;
  };
  const Case cases[] = {
      {"read through a key never exposed", false, BulkAccess::kRemoteRead, false, 9999, 0, "never exposed"},
      {"read after the revoke", false, BulkAccess::kRemoteRead, true, 0, 0, "which was revoked"},
      {"write after the revoke", true, BulkAccess::kRemoteWrite, true, 0, 0, "which was revoked"},
      {"write into a range exposed for reading", true, BulkAccess::kRemoteRead, false, 0, 0,
       "exposed for reading only"},
      {"read of a range exposed for writing", false, BulkAccess::kRemoteWrite, false, 0, 0,
       "exposed for writing only"},
      {"read past the exposure's end", false, BulkAccess::kRemoteRead, false, 0, 4096, "which exposes"},
      {"write past the exposure's end", true, BulkAccess::kRemoteWrite, false, 0, 4096, "which exposes"},
  };
  for (const Case& k : cases) {
    CAPTURE(k.name);
    Pair p;
    constexpr size_t kBytes = 64 * 1024;
    // a's memory: the exposed middle of a larger buffer, so an access past
    // the end would land in bytes we check.
    std::vector<std::byte> amem(3 * kBytes);
    fill(amem, 1);
    const std::vector<std::byte> before = amem;
    RemoteSegment seg = expose(p.a, reg(p.a, amem), kBytes, kBytes, k.access);
    if (k.revoke_first) REQUIRE(p.a.link->revoke(seg, 1));
    if (k.forge_rkey != 0) seg.rkey = k.forge_rkey;
    seg.length += k.forge_extra;
    std::vector<std::byte> bmem(seg.length);
    fill(bmem, 2);
    const BulkRegistration breg = reg(p.b, bmem);
    const Status st = k.write ? p.b.link->write(breg, 0, seg, 0, seg.length, 42)
                              : p.b.link->read(breg, 0, seg, 0, seg.length, 42);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    REQUIRE(p.pump([&] { return p.a.has_link_down() && p.b.has_link_down(); }));
    CHECK_MESSAGE(p.a.link->down_reason().find(k.reason) != std::string::npos, p.a.link->down_reason());
    if (k.write && k.forge_extra != 0) {
      // A write is checked chunk by chunk, so the chunks that lie inside
      // the exposure may land before the one that runs past its end fails
      // the link (as RDMA WRITEs before a failing one do): nothing outside
      // the exposure changes, and inside it is b's bytes up to a chunk
      // edge, a's after.
      CHECK(std::equal(amem.begin(), amem.begin() + kBytes, before.begin()));
      CHECK(std::equal(amem.begin() + 2 * kBytes, amem.end(), before.begin() + 2 * kBytes));
      size_t landed = 0;
      while (landed < kBytes && amem[kBytes + landed] == bmem[landed]) ++landed;
      landed -= landed % kBulkChunkBytes;
      CHECK(std::equal(amem.begin() + kBytes + landed, amem.begin() + 2 * kBytes, before.begin() + kBytes + landed));
    } else {
      CHECK(amem == before);
    }
    // b's read never completed OK: it failed with the link.
    if (!k.write) {
      REQUIRE(find_done(p.b, 42) != nullptr);
      CHECK(find_done(p.b, 42)->bulk_status == static_cast<uint16_t>(StatusCode::kUnavailable));
      CHECK(mismatch(bmem, 2) == -1);
    }
  }
}

TEST_CASE("shm bulk: a revoke while serving ends the peer's read UNAVAILABLE; the link serves on") {
  Pair p;
  constexpr size_t kBytes = 16 << 20;
  std::vector<std::byte> src(kBytes), dst(kBytes, std::byte{0});
  fill(src, 3);
  const RemoteSegment in = expose(p.a, reg(p.a, src), 0, kBytes, BulkAccess::kRemoteRead);
  REQUIRE(p.b.link->read(reg(p.b, dst), 0, in, 0, kBytes, 8).ok());
  REQUIRE(p.pump([&] { return p.a.link->shm_stats().bulk_bytes_sent >= 2 * kBulkChunkBytes; }));
  REQUIRE(p.a.link->revoke(in, 1));  // at once: nothing of the range is in flight
  const uint64_t served = p.a.link->shm_stats().bulk_bytes_sent;
  REQUIRE(p.pump([&] { return find_done(p.b, 8) != nullptr; }));
  CHECK(find_done(p.b, 8)->bulk_status == static_cast<uint16_t>(StatusCode::kUnavailable));
  CHECK(served < kBytes);
  CHECK(p.a.link->shm_stats().bulk_bytes_sent == served);  // nothing after the revoke
  // What came before the revoke is in place; nothing after it.
  CHECK(mismatch(dst, 3, 0, served) == -1);
  CHECK(std::all_of(dst.begin() + static_cast<ptrdiff_t>(served), dst.end(),
                    [](std::byte x) { return x == std::byte{0}; }));
  Pair::control(p.b, 11);
  Pair::control(p.a, 12);
  REQUIRE(p.pump([&] { return has_control(p.a, 11) && has_control(p.b, 12); }));
  CHECK_FALSE(p.a.link->down());
  CHECK_FALSE(p.b.link->down());
}

TEST_CASE("shm bulk: a failed link ends its reads and writes UNAVAILABLE before its kLinkDown") {
  Pair p;
  // The write is larger than the staging area, so it cannot finish without
  // the peer consuming.
  constexpr size_t kBytes = 2 * kStagingBytes;
  std::vector<std::byte> src(kBytes), dst(kBytes);
  fill(src, 4);
  const RemoteSegment in = expose(p.a, reg(p.a, src), 0, src.size(), BulkAccess::kRemoteRead);
  const RemoteSegment out = expose(p.a, reg(p.a, dst), 0, dst.size(), BulkAccess::kRemoteWrite);
  std::vector<std::byte> bmem(kBytes);
  const BulkRegistration breg = reg(p.b, bmem);
  REQUIRE(p.b.link->read(breg, 0, in, 0, bmem.size(), 1).ok());
  REQUIRE(p.b.link->write(breg, 0, out, 0, bmem.size(), 2).ok());
  p.a.link.reset();  // the client goes away before serving anything
  REQUIRE(pump_until({&p.b}, [&] { return p.b.has_link_down(); }));
  const size_t down = index_of(p.b, CKind::kLinkDown);
  for (const uint64_t t : {uint64_t{1}, uint64_t{2}}) {
    CAPTURE(t);
    const size_t i = index_of(p.b, CKind::kBulkDone, t);
    REQUIRE(i != SIZE_MAX);
    CHECK(i < down);
    // The write staged what fit, never all of it.
    CHECK(p.b.got[i].bulk_status == static_cast<uint16_t>(StatusCode::kUnavailable));
  }
  CHECK(p.b.link->read(breg, 0, in, 0, 1, 3).code() == StatusCode::kUnavailable);
}

TEST_CASE("shm bulk: a peer that consumes no staged chunk is failed after peer_timeout_ms") {
  Config config;
  config.peer_timeout_ms = 300;
  End hub(config);
  RawPeer raw = connect_raw(hub, kGeo);
  hub.attach(kGeo);
  // The raw peer "exposed" key 1 for writing; it never consumes anything.
  std::vector<std::byte> mem(4 * kStagingBytes);
  const BulkRegistration r = reg(hub, mem);
  REQUIRE(hub.link->write(r, 0, RemoteSegment{0, mem.size(), 1}, 0, mem.size(), 6).ok());
  const auto t0 = Clock::now();
  REQUIRE(pump_until({&hub}, [&] { return hub.has_link_down(); }));
  const auto waited = Clock::now() - t0;
  CHECK_MESSAGE(hub.link->down_reason().find("consumed no bulk data") != std::string::npos,
                hub.link->down_reason());
  CHECK(waited >= 300ms);
  // It staged what fit, then waited.
  CHECK(hub.link->shm_stats().bulk_bytes_sent == kStagingBytes);
  const size_t i = index_of(hub, CKind::kBulkDone, 6);
  REQUIRE(i != SIZE_MAX);
  CHECK(i < index_of(hub, CKind::kLinkDown));
  CHECK(hub.got[i].bulk_status == static_cast<uint16_t>(StatusCode::kUnavailable));
}

TEST_CASE("shm bulk: hostile bulk descriptors close only their link") {
  // hub reads 1 MiB from the raw peer's key 1 (tag 1 on the wire), or
  // exposes 64 KiB for writing as key 1; the raw peer then misbehaves.
  struct Case {
    const char* name;
    bool hub_reads;
    std::function<void(RawPeer&)> act;
    const char* reason;
  };
  auto read_data = [](RawPeer& p, uint64_t tag, uint32_t status, uint64_t addr, uint32_t offset,
                      uint32_t length) {
    Descriptor d{};
    d.lane = static_cast<uint32_t>(DescLane::kBulkReadData);
    d.offset = offset;
    d.length = length;
    std::memcpy(d.payload, &tag, 8);
    std::memcpy(d.payload + 8, &status, 4);
    std::memcpy(d.payload + 16, &addr, 8);
    p.put_bulk(d);
  };
  auto write_data = [](RawPeer& p, uint32_t rkey, uint64_t addr, uint32_t offset, uint32_t length) {
    Descriptor d{};
    d.lane = static_cast<uint32_t>(DescLane::kBulkWriteData);
    d.offset = offset;
    d.length = length;
    std::memcpy(d.payload, &rkey, 4);
    std::memcpy(d.payload + 8, &addr, 8);
    p.put_bulk(d);
  };
  auto read_request = [](RawPeer& p, uint64_t tag, uint32_t rkey, uint64_t addr, uint64_t length) {
    Descriptor d{};
    d.lane = static_cast<uint32_t>(DescLane::kBulkReadRequest);
    std::memcpy(d.payload, &tag, 8);
    std::memcpy(d.payload + 8, &rkey, 4);
    std::memcpy(d.payload + 16, &addr, 8);
    std::memcpy(d.payload + 24, &length, 8);
    p.put_bulk(d);
  };
  const std::vector<Case> cases = {
      {"read data for a read never asked", true,
       [&](RawPeer& p) { read_data(p, 77, 0, 0, 0, 4096); }, "unknown read 77"},
      {"read data outside the staging area", true,
       [&](RawPeer& p) { read_data(p, 1, 0, 0, static_cast<uint32_t>(kStagingBytes) - 100, 4096); },
       "staging offset"},
      {"read data chunk larger than a chunk", true,
       [&](RawPeer& p) { read_data(p, 1, 0, 0, 0, kBulkChunkBytes + 1); }, "chunks are 1.."},
      {"read data out of order", true, [&](RawPeer& p) { read_data(p, 1, 0, 8192, 0, 4096); },
       "out of order"},
      {"read data beyond the read", true,
       [&](RawPeer& p) {
         for (uint64_t at = 0; at < (1 << 20); at += kBulkChunkBytes) read_data(p, 1, 0, at, 0, kBulkChunkBytes);
         read_data(p, 1, 0, 1 << 20, 0, 1);
       },
       "unknown read 1"},
      {"a failed read that carries data", true, [&](RawPeer& p) { read_data(p, 1, 14, 0, 0, 16); },
       "failed read with data"},
      {"write data into a key never exposed", false, [&](RawPeer& p) { write_data(p, 5, 0, 0, 16); },
       "never exposed"},
      {"write data past the exposure", false,
       [&](RawPeer& p) { write_data(p, 1, 65536 - 8, 0, 16); }, "which exposes"},
      {"write data with a huge address (wraps a 64-bit sum)", false,
       [&](RawPeer& p) { write_data(p, 1, ~uint64_t{0} - 4, 0, 16); }, "which exposes"},
      {"a bulk descriptor in the slot ring", false,
       [&](RawPeer& p) {
         Descriptor d{};
         d.lane = static_cast<uint32_t>(DescLane::kBulkWriteData);
         d.length = 16;
         p.put(d);
       },
       "in the slot ring"},
      {"a slot descriptor in the bulk ring", false,
       [&](RawPeer& p) {
         Descriptor d{};
         d.lane = static_cast<uint32_t>(DescLane::kSlot);
         d.length = 16;
         p.put_bulk(d);
       },
       "unknown lane"},
      {"read requests against a write-only exposure", false,
       [&](RawPeer& p) { read_request(p, 1, 1, 0, 16); }, "exposed for writing only"},
  };
  for (const Case& k : cases) {
    CAPTURE(k.name);
    End hub;
    RawPeer raw = connect_raw(hub, kGeo);
    hub.attach(kGeo);
    std::vector<std::byte> mem(1 << 20, std::byte{0});
    const BulkRegistration r = reg(hub, mem);
    if (k.hub_reads) {
      REQUIRE(hub.link->read(r, 0, RemoteSegment{0, mem.size(), 1}, 0, mem.size(), 9).ok());
      hub.poll_once();  // publishes the READ_REQ
    } else {
      const RemoteSegment s = expose(hub, r, 0, 65536, BulkAccess::kRemoteWrite);
      REQUIRE(s.rkey == 1);
    }
    k.act(raw);
    REQUIRE(pump_until({&hub}, [&] { return hub.has_link_down(); }));
    CHECK_MESSAGE(hub.link->down_reason().find(k.reason) != std::string::npos, hub.link->down_reason());
    if (!k.hub_reads) CHECK(std::all_of(mem.begin(), mem.end(), [](std::byte x) { return x == std::byte{0}; }));
  }
}

TEST_CASE("shm bulk: more than kMaxBulkReads read requests from the peer fail the link") {
  End hub;
  RawPeer raw = connect_raw(hub, kGeo);
  hub.attach(kGeo);
  std::vector<std::byte> mem(1 << 20);
  const RemoteSegment s = expose(hub, reg(hub, mem), 0, mem.size(), BulkAccess::kRemoteRead);
  for (uint64_t tag = 1; tag <= ShmLink::kMaxBulkReads + 1; ++tag) {
    Descriptor d{};
    d.lane = static_cast<uint32_t>(DescLane::kBulkReadRequest);
    const uint64_t addr = 0, length = mem.size();
    std::memcpy(d.payload, &tag, 8);
    std::memcpy(d.payload + 8, &s.rkey, 4);
    std::memcpy(d.payload + 16, &addr, 8);
    std::memcpy(d.payload + 24, &length, 8);
    raw.put_bulk(d);
  }
  REQUIRE(pump_until({&hub}, [&] { return hub.has_link_down(); }));
  CHECK_MESSAGE(hub.link->down_reason().find("bulk reads outstanding") != std::string::npos,
                hub.link->down_reason());
}

TEST_CASE("shm bulk: dma-buf memory is refused with a reason, host memory registers") {
  Pair p;
  std::vector<std::byte> m(4096);
  auto r = p.a.link->register_bulk(BulkSource{m.data(), m.size(), 3, 0});
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kUnimplemented);
  CHECK(r.status().message().find("dma-buf") != std::string::npos);
  CHECK(p.a.link->register_bulk(BulkSource{nullptr, 0}).status().code() == StatusCode::kInvalidArgument);
  CHECK(p.a.link->supports_bulk());
  CHECK(p.a.link->bulk_domain() == p.b.link->bulk_domain());
}

TEST_CASE("shm bulk: a bulk head claiming descriptors that are not there fails the link before sleep") {
  // As for the slot ring: the head is read only before sleeping, and a
  // lying one must not keep the loop awake forever.
  for (const uint64_t claim : {uint64_t{1}, uint64_t{kBulkDescCount} + 5}) {
    CAPTURE(claim);
    End hub;
    RawPeer raw = connect_raw(hub, kGeo);
    hub.attach(kGeo);
    CHECK(hub.transport.prepare_sleep());  // honest: nothing there, it may sleep
    hub.transport.poll(std::span<Completion>{});  // withdraws the announcement
    std::atomic_ref<uint64_t>(raw.ctl()->bulk_head).store(claim, std::memory_order_seq_cst);
    CHECK_FALSE(hub.transport.prepare_sleep());
    REQUIRE(pump_until({&hub}, [&] { return hub.has_link_down(); }));
    CHECK_MESSAGE(hub.link->down_reason().find("claims descriptors") != std::string::npos,
                  hub.link->down_reason());
  }
}

TEST_CASE("shm bulk: what a peer staged before it exited is delivered before the link goes down") {
  End hub;
  RawPeer raw = connect_raw(hub, kGeo);
  hub.attach(kGeo);
  constexpr uint32_t kChunks = 4;  // more than one poll copies
  std::vector<std::byte> mem(size_t{kChunks} * kBulkChunkBytes, std::byte{0});
  const RemoteSegment s = expose(hub, reg(hub, mem), 0, mem.size(), BulkAccess::kRemoteWrite);
  std::byte* staging = raw.own.map.base() + raw.own.layout.staging_offset;
  for (uint32_t i = 0; i < kChunks; ++i) {
    std::memset(staging + size_t{i} * kBulkChunkBytes, 0x30 + static_cast<int>(i), kBulkChunkBytes);
    Descriptor d{};
    d.lane = static_cast<uint32_t>(DescLane::kBulkWriteData);
    d.offset = i * kBulkChunkBytes;
    d.length = kBulkChunkBytes;
    const uint64_t addr = uint64_t{i} * kBulkChunkBytes;
    std::memcpy(d.payload, &s.rkey, 4);
    std::memcpy(d.payload + 8, &addr, 8);
    raw.put_bulk(d);
  }
  raw.sock.reset();  // the peer exits
  // The hang-up is seen first (a loop looks before it sleeps), then polls.
  CHECK_FALSE(hub.transport.prepare_sleep());
  REQUIRE(pump_until({&hub}, [&] { return hub.has_link_down(); }));
  CHECK_MESSAGE(hub.link->down_reason().find("peer closed") != std::string::npos, hub.link->down_reason());
  for (uint32_t i = 0; i < kChunks; ++i) {
    CAPTURE(i);
    CHECK(mem[size_t{i} * kBulkChunkBytes] == std::byte(0x30 + i));
    CHECK(mem[size_t{i + 1} * kBulkChunkBytes - 1] == std::byte(0x30 + i));
  }
}

TEST_CASE("shm bulk: after bulk bytes moved a loop keeps polling kBulkSpin before it may sleep") {
  Pair p;
  // Idle links may sleep at once.
  CHECK(p.a.transport.prepare_sleep());
  CHECK(p.b.transport.prepare_sleep());
  p.a.transport.poll(std::span<Completion>{});  // withdraws the announcements
  p.b.transport.poll(std::span<Completion>{});
  std::vector<std::byte> src(1 << 20), dst(1 << 20);
  fill(src, 6);
  const RemoteSegment in = expose(p.a, reg(p.a, src), 0, src.size(), BulkAccess::kRemoteRead);
  REQUIRE(p.b.link->read(reg(p.b, dst), 0, in, 0, dst.size(), 1).ok());
  REQUIRE(p.pump([&] { return find_done(p.b, 1) != nullptr; }));
  // Both moved bulk bytes just now: neither sleeps yet (a chunk of the
  // next transfer is likely one poll of the peer away) ...
  const auto t0 = Clock::now();
  CHECK_FALSE(p.a.transport.prepare_sleep());
  CHECK_FALSE(p.b.transport.prepare_sleep());
  // ... and both may once kBulkSpin has passed with nothing more.
  REQUIRE(test_wait([&] { return p.b.transport.prepare_sleep(); }));
  CHECK(Clock::now() - t0 >= kBulkSpin);
  REQUIRE(test_wait([&] { return p.a.transport.prepare_sleep(); }));
}
