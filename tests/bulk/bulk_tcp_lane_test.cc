// Bulk lanes (transport/tcp/bulk_lanes.h): a TCP session's second
// connection, moved by a thread of the loop's own, for transfers through
// exposures of at least Config::tcp_bulk_lane bytes.  Both ends in this
// thread (tcp_world.h); the lane threads run beside it.
#include <fcntl.h>
#include <sched.h>

#include <sys/socket.h>

#include <array>
#include <mutex>
#include <thread>

#include "tcp_world.h"

namespace {

using namespace tcp_world;

Config lanes_from(uint32_t bytes) {
  Config c;
  c.tcp_bulk_lane = bytes;
  return c;
}

size_t index_of(const End& e, CKind kind, uint64_t token = 0) {
  for (size_t i = 0; i < e.got.size(); ++i)
    if (e.got[i].kind == kind && (kind != CKind::kBulkDone || e.got[i].bulk_token == token)) return i;
  return e.got.size();
}

TEST_CASE("an exposure of tcp_bulk_lane bytes or more is made on the lane and moved there, every byte; smaller ones stay on the connection") {
  World w(lanes_from(1 << 20));
  End *owner, *peer;
  std::tie(owner, peer) = w.connect();
  w.lane(*owner, *peer);
  const size_t big = (size_t{24} << 20) + 3, small = (size_t{1} << 20) - 1;
  std::vector<std::byte> src = pattern(big, 1), dst(big), back(big, std::byte{0x5A});
  BulkRegistration sreg = reg(*owner->link, src), dreg = reg(*peer->link, dst);
  BulkRegistration breg = reg(*owner->link, back), preg = reg(*peer->link, dst);

  // Request data: the peer reads it through the lane.
  auto seg = owner->link->expose(sreg, 0, big, BulkAccess::kRemoteRead);
  REQUIRE(seg.ok());
  CHECK((seg->rkey & TcpTransport::kLaneKeyBit) != 0);
  CHECK(owner->link->lane_exposures() == 1);
  CHECK(owner->link->exposures() == 0);
  REQUIRE(peer->link->read(dreg, 0, seg.value(), 0, big, 1).ok());
  REQUIRE(w.pump_until([&] { return peer->find(CKind::kBulkDone, 1) || peer->down(); }));
  ok_done(*peer, 1);
  check_equal(dst, src);
  bool revoked = owner->link->revoke(seg.value(), 2);
  REQUIRE(w.pump_until([&] { return revoked || owner->find(CKind::kBulkDone, 2); }));
  CHECK(owner->link->lane_exposures() == 0);

  // A reply destination: the peer writes it through the lane (offset 1,
  // the guard byte either side untouched).
  auto wseg = owner->link->expose(breg, 1, big - 2, BulkAccess::kRemoteWrite);
  REQUIRE(wseg.ok());
  CHECK((wseg->rkey & TcpTransport::kLaneKeyBit) != 0);
  REQUIRE(peer->link->write(preg, 1, wseg.value(), 0, big - 2, 3).ok());
  REQUIRE(w.pump_until([&] { return peer->find(CKind::kBulkDone, 3) || peer->down(); }));
  ok_done(*peer, 3);
  // The fence: a frame the writer posts after the kBulkDone reaches the
  // owner only once every written byte is in place.
  owner->link->arm(2);
  std::vector<std::byte> msg(64, std::byte{0x11});
  Outgoing o{msg.data(), 64, core::make_imm(2, 1), Delivery::kSlot};
  peer->link->post({&o, 1});
  REQUIRE(w.pump_until([&] { return owner->find(CKind::kMessage) || owner->down(); }));
  CHECK(back.front() == std::byte{0x5A});
  CHECK(back.back() == std::byte{0x5A});
  CHECK(std::equal(back.begin() + 1, back.end() - 1, dst.begin() + 1));

  // Under the threshold: the session's own connection, no lane bit.
  auto sseg = owner->link->expose(sreg, 0, small, BulkAccess::kRemoteRead);
  REQUIRE(sseg.ok());
  CHECK((sseg->rkey & TcpTransport::kLaneKeyBit) == 0);
  CHECK(owner->link->exposures() == 1);
  std::vector<std::byte> sdst(small);
  BulkRegistration sdreg = reg(*peer->link, sdst);
  REQUIRE(peer->link->read(sdreg, 0, sseg.value(), 0, small, 4).ok());
  REQUIRE(w.pump_until([&] { return peer->find(CKind::kBulkDone, 4) || peer->down(); }));
  ok_done(*peer, 4);
  CHECK(std::equal(sdst.begin(), sdst.end(), src.begin()));
  CHECK_FALSE(owner->down());
  CHECK_FALSE(peer->down());
}

TEST_CASE("a frame posted after a lane write's kBulkDone waits at the FENCE until the lane has delivered the data") {
  // Small enough that the write fits the lane's socket buffers while the
  // owner's lane thread is held still.
  World w(lanes_from(4096));
  End *owner, *writer;
  std::tie(owner, writer) = w.connect();
  w.lane(*owner, *writer);
  const size_t size = 32 * 1024;
  std::vector<std::byte> src = pattern(size, 7), dst(size, std::byte{0});
  BulkRegistration sreg = reg(*writer->link, src), dreg = reg(*owner->link, dst);
  auto seg = owner->link->expose(dreg, 0, size, BulkAccess::kRemoteWrite);
  REQUIRE(seg.ok());
  REQUIRE((seg->rkey & TcpTransport::kLaneKeyBit) != 0);
  owner->link->arm(5);
  std::mutex* owner_lanes = w.a.lanes_mutex();
  REQUIRE(owner_lanes != nullptr);
  {
    // The owner's lane thread cannot poll: the written bytes stay in its
    // socket while the reply travels on the session's connection.
    std::lock_guard<std::mutex> hold(*owner_lanes);
    REQUIRE(writer->link->write(sreg, 0, seg.value(), 0, size, 9).ok());
    REQUIRE(w.pump_until([&] { return writer->find(CKind::kBulkDone, 9) || writer->down(); }));
    ok_done(*writer, 9);
    std::vector<std::byte> msg(64, std::byte{0x22});
    Outgoing o{msg.data(), 64, core::make_imm(5, 1), Delivery::kSlot};
    writer->link->post({&o, 1});
    REQUIRE(w.pump_until([&] { return owner->link->fenced() || owner->down(); }));
    CHECK(owner->find(CKind::kMessage) == nullptr);
    CHECK(owner->link->lane_bytes_in() == 0);
  }
  REQUIRE(w.pump_until([&] { return owner->find(CKind::kMessage) || owner->down(); }));
  CHECK_FALSE(owner->link->fenced());
  check_equal(dst, src);
  CHECK_FALSE(owner->down());
}

TEST_CASE("a lane thread polls on for tcp_lane_spin_us after its last work before it sleeps; with 0 it sleeps between bursts") {
  // 24 MiB read through the lane: the reader's lane thread receives it in
  // bursts, with the socket empty between them.
  auto transfer = [](uint32_t spin_us, uint64_t* reader_sleeps, uint64_t* owner_sleeps) {
    Config c = lanes_from(1 << 20);
    c.tcp_lane_spin_us = spin_us;
    World w(c);
    End *owner, *reader;
    std::tie(owner, reader) = w.connect();
    w.lane(*owner, *reader);
    const size_t size = size_t{24} << 20;
    std::vector<std::byte> src = pattern(size, 11), dst(size);
    BulkRegistration sreg = reg(*owner->link, src), dreg = reg(*reader->link, dst);
    auto seg = owner->link->expose(sreg, 0, size, BulkAccess::kRemoteRead);
    REQUIRE(seg.ok());
    REQUIRE((seg->rkey & TcpTransport::kLaneKeyBit) != 0);
    const uint64_t before = w.b.lane_sleeps();
    REQUIRE(reader->link->read(dreg, 0, seg.value(), 0, size, 1).ok());
    REQUIRE(w.pump_until([&] { return reader->find(CKind::kBulkDone, 1) || reader->down(); }));
    ok_done(*reader, 1);
    check_equal(dst, src);
    *reader_sleeps = w.b.lane_sleeps() - before;
    *owner_sleeps = w.a.lane_sleeps();
  };
  uint64_t reader = 0, owner = 0;
  // 0: the reader's lane thread sleeps whenever a poll finds nothing to
  // complete, many times per transfer.
  transfer(0, &reader, &owner);
  CAPTURE(reader);
  CHECK(reader > 0);
  // Ten seconds: neither lane thread sleeps from its start to the end of
  // the transfer (far less than ten seconds apart, even under ASan).
  transfer(10'000'000, &reader, &owner);
  CHECK(reader == 0);
  CHECK(owner == 0);
}

TEST_CASE("a lane thread stays awake through a transfer whose data keeps arriving, however long it lasts; it sleeps once the data stops") {
  // The reader's lane peer is this test, on a raw socket: it answers the
  // READ_REQ with READ_DATA frames of 64 KiB, one every 20 ms, for 1.2 s
  // in all, while the spin is 200 ms.  Data that arrives is work: the
  // reader's lane thread must not sleep between frames.  When only
  // completions counted (a read has one, at its last byte), it slept each
  // time 200 ms had passed since the last, in the middle of the transfer.
  Config c = lanes_from(1 << 20);
  c.tcp_lane_spin_us = 200'000;
  World w(c);
  End *owner, *reader;
  std::tie(owner, reader) = w.connect();
  auto [raw, lane_fd] = loopback_pair();
  REQUIRE(reader->link->attach_lane(lane_fd).ok());
  constexpr size_t kFrame = 64 * 1024, kFrames = 60;
  const size_t size = kFrame * kFrames;
  std::vector<std::byte> src = pattern(size, 13), dst(size);
  BulkRegistration dreg = reg(*reader->link, dst);
  const RemoteSegment seg{0, size, TcpTransport::kLaneKeyBit | 1};
  REQUIRE(reader->link->read(dreg, 0, seg, 0, size, 1).ok());

  const PacedReadPeer peer_end{raw};
  // The loop side runs meanwhile, as in a server (nothing needs it).
  const uint64_t tag = peer_end.take_request([&] { w.poll_one(w.b); });
  const uint64_t before = w.b.lane_sleeps();
  std::thread peer([&] { peer_end.send(tag, src, kFrame, std::chrono::milliseconds(20)); });
  const bool finished = w.pump_until([&] { return reader->find(CKind::kBulkDone, 1) || reader->down(); });
  const uint64_t during = w.b.lane_sleeps() - before;
  peer.join();
  REQUIRE(finished);
  ok_done(*reader, 1);
  check_equal(dst, src);
  CAPTURE(during);
  // 0 here; one sleep is allowed for a machine that stalls the peer's
  // thread for a whole spin once.  The old rule slept 5 times.
  CHECK(during <= 1);
  // Nothing more comes: after its spin the thread sleeps (the rule is a
  // spin, not a busy loop).
  const uint64_t after = w.b.lane_sleeps();
  CHECK(w.pump_until([&] { return w.b.lane_sleeps() > after; }));
  ::close(raw);
}

TEST_CASE("a lane that dies takes its session link with it; the lane's transfer ends before kLinkDown") {
  World w(lanes_from(1 << 20));
  End *owner, *reader;
  std::tie(owner, reader) = w.connect();
  w.lane(*owner, *reader);
  const size_t size = size_t{256} << 20;
  std::vector<std::byte> src(size, std::byte{3}), dst(size);
  BulkRegistration sreg = reg(*owner->link, src), dreg = reg(*reader->link, dst);
  auto seg = owner->link->expose(sreg, 0, size, BulkAccess::kRemoteRead);
  REQUIRE(seg.ok());
  // The owner's lane thread is held while the read is requested, so the
  // owner's process "dies" (its link and lane close) with the read far
  // from done.
  std::mutex* owner_lanes = w.a.lanes_mutex();
  REQUIRE(owner_lanes != nullptr);
  owner_lanes->lock();
  REQUIRE(reader->link->read(dreg, 0, seg.value(), 0, size, 11).ok());
  owner_lanes->unlock();
  owner->link.reset();
  REQUIRE(w.pump_until([&] { return reader->down(); }));
  const size_t done = index_of(*reader, CKind::kBulkDone, 11);
  REQUIRE(done < reader->got.size());
  CHECK(reader->got[done].bulk_status != 0);
  CHECK(done < index_of(*reader, CKind::kLinkDown));
}

TEST_CASE("a lane token is claimed once, by the link that offered it; anything else is refused") {
  World w(lanes_from(1 << 20));
  End *client, *server;
  std::tie(client, server) = w.connect();
  const uint64_t token = server->link->offer_lane(7);
  CHECK((token & 0xffff) == 7);
  CHECK((token >> 16) != 0);
  CHECK(server->link->offer_lane(7) == 0);  // one offer per link
  auto [c1, s1] = loopback_pair();
  CHECK_FALSE(w.b.accept_lane(token ^ (uint64_t{1} << 40), s1).ok());
  CHECK(::fcntl(s1, F_GETFD) == -1);  // the refused fd is closed
  ::close(c1);
  CHECK_FALSE(server->link->has_lane());
  auto [c2, s2] = loopback_pair();
  REQUIRE(w.b.accept_lane(token, s2).ok());
  CHECK(server->link->has_lane());
  REQUIRE(client->link->attach_lane(c2).ok());
  auto [c3, s3] = loopback_pair();
  CHECK_FALSE(w.b.accept_lane(token, s3).ok());  // claimed already
  ::close(c3);
  // A lane is no session: a slot frame on it fails the link, and its session.
  auto [c4, s4] = loopback_pair();
  End *x, *y;
  std::tie(x, y) = w.connect();
  REQUIRE(y->link->attach_lane(s4).ok());
  std::array<std::byte, 8 + 64> frame{};
  frame[0] = std::byte{64};
  REQUIRE(::send(c4, frame.data(), frame.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(frame.size()));
  REQUIRE(w.pump_until([&] { return y->down(); }));
  CHECK_MESSAGE(y->link->down_reason().find("bulk lane") != std::string::npos, y->link->down_reason());
  ::close(c4);
  CHECK_FALSE(client->down());
}

}  // namespace
