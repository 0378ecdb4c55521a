// Helpers of the shared-memory transport tests: a connected pair of links
// over a socketpair, and a raw peer that speaks the segment format by hand
// (for hostile descriptors and scribbling).
#pragma once

#include <sys/socket.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <doctest/doctest.h>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/wire_format.h"
#include "transport/shm/shm_transport.h"

namespace shm_test {

using namespace slotrpc;
using namespace slotrpc::transport;
using namespace slotrpc::transport::shm;
using CKind = Completion::Kind;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

inline constexpr auto kTimeout = 10s;

// Polls a condition until it holds; false after the deadline.
inline bool test_wait(const std::function<bool()>& done, std::chrono::milliseconds limit = kTimeout) {
  const auto until = Clock::now() + limit;
  while (!done()) {
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return true;
}

inline std::pair<int, int> unix_pair() {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  return {sv[0], sv[1]};
}

// One end: a transport, its link, and the session's private rings.
struct End {
  End() = default;
  explicit End(const Config& config) : transport(config) {}
  ShmTransport transport;
  std::unique_ptr<ShmLink> link;
  std::vector<std::byte> recv;
  std::vector<std::byte> send;  // private send ring (copy mode)
  std::vector<Completion> got;  // everything polled, in order
  Geometry g;

  void attach(Geometry geo, bool arm_all = true) {
    g = geo;
    recv.assign(size_t{g.slot_count} * g.slot_size, std::byte{0});
    send.assign(size_t{g.slot_count} * g.slot_size, std::byte{0});
    MemoryRegion r{recv.data(), recv.size()};
    MemoryRegion s{send.data(), send.size()};
    REQUIRE(link->attach(r, s, g.slot_count, g.slot_size, this).ok());
    if (arm_all)
      for (uint32_t i = 0; i < g.slot_count; ++i) link->arm(static_cast<uint16_t>(i));
  }
  size_t poll_once() {
    std::array<Completion, 16> buf;
    const size_t n = transport.poll(buf);
    got.insert(got.end(), buf.begin(), buf.begin() + static_cast<ptrdiff_t>(n));
    return n;
  }
  const std::byte* slot(uint16_t i) const { return recv.data() + size_t{i} * g.slot_size; }
  bool has_link_down() const {
    for (const auto& c : got)
      if (c.kind == CKind::kLinkDown) return true;
    return false;
  }
};

// Pumps every end until `done` holds; false after the deadline.
inline bool pump_until(std::initializer_list<End*> ends, const std::function<bool()>& done,
                       std::chrono::milliseconds limit = kTimeout) {
  const auto until = Clock::now() + limit;
  while (!done()) {
    if (Clock::now() >= until) return false;
    for (End* e : ends) e->poll_once();
  }
  return true;
}

// Two links over one socketpair, both ends in this thread.
inline void connect(End& a, End& b, Geometry g) {
  auto [s0, s1] = unix_pair();
  auto oa = a.transport.offer(s0, g);
  REQUIRE(oa.ok());
  auto ob = b.transport.offer(s1, g);
  REQUIRE(ob.ok());
  auto la = a.transport.complete(std::move(oa).value(), 5s, "a");
  REQUIRE_MESSAGE(la.ok(), la.status().message());
  auto lb = b.transport.complete(std::move(ob).value(), 5s, "b");
  REQUIRE_MESSAGE(lb.ok(), lb.status().message());
  a.link = std::move(la).value();
  b.link = std::move(lb).value();
}

inline std::array<std::byte, core::kHeaderSize> control_bytes(uint64_t seq) {
  std::array<std::byte, core::kHeaderSize> h{};
  std::memcpy(h.data(), &seq, sizeof seq);
  return h;
}

// A peer that writes its segment by hand: whatever a hostile process could.
struct RawPeer {
  OwnSegment own;
  PeerSegment peer;
  Fd sock;
  uint64_t published = 0;

  ControlBlock* ctl() { return reinterpret_cast<ControlBlock*>(own.map.base()); }
  std::byte* data() { return own.map.base() + own.layout.data_offset; }
  std::byte* descs() { return own.map.base() + own.layout.desc_offset; }
  std::byte* slot(uint16_t i) { return data() + size_t{i} * own.layout.geometry.slot_size; }
  void put(const Descriptor& d) {
    // What an honest sender writes: the fields, then the sequence word.
    auto* slot = reinterpret_cast<Descriptor*>(descs()) + published % own.layout.desc_count;
    std::memcpy(reinterpret_cast<std::byte*>(slot) + sizeof d.seq,
                reinterpret_cast<const std::byte*>(&d) + sizeof d.seq, sizeof d - sizeof d.seq);
    ++published;
    std::atomic_ref<uint64_t>(slot->seq).store(published, std::memory_order_release);
    std::atomic_ref<uint64_t>(ctl()->head).store(published, std::memory_order_seq_cst);
  }
  // A descriptor in the bulk ring (bulk lanes, shm_bulk.cc).
  uint64_t bulk_published = 0;
  void put_bulk(const Descriptor& d) {
    auto* slot = reinterpret_cast<Descriptor*>(own.map.base() + own.layout.bulk_desc_offset) +
                 bulk_published % kBulkDescCount;
    std::memcpy(reinterpret_cast<std::byte*>(slot) + sizeof d.seq,
                reinterpret_cast<const std::byte*>(&d) + sizeof d.seq, sizeof d - sizeof d.seq);
    ++bulk_published;
    std::atomic_ref<uint64_t>(slot->seq).store(bulk_published, std::memory_order_release);
    std::atomic_ref<uint64_t>(ctl()->bulk_head).store(bulk_published, std::memory_order_seq_cst);
  }
  void put_slot(uint16_t slot, uint32_t length, uint32_t offset = 0) {
    Descriptor d{};
    d.lane = static_cast<uint32_t>(DescLane::kSlot);
    d.length = length;
    d.imm = core::make_imm(slot, 1);
    d.offset = offset;
    put(d);
  }
  void put_control(uint64_t seq) {
    Descriptor d{};
    d.lane = static_cast<uint32_t>(DescLane::kControl);
    d.length = core::kHeaderSize;
    const auto h = control_bytes(seq);
    std::memcpy(d.payload, h.data(), h.size());
    put(d);
  }
};

// `link_end` offers first (its transport sends), the raw peer answers.
inline RawPeer connect_raw(End& link_end, Geometry g) {
  auto [s0, s1] = unix_pair();
  auto o = link_end.transport.offer(s0, g);
  REQUIRE(o.ok());
  RawPeer p;
  p.sock = Fd(s1);
  auto own = create_own_segment(g);
  REQUIRE(own.ok());
  p.own = std::move(own).value();
  REQUIRE(send_offer(s1, p.own).ok());
  auto peer = receive_offer(s1, g, 5s);
  REQUIRE_MESSAGE(peer.ok(), peer.status().message());
  p.peer = std::move(peer).value();
  auto l = link_end.transport.complete(std::move(o).value(), 5s, "raw");
  REQUIRE_MESSAGE(l.ok(), l.status().message());
  link_end.link = std::move(l).value();
  return p;
}

}  // namespace shm_test
