// ShmTransport / ShmLink in one process: both ends (or a hand-written raw
// peer) in this thread over a socketpair, pumped with bounded loops; the
// sleep test runs the receiver's loop in a second thread.
#include <poll.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "core/slot_ring.h"
#include "shm_test_util.h"

using namespace shm_test;

namespace {

constexpr Geometry kSmall{8, 256};

// Payload of message `seq`: the number, then a pattern derived from it.
uint32_t payload_len(uint64_t seq, uint32_t slot_size) {
  return 16 + static_cast<uint32_t>(seq * 37 % (slot_size - 16));
}
void fill(std::byte* p, uint32_t len, uint64_t seq) {
  std::memcpy(p, &seq, sizeof seq);
  for (uint32_t i = sizeof seq; i < len; ++i) p[i] = static_cast<std::byte>((seq + i) & 0xff);
}
bool check(const std::byte* p, uint32_t len, uint64_t seq) {
  uint64_t got;
  std::memcpy(&got, p, sizeof got);
  if (got != seq) return false;
  for (uint32_t i = sizeof seq; i < len; ++i)
    if (p[i] != static_cast<std::byte>((seq + i) & 0xff)) return false;
  return true;
}

// Sends one round from `from`: a slot message in every slot, then one
// control message.  in_place: built at the end of the shared slot (as the
// core's SlotBuilder does), otherwise in the private send ring.
void send_round(End& from, uint64_t& seq, bool in_place) {
  std::vector<Outgoing> batch;
  const uint32_t size = from.g.slot_size;
  for (uint16_t s = 0; s < from.g.slot_count; ++s) {
    const uint32_t len = payload_len(seq, size);
    std::byte* slot = in_place ? from.link->send_slots().data() + size_t{s} * size
                               : from.send.data() + size_t{s} * size;
    std::byte* msg = in_place ? slot + (size - len) : slot;
    fill(msg, len, seq++);
    batch.push_back(Outgoing{msg, len, core::make_imm(s, 7), Delivery::kSlot});
  }
  const auto ctl = control_bytes(seq++);
  batch.push_back(Outgoing{ctl.data(), static_cast<uint32_t>(ctl.size()), core::make_imm(0, 0),
                           Delivery::kControl});
  from.link->post(batch);
}

// Checks what `to` received since `first` as one round, then re-arms.
void check_round(End& to, size_t first, uint64_t& seq) {
  REQUIRE(to.got.size() - first == to.g.slot_count + 1);
  for (uint16_t s = 0; s < to.g.slot_count; ++s) {
    const Completion& c = to.got[first + s];
    REQUIRE(c.kind == CKind::kMessage);
    REQUIRE(c.slot == s);
    REQUIRE(c.context == &to);
    const uint32_t len = payload_len(seq, to.g.slot_size);
    REQUIRE(c.length == len);
    REQUIRE_MESSAGE(check(to.slot(s), len, seq), "slot message " << seq << " corrupted or out of order");
    ++seq;
    to.link->arm(s);
  }
  const Completion& c = to.got[first + to.g.slot_count];
  REQUIRE(c.kind == CKind::kControl);
  uint64_t got;
  std::memcpy(&got, c.control.data(), sizeof got);
  REQUIRE(got == seq);
  ++seq;
}

}  // namespace

TEST_CASE("shm: messages flow both ways in order, around the rings many times") {
  End a, b;
  connect(a, b, kSmall);
  a.attach(kSmall);
  b.attach(kSmall);
  // 8 slots, 9 descriptors a round: 128-descriptor rings wrap every ~14 rounds.
  constexpr int kRounds = 600;
  uint64_t a_seq = 0, b_seq = uint64_t{1} << 40, a_check = 0, b_check = uint64_t{1} << 40;
  for (int r = 0; r < kRounds; ++r) {
    const size_t a_first = a.got.size(), b_first = b.got.size();
    send_round(a, a_seq, /*in_place=*/false);
    send_round(b, b_seq, /*in_place=*/true);
    REQUIRE(pump_until({&a, &b}, [&] {
      return a.got.size() - a_first >= kSmall.slot_count + 1 &&
             b.got.size() - b_first >= kSmall.slot_count + 1;
    }));
    check_round(b, b_first, a_check);
    check_round(a, a_first, b_check);
  }
  CHECK_FALSE(a.has_link_down());
  CHECK_FALSE(b.has_link_down());
  const uint64_t slot_msgs = uint64_t{kRounds} * kSmall.slot_count;
  // a built in its private ring (one copy in post), b in the shared slots
  // (none); messages of up to kInlineMax bytes went in the descriptor.
  const auto& as = a.link->shm_stats();
  const auto& bs = b.link->shm_stats();
  CHECK(as.inline_sends > 0);
  CHECK(bs.inline_sends > 0);
  CHECK(as.copied_sends + as.inline_sends == slot_msgs);
  CHECK(as.in_place_sends == 0);
  CHECK(bs.in_place_sends + bs.inline_sends == slot_msgs);
  CHECK(bs.copied_sends == 0);
  CHECK(a.link->stats().slot_sends == slot_msgs);
  CHECK(a.link->stats().control_sends == kRounds);
}

TEST_CASE("shm: a full descriptor ring backlogs in order and flushes as the peer reads") {
  End a, b;
  connect(a, b, kSmall);
  a.attach(kSmall);
  b.attach(kSmall);
  // Twice what the ring holds (the ring, then the backlog's budget of one
  // more ring), b not polling meanwhile.
  const uint64_t kCount = 2 * uint64_t{compute_layout(kSmall).value().desc_count};
  for (uint64_t i = 0; i < kCount; ++i) {
    const auto h = control_bytes(i);
    const Outgoing o{h.data(), static_cast<uint32_t>(h.size()), 0, Delivery::kControl};
    a.link->post({&o, 1});
  }
  CHECK(a.link->shm_stats().backlogged > 0);
  REQUIRE(pump_until({&a, &b}, [&] { return b.got.size() >= kCount; }));
  REQUIRE(b.got.size() == kCount);
  for (uint64_t i = 0; i < kCount; ++i) {
    REQUIRE(b.got[i].kind == CKind::kControl);
    uint64_t v;
    std::memcpy(&v, b.got[i].control.data(), sizeof v);
    REQUIRE(v == i);
  }
}

TEST_CASE("shm: a backlog over its budget (one more ring) fails the link and names the budget") {
  End a, b;
  connect(a, b, kSmall);
  a.attach(kSmall);
  b.attach(kSmall);
  const uint64_t ring = compute_layout(kSmall).value().desc_count;
  for (uint64_t i = 0; i < 2 * ring; ++i) {
    const auto h = control_bytes(i);
    const Outgoing o{h.data(), static_cast<uint32_t>(h.size()), 0, Delivery::kControl};
    a.link->post({&o, 1});
  }
  REQUIRE_FALSE(a.link->down());  // exactly at the budget: still fine
  const auto h = control_bytes(2 * ring);
  const Outgoing o{h.data(), static_cast<uint32_t>(h.size()), 0, Delivery::kControl};
  a.link->post({&o, 1});
  REQUIRE(a.link->down());
  CHECK_MESSAGE(a.link->down_reason().find("send backlog over budget") != std::string::npos,
                a.link->down_reason());
  REQUIRE(pump_until({&a}, [&] { return a.has_link_down(); }));
}

TEST_CASE("shm: a sleeping receiver is woken through its socket") {
  End a, b;
  connect(a, b, kSmall);
  a.attach(kSmall);
  b.attach(kSmall);
  constexpr uint64_t kRounds = 200;
  std::atomic<bool> asleep{false};
  std::atomic<uint64_t> received{0};
  std::atomic<int> timeouts{0};
  std::atomic<bool> stop{false};
  // Ends the loop also when a check fails (REQUIRE throws): stop_fd wakes it.
  Fd stop_fd(::eventfd(0, EFD_CLOEXEC));
  struct Joiner {
    std::thread t;
    std::atomic<bool>& stop;
    int fd;
    ~Joiner() { finish(); }
    void finish() {
      stop.store(true);
      const uint64_t one = 1;
      [[maybe_unused]] ssize_t n = ::write(fd, &one, sizeof one);
      if (t.joinable()) t.join();
    }
  } joiner{{}, stop, stop_fd.get()};
  // b's event loop: poll, and when idle sleep on wait_fd() like the reactor.
  joiner.t = std::thread([&] {
    const int ep = ::epoll_create1(EPOLL_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ::epoll_ctl(ep, EPOLL_CTL_ADD, b.transport.wait_fd(), &ev);
    ::epoll_ctl(ep, EPOLL_CTL_ADD, stop_fd.get(), &ev);
    while (!stop.load()) {
      std::array<Completion, 16> buf;
      const size_t n = b.transport.poll(buf);
      for (size_t i = 0; i < n; ++i)
        if (buf[i].kind == CKind::kControl) received.fetch_add(1);
      if (n != 0 || !b.transport.prepare_sleep()) continue;
      asleep.store(true);
      epoll_event out;
      // Bounded so a lost wake-up fails the test instead of hanging it.
      if (::epoll_wait(ep, &out, 1, 10000) == 0 && !stop.load()) timeouts.fetch_add(1);
      asleep.store(false);
    }
    ::close(ep);
  });
  // Deliberate rounds: a posts only once b is asleep.
  for (uint64_t i = 0; i < kRounds; ++i) {
    REQUIRE(test_wait([&] { return asleep.load(); }));
    const auto h = control_bytes(i);
    const Outgoing o{h.data(), static_cast<uint32_t>(h.size()), 0, Delivery::kControl};
    a.link->post({&o, 1});
    REQUIRE(test_wait([&] { return received.load() == i + 1; }));
  }
  // Free-running: posts race with b going to sleep (announce, re-check).
  // Within the backlog budget (one more ring): a waits when b lags far.
  const size_t ring = compute_layout(kSmall).value().desc_count;
  for (uint64_t i = 0; i < 20000; ++i) {
    if (a.link->backlog() >= ring / 2)
      REQUIRE(pump_until({&a}, [&] { return a.link->backlog() < ring / 2; }));
    const auto h = control_bytes(i);
    const Outgoing o{h.data(), static_cast<uint32_t>(h.size()), 0, Delivery::kControl};
    a.link->post({&o, 1});
    a.poll_once();  // flushes a's backlog when b lags
  }
  const bool all = pump_until({&a}, [&] { return received.load() == kRounds + 20000; });
  INFO("received " << received.load() << ", a down: " << a.link->down_reason()
                   << ", b down: " << b.link->down_reason() << ", timeouts " << timeouts.load()
                   << ", a backlog " << a.link->backlog());
  REQUIRE(all);
  joiner.finish();
  CHECK(timeouts.load() == 0);
  CHECK(a.link->shm_stats().wakeups_sent >= kRounds);
}

TEST_CASE("shm: the peer cannot write our segment, and an unsealed peer segment is refused") {
  SUBCASE("our segment reaches the peer read-only") {
    auto own = create_own_segment(kSmall);
    REQUIRE(own.ok());
    const int fd = own.value().memfd.get();
    // What a hostile peer holding the fd would try.
    void* p = ::mmap(nullptr, own.value().layout.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(p == MAP_FAILED);
    CHECK(errno == EPERM);
    const char x = 1;
    CHECK(::pwrite(fd, &x, 1, 0) < 0);
    CHECK(::ftruncate(fd, 0) < 0);
    void* ro = ::mmap(nullptr, own.value().layout.total, PROT_READ, MAP_SHARED, fd, 0);
    REQUIRE(ro != MAP_FAILED);
    CHECK(::mprotect(ro, own.value().layout.total, PROT_READ | PROT_WRITE) != 0);
    ::munmap(ro, own.value().layout.total);
    // The owner still writes through its own mapping.
    own.value().map.base()[0] = std::byte{1};
  }
  SUBCASE("offers that do not match are refused with a reason") {
    auto [s0, s1] = unix_pair();
    Fd a(s0), b(s1);
    std::string expect;
    SUBCASE("unsealed memfd") {
      auto l = compute_layout(kSmall);
      OwnSegment fake;
      fake.layout = l.value();
      fake.memfd = Fd(::memfd_create("fake", MFD_CLOEXEC));
      REQUIRE(::ftruncate(fake.memfd.get(), static_cast<off_t>(fake.layout.total)) == 0);
      REQUIRE(send_offer(a.get(), fake).ok());
      expect = "not sealed against shrinking";
    }
    SUBCASE("another geometry") {
      auto own = create_own_segment(Geometry{16, 256});
      REQUIRE(send_offer(a.get(), own.value()).ok());
      expect = "the session agreed on 8 of 256";
    }
    // An offer in this format from the test's own hand: `version`, and
    // the segment's memfd followed by `extra` if that is an fd.
    auto raw_offer = [&](uint32_t version, int extra) {
      auto own = create_own_segment(kSmall);
      REQUIRE(own.ok());
      Offer o;
      o.version = version;
      o.slot_count = kSmall.slot_count;
      o.slot_size = kSmall.slot_size;
      o.desc_count = own.value().layout.desc_count;
      o.segment_bytes = own.value().layout.total;
      iovec iov{&o, sizeof o};
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 2)] = {};
      const int fds[2] = {own.value().memfd.get(), extra};
      const size_t nfds = extra >= 0 ? 2 : 1;
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      msg.msg_control = control;
      msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
      std::memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
      REQUIRE(::sendmsg(a.get(), &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof o));
    };
    SUBCASE("a wake eventfd beside the memfd (offer version 4's shape)") {
      Fd ev(::eventfd(0, EFD_CLOEXEC));
      raw_offer(kOfferVersion, ev.get());
      expect = "offer carries 2 fds, expected 1";
    }
    SUBCASE("an older offer version") {
      Fd ev(::eventfd(0, EFD_CLOEXEC));
      raw_offer(4, ev.get());
      expect = "the peer speaks shm offer version 4, this side 5";
    }
    SUBCASE("no offer at all") {
      expect = "no offer from the peer";
    }
    auto r = receive_offer(b.get(), kSmall, std::chrono::milliseconds(200));
    REQUIRE_FALSE(r.ok());
    CHECK_MESSAGE(r.status().message().find(expect) != std::string::npos, r.status().message());
  }
}

// The wake-up is a byte on the link's own socket end, sent with
// MSG_DONTWAIT: a peer that says it sleeps and never reads fills its
// socket, and every later wake-up is refused at once instead of waiting
// (docs/design.md, "Trust and security").
TEST_CASE("shm: a peer that never drains its wake-ups costs the waker a refused send, never a wait") {
  End a;
  auto raw = connect_raw(a, Geometry{8, 256});
  a.attach(Geometry{8, 256});
  auto* ctl = reinterpret_cast<ControlBlock*>(raw.own.map.base());
  std::atomic_ref<uint32_t>(ctl->sleeping).store(1, std::memory_order_seq_cst);
  const auto* a_ctl = reinterpret_cast<const ControlBlock*>(raw.peer.map.base());
  // The peer consumes every descriptor (so the ring never fills) and never
  // reads its socket.
  auto post_and_consume = [&](uint64_t i) {
    const auto h = control_bytes(i);
    const Outgoing o{h.data(), static_cast<uint32_t>(h.size()), 0, Delivery::kControl};
    a.link->post({&o, 1});
    std::atomic_ref<uint64_t>(ctl->tail).store(load_peer(a_ctl->head, std::memory_order_acquire),
                                               std::memory_order_release);
  };
  // One announced sleep: one wake-up, however many batches follow.
  for (uint64_t i = 0; i < 1000; ++i) post_and_consume(i);
  CHECK(a.link->shm_stats().wakeups_sent == 1);
  // A new announcement before each post: each post wakes the peer.  On a
  // thread of its own, so that a send that waited (the bug) fails the
  // test after 20 s instead of hanging it; the test then drains the
  // peer's socket to free it.
  std::atomic<uint64_t> posted{0};
  std::atomic<bool> finished{false};
  std::thread poster([&] {
    for (uint64_t i = 0; i < 200000; ++i) {
      std::atomic_ref<uint32_t>(ctl->sleeping)
          .store(static_cast<uint32_t>(i + 2), std::memory_order_seq_cst);
      post_and_consume(i);
      posted.store(i + 1, std::memory_order_relaxed);
    }
    finished.store(true);
  });
  const bool in_time = test_wait([&] { return finished.load(); }, 20s);
  CHECK_MESSAGE(in_time, "a wake-up send waited on the peer: " << posted.load()
                                                                << " of 200000 posted in 20 s");
  while (!finished.load()) {
    std::array<char, 4096> sink;
    [[maybe_unused]] const ssize_t n = ::recv(raw.sock.get(), sink.data(), sink.size(), MSG_DONTWAIT);
  }
  poster.join();
  CHECK(posted.load() == 200000);
  CHECK_FALSE(a.link->down());
  CHECK(a.link->shm_stats().wakeups_sent == 200001);
  // The socket filled long before: most wake-ups found it full, which is
  // as good as delivered (the peer has a readable socket).
  CHECK(a.link->shm_stats().wakeups_already_pending > 0);
}

// Bytes on the socket after the handshake are wake-ups, whatever they
// are: drained a buffer per event, and the link goes on.
TEST_CASE("shm: bytes on the socket are wake-ups: drained, the link stays up") {
  End a;
  auto raw = connect_raw(a, kSmall);
  a.attach(kSmall);
  std::vector<char> junk(64 * 1024, 'x');
  size_t sent = 0;
  while (sent < junk.size()) {
    const ssize_t n = ::send(raw.sock.get(), junk.data() + sent, junk.size() - sent,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else {
      REQUIRE((errno == EAGAIN || errno == EWOULDBLOCK));
      a.transport.prepare_sleep();  // drains, as a loop about to sleep does
      a.poll_once();                // and wakes up again
    }
  }
  // All of it drained by the loop's sleep checks, never a failure.
  REQUIRE(test_wait([&] {
    a.transport.prepare_sleep();
    a.poll_once();
    pollfd pfd{a.transport.wait_fd(), POLLIN, 0};
    return ::poll(&pfd, 1, 0) == 0;
  }));
  CHECK_FALSE(a.link->down());
  raw.put_control(7);
  REQUIRE(pump_until({&a}, [&] { return !a.got.empty(); }));
  CHECK(a.got.back().kind == CKind::kControl);
}

// A raw peer's nonsense closes its link with the reason, while another
// link on the same transport keeps working.
TEST_CASE("shm: hostile descriptors close only their link") {
  struct Case {
    const char* name;
    std::function<void(RawPeer&)> act;
    const char* reason;
  };
  const std::vector<Case> cases = {
      {"descriptor sequence word neither the next nor the previous lap",
       [](RawPeer& p) {
         auto* d = reinterpret_cast<Descriptor*>(p.descs());
         std::atomic_ref<uint64_t>(d->seq).store(1'000'000, std::memory_order_release);
       },
       "sequence word 1000000"},
      {"descriptor sequence word of a later lap",
       [](RawPeer& p) {
         auto* d = reinterpret_cast<Descriptor*>(p.descs());
         std::atomic_ref<uint64_t>(d->seq).store(p.own.layout.desc_count + 1,
                                                 std::memory_order_release);
       },
       "sequence word"},
      {"inline message longer than the descriptor holds",
       [](RawPeer& p) {
         Descriptor d{};
         d.lane = static_cast<uint32_t>(DescLane::kInline);
         d.length = kInlineMax + 1;
         d.imm = core::make_imm(1, 1);
         p.put(d);
       },
       "inline message of 41 bytes"},
      {"huge inline length",
       [](RawPeer& p) {
         Descriptor d{};
         d.lane = static_cast<uint32_t>(DescLane::kInline);
         d.length = 0xffffffffu;
         d.imm = core::make_imm(1, 1);
         p.put(d);
       },
       "inline message"},
      {"empty inline message",
       [](RawPeer& p) {
         Descriptor d{};
         d.lane = static_cast<uint32_t>(DescLane::kInline);
         d.length = 0;
         d.imm = core::make_imm(1, 1);
         p.put(d);
       },
       "inline message of 0 bytes"},
      {"inline message into a slot outside the ring",
       [](RawPeer& p) {
         Descriptor d{};
         d.lane = static_cast<uint32_t>(DescLane::kInline);
         d.length = 8;
         d.imm = core::make_imm(8, 1);
         p.put(d);
       },
       "outside ring"},
      {"inline message into an unarmed slot",
       [](RawPeer& p) {
         Descriptor d{};
         d.lane = static_cast<uint32_t>(DescLane::kInline);
         d.length = 8;
         d.imm = core::make_imm(2, 1);
         p.put(d);
       },
       "not armed"},
      {"slot outside the ring", [](RawPeer& p) { p.put_slot(8, 64); }, "outside ring"},
      {"length beyond the slot", [](RawPeer& p) { p.put_slot(1, 257); }, "does not fit"},
      {"offset pushing past the slot", [](RawPeer& p) { p.put_slot(1, 64, 200); }, "does not fit"},
      {"huge offset (wraps a 32-bit sum)", [](RawPeer& p) { p.put_slot(1, 64, 0xffffffc0u); },
       "does not fit"},
      {"empty message", [](RawPeer& p) { p.put_slot(1, 0); }, "does not fit"},
      {"unarmed slot", [](RawPeer& p) { p.put_slot(0, 64); p.put_slot(0, 64); }, "not armed"},
      {"unknown lane",
       [](RawPeer& p) {
         Descriptor d{};
         d.lane = 77;
         d.length = 32;
         p.put(d);
       },
       "unknown lane"},
      {"control of the wrong size",
       [](RawPeer& p) {
         Descriptor d{};
         d.lane = static_cast<uint32_t>(DescLane::kControl);
         d.length = 31;
         p.put(d);
       },
       "control descriptor"},
  };
  for (const Case& k : cases) {
    CAPTURE(k.name);
    End hub, good;
    RawPeer raw = connect_raw(hub, kSmall);
    hub.attach(kSmall, /*arm_all=*/false);
    hub.link->arm(0);
    hub.link->arm(1);
    // A second, well-behaved link on hub's transport.
    auto [s0, s1] = unix_pair();
    auto oh = hub.transport.offer(s0, kSmall);
    auto og = good.transport.offer(s1, kSmall);
    REQUIRE((oh.ok() && og.ok()));
    auto lh = hub.transport.complete(std::move(oh).value(), 5s, "hub-good");
    auto lg = good.transport.complete(std::move(og).value(), 5s, "good");
    REQUIRE((lh.ok() && lg.ok()));
    good.link = std::move(lg).value();
    good.attach(kSmall);
    std::unique_ptr<ShmLink> hub_good = std::move(lh).value();
    std::vector<std::byte> r2(size_t{kSmall.slot_count} * kSmall.slot_size);
    int ctx2 = 0;
    REQUIRE(hub_good->attach({r2.data(), r2.size()}, {r2.data(), r2.size()}, kSmall.slot_count,
                             kSmall.slot_size, &ctx2).ok());

    k.act(raw);
    REQUIRE(pump_until({&hub}, [&] { return hub.has_link_down(); }));
    const Completion* down = nullptr;
    for (const auto& c : hub.got)
      if (c.kind == CKind::kLinkDown) down = &c;
    CHECK(down->link == hub.link.get());
    CHECK(down->context == &hub);
    CHECK_MESSAGE(hub.link->down_reason().find(k.reason) != std::string::npos,
                  hub.link->down_reason());
    // The raw peer sees its socket closed: the link is gone for it too.
    char b;
    REQUIRE(test_wait([&] { return ::recv(raw.sock.get(), &b, 1, MSG_DONTWAIT) == 0; }));

    // The other link is untouched.
    const auto h = control_bytes(4242);
    const Outgoing o{h.data(), 32, 0, Delivery::kControl};
    good.link->post({&o, 1});
    const size_t before = hub.got.size();
    REQUIRE(pump_until({&hub}, [&] { return hub.got.size() > before; }));
    CHECK(hub.got.back().kind == CKind::kControl);
    CHECK(hub.got.back().link == hub_good.get());
    CHECK_FALSE(hub_good->down());
  }
}

TEST_CASE("shm: a peer's consumed count that runs ahead of what we sent closes the link") {
  End hub;
  RawPeer raw = connect_raw(hub, kSmall);
  hub.attach(kSmall);
  // Fill our descriptor ring (the raw peer never consumes), then lie.
  const uint32_t ring = raw.own.layout.desc_count;
  const auto h = control_bytes(1);
  const Outgoing o{h.data(), 32, 0, Delivery::kControl};
  for (uint32_t i = 0; i < ring; ++i) hub.link->post({&o, 1});
  CHECK(hub.link->shm_stats().backlogged == 0);
  std::atomic_ref<uint64_t>(raw.ctl()->tail).store(uint64_t{ring} * 5, std::memory_order_seq_cst);
  hub.link->post({&o, 1});
  REQUIRE(pump_until({&hub}, [&] { return hub.has_link_down(); }));
  CHECK_MESSAGE(hub.link->down_reason().find("consumed count") != std::string::npos,
                hub.link->down_reason());
}

TEST_CASE("shm: post refuses what would break the peer, and attach checks the geometry") {
  End a, b;
  connect(a, b, kSmall);
  std::vector<std::byte> r(size_t{16} * 256);
  CHECK_FALSE(a.link->attach({r.data(), r.size()}, {r.data(), r.size()}, 16, 256, nullptr).ok());
  a.attach(kSmall);
  // A message built in slot 2 of the shared area but sent as slot 3.
  std::byte* slot2 = a.link->send_slots().data() + 2 * 256;
  const Outgoing o{slot2, 64, core::make_imm(3, 1), Delivery::kSlot};
  a.link->post({&o, 1});
  REQUIRE(pump_until({&a}, [&] { return a.has_link_down(); }));
  CHECK_MESSAGE(a.link->down_reason().find("another slot") != std::string::npos,
                a.link->down_reason());
  // b learns at once through the socket.
  REQUIRE(pump_until({&b}, [&] { return b.has_link_down(); }));
  CHECK_MESSAGE(b.link->down_reason().find("peer closed") != std::string::npos,
                b.link->down_reason());
}

// The sleep/wake race, step by step in one thread: a message published
// after the receiver's last poll but before it announces sleep must keep it
// awake (the re-check after the announcement); one published after the
// announcement must make its wait_fd readable (the eventfd).
TEST_CASE("shm: announce, re-check, then sleep: no message is left behind a sleeping loop") {
  End a, b;
  connect(a, b, kSmall);
  a.attach(kSmall);
  b.attach(kSmall);
  auto readable = [](int fd) {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, 0) == 1;
  };
  const auto h = control_bytes(1);
  const Outgoing o{h.data(), 32, 0, Delivery::kControl};

  CHECK(b.poll_once() == 0);
  a.link->post({&o, 1});  // b has not announced: no wake-up is sent
  CHECK(a.link->shm_stats().wakeups_sent == 0);
  CHECK_FALSE(b.transport.prepare_sleep());  // the re-check finds it
  CHECK(b.poll_once() == 1);

  REQUIRE(b.transport.prepare_sleep());  // nothing pending: may sleep
  CHECK_FALSE(readable(b.transport.wait_fd()));
  a.link->post({&o, 1});
  CHECK(a.link->shm_stats().wakeups_sent == 1);
  CHECK(readable(b.transport.wait_fd()));
  CHECK(b.poll_once() == 1);
  // Awake again: the next message costs no wake-up.
  a.link->post({&o, 1});
  CHECK(a.link->shm_stats().wakeups_sent == 1);
  CHECK(b.poll_once() == 1);
  // The eventfd was drained before the next announcement.
  REQUIRE(b.transport.prepare_sleep());
  CHECK_FALSE(readable(b.transport.wait_fd()));
}

TEST_CASE("shm: a head word claiming descriptors that are not there fails the link before sleep") {
  // The busy poller reads descriptors, not the head; the head is read before
  // sleeping.  A lying one must not keep the loop awake forever.
  End hub;
  RawPeer raw = connect_raw(hub, kSmall);
  hub.attach(kSmall);
  raw.put_control(1);
  REQUIRE(pump_until({&hub}, [&] { return hub.got.size() == 1; }));
  CHECK(hub.transport.prepare_sleep());  // honest: nothing more, it may sleep
  hub.transport.poll(std::span<Completion>{});  // withdraws the announcement
  std::atomic_ref<uint64_t>(raw.ctl()->head).store(1'000'000, std::memory_order_seq_cst);
  CHECK_FALSE(hub.transport.prepare_sleep());
  REQUIRE(pump_until({&hub}, [&] { return hub.has_link_down(); }));
  CHECK_MESSAGE(hub.link->down_reason().find("claims descriptors") != std::string::npos,
                hub.link->down_reason());
}

TEST_CASE("shm: slot messages up to kInlineMax bytes travel in the descriptor, larger ones in the slot") {
  End a, b;
  connect(a, b, kSmall);
  a.attach(kSmall);
  b.attach(kSmall);
  uint16_t slot = 0;
  for (const uint32_t len : {1u, kInlineMax - 1, kInlineMax, kInlineMax + 1, 200u}) {
    CAPTURE(len);
    const uint64_t inline_before = a.link->shm_stats().inline_sends;
    std::vector<std::byte> msg(len);
    for (uint32_t i = 0; i < len; ++i) msg[i] = std::byte(uint8_t(len * 7 + i));
    const Outgoing o{msg.data(), len, core::make_imm(slot, 1), Delivery::kSlot};
    a.link->post({&o, 1});
    const size_t before = b.got.size();
    REQUIRE(pump_until({&b}, [&] { return b.got.size() > before; }));
    const Completion& c = b.got.back();
    REQUIRE(c.kind == CKind::kMessage);
    CHECK(c.slot == slot);
    REQUIRE(c.length == len);
    CHECK(std::memcmp(b.slot(slot), msg.data(), len) == 0);
    CHECK(a.link->shm_stats().inline_sends == inline_before + (len <= kInlineMax ? 1 : 0));
    ++slot;
  }
}

TEST_CASE("shm: a SlotRing over send_slots() is sent in place and outlives its link") {
  // core::SlotRing maps the link's data area a second time; ShmLink must
  // recognise that mapping (register_memory) and send from it without a
  // copy, and the ring must stay writable after the link is gone (a client
  // stream's writer may build in it after its session closed).
  End a, b;
  connect(a, b, kSmall);
  core::SlotRing ring(kSmall.slot_count, kSmall.slot_size, a.link->send_slots());
  REQUIRE(ring.placed());
  CHECK(ring.slot(0) != a.link->send_slots().data());  // its own mapping
  REQUIRE(ring.register_with(*a.link, transport::Access::kLocalSend).ok());
  a.attach(kSmall);
  b.attach(kSmall);
  constexpr uint32_t kLen = 200;  // past kInlineMax: through the slot
  std::byte* msg = ring.slot(3) + kSmall.slot_size - kLen;  // at the slot's end, as FlatBuffers build
  for (uint32_t i = 0; i < kLen; ++i) msg[i] = std::byte(uint8_t(i * 13 + 5));
  const Outgoing o{msg, kLen, core::make_imm(3, 1), Delivery::kSlot};
  a.link->post({&o, 1});
  REQUIRE(pump_until({&b}, [&] { return !b.got.empty(); }));
  REQUIRE(b.got.back().kind == CKind::kMessage);
  REQUIRE(b.got.back().length == kLen);
  CHECK(std::memcmp(b.slot(3), msg, kLen) == 0);
  CHECK(a.link->shm_stats().in_place_sends == 1);
  CHECK(a.link->shm_stats().copied_sends == 0);
  CHECK(a.link->stats().noninline_sends == 1);
  ring.deregister();
  a.link.reset();
  msg[0] = std::byte{1};  // still mapped: no fault
  CHECK(msg[0] == std::byte{1});
}
