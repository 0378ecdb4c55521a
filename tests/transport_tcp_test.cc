// TcpTransport / TcpLink over real loopback TCP connections, both ends in
// this one thread: each test pumps both transports' poll() in a bounded loop.
#include "transport/tcp/tcp_transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <doctest/doctest.h>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/wire_format.h"

namespace {

using namespace slotrpc;
using namespace slotrpc::transport;
using CKind = Completion::Kind;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr auto kTimeout = 5s;
constexpr std::byte kFill{0xEE};

// A connected loopback pair: first = client end, second = accepted end.
// buffer_bytes > 0 shrinks the client's send and the server's receive
// buffers, so big messages cannot be written in one go.
std::pair<int, int> loopback_pair(int buffer_bytes = 0) {
  int lst = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(lst >= 0);
  if (buffer_bytes > 0)  // before listen, so the window scale is negotiated small
    REQUIRE(::setsockopt(lst, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof buffer_bytes) == 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  REQUIRE(::bind(lst, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(lst, 4) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(::getsockname(lst, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  int c = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(c >= 0);
  if (buffer_bytes > 0)
    REQUIRE(::setsockopt(c, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof buffer_bytes) == 0);
  REQUIRE(::connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  int s = ::accept4(lst, nullptr, nullptr, SOCK_CLOEXEC);
  REQUIRE(s >= 0);
  ::close(lst);
  return {c, s};
}

// 32-byte header followed by a payload whose bytes depend on `seed`.
std::vector<std::byte> make_message(uint16_t slot, uint32_t total_len, uint32_t seed) {
  REQUIRE(total_len >= 1);
  std::vector<std::byte> m(total_len);
  for (uint32_t i = 0; i < total_len; ++i)
    m[i] = static_cast<std::byte>((i * 131u + seed * 7919u + (i >> 8)) & 0xff);
  if (total_len >= core::kHeaderSize) {
    core::Header h;
    h.flags = static_cast<uint8_t>(core::Kind::kRequest);
    h.request_id = seed;
    h.payload_len = total_len - static_cast<uint32_t>(core::kHeaderSize);
    h.slot = slot;
    core::encode_header(h, m.data());
  }
  return m;
}

Outgoing slot_out(const std::vector<std::byte>& m, uint16_t slot, uint32_t gen) {
  return Outgoing{m.data(), static_cast<uint32_t>(m.size()), core::make_imm(slot, gen), Delivery::kSlot};
}

// One end: a transport, its link and the receive ring the link writes into.
struct Side {
  explicit Side(const Config& config = Config{}) : t(config) {}
  TcpTransport t;
  std::unique_ptr<TcpLink> link;
  std::vector<std::byte> ring;
  MemoryRegion region;
  std::vector<Completion> got;
  int fd = -1;  // the link's socket, for kernel-side inspection only

  void adopt(int sock, const char* name) {
    fd = sock;
    auto r = t.adopt(sock, name);
    REQUIRE_MESSAGE(r.ok(), r.status().to_string());
    link = std::move(r).value();
  }
  void attach(uint32_t slot_count, uint32_t slot_size) {
    ring.assign(size_t{slot_count} * slot_size, kFill);
    auto r = link->register_memory(ring, Access::kRemoteWrite);
    REQUIRE(r.ok());
    region = r.value();
    Status s = link->attach(region, MemoryRegion{}, slot_count, slot_size, this);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
  }
  // A small out span on purpose: exercises partial hand-out of the queue.
  size_t poll_once() {
    std::array<Completion, 7> buf;
    const size_t n = t.poll(buf);
    REQUIRE(n <= buf.size());
    got.insert(got.end(), buf.begin(), buf.begin() + static_cast<ptrdiff_t>(n));
    return n;
  }
  std::byte* slot(uint32_t i, uint32_t slot_size) { return ring.data() + size_t{i} * slot_size; }
};

// Polls every side until done() or the time bound; returns done().
bool pump(std::initializer_list<Side*> sides, const std::function<bool()>& done,
          std::chrono::milliseconds limit = std::chrono::duration_cast<std::chrono::milliseconds>(kTimeout)) {
  const auto deadline = Clock::now() + limit;
  while (!done()) {
    if (Clock::now() > deadline) return false;
    for (Side* s : sides) s->poll_once();
  }
  return true;
}
// Polls for a fixed time, to show that nothing more arrives.
void pump_for(std::initializer_list<Side*> sides, std::chrono::milliseconds d) {
  (void)pump(sides, [] { return false; }, d);
}

struct Pair {
  Side a, b;
  Pair(uint32_t slot_count, uint32_t slot_size, int buffer_bytes = 0, const Config& config = Config{})
      : a(config), b(config) {
    auto [c, s] = loopback_pair(buffer_bytes);
    a.adopt(c, "tcp test a -> b");
    b.adopt(s, "tcp test b -> a");
    a.attach(slot_count, slot_size);
    b.attach(slot_count, slot_size);
  }
};

bool contains(const std::string& s, const char* needle) { return s.find(needle) != std::string::npos; }

size_t count_kind(const std::vector<Completion>& v, CKind k) {
  size_t n = 0;
  for (const auto& c : v) n += c.kind == k;
  return n;
}

void write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::send(fd, c, n, MSG_NOSIGNAL);
    REQUIRE(w > 0);
    c += w;
    n -= static_cast<size_t>(w);
  }
}
void write_all(int fd, const std::vector<std::byte>& v) { write_all(fd, v.data(), v.size()); }

std::vector<std::byte> frame(uint32_t word, uint32_t imm, const std::vector<std::byte>& body) {
  std::vector<std::byte> f(8);
  for (int i = 0; i < 4; ++i) {
    f[i] = static_cast<std::byte>((word >> (8 * i)) & 0xff);
    f[4 + i] = static_cast<std::byte>((imm >> (8 * i)) & 0xff);
  }
  f.insert(f.end(), body.begin(), body.end());
  return f;
}

// Reads exactly n bytes from a blocking raw socket, pumping `side` while
// waiting so its link can finish writing.
std::vector<std::byte> read_exact(int fd, size_t n, Side& side) {
  std::vector<std::byte> out(n);
  size_t have = 0;
  const auto deadline = Clock::now() + kTimeout;
  while (have < n && Clock::now() < deadline) {
    side.poll_once();
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 1) <= 0) continue;
    const ssize_t r = ::recv(fd, out.data() + have, n - have, MSG_DONTWAIT);
    if (r <= 0) break;
    have += static_cast<size_t>(r);
  }
  REQUIRE(have == n);
  return out;
}

int inq(int fd) {
  int v = 0;
  REQUIRE(::ioctl(fd, FIONREAD, &v) == 0);
  return v;
}

}  // namespace

TEST_CASE("tcp: a slot message lands byte-exact in its slot") {
  constexpr uint32_t kSlotSize = 4096;
  Pair p(8, kSlotSize);
  const auto msg = make_message(3, 1000, 1);
  p.b.link->arm(3);
  Outgoing o = slot_out(msg, 3, 7);
  p.a.link->post({&o, 1});

  REQUIRE(pump({&p.a, &p.b}, [&] { return !p.b.got.empty(); }));
  pump_for({&p.a, &p.b}, 20ms);
  REQUIRE(p.b.got.size() == 1);
  const Completion& c = p.b.got[0];
  CHECK(c.kind == CKind::kMessage);
  CHECK(c.slot == 3);
  CHECK(c.length == 1000);
  CHECK(c.imm == core::make_imm(3, 7));
  CHECK(c.context == &p.b);
  CHECK(c.link == p.b.link.get());
  CHECK(std::memcmp(p.b.slot(3, kSlotSize), msg.data(), msg.size()) == 0);
  // Nothing outside the message was touched.
  for (size_t i = 0; i < p.b.ring.size(); ++i) {
    const bool inside = i >= 3 * kSlotSize && i < 3 * kSlotSize + msg.size();
    if (!inside && p.b.ring[i] != kFill) FAIL("ring byte " << i << " was overwritten");
  }
  CHECK(p.a.got.empty());
}

TEST_CASE("tcp: a batch of 100 mixed-size messages arrives in order") {
  constexpr uint32_t kSlots = 128, kSlotSize = 32768;
  Pair p(kSlots, kSlotSize);
  std::vector<std::vector<std::byte>> msgs;
  std::vector<Outgoing> batch;
  std::vector<uint16_t> slots;
  for (uint32_t i = 0; i < 100; ++i) {
    // Sizes from 1 byte to a full slot (the big ones use the direct read).
    uint32_t len = i % 10 == 0 ? kSlotSize : i % 10 == 1 ? 1 : 1 + (i * 7919u) % 3000;
    if (i % 10 == 5) len = 20000;
    const auto slot = static_cast<uint16_t>((i * 37) % 100);  // a permutation of 0..99
    slots.push_back(slot);
    msgs.push_back(make_message(slot, len, i));
    p.b.link->arm(slot);
  }
  for (uint32_t i = 0; i < 100; ++i) batch.push_back(slot_out(msgs[i], slots[i], i));
  p.a.link->post(batch);

  REQUIRE(pump({&p.a, &p.b}, [&] { return p.b.got.size() >= 100; }));
  pump_for({&p.a, &p.b}, 20ms);
  REQUIRE(p.b.got.size() == 100);
  for (uint32_t i = 0; i < 100; ++i) {
    CAPTURE(i);
    const Completion& c = p.b.got[i];
    REQUIRE(c.kind == CKind::kMessage);
    CHECK(c.imm == core::make_imm(slots[i], i));
    CHECK(c.slot == slots[i]);
    CHECK(c.length == msgs[i].size());
    CHECK(std::memcmp(p.b.slot(slots[i], kSlotSize), msgs[i].data(), msgs[i].size()) == 0);
  }
}

TEST_CASE("tcp: 1 MiB messages larger than the socket buffers arrive intact") {
  constexpr uint32_t kSlotSize = 1u << 20;
  Pair p(2, kSlotSize, /*buffer_bytes=*/16 * 1024);
  const auto big0 = make_message(0, kSlotSize, 11);
  const auto big1 = make_message(1, kSlotSize - 5, 12);
  std::array<std::byte, core::kHeaderSize> ping{};
  core::Header h;
  h.flags = static_cast<uint8_t>(core::Kind::kPing);
  h.request_id = 99;
  core::encode_header(h, ping.data());
  p.b.link->arm(0);
  p.b.link->arm(1);
  const Outgoing batch[] = {slot_out(big0, 0, 1),
                            Outgoing{ping.data(), core::kHeaderSize, 0, Delivery::kControl},
                            slot_out(big1, 1, 2)};
  p.a.link->post(batch);

  // The kernel cannot have taken everything: post() must have kept the rest
  // (and must not have blocked to push it).
  int outq = 0;
  REQUIRE(::ioctl(p.a.fd, SIOCOUTQ, &outq) == 0);
  const size_t total = big0.size() + big1.size() + 3 * 8 + core::kHeaderSize;
  CHECK(static_cast<size_t>(outq) + static_cast<size_t>(inq(p.b.fd)) < total);

  REQUIRE(pump({&p.a, &p.b}, [&] { return p.b.got.size() >= 3; }));
  pump_for({&p.a, &p.b}, 20ms);
  REQUIRE(p.b.got.size() == 3);
  CHECK(p.b.got[0].kind == CKind::kMessage);
  CHECK(p.b.got[0].slot == 0);
  CHECK(p.b.got[0].length == big0.size());
  CHECK(p.b.got[1].kind == CKind::kControl);
  CHECK(p.b.got[1].control == ping);
  CHECK(p.b.got[2].kind == CKind::kMessage);
  CHECK(p.b.got[2].slot == 1);
  CHECK(p.b.got[2].length == big1.size());
  CHECK(std::memcmp(p.b.slot(0, kSlotSize), big0.data(), big0.size()) == 0);
  CHECK(std::memcmp(p.b.slot(1, kSlotSize), big1.data(), big1.size()) == 0);
  CHECK(p.a.got.empty());
}

TEST_CASE("tcp: a control message arrives inside the completion") {
  Pair p(4, 256);
  std::array<std::byte, core::kHeaderSize> hdr{};
  core::Header h;
  h.flags = static_cast<uint8_t>(core::Kind::kCancel);
  h.request_id = 42;
  h.slot = 2;
  h.generation = 5;
  core::encode_header(h, hdr.data());
  const auto sent = hdr;
  Outgoing o{hdr.data(), core::kHeaderSize, core::make_imm(2, 5), Delivery::kControl};
  p.a.link->post({&o, 1});
  hdr.fill(std::byte{0});  // post() must have copied the 32 bytes

  REQUIRE(pump({&p.a, &p.b}, [&] { return !p.b.got.empty(); }));
  REQUIRE(p.b.got.size() == 1);
  const Completion& c = p.b.got[0];
  CHECK(c.kind == CKind::kControl);
  CHECK(c.length == core::kHeaderSize);
  CHECK(c.imm == core::make_imm(2, 5));
  CHECK(c.context == &p.b);
  CHECK(c.link == p.b.link.get());
  CHECK(c.control == sent);
  CHECK(core::decode_header(c.control.data()).request_id == 42);
  for (std::byte x : p.b.ring) REQUIRE(x == kFill);  // no slot was written
}

TEST_CASE("tcp: frames on the wire follow the documented format") {
  auto [raw, s] = loopback_pair();
  Side b;
  b.adopt(s, "tcp test link <- raw");
  b.attach(4, 512);

  SUBCASE("hand-built frames are parsed, even when split into pieces") {
    b.link->arm(2);
    const auto body = make_message(2, 300, 3);
    const auto f1 = frame(300, core::make_imm(2, 9), body);
    std::vector<std::byte> ctl(core::kHeaderSize, std::byte{0x5a});
    const auto f2 = frame(0x8000'0000u | 32u, 0x1234'5678u, ctl);
    // Prefix in two pieces, then the body in two, then the control frame.
    write_all(raw, f1.data(), 3);
    pump_for({&b}, 5ms);
    write_all(raw, f1.data() + 3, 7);
    pump_for({&b}, 5ms);
    write_all(raw, f1.data() + 10, f1.size() - 10);
    write_all(raw, f2);
    REQUIRE(pump({&b}, [&] { return b.got.size() >= 2; }));
    CHECK(b.got[0].kind == CKind::kMessage);
    CHECK(b.got[0].slot == 2);
    CHECK(b.got[0].length == 300);
    CHECK(b.got[0].imm == core::make_imm(2, 9));
    CHECK(std::memcmp(b.slot(2, 512), body.data(), body.size()) == 0);
    CHECK(b.got[1].kind == CKind::kControl);
    CHECK(b.got[1].imm == 0x1234'5678u);
    CHECK(std::memcmp(b.got[1].control.data(), ctl.data(), ctl.size()) == 0);
  }

  SUBCASE("a link writes little-endian prefixes with the lane bit") {
    const auto body = make_message(3, 100, 4);
    std::array<std::byte, core::kHeaderSize> ctl;
    ctl.fill(std::byte{0xc3});
    const Outgoing batch[] = {slot_out(body, 3, 0x0102),
                              Outgoing{ctl.data(), core::kHeaderSize, 0xa1b2c3d4u, Delivery::kControl}};
    b.link->post(batch);
    const auto bytes = read_exact(raw, 8 + 100 + 8 + 32, b);
    const auto expect1 = frame(100, core::make_imm(3, 0x0102), body);
    const auto expect2 =
        frame(0x8000'0000u | 32u, 0xa1b2c3d4u, std::vector<std::byte>(ctl.begin(), ctl.end()));
    CHECK(std::memcmp(bytes.data(), expect1.data(), expect1.size()) == 0);
    CHECK(std::memcmp(bytes.data() + expect1.size(), expect2.data(), expect2.size()) == 0);
    CHECK(static_cast<uint8_t>(bytes[0]) == 100);  // low byte first
    CHECK(static_cast<uint8_t>(bytes[expect1.size() + 3]) == 0x80);  // lane bit in the top byte
  }
  ::close(raw);
}

TEST_CASE("tcp: a frame into an unarmed slot brings the receiver's link down") {
  constexpr uint32_t kSlotSize = 1024;
  Pair p(8, kSlotSize);
  const auto msg = make_message(5, 200, 1);

  SUBCASE("never armed") {
    Outgoing o = slot_out(msg, 5, 1);
    p.a.link->post({&o, 1});
    REQUIRE(pump({&p.a, &p.b}, [&] { return !p.b.got.empty() && !p.a.got.empty(); }));
    pump_for({&p.a, &p.b}, 20ms);
    REQUIRE(p.b.got.size() == 1);
    CHECK(p.b.got[0].kind == CKind::kLinkDown);
    CHECK(p.b.got[0].link == p.b.link.get());
    CHECK(p.b.got[0].context == &p.b);
    CHECK_MESSAGE(contains(p.b.link->down_reason(), "slot 5 which was not armed"),
                  p.b.link->down_reason());
    CHECK(std::memcmp(p.b.slot(5, kSlotSize), msg.data(), 16) != 0);  // nothing written
    // The sender sees the connection go away.
    REQUIRE(p.a.got.size() == 1);
    CHECK(p.a.got[0].kind == CKind::kLinkDown);
  }

  SUBCASE("armed once, written twice") {
    p.b.link->arm(5);
    const Outgoing batch[] = {slot_out(msg, 5, 1), slot_out(msg, 5, 2)};
    p.a.link->post(batch);
    REQUIRE(pump({&p.a, &p.b}, [&] { return p.b.got.size() >= 2; }));
    REQUIRE(p.b.got.size() == 2);
    CHECK(p.b.got[0].kind == CKind::kMessage);
    CHECK(p.b.got[1].kind == CKind::kLinkDown);
    CHECK(contains(p.b.link->down_reason(), "not armed"));
  }

  SUBCASE("re-armed between writes") {
    p.b.link->arm(5);
    Outgoing o1 = slot_out(msg, 5, 1);
    p.a.link->post({&o1, 1});
    REQUIRE(pump({&p.a, &p.b}, [&] { return !p.b.got.empty(); }));
    p.b.link->arm(5);
    Outgoing o2 = slot_out(msg, 5, 2);
    p.a.link->post({&o2, 1});
    REQUIRE(pump({&p.a, &p.b}, [&] { return p.b.got.size() >= 2; }));
    pump_for({&p.a, &p.b}, 20ms);
    CHECK(count_kind(p.b.got, CKind::kMessage) == 2);
    CHECK(count_kind(p.b.got, CKind::kLinkDown) == 0);
  }
}

TEST_CASE("tcp: frames that do not fit the ring bring the receiver's link down") {
  constexpr uint32_t kSlotSize = 512;
  Pair p(4, kSlotSize);

  SUBCASE("longer than the slot") {
    const auto msg = make_message(1, kSlotSize + 1, 1);
    p.b.link->arm(1);
    Outgoing o = slot_out(msg, 1, 1);
    p.a.link->post({&o, 1});
    REQUIRE(pump({&p.a, &p.b}, [&] { return !p.b.got.empty(); }));
    pump_for({&p.a, &p.b}, 20ms);
    REQUIRE(p.b.got.size() == 1);
    CHECK(p.b.got[0].kind == CKind::kLinkDown);
    CHECK_MESSAGE(contains(p.b.link->down_reason(), "frame of 513 bytes exceeds slot size 512"),
                  p.b.link->down_reason());
  }

  SUBCASE("slot outside the ring") {
    const auto msg = make_message(9, 64, 1);
    Outgoing o = slot_out(msg, 9, 1);
    p.a.link->post({&o, 1});
    REQUIRE(pump({&p.a, &p.b}, [&] { return !p.b.got.empty(); }));
    REQUIRE(p.b.got.size() == 1);
    CHECK(p.b.got[0].kind == CKind::kLinkDown);
    CHECK_MESSAGE(contains(p.b.link->down_reason(), "slot 9 outside ring of 4"),
                  p.b.link->down_reason());
  }
  // Validation happens before any byte is copied.
  for (std::byte x : p.b.ring) REQUIRE(x == kFill);
}

TEST_CASE("tcp: malformed frames from a raw peer bring the link down") {
  auto [raw, s] = loopback_pair();
  Side b;
  b.adopt(s, "tcp test link <- raw");
  const char* expect = nullptr;

  SUBCASE("frame before attach") {
    write_all(raw, frame(40, core::make_imm(0, 0), std::vector<std::byte>(40)));
    expect = "attach";
  }
  SUBCASE("control frame of the wrong size") {
    b.attach(4, 512);
    write_all(raw, frame(0x8000'0000u | 31u, 0, std::vector<std::byte>(31)));
    expect = "control frame of 31 bytes";
  }
  SUBCASE("empty body") {
    b.attach(4, 512);
    b.link->arm(0);
    write_all(raw, frame(0, core::make_imm(0, 0), {}));
    expect = "empty";
  }
  REQUIRE(pump({&b}, [&] { return !b.got.empty(); }));
  pump_for({&b}, 20ms);
  REQUIRE(b.got.size() == 1);
  CHECK(b.got[0].kind == CKind::kLinkDown);
  CHECK_MESSAGE(contains(b.link->down_reason(), expect), b.link->down_reason());
  ::close(raw);
}

TEST_CASE("tcp: closing one side gives the other exactly one kLinkDown") {
  SUBCASE("close() on the link") {
    Pair p(4, 256);
    p.a.link->close("bye");
    p.a.link->close("again");  // idempotent
    const auto msg = make_message(0, 64, 1);
    Outgoing o = slot_out(msg, 0, 1);
    p.a.link->post({&o, 1});  // ignored on a down link
    REQUIRE(pump({&p.a, &p.b}, [&] { return !p.b.got.empty(); }));
    pump_for({&p.a, &p.b}, 100ms);
    REQUIRE(p.a.got.size() == 1);
    CHECK(p.a.got[0].kind == CKind::kLinkDown);
    CHECK(p.a.got[0].context == &p.a);
    CHECK(p.a.link->down_reason() == "bye");
    REQUIRE(p.b.got.size() == 1);
    CHECK(p.b.got[0].kind == CKind::kLinkDown);
    CHECK(p.b.got[0].link == p.b.link.get());
    CHECK_MESSAGE(contains(p.b.link->down_reason(), "peer closed the connection"),
                  p.b.link->down_reason());
  }

  SUBCASE("the peer's socket is closed (FIN) after sending") {
    auto [raw, s] = loopback_pair();
    Side b;
    b.adopt(s, "tcp test link <- raw");
    b.attach(4, 256);
    b.link->arm(1);
    const auto body = make_message(1, 100, 2);
    write_all(raw, frame(100, core::make_imm(1, 0), body));
    ::close(raw);
    REQUIRE(pump({&b}, [&] { return b.got.size() >= 2; }));
    pump_for({&b}, 100ms);
    REQUIRE(b.got.size() == 2);
    CHECK(b.got[0].kind == CKind::kMessage);  // data before the FIN still arrives
    CHECK(b.got[1].kind == CKind::kLinkDown);
    CHECK(contains(b.link->down_reason(), "peer closed the connection"));
  }

  SUBCASE("the peer resets the connection") {
    auto [raw, s] = loopback_pair();
    Side b;
    b.adopt(s, "tcp test link <- raw");
    b.attach(4, 256);
    linger lg{1, 0};  // close() sends RST
    REQUIRE(::setsockopt(raw, SOL_SOCKET, SO_LINGER, &lg, sizeof lg) == 0);
    ::close(raw);
    REQUIRE(pump({&b}, [&] { return !b.got.empty(); }));
    pump_for({&b}, 100ms);
    REQUIRE(b.got.size() == 1);
    CHECK(b.got[0].kind == CKind::kLinkDown);
    CHECK_MESSAGE(contains(b.link->down_reason(), "reset"), b.link->down_reason());
    // Posting to a dead link neither sends nor reports anything new.
    const auto msg = make_message(0, 64, 1);
    Outgoing o = slot_out(msg, 0, 1);
    b.link->post({&o, 1});
    pump_for({&b}, 20ms);
    CHECK(b.got.size() == 1);
  }
}

TEST_CASE("tcp: destroying a link drops its queued completions") {
  constexpr uint32_t kSlotSize = 256;
  Side a1, a2, b;  // b.t receives for two links: b.link (from a1) and b2 (from a2)
  auto [c1, s1] = loopback_pair();
  auto [c2, s2] = loopback_pair();
  a1.adopt(c1, "a1");
  a2.adopt(c2, "a2");
  b.adopt(s1, "b1");
  auto r = b.t.adopt(s2, "b2");
  REQUIRE(r.ok());
  std::unique_ptr<TcpLink> b2 = std::move(r).value();
  a1.attach(4, kSlotSize);
  a2.attach(4, kSlotSize);
  b.attach(4, kSlotSize);
  std::vector<std::byte> ring2(4 * kSlotSize);
  int ctx2 = 0;
  REQUIRE(b2->attach(MemoryRegion{ring2.data(), ring2.size()}, MemoryRegion{}, 4, kSlotSize, &ctx2).ok());

  std::vector<std::vector<std::byte>> msgs;
  for (uint16_t i = 0; i < 3; ++i) msgs.push_back(make_message(i, 100, i));
  std::vector<Outgoing> batch;
  for (uint16_t i = 0; i < 3; ++i) {
    batch.push_back(slot_out(msgs[i], i, 0));
    b.link->arm(i);
    b2->arm(i);
  }
  a1.link->post(batch);
  a2.link->post(batch);
  a1.link->close("done");  // b1 will also queue a kLinkDown after its messages

  // Wait until the kernel holds both streams, so one poll reads both links.
  const int want = 3 * (8 + 100);
  const auto deadline = Clock::now() + kTimeout;
  while ((inq(s1) < want || inq(s2) < want) && Clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  REQUIRE(inq(s1) == want);
  REQUIRE(inq(s2) == want);

  std::array<Completion, 1> one;
  REQUIRE(b.t.poll(one) == 1);
  CHECK_FALSE(b.t.prepare_sleep());  // more are queued
  const void* dead = b.link.get();
  const bool first_was_dead = one[0].link == dead;
  b.link.reset();

  std::vector<Completion> after;
  const auto until = Clock::now() + 200ms;
  while (Clock::now() < until) {
    std::array<Completion, 8> buf;
    const size_t n = b.t.poll(buf);
    after.insert(after.end(), buf.begin(), buf.begin() + static_cast<ptrdiff_t>(n));
  }
  for (const Completion& c : after) REQUIRE(c.link != dead);
  // b2's three messages all survive, in order.
  const size_t b2_total = after.size() + (first_was_dead ? 0 : 1);
  CHECK(b2_total == 3);
  for (const Completion& c : after) {
    CHECK(c.link == b2.get());
    CHECK(c.context == &ctx2);
    CHECK(c.kind == CKind::kMessage);
  }
  CHECK(b.t.prepare_sleep());
}

TEST_CASE("tcp: adopt, attach and Link::register_memory validate their input") {
  TcpTransport t;
  CHECK(t.name() == "tcp");
  CHECK(t.wait_fd() >= 0);

  SUBCASE("adopt refuses a bad fd") {
    auto r = t.adopt(-1, "bad");
    CHECK_FALSE(r.ok());
  }
  SUBCASE("adopt refuses a pipe and closes it") {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    auto r = t.adopt(fds[0], "pipe");
    CHECK_FALSE(r.ok());
    CHECK(::fcntl(fds[0], F_GETFD) == -1);  // ownership was taken
    ::close(fds[1]);
  }
  SUBCASE("adopt refuses an unconnected socket") {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    auto r = t.adopt(fd, "unconnected");
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kUnavailable);
  }
  SUBCASE("attach checks the ring") {
    auto [c, s] = loopback_pair();
    ::close(s);
    auto r = t.adopt(c, "x");
    REQUIRE(r.ok());
    auto link = std::move(r).value();
    CHECK(link->describe() == "x");
    std::vector<std::byte> mem(1000);
    auto region = link->register_memory(mem, Access::kRemoteWrite);
    REQUIRE(region.ok());
    CHECK(region->base == mem.data());
    CHECK(region->length == 1000);
    CHECK(region->lkey == 0);
    CHECK(region->rkey == 0);
    CHECK(link->attach(region.value(), MemoryRegion{}, 4, 256, nullptr).code() == StatusCode::kInvalidArgument);
    CHECK(link->attach(region.value(), MemoryRegion{}, 3, 256, nullptr).ok());
    CHECK(link->attach(region.value(), MemoryRegion{}, 3, 256, nullptr).code() == StatusCode::kInvalidArgument);
    link->deregister(region.value());
    CHECK(region->base == nullptr);
    CHECK(region->length == 0);
  }
}

// ------------------------------------------------------------ buffer budgets

namespace {

// Posts `count` PING control frames, request ids first, first + 1, ...,
// as one batch.
void post_pings(Side& s, uint64_t first, size_t count) {
  std::vector<std::array<std::byte, core::kHeaderSize>> hdrs(count);
  std::vector<Outgoing> batch(count);
  for (size_t i = 0; i < count; ++i) {
    core::Header h;
    h.flags = static_cast<uint8_t>(core::Kind::kPing);
    h.request_id = first + i;
    core::encode_header(h, hdrs[i].data());
    batch[i] = Outgoing{hdrs[i].data(), core::kHeaderSize, core::make_imm(0, 0), Delivery::kControl};
  }
  s.link->post(batch);
}

// The request ids of the control completions in `got`, in order; a
// kLinkDown shows up as ~0.
std::vector<uint64_t> control_ids(const std::vector<Completion>& got) {
  std::vector<uint64_t> ids;
  for (const Completion& c : got)
    ids.push_back(c.kind == CKind::kControl ? core::decode_header(c.control.data()).request_id
                                            : ~uint64_t{0});
  return ids;
}

// Posts until more than the budget waits for a peer that does not read and
// the kernel's buffers take no more (the queue stays put while `s` is
// polled); returns how many frames were posted.  Stops early if the link
// goes down.
size_t overfill(Side& s) {
  size_t posted = 0;
  for (;;) {
    post_pings(s, 1000 + posted, 256);
    posted += 256;
    const uint64_t before = s.link->queued_bytes();
    pump_for({&s}, 20ms);
    if (!s.got.empty()) return posted;
    if (before > s.link->output_budget() && s.link->queued_bytes() == before) return posted;
    REQUIRE_MESSAGE(posted < 1'000'000, "the socket took everything: no backpressure to test");
  }
}

}  // namespace

TEST_CASE("tcp: past its output budget a link stops reading, and resumes once the peer drains") {
  Pair p(4, 256, 4096);
  REQUIRE(p.a.link->output_budget() == TcpTransport::output_budget(4, 256));
  REQUIRE(p.a.link->listening());
  const size_t posted = overfill(p.a);
  CHECK_FALSE(p.a.link->listening());

  // b's frames reach a's socket, but a must not read them while its own
  // output is over budget: a peer that never reads cannot make it read on.
  post_pings(p.b, 1, 3);
  pump_for({&p.a}, 200ms);
  CHECK(p.a.got.empty());
  CHECK_FALSE(p.a.link->listening());

  // b reads: a's queue drains, a reads again, and nothing was lost on
  // either side, in order.
  REQUIRE(pump({&p.a, &p.b}, [&] { return p.a.got.size() >= 3 && p.b.got.size() >= posted; }));
  CHECK(p.a.link->listening());
  CHECK(p.a.link->queued_bytes() == 0);
  CHECK(control_ids(p.a.got) == std::vector<uint64_t>{1, 2, 3});
  std::vector<uint64_t> want(posted);
  for (size_t i = 0; i < posted; ++i) want[i] = 1000 + i;
  CHECK(control_ids(p.b.got) == want);
}

TEST_CASE("tcp: a peer that reads nothing for peer_timeout_ms while output waits is closed") {
  Config cfg;
  cfg.peer_timeout_ms = 200;
  Pair p(4, 256, 4096, cfg);
  const auto t0 = Clock::now();
  overfill(p.a);
  REQUIRE(pump({&p.a}, [&] { return !p.a.got.empty(); }));
  const auto waited = Clock::now() - t0;
  REQUIRE(p.a.got.size() == 1);
  CHECK(p.a.got[0].kind == CKind::kLinkDown);
  const std::string& why = p.a.link->down_reason();
  CHECK_MESSAGE(contains(why, "peer has read nothing for"), why);
  CHECK_MESSAGE(contains(why, "bytes queued (peer_timeout_ms = 200)"), why);
  CHECK(waited >= 200ms);
  CHECK(p.a.link->queued_bytes() == 0);  // the queue went with the link
}

TEST_CASE("tcp: a slow peer that keeps reading is never closed by the drain timeout") {
  Config cfg;
  cfg.peer_timeout_ms = 200;
  Pair p(4, 256, 4096, cfg);
  constexpr size_t kFrames = 12'000;  // ~480 KB: many times the socket buffers
  post_pings(p.a, 0, kFrames);
  REQUIRE(p.a.link->queued_bytes() > p.a.link->output_budget());
  // b reads only every 50 ms (a quarter of the timeout), taking what the
  // sockets hold each time; a keeps writing in between.  This takes many
  // timeouts in all, so only progress-based draining keeps a alive.
  const auto t0 = Clock::now();
  const auto deadline = t0 + 30s;
  auto next_read = t0;
  while (p.b.got.size() < kFrames && Clock::now() < deadline && p.a.got.empty()) {
    p.a.poll_once();
    if (Clock::now() >= next_read) {
      while (p.b.poll_once() != 0) {
      }
      next_read = Clock::now() + 50ms;
    }
  }
  const auto took = Clock::now() - t0;
  CHECK_MESSAGE(p.a.got.empty(), "a went down: " << p.a.link->down_reason());
  REQUIRE(p.b.got.size() == kFrames);
  std::vector<uint64_t> want(kFrames);
  for (size_t i = 0; i < kFrames; ++i) want[i] = i;
  CHECK(control_ids(p.b.got) == want);
  // Otherwise the test proved nothing about the timeout.
  CHECK_MESSAGE(took > 400ms, "drained in " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms");
}
