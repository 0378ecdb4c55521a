// The in-memory link (lib/transport/memory): a slot message lands in the
// peer's armed slot with one completion, control messages travel inside
// theirs, a slot the peer has not armed is refused before a byte moves, and
// either end going away takes both down with a reason.  And, on a reactor
// polling it, what a completion callback's latency stamp is.
#include <doctest/doctest.h>

#include <array>
#include <cstring>
#include <memory>
#include <vector>

#include "reactor/reactor.h"
#include "transport/memory/memory_transport.h"

using namespace slotrpc;
using namespace slotrpc::transport;

namespace {

constexpr uint32_t kSlots = 4;
constexpr uint32_t kSlotSize = 256;

struct End {
  std::vector<std::byte> recv = std::vector<std::byte>(kSlots * kSlotSize);
  std::vector<std::byte> send = std::vector<std::byte>(kSlots * kSlotSize);
  int context = 0;  // what the completions must carry

  void attach(Link& link) {
    auto r = link.register_memory(recv, Access::kRemoteWrite);
    auto s = link.register_memory(send, Access::kLocalSend);
    REQUIRE(r.ok());
    REQUIRE(s.ok());
    REQUIRE(link.attach(r.value(), s.value(), kSlots, kSlotSize, &context).ok());
  }
};

std::vector<Completion> poll_all(memory::MemoryTransport& t) {
  std::vector<Completion> out;
  std::array<Completion, 3> batch;  // smaller than what is queued: several polls
  for (size_t n; (n = t.poll(batch)) != 0;) out.insert(out.end(), batch.begin(), batch.begin() + n);
  return out;
}

Outgoing slot_message(const std::byte* data, uint32_t length, uint16_t slot) {
  Outgoing o;
  o.data = data;
  o.length = length;
  o.imm = make_imm(slot, 7);
  return o;
}

}  // namespace

TEST_CASE("a slot message lands in the peer's armed slot, a control message in its completion") {
  memory::MemoryTransport t;
  auto [a, b] = t.pair("test");
  End ea, eb;
  ea.attach(*a);
  eb.attach(*b);
  b->arm(2);

  std::byte* msg = ea.send.data() + 2 * kSlotSize;
  for (uint32_t i = 0; i < 100; ++i) msg[i] = std::byte(i + 1);
  std::array<std::byte, kHeaderSize> control;
  control.fill(std::byte{0x5a});
  Outgoing batch[2] = {slot_message(msg, 100, 2), {}};
  batch[1].data = control.data();
  batch[1].length = kHeaderSize;
  batch[1].delivery = Delivery::kControl;
  a->post(batch);
  control.fill(std::byte{0});  // post() copied it

  CHECK(t.prepare_sleep() == false);  // work is queued: no sleep
  const auto got = poll_all(t);
  REQUIRE(got.size() == 2);
  CHECK(got[0].kind == Completion::Kind::kMessage);
  CHECK(got[0].slot == 2);
  CHECK(got[0].length == 100);
  CHECK(got[0].imm == make_imm(2, 7));
  CHECK(got[0].context == &eb.context);
  CHECK(got[0].link == b.get());
  CHECK(std::memcmp(eb.recv.data() + 2 * kSlotSize, msg, 100) == 0);
  CHECK(got[1].kind == Completion::Kind::kControl);
  CHECK(got[1].context == &eb.context);
  CHECK(got[1].control[31] == std::byte{0x5a});
  CHECK(t.prepare_sleep());
  CHECK_FALSE(b->armed(2));  // used by that message: armed again only by the receiver
  const LinkStats s = a->stats();
  CHECK(s.slot_sends == 1);
  CHECK(s.control_sends == 1);
  CHECK(s.messages == 2);
  CHECK_FALSE(a->down());
}

TEST_CASE("the queue grows past its first size and keeps the order") {
  memory::MemoryTransport t;
  auto [a, b] = t.pair("test");
  End ea, eb;
  ea.attach(*a);
  eb.attach(*b);
  std::vector<std::array<std::byte, kHeaderSize>> controls(200);
  for (size_t i = 0; i < controls.size(); ++i) {
    controls[i].fill(std::byte(i));
    Outgoing o;
    o.data = controls[i].data();
    o.length = kHeaderSize;
    o.delivery = Delivery::kControl;
    a->post({&o, 1});
  }
  CHECK(b->queued() == 200);
  const auto got = poll_all(t);
  REQUIRE(got.size() == 200);
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i].control[0] == std::byte(i));
}

TEST_CASE("a slot the peer has not armed is refused before a byte moves, and both ends go down") {
  memory::MemoryTransport t;
  auto [a, b] = t.pair("test");
  End ea, eb;
  ea.attach(*a);
  eb.attach(*b);
  eb.recv[kSlotSize] = std::byte{0x11};  // what a handler would still be reading in slot 1
  std::array<std::byte, 64> msg;
  msg.fill(std::byte{0x22});
  Outgoing o = slot_message(msg.data(), msg.size(), 1);
  a->post({&o, 1});
  CHECK(eb.recv[kSlotSize] == std::byte{0x11});
  CHECK(a->down());
  CHECK(b->down());
  CHECK(a->down_reason().find("slot 1 is not armed") != std::string::npos);
  CHECK(b->down_reason().find("peer closed: ") == 0);
  const auto got = poll_all(t);
  REQUIRE(got.size() == 2);
  for (const Completion& c : got) CHECK(c.kind == Completion::Kind::kLinkDown);
  a->post({&o, 1});  // after the link went down: dropped
  CHECK(poll_all(t).empty());
}

TEST_CASE("a message that does not fit the peer's ring fails the link with its size") {
  memory::MemoryTransport t;
  auto [a, b] = t.pair("test");
  End ea, eb;
  ea.attach(*a);
  eb.attach(*b);
  b->arm(0);
  std::vector<std::byte> big(kSlotSize + 1);
  Outgoing o = slot_message(big.data(), big.size(), 0);
  a->post({&o, 1});
  CHECK(a->down_reason().find("257 bytes for slot 0 does not fit") != std::string::npos);
}

TEST_CASE("close or destruction of one end takes the other down with the reason") {
  memory::MemoryTransport t;
  {
    auto [a, b] = t.pair("close");
    End ea, eb;
    ea.attach(*a);
    eb.attach(*b);
    a->close("done here");
    CHECK(a->down_reason() == "done here");
    CHECK(b->down_reason() == "peer closed: done here");
    const auto got = poll_all(t);
    REQUIRE(got.size() == 2);
    CHECK(got[0].kind == Completion::Kind::kLinkDown);
    CHECK(got[1].kind == Completion::Kind::kLinkDown);
  }
  auto [a, b] = t.pair("destroy");
  End ea, eb;
  ea.attach(*a);
  eb.attach(*b);
  a.reset();
  CHECK(b->down());
  CHECK(b->down_reason() == "peer's link was destroyed");
  const auto got = poll_all(t);
  REQUIRE(got.size() == 1);
  CHECK(got[0].link == b.get());
  CHECK(got[0].context == &eb.context);
}

// Loop::stamp(), the latency stamp a client call takes: inside a
// completion callback the batch's one clock read, outside a batch (a posted
// task) a fresh read, never a stale batch's time.
TEST_CASE("a latency stamp inside a completion callback is the batch's clock read, outside a fresh one") {
  Config config;
  reactor::Reactor loop(config, "stamp-test");
  auto added = loop.add_transport(std::make_unique<memory::MemoryTransport>());
  REQUIRE(added.ok());
  auto& t = *static_cast<memory::MemoryTransport*>(added.value());
  auto [a, b] = t.pair("stamp");

  struct Probe : core::SessionBase {
    reactor::Reactor* loop = nullptr;
    int seen = 0;
    core::Clock::time_point received{}, stamped{};
  } probe;
  probe.loop = &loop;
  probe.on_completion = [](core::SessionBase* s, const Completion&) {
    auto* p = static_cast<Probe*>(s);
    ++p->seen;
    p->received = p->loop->received_at();
    p->stamped = p->loop->stamp();
  };
  probe.flush = [](core::SessionBase*) {};
  End ea, eb;
  ea.attach(*a);
  std::vector<std::byte> recv(kSlots * kSlotSize), send(kSlots * kSlotSize);
  auto r = b->register_memory(recv, Access::kRemoteWrite);
  auto s = b->register_memory(send, Access::kLocalSend);
  REQUIRE(b->attach(r.value(), s.value(), kSlots, kSlotSize, static_cast<core::SessionBase*>(&probe)).ok());

  std::array<std::byte, kHeaderSize> control{};
  Outgoing o;
  o.data = control.data();
  o.length = kHeaderSize;
  o.delivery = Delivery::kControl;
  a->post({&o, 1});
  const auto before = core::Clock::now();
  REQUIRE(loop.run_one_turn());
  REQUIRE(probe.seen == 1);
  CHECK(probe.received >= before);
  CHECK(probe.stamped == probe.received);

  // After the batch: no batch time is left behind for a later stamp.
  CHECK(loop.received_at() == core::Clock::time_point{});
  const auto outside = loop.stamp();
  CHECK(outside >= probe.received);
}
