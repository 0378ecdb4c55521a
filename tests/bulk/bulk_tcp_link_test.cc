// TcpLink's bulk operations (transport.h "Bulk transfers") over
// real loopback connections, both ends in this thread (tcp_world.h).
#include <algorithm>
#include <deque>

#include "tcp_world.h"

namespace {

using namespace tcp_world;

TEST_CASE("read pulls an exposed range into local memory, every byte") {
  for (size_t size : {size_t{1} << 20, (size_t{64} << 20) + 1}) {
    CAPTURE(size);
    World w;
    End *owner, *reader;
    std::tie(owner, reader) = w.connect();
    std::vector<std::byte> src = pattern(size, 1);
    std::vector<std::byte> dst(size, std::byte{0});
    BulkRegistration sreg = reg(*owner->link, src);
    BulkRegistration dreg = reg(*reader->link, dst);
    auto seg = owner->link->expose(sreg, 0, size, BulkAccess::kRemoteRead);
    REQUIRE(seg.ok());
    REQUIRE(reader->link->read(dreg, 0, seg.value(), 0, size, 7).ok());
    REQUIRE(w.pump_until([&] { return reader->find(CKind::kBulkDone, 7) || reader->down(); }));
    ok_done(*reader, 7);
    check_equal(dst, src);
    CHECK(owner->link->revoke(seg.value(), 8));
    CHECK(owner->link->exposures() == 0);
    CHECK_FALSE(owner->down());
  }
}

TEST_CASE("write pushes local memory into an exposed range; a slot frame posted after its kBulkDone follows the bytes") {
  for (size_t size : {size_t{1} << 20, (size_t{64} << 20) + 1}) {
    CAPTURE(size);
    World w;
    End *owner, *writer;
    std::tie(owner, writer) = w.connect();
    std::vector<std::byte> src = pattern(size, 2);
    // The exposure is offset into a larger buffer: guard bytes either side
    // must stay untouched.
    std::vector<std::byte> dst(size + 200, std::byte{0x5A});
    BulkRegistration sreg = reg(*writer->link, src);
    BulkRegistration dreg = reg(*owner->link, dst);
    auto seg = owner->link->expose(dreg, 100, size, BulkAccess::kRemoteWrite);
    REQUIRE(seg.ok());
    owner->link->arm(3);
    REQUIRE(writer->link->write(sreg, 0, seg.value(), 0, size, 9).ok());
    // The "reply", posted once the write is done (as the core does): its
    // arrival means every written byte is in place.
    REQUIRE(w.pump_until([&] { return writer->find(CKind::kBulkDone, 9) || writer->down(); }));
    ok_done(*writer, 9);
    std::vector<std::byte> msg(64, std::byte{0x11});
    Outgoing o{msg.data(), 64, core::make_imm(3, 1), Delivery::kSlot};
    writer->link->post({&o, 1});
    bool checked = false;
    REQUIRE(w.pump_until([&] {
      if (!checked && owner->find(CKind::kMessage)) {
        checked = true;
        std::vector<std::byte> mid(dst.begin() + 100, dst.begin() + 100 + static_cast<ptrdiff_t>(size));
        check_equal(mid, src);
      }
      return checked || owner->down() || writer->down();
    }));
    for (size_t i = 0; i < 100; ++i) REQUIRE(dst[i] == std::byte{0x5A});
    for (size_t i = 100 + size; i < dst.size(); ++i) REQUIRE(dst[i] == std::byte{0x5A});
  }
}

// A violation fails the link it came through, and nothing else: a second
// link between the same two transports still moves data afterwards.
void expect_violation(World& w, End& owner, End& peer, const char* reason_part) {
  REQUIRE(w.pump_until([&] { return owner.down() && peer.down(); }));
  CHECK_MESSAGE(owner.link->down_reason().find(reason_part) != std::string::npos,
                owner.link->down_reason());
  End *o2, *p2;
  std::tie(o2, p2) = w.connect();
  std::vector<std::byte> src = pattern(300000, 5), dst(300000);
  BulkRegistration sreg = reg(*o2->link, src), dreg = reg(*p2->link, dst);
  auto seg = o2->link->expose(sreg, 0, src.size(), BulkAccess::kRemoteRead);
  REQUIRE(seg.ok());
  REQUIRE(p2->link->read(dreg, 0, seg.value(), 0, src.size(), 1).ok());
  REQUIRE(w.pump_until([&] { return p2->find(CKind::kBulkDone, 1) || p2->down(); }));
  ok_done(*p2, 1);
  check_equal(dst, src);
}

TEST_CASE("a revoked key, the wrong access or a range beyond the exposure fail that link only") {
  World w;
  End *owner, *peer;
  std::tie(owner, peer) = w.connect();
  std::vector<std::byte> mem = pattern(1 << 20, 3), local(2 << 20, std::byte{0});
  const std::vector<std::byte> before = mem;
  BulkRegistration oreg = reg(*owner->link, mem), preg = reg(*peer->link, local);

  SUBCASE("revoked key") {
    auto seg = owner->link->expose(oreg, 0, mem.size(), BulkAccess::kRemoteRead);
    REQUIRE(seg.ok());
    CHECK(owner->link->revoke(seg.value(), 1));
    REQUIRE(peer->link->read(preg, 0, seg.value(), 0, 4096, 2).ok());
    expect_violation(w, *owner, *peer, "revoked");
    // The read ended (failed) before the link did.
    const Completion* d = peer->find(CKind::kBulkDone, 2);
    REQUIRE(d != nullptr);
    CHECK(d->bulk_status != 0);
  }
  SUBCASE("write through a read-only exposure") {
    auto seg = owner->link->expose(oreg, 0, mem.size(), BulkAccess::kRemoteRead);
    REQUIRE(seg.ok());
    REQUIRE(peer->link->write(preg, 0, seg.value(), 0, 4096, 2).ok());
    expect_violation(w, *owner, *peer, "reading only");
    check_equal(mem, before);
  }
  SUBCASE("read through a write-only exposure") {
    auto seg = owner->link->expose(oreg, 0, mem.size(), BulkAccess::kRemoteWrite);
    REQUIRE(seg.ok());
    REQUIRE(peer->link->read(preg, 0, seg.value(), 0, 4096, 2).ok());
    expect_violation(w, *owner, *peer, "writing only");
  }
  SUBCASE("beyond the exposed range") {
    auto seg = owner->link->expose(oreg, 4096, 8192, BulkAccess::kRemoteWrite);
    REQUIRE(seg.ok());
    RemoteSegment forged = seg.value();
    forged.length = 1 << 20;  // the peer claims more than it was given
    REQUIRE(peer->link->write(preg, 0, forged, 4096, 8192, 2).ok());
    expect_violation(w, *owner, *peer, "which exposes 8192");
    check_equal(mem, before);
  }
  SUBCASE("a key never exposed") {
    REQUIRE(peer->link->read(preg, 0, RemoteSegment{0, 4096, 77}, 0, 4096, 2).ok());
    expect_violation(w, *owner, *peer, "never exposed");
  }
}

TEST_CASE("slot frames posted while a large read is served go out between its chunks") {
  World w;
  End *owner, *reader;
  std::tie(owner, reader) = w.connect();
  const size_t size = size_t{64} << 20;
  std::vector<std::byte> src = pattern(size, 4), dst(size);
  BulkRegistration sreg = reg(*owner->link, src), dreg = reg(*reader->link, dst);
  auto seg = owner->link->expose(sreg, 0, size, BulkAccess::kRemoteRead);
  REQUIRE(seg.ok());
  REQUIRE(reader->link->read(dreg, 0, seg.value(), 0, size, 5).ok());
  // Until the owner has begun serving (its output is queued), then a slot
  // frame: with every chunk queued up front it would arrive after the data.
  REQUIRE(w.pump_until([&] { return owner->link->queued_bytes() > 0 || reader->down(); }));
  std::vector<std::byte> msg(64, std::byte{0x22});
  reader->link->arm(1);
  Outgoing o{msg.data(), 64, core::make_imm(1, 1), Delivery::kSlot};
  owner->link->post({&o, 1});
  REQUIRE(w.pump_until([&] { return reader->find(CKind::kBulkDone, 5) || reader->down(); }));
  ok_done(*reader, 5);
  size_t msg_at = ~size_t{0}, done_at = ~size_t{0};
  for (size_t i = 0; i < reader->got.size(); ++i) {
    if (reader->got[i].kind == CKind::kMessage && msg_at == ~size_t{0}) msg_at = i;
    if (reader->got[i].kind == CKind::kBulkDone) done_at = i;
  }
  REQUIRE(msg_at != ~size_t{0});
  CHECK(msg_at < done_at);
  check_equal(dst, src);
}

TEST_CASE("slot frames posted while a large write is under way go out between its chunks") {
  World w;
  End *owner, *writer;
  std::tie(owner, writer) = w.connect();
  const size_t size = size_t{64} << 20;
  std::vector<std::byte> src = pattern(size, 6), dst(size);
  BulkRegistration sreg = reg(*writer->link, src), dreg = reg(*owner->link, dst);
  auto seg = owner->link->expose(dreg, 0, size, BulkAccess::kRemoteWrite);
  REQUIRE(seg.ok());
  REQUIRE(writer->link->write(sreg, 0, seg.value(), 0, size, 6).ok());
  // An unrelated message posted right after: with every chunk queued up
  // front (as before) it would reach the owner after all 64 MiB.
  std::vector<std::byte> msg(64, std::byte{0x33});
  owner->link->arm(2);
  Outgoing o{msg.data(), 64, core::make_imm(2, 1), Delivery::kSlot};
  writer->link->post({&o, 1});
  uint64_t landed_when_message = ~uint64_t{0};
  REQUIRE(w.pump_until([&] {
    if (landed_when_message == ~uint64_t{0} && owner->find(CKind::kMessage)) {
      landed_when_message = 0;
      for (size_t i = 0; i < size; i += 4096) landed_when_message += dst[i] == src[i] ? 1 : 0;
    }
    return writer->find(CKind::kBulkDone, 6) || writer->down();
  }));
  ok_done(*writer, 6);
  REQUIRE(w.pump_until([&] { return owner->find(CKind::kMessage) || owner->down(); }));
  // Pages (4 KiB samples) already written when the message arrived: far
  // fewer than all of them (a few chunks at most; a sample may match by
  // chance, 1 in 256).
  CHECK(landed_when_message < (size / 4096) / 2);
  REQUIRE(w.pump_until([&] { return std::equal(dst.begin(), dst.end(), src.begin()) || owner->down(); }));
  check_equal(dst, src);
}

TEST_CASE("a slot frame goes ahead of bulk data frames queued before it") {
  // The owner writes 64 MiB into the peer and serves a 64 KiB read for it
  // at the same time, while the peer reads nothing: the owner's socket
  // fills, and the served chunk waits in the owner's queue behind the
  // write's chunk.  A slot frame posted then must pass the served chunk:
  // the peer sees the message before its read completes.  (One queue in
  // posting order delivers the read's data first.)  Small fixed socket
  // buffers, and write chunks of 1 MiB (SLOTRPC_TCP_BULK_SLICE): the write
  // chunk in progress when the read arrives is far from done, and stays so
  // while the peer reads nothing.
  Config config;
  config.tcp_bulk_slice = TcpTransport::kBulkChunkBytes;
  World w(config);
  End *owner, *peer;
  std::tie(owner, peer) = w.connect(true);
  const size_t big = size_t{64} << 20, small = 64 * 1024;
  std::vector<std::byte> wsrc = pattern(big, 7), wdst(big);
  std::vector<std::byte> rsrc = pattern(small, 8), rdst(small);
  BulkRegistration wsreg = reg(*owner->link, wsrc), wdreg = reg(*peer->link, wdst);
  BulkRegistration rsreg = reg(*owner->link, rsrc), rdreg = reg(*peer->link, rdst);
  auto wseg = peer->link->expose(wdreg, 0, big, BulkAccess::kRemoteWrite);
  auto rseg = owner->link->expose(rsreg, 0, small, BulkAccess::kRemoteRead);
  REQUIRE(wseg.ok());
  REQUIRE(rseg.ok());
  REQUIRE(owner->link->write(wsreg, 0, wseg.value(), 0, big, 1).ok());
  // Only the owner is polled until its socket is full: its queue has not
  // moved for many turns.
  const auto deadline = Clock::now() + kTimeout;
  uint64_t last = 0;
  for (int still = 0; still < 200 && !owner->down() && Clock::now() < deadline;) {
    w.poll_one(w.a);
    const uint64_t q = owner->link->queued_bytes();
    still = q != 0 && q == last ? still + 1 : 0;
    last = q;
  }
  REQUIRE(owner->link->queued_bytes() > 0);
  // read() sends its request at once; the owner queues the served chunk
  // behind the write's, with no room in the socket for either.
  REQUIRE(peer->link->read(rdreg, 0, rseg.value(), 0, small, 2).ok());
  while (owner->link->bulk_serving() == 0 && !owner->down() && Clock::now() < deadline) w.poll_one(w.a);
  REQUIRE(owner->link->bulk_serving() == 1);
  std::vector<std::byte> msg(64, std::byte{0x44});
  peer->link->arm(4);
  Outgoing o{msg.data(), 64, core::make_imm(4, 1), Delivery::kSlot};
  owner->link->post({&o, 1});
  REQUIRE(w.pump_until([&] { return (peer->find(CKind::kBulkDone, 2) && owner->find(CKind::kBulkDone, 1)) || peer->down(); }));
  ok_done(*peer, 2);
  ok_done(*owner, 1);
  size_t msg_at = ~size_t{0}, read_at = ~size_t{0};
  for (size_t i = 0; i < peer->got.size(); ++i) {
    if (peer->got[i].kind == CKind::kMessage) msg_at = std::min(msg_at, i);
    if (peer->got[i].kind == CKind::kBulkDone && peer->got[i].bulk_token == 2) read_at = i;
  }
  REQUIRE(msg_at != ~size_t{0});
  CHECK(msg_at < read_at);
  check_equal(rdst, rsrc);
  REQUIRE(w.pump_until([&] { return std::equal(wdst.begin(), wdst.end(), wsrc.begin()) || peer->down(); }));
  check_equal(wdst, wsrc);
}

TEST_CASE("while bulk data flows the socket keeps little of it unsent; afterwards its setting is back") {
  // Both the default slice and another one (SLOTRPC_TCP_BULK_SLICE): the
  // low-water mark is two slices while the frames are (a link whose
  // frames grow takes it along: the adaptive-slices case below).
  Config config;
  SUBCASE("default slice") {}
  SUBCASE("16 KiB slices") { config.tcp_bulk_slice = 16 * 1024; }
  World w(config);
  REQUIRE(w.b.bulk_slice() == config.tcp_bulk_slice);
  REQUIRE(w.b.bulk_notsent_lowat() == 2 * static_cast<int>(config.tcp_bulk_slice));
  End *owner, *writer;
  std::tie(owner, writer) = w.connect();
  const int before = writer->link->notsent_lowat();  // 0: the sysctl's default
  REQUIRE(before >= 0);
  REQUIRE(before != w.b.bulk_notsent_lowat());
  const size_t size = size_t{16} << 20;
  std::vector<std::byte> src = pattern(size, 9), dst(size);
  BulkRegistration sreg = reg(*writer->link, src), dreg = reg(*owner->link, dst);
  auto seg = owner->link->expose(dreg, 0, size, BulkAccess::kRemoteWrite);
  REQUIRE(seg.ok());
  REQUIRE(writer->link->write(sreg, 0, seg.value(), 0, size, 3).ok());
  // The first frame of a transfer is one slice; the next ones may have
  // grown already (the mark follows them, up to two 1 MiB frames).
  const int mark = writer->link->notsent_lowat();
  CHECK(mark >= w.b.bulk_notsent_lowat());
  CHECK(mark <= 2 * static_cast<int>(TcpTransport::kBulkChunkBytes));
  CHECK(owner->link->notsent_lowat() == before);  // the receiving side sends no bulk data
  REQUIRE(w.pump_until([&] { return writer->find(CKind::kBulkDone, 3) || writer->down(); }));
  ok_done(*writer, 3);
  CHECK(writer->link->notsent_lowat() == before);
  REQUIRE(w.pump_until([&] { return std::equal(dst.begin(), dst.end(), src.begin()) || owner->down(); }));
  check_equal(dst, src);
}

// Adaptive slices (TcpLink::next_slice): WRITE_DATA frames a write of
// `size` bytes took (LinkStats::bulk_requests counts one per frame).
// `during`, if set, runs once right after the write is started, before any
// of it has been sent.
uint64_t write_frames(World& w, End& owner, End& writer, size_t size, uint64_t token,
                      const std::function<void()>& during = {}) {
  std::vector<std::byte> src = pattern(size, static_cast<uint32_t>(token));
  // Bytes land in order: once the last one is there, all are (checked
  // once, not on every turn of the pump).
  std::vector<std::byte> dst(size, ~src.back());
  BulkRegistration sreg = reg(*writer.link, src), dreg = reg(*owner.link, dst);
  auto seg = owner.link->expose(dreg, 0, size, BulkAccess::kRemoteWrite);
  REQUIRE(seg.ok());
  const uint64_t before = writer.link->stats().bulk_requests;
  REQUIRE(writer.link->write(sreg, 0, seg.value(), 0, size, token).ok());
  if (during) during();
  REQUIRE(w.pump_until([&] { return writer.find(CKind::kBulkDone, token) || writer.down(); }));
  ok_done(writer, token);
  REQUIRE(w.pump_until([&] { return dst.back() == src.back() || owner.down(); }));
  check_equal(dst, src);
  CHECK(owner.link->revoke(seg.value(), token + 1000));
  return writer.link->stats().bulk_requests - before;
}

TEST_CASE("bulk data alone on a connection grows its frames to 1 MiB; a slot frame during a transfer keeps that one and the next at tcp_bulk_slice") {
  World w;  // the default slice, 64 KiB
  const uint64_t slice = w.a.bulk_slice();
  REQUIRE(slice == 64 * 1024);
  // Fixed 64 KiB socket buffers: a 1 MiB frame takes many turns to leave,
  // so a slot frame posted (or arriving) right after write() is always
  // seen before the transfer's second frame is sized.
  End *owner, *writer;
  std::tie(owner, writer) = w.connect(true);
  const size_t size = size_t{4} << 20;
  // Alone: 64, 128, 256, 512 KiB, three 1 MiB frames and 64 KiB (8
  // frames, not 64); the next transfer starts at 1 MiB.
  CHECK(write_frames(w, *owner, *writer, size, 1) == 8);
  // The socket's low-water mark is two frames of the grown slice.
  CHECK(write_frames(w, *owner, *writer, size, 2,
                     [&] { CHECK(writer->link->notsent_lowat() == 2 << 20); }) == 4);
  // A slot frame during the transfer, sent or received by the writer's
  // link: every later frame of it is one slice, and so is the next
  // transfer (which saw none), in case the calls go on.
  uint32_t slot = 0;
  // A posted slot body is sent from where it is, maybe after post()
  // returns (behind a bulk frame already started): it lives to the end.
  std::deque<std::vector<std::byte>> bodies;
  auto post = [&](End& from, End& to) {
    std::vector<std::byte>& msg = bodies.emplace_back(64, std::byte{0x66});
    to.link->arm(slot);
    Outgoing o{msg.data(), 64, core::make_imm(slot, 1), Delivery::kSlot};
    from.link->post({&o, 1});
    ++slot;
  };
  SUBCASE("sent") {
    // The first frame was queued by write() at 1 MiB, before the message.
    CHECK(write_frames(w, *owner, *writer, size, 3, [&] { post(*writer, *owner); }) == 1 + (size - (1u << 20)) / slice);
  }
  SUBCASE("received") {
    // The message reaches the writer's link while its first frame goes out.
    CHECK(write_frames(w, *owner, *writer, size, 3, [&] { post(*owner, *writer); }) == 1 + (size - (1u << 20)) / slice);
  }
  CHECK(write_frames(w, *owner, *writer, size, 4,
                     [&] { CHECK(writer->link->notsent_lowat() == w.b.bulk_notsent_lowat()); }) ==
        size / slice);
  // Two transfers without slot frames: growing again, from one slice
  // (128, 256, 512 KiB, three 1 MiB frames and 128 KiB: 7).
  CHECK(write_frames(w, *owner, *writer, size, 5) == 7);
  CHECK(write_frames(w, *owner, *writer, size, 6) == 4);
  // A transfer of one frame with a slot frame beside it: no later frame of
  // its own saw the message, and still the next transfer is one slice.
  CHECK(write_frames(w, *owner, *writer, 1u << 20, 7, [&] { post(*writer, *owner); }) == 1);
  CHECK(write_frames(w, *owner, *writer, size, 8) == size / slice);
  CHECK_FALSE(owner->down());
  CHECK_FALSE(writer->down());
}

TEST_CASE("a slot frame on another session of the loop keeps a transfer's frames at tcp_bulk_slice; a receiver with other sessions on its loop takes a slice per recv") {
  World w;
  const uint64_t slice = w.a.bulk_slice();
  const size_t size = size_t{4} << 20;
  // Receiving alone on its loop: the receiver asks for the rest of each
  // 1 MiB frame, and loopback hands over far more than a slice per recv.
  End *owner, *writer;
  std::tie(owner, writer) = w.connect();
  (void)write_frames(w, *owner, *writer, size, 1);
  CHECK(write_frames(w, *owner, *writer, size, 2) == 4);  // grown
  uint64_t before = owner->link->bulk_recvs();
  CHECK(write_frames(w, *owner, *writer, size, 3) == 4);
  const uint64_t alone = owner->link->bulk_recvs() - before;
  // A second session on the same loops: the receiver now takes at most a
  // slice per recv (so at least size / slice calls) though the frames are
  // still 1 MiB (no call went by).
  End *o2, *w2;
  std::tie(o2, w2) = w.connect();
  before = owner->link->bulk_recvs();
  CHECK(write_frames(w, *owner, *writer, size, 4) == 4);
  const uint64_t shared = owner->link->bulk_recvs() - before;
  CAPTURE(alone);
  CAPTURE(shared);
  CHECK(shared >= size / slice);
  CHECK(alone < size / slice);
  // A call on the other session (posted by the writer's loop, received by
  // the owner's) during a transfer: the writer's link has seen no slot
  // frame of its own, and still its later frames are one slice.  Fixed
  // 64 KiB socket buffers, so that the message is seen before the second
  // frame is sized (as in the case above).
  End *o3, *w3;
  std::tie(o3, w3) = w.connect(true);
  (void)write_frames(w, *o3, *w3, size, 5);
  CHECK(write_frames(w, *o3, *w3, size, 6) == 4);
  std::vector<std::byte> msg(64, std::byte{0x77});  // sent from here, maybe after post() returns
  auto other_call = [&] {
    o2->link->arm(0);
    Outgoing o{msg.data(), 64, core::make_imm(0, 1), Delivery::kSlot};
    w2->link->post({&o, 1});
  };
  CHECK(write_frames(w, *o3, *w3, size, 7, other_call) == 1 + (size - (1u << 20)) / slice);
  REQUIRE(w.pump_until([&] { return o2->find(CKind::kMessage) || o2->down(); }));
  CHECK_FALSE(o2->down());
}

// The first piece of a transfer's first 1 MiB frame, received by `owner`
// in one poll: how many recv calls the owner's link made for bulk data in
// that poll, and how many bytes landed.  `writer` and `owner` must have
// fixed 64 KiB socket buffers (a frame then arrives in pieces) and 1 MiB
// frames (grown); the transfer is finished and checked before returning.
std::pair<uint64_t, size_t> first_piece(World& w, End& owner, End& writer, uint64_t token) {
  const size_t size = size_t{4} << 20;
  std::vector<std::byte> src(size, std::byte{0x11}), dst(size, std::byte{0});
  BulkRegistration sreg = reg(*writer.link, src), dreg = reg(*owner.link, dst);
  auto seg = owner.link->expose(dreg, 0, size, BulkAccess::kRemoteWrite);
  REQUIRE(seg.ok());
  REQUIRE(writer.link->write(sreg, 0, seg.value(), 0, size, token).ok());
  w.poll_one(w.b);  // the writer's loop: as much of the frame as the socket takes
  const uint64_t before = owner.link->bulk_recvs();
  w.poll_one(w.a);  // the owner's loop: one event
  const uint64_t recvs = owner.link->bulk_recvs() - before;
  const size_t landed = static_cast<size_t>(std::count(dst.begin(), dst.end(), std::byte{0x11}));
  REQUIRE(w.pump_until([&] { return writer.find(CKind::kBulkDone, token) || writer.down(); }));
  ok_done(writer, token);
  REQUIRE(w.pump_until([&] { return dst.back() == src.back() || owner.down(); }));
  check_equal(dst, src);
  CHECK(owner.link->revoke(seg.value(), token + 1000));
  return {recvs, landed};
}

TEST_CASE("a short read of bulk data reads on at once while the link has its loop to itself, not while it shares it") {
  World w;
  const uint64_t slice = w.a.bulk_slice();
  End *owner, *writer;
  std::tie(owner, writer) = w.connect(true);  // the owner is on w.a, the writer on w.b
  const size_t size = size_t{4} << 20;
  (void)write_frames(w, *owner, *writer, size, 1);
  REQUIRE(write_frames(w, *owner, *writer, size, 2) == 4);  // 1 MiB frames from here on
  // Alone: a recv that came back short (part of a 1 MiB frame) is
  // followed at once by another, up to the event's budget of 4.  Here the
  // next one finds what the sender's socket released when the first
  // opened the window (loopback sends it at once), or nothing; in a
  // transfer between two threads it finds the next 64 KiB the sender
  // copied meanwhile, where going round the loop would cost a turn and an
  // epoll_wait for each.
  auto [alone, landed] = first_piece(w, *owner, *writer, 3);
  CAPTURE(landed);
  REQUIRE(landed > 0);
  REQUIRE(landed < (size_t{1} << 20));
  CHECK(alone >= 2);
  CHECK(alone <= 4);
  // Sharing the loop with another session: one slice per recv, and the
  // event ends at the first short one (the other session's calls wait
  // for each copy), so exactly one recv per slice that landed, or part of one.
  End *o2, *w2;
  std::tie(o2, w2) = w.connect();
  auto [shared, landed2] = first_piece(w, *owner, *writer, 4);
  CAPTURE(landed2);
  REQUIRE(landed2 > 0);
  REQUIRE(landed2 % slice != 0);  // the last recv was short, not a full slice
  CHECK(shared == (landed2 + slice - 1) / slice);
  CHECK_FALSE(o2->down());
}

TEST_CASE("revoke during a served read: the reader's read fails, the link goes on") {
  World w;
  End *owner, *reader;
  std::tie(owner, reader) = w.connect();
  const size_t size = size_t{16} << 20;
  std::vector<std::byte> src = pattern(size, 6), dst(size);
  BulkRegistration sreg = reg(*owner->link, src), dreg = reg(*reader->link, dst);
  auto seg = owner->link->expose(sreg, 0, size, BulkAccess::kRemoteRead);
  REQUIRE(seg.ok());
  REQUIRE(reader->link->read(dreg, 0, seg.value(), 0, size, 5).ok());
  REQUIRE(w.pump_until([&] { return owner->link->queued_bytes() > 0 || owner->down(); }));
  if (!owner->link->revoke(seg.value(), 6))
    REQUIRE(w.pump_until([&] { return owner->find(CKind::kBulkDone, 6) || owner->down(); }));
  REQUIRE(w.pump_until([&] { return reader->find(CKind::kBulkDone, 5) || reader->down(); }));
  const Completion* d = reader->find(CKind::kBulkDone, 5);
  REQUIRE(d != nullptr);
  CHECK(d->bulk_status == static_cast<uint16_t>(StatusCode::kUnavailable));
  CHECK_FALSE(owner->down());
  CHECK_FALSE(reader->down());
  // The same link still carries slot frames.
  owner->link->arm(2);
  std::vector<std::byte> msg(64, std::byte{0x33});
  Outgoing o{msg.data(), 64, core::make_imm(2, 1), Delivery::kSlot};
  reader->link->post({&o, 1});
  REQUIRE(w.pump_until([&] { return owner->find(CKind::kMessage) || owner->down(); }));
  CHECK_FALSE(owner->down());
}

TEST_CASE("dma-buf memory is refused on tcp with a message that says so") {
  World w;
  End *a, *b;
  std::tie(a, b) = w.connect();
  std::vector<std::byte> mem(4096);
  auto r = a->link->register_bulk(BulkSource{mem.data(), mem.size(), 3, 0});
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kUnimplemented);
  CHECK(r.status().message().find("dma-buf") != std::string::npos);
  CHECK(a->link->supports_bulk());
  CHECK(a->link->bulk_domain() == b->link->bulk_domain());
}

}  // namespace
