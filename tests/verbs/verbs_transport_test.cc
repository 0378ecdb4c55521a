// The verbs transport on its own, without sessions: device selection, link
// setup and teardown, slot writes and control sends both ways, inline and
// non-inline sizes, doorbell batching and send-queue overflow, another
// session's rkey (both ring protections: memory windows in a shared PD, and
// a PD per session), the shared receive queue and its budget, the control
// connection's EOF, and sleeping on wait_fd.
//
// Needs an RDMA device: run by the `rxe` suite (this host's device, else the
// Soft-RoCE VM; see tests/rxe/README.md).
#include "verbs_test_util.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/wire_format.h"
#include "transport/verbs/verbs_transport.h"

int main(int argc, char** argv) { return verbs_test::main(argc, argv); }

namespace {

using namespace std::chrono_literals;
using slotrpc::Config;
using slotrpc::StatusCode;
using slotrpc::transport::Access;
using slotrpc::transport::Completion;
using slotrpc::transport::Delivery;
using slotrpc::transport::MemoryRegion;
using slotrpc::transport::Outgoing;
using namespace slotrpc::transport::verbs;
using CKind = Completion::Kind;

constexpr std::byte kFill{0xee};

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

Config test_config() {
  auto c = Config{}.with_environment();
  REQUIRE_MESSAGE(c.ok(), c.status().to_string());
  return c.value();
}

Config with_srq(slotrpc::SharedReceiveQueue mode) {
  Config c = test_config();
  c.srq = mode;
  return c;
}
// Both ways of receiving and protecting rings (rxe has SRQs and type-2
// memory windows, so "on" is the shared mode).
constexpr slotrpc::SharedReceiveQueue kModes[] = {slotrpc::SharedReceiveQueue::kOn,
                                                  slotrpc::SharedReceiveQueue::kOff};

std::unique_ptr<VerbsTransport> make_transport(const Config& cfg = test_config()) {
  auto t = VerbsTransport::create(cfg);
  REQUIRE_MESSAGE(t.ok(), t.status().to_string());
  return std::move(t).value();
}

// One end of a link pair: its link, receive ring and send ring.
struct End {
  VerbsTransport& t;
  uint32_t slots;
  uint32_t size;
  std::unique_ptr<VerbsLink> link;
  std::vector<std::byte> recv;
  std::vector<std::byte> send;
  MemoryRegion recv_mr{};
  MemoryRegion send_mr{};
  std::vector<Completion> got;

  End(VerbsTransport& transport, uint32_t s, uint32_t sz) : t(transport), slots(s), size(sz) {}
  ~End() { destroy(); }
  void destroy() {
    if (!link) return;
    link->deregister(recv_mr);
    link->deregister(send_mr);
    link.reset();
  }
  std::byte* rslot(uint32_t i) { return recv.data() + size_t{i} * size; }
  std::byte* sslot(uint32_t i) { return send.data() + size_t{i} * size; }
  size_t count(CKind k) const {
    return static_cast<size_t>(std::count_if(got.begin(), got.end(), [k](const Completion& c) { return c.kind == k; }));
  }
  const Completion* first(CKind k) const {
    for (const Completion& c : got)
      if (c.kind == k) return &c;
    return nullptr;
  }
};

std::unique_ptr<End> make_end(VerbsTransport& t, uint32_t slots, uint32_t size, const std::string& name) {
  auto e = std::make_unique<End>(t, slots, size);
  auto l = t.create_link(name, slots);
  REQUIRE_MESSAGE(l.ok(), l.status().to_string());
  e->link = std::move(l).value();
  e->recv.assign(size_t{slots} * size, kFill);
  e->send.assign(size_t{slots} * size, std::byte{0});
  auto r = e->link->register_memory(e->recv, Access::kRemoteWrite);
  REQUIRE_MESSAGE(r.ok(), r.status().to_string());
  e->recv_mr = r.value();
  auto s = e->link->register_memory(e->send, Access::kLocalSend);
  REQUIRE_MESSAGE(s.ok(), s.status().to_string());
  e->send_mr = s.value();
  CHECK(e->recv_mr.rkey != 0);
  auto st = e->link->attach(e->recv_mr, e->send_mr, slots, size, e.get());
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  for (uint32_t i = 0; i < slots; ++i) e->link->arm(static_cast<uint16_t>(i));
  return e;
}

// Exchanges QpInfo (through the wire encoding) and connects both links.
void connect_pair(End& a, End& b, int fd_a = -1, int fd_b = -1) {
  auto through_wire = [](const QpInfo& info) {
    std::array<std::byte, kQpInfoSize> buf;
    encode_qp_info(info, buf.data());
    auto back = decode_qp_info(buf);
    REQUIRE_MESSAGE(back.ok(), back.status().to_string());
    return back.value();
  };
  const QpInfo ia = through_wire(a.link->local_info());
  const QpInfo ib = through_wire(b.link->local_info());
  auto st = a.link->connect(ib, fd_a, "b");
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  st = b.link->connect(ia, fd_b, "a");
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  CHECK(a.link->connected());
  CHECK(b.link->connected());
}

// Polls the transports, handing completions to their End, until done().
bool pump(std::initializer_list<VerbsTransport*> ts, const std::function<bool()>& done,
          std::chrono::milliseconds limit = 10000ms) {
  const auto until = std::chrono::steady_clock::now() + limit;
  std::array<Completion, 16> buf;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    for (VerbsTransport* t : ts) {
      const size_t n = t->poll(buf);
      for (size_t i = 0; i < n; ++i) static_cast<End*>(buf[i].context)->got.push_back(buf[i]);
    }
  }
  return true;
}
void settle(std::initializer_list<VerbsTransport*> ts, std::chrono::milliseconds d = 100ms) {
  (void)pump(ts, [] { return false; }, d);
}

uint8_t pattern(uint32_t seed, size_t i) { return static_cast<uint8_t>((seed * 131 + i * 7 + 1) & 0xff); }

// A slot message of `len` bytes in send slot `slot`.
Outgoing slot_message(End& e, uint16_t slot, uint32_t len, uint32_t gen) {
  std::byte* p = e.sslot(slot);
  for (uint32_t i = 0; i < len; ++i) p[i] = std::byte{pattern(gen + slot, i)};
  return Outgoing{p, len, slotrpc::core::make_imm(slot, gen), Delivery::kSlot};
}
bool slot_holds(End& e, uint16_t slot, uint32_t len, uint32_t gen) {
  const std::byte* p = e.rslot(slot);
  for (uint32_t i = 0; i < len; ++i)
    if (p[i] != std::byte{pattern(gen + slot, i)}) return false;
  return true;
}
std::array<std::byte, 32> control_bytes(uint32_t seq) {
  std::array<std::byte, 32> b;
  for (size_t i = 0; i < b.size(); ++i) b[i] = std::byte{pattern(seq, i)};
  std::memcpy(b.data(), &seq, sizeof seq);
  return b;
}

}  // namespace

TEST_CASE("device: chosen by default, by name, and errors that list what exists") {
  Config cfg = test_config();
  auto d = Device::open(cfg);
  REQUIRE_MESSAGE(d.ok(), d.status().to_string());
  const std::string name = d.value()->name();
  MESSAGE("device: " << d.value()->describe());
  CHECK(d.value()->port() == cfg.device_port);
  CHECK(mtu_bytes(d.value()->active_mtu()) >= 256);
  if (verbs_test::in_rxe_vm()) CHECK(d.value()->ethernet() == d.value()->roce_v2());  // rxe: RoCE v2 only
  CHECK(contains(d.value()->describe(), name));

  SUBCASE("by name") {
    cfg.device = name;
    auto n = Device::open(cfg);
    REQUIRE_MESSAGE(n.ok(), n.status().to_string());
    CHECK(n.value()->name() == name);
  }
  SUBCASE("an unknown name lists the devices found") {
    cfg.device = "nosuch0";
    auto n = Device::open(cfg);
    REQUIRE_FALSE(n.ok());
    CHECK(n.status().code() == StatusCode::kUnavailable);
    CHECK_MESSAGE(contains(n.status().message(), "'nosuch0'"), n.status().message());
    CHECK_MESSAGE(contains(n.status().message(), "not found"), n.status().message());
    CHECK_MESSAGE(contains(n.status().message(), name), n.status().message());
  }
  SUBCASE("a port the device does not have") {
    cfg.device_port = 255;  // no real device has that many ports
    auto n = Device::open(cfg);
    REQUIRE_FALSE(n.ok());
    CHECK_MESSAGE(contains(n.status().message(), "no port 255"), n.status().message());
    CHECK_MESSAGE(contains(n.status().message(), name), n.status().message());
  }
  SUBCASE("GID index: auto picks RoCE v2; an empty entry is refused with the valid ones") {
    cfg.gid_index = static_cast<int32_t>(d.value()->gid_index());
    auto n = Device::open(cfg);
    REQUIRE_MESSAGE(n.ok(), n.status().to_string());
    CHECK(std::memcmp(n.value()->gid().raw, d.value()->gid().raw, 16) == 0);
    cfg.device = name;
    cfg.gid_index = 200;
    n = Device::open(cfg);
    REQUIRE_FALSE(n.ok());
    CHECK_MESSAGE(contains(n.status().message(), "GID index 200"), n.status().message());
    CHECK_MESSAGE(contains(n.status().message(), "valid entries: " + std::to_string(d.value()->gid_index())),
                  n.status().message());
  }
  SUBCASE("GID auto-selection chose RoCE v2 where the port has such an entry") {
    // Independent of Device: walk the port's GID table ourselves.
    bool has_v2 = false;
    int first_v2 = -1;
    ibv_port_attr pa{};
    REQUIRE(ibv_query_port(d.value()->context(), d.value()->port(), &pa) == 0);
    for (int g = 0; g < pa.gid_tbl_len; ++g) {
      ibv_gid_entry e{};
      if (ibv_query_gid_ex(d.value()->context(), d.value()->port(), static_cast<uint32_t>(g), &e, 0) != 0) continue;
      bool zero = true;
      for (uint8_t b : e.gid.raw) zero = zero && b == 0;
      if (!zero && e.gid_type == IBV_GID_TYPE_ROCE_V2) {
        has_v2 = true;
        if (first_v2 < 0) first_v2 = g;
      }
    }
    MESSAGE("GID auto: index " << unsigned{d.value()->gid_index()}
                               << std::string(d.value()->roce_v2() ? " (RoCE v2)" : "") << "; first RoCE v2 entry "
                               << first_v2);
    if (verbs_test::in_rxe_vm()) CHECK(has_v2);  // rxe0 on dummy0: fe80:: at index 0, RoCE v2
    if (has_v2) {
      CHECK(d.value()->roce_v2());
      CHECK(int{d.value()->gid_index()} == first_v2);
    }
  }
  SUBCASE("relaxed ordering: what auto resolved to, per device") {
    // Every device with an active port, each opened by name with auto: a
    // device not on PCI (rxe) resolves off; on PCI, on exactly when the
    // device accepts an IBV_ACCESS_RELAXED_ORDERING registration.
    int num = 0;
    ibv_device** list = ibv_get_device_list(&num);
    REQUIRE(list != nullptr);
    int checked = 0;
    for (int i = 0; i < num; ++i) {
      const std::string dev_name = ibv_get_device_name(list[i]);
      Config c = test_config();
      c.device = dev_name;
      c.relaxed_ordering = slotrpc::RelaxedOrdering::kAuto;
      auto n = Device::open(c);
      if (!n.ok()) continue;  // no active port
      std::error_code ec;
      const auto subsystem = std::filesystem::canonical(
          std::filesystem::path("/sys/class/infiniband") / dev_name / "device" / "subsystem", ec);
      const bool pci = !ec && subsystem.filename() == "pci";
      bool expect = false;
      if (pci) {
        ibv_pd* pd = ibv_alloc_pd(n.value()->context());
        REQUIRE(pd != nullptr);
        std::vector<std::byte> page(4096);
        ibv_mr* mr = ibv_reg_mr(pd, page.data(), page.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_RELAXED_ORDERING);
        expect = mr != nullptr;
        if (mr != nullptr) ibv_dereg_mr(mr);
        ibv_dealloc_pd(pd);
      }
      MESSAGE("relaxed ordering auto on " << dev_name << std::string(pci ? " (PCI)" : " (not PCI)") << ": "
                                          << std::string(n.value()->relaxed_ordering() ? "on" : "off"));
      CHECK_MESSAGE(n.value()->relaxed_ordering() == expect, dev_name);
      if (verbs_test::in_rxe_vm()) CHECK_FALSE(n.value()->relaxed_ordering());  // rxe: not on PCI
      c.relaxed_ordering = slotrpc::RelaxedOrdering::kOn;
      auto on = Device::open(c);
      REQUIRE(on.ok());
      CHECK(on.value()->relaxed_ordering());  // on means on, whatever auto found
      ++checked;
    }
    ibv_free_device_list(list);
    CHECK(checked >= 1);
  }
  SUBCASE("probe describes the choice") {
    auto p = probe(cfg);
    REQUIRE(p.ok());
    CHECK(p.value() == d.value()->describe());
  }
}

TEST_CASE("verbs link: slot writes and control sends both ways; setup and teardown 20 times") {
 for (const auto mode : kModes) {
  CAPTURE(mode);
  auto ta = make_transport(with_srq(mode));
  auto tb = make_transport(with_srq(mode));
  const bool shared = mode == slotrpc::SharedReceiveQueue::kOn;
  CHECK(ta->shared_mode() == shared);
  constexpr uint32_t kSlots = 8, kSize = 4096;
  for (uint32_t round = 0; round < 20; ++round) {
    CAPTURE(round);
    auto a = make_end(*ta, kSlots, kSize, "a");
    auto b = make_end(*tb, kSlots, kSize, "b");
    CHECK(a->link->shared_receive_queue() == shared);
    CHECK(a->link->memory_window() == shared);
    CHECK(a->link->stats().shared_receive_queue == shared);
    connect_pair(*a, *b);
    CHECK(contains(a->link->describe(), "qp " + std::to_string(b->link->qp_num())));

    // a -> b: one message per slot, one batch.
    std::vector<Outgoing> batch;
    for (uint16_t s = 0; s < kSlots; ++s) batch.push_back(slot_message(*a, s, 100 + 500 * s, round));
    const auto before = a->link->stats();
    a->link->post(batch);
    CHECK(a->link->stats().doorbells == before.doorbells + 1);
    REQUIRE(pump({ta.get(), tb.get()}, [&] { return b->got.size() == kSlots; }));
    for (uint16_t s = 0; s < kSlots; ++s) {
      const Completion& c = b->got[s];
      CHECK(c.kind == CKind::kMessage);
      CHECK(c.slot == s);  // in order
      CHECK(c.length == 100 + 500u * s);
      CHECK(c.imm == slotrpc::core::make_imm(s, round));
      CHECK(c.link == b->link.get());
      CHECK(slot_holds(*b, s, c.length, round));
    }
    // b -> a, and control messages both ways.
    batch.clear();
    for (uint16_t s = 0; s < kSlots; ++s) batch.push_back(slot_message(*b, s, 32 + s, round + 1));
    auto ctl = control_bytes(round);
    batch.push_back(Outgoing{ctl.data(), 32, 0, Delivery::kControl});
    b->link->post(batch);
    ctl.fill(std::byte{0});  // post() copied it
    auto ctl2 = control_bytes(round + 100);
    a->link->post(std::vector<Outgoing>{Outgoing{ctl2.data(), 32, 0, Delivery::kControl}});
    REQUIRE(pump({ta.get(), tb.get()}, [&] { return a->got.size() == kSlots + 1 && b->got.size() == kSlots + 1; }));
    for (uint16_t s = 0; s < kSlots; ++s) CHECK(slot_holds(*a, s, 32 + s, round + 1));
    REQUIRE(a->got.back().kind == CKind::kControl);
    CHECK(a->got.back().control == control_bytes(round));
    REQUIRE(b->got.back().kind == CKind::kControl);
    CHECK(b->got.back().control == control_bytes(round + 100));
    CHECK(a->count(CKind::kLinkDown) == 0);
    CHECK(b->count(CKind::kLinkDown) == 0);
    // Closing is idempotent and reported once.
    a->link->close("test closes a");
    a->link->close("again");
    // Wait for the report itself (settle() alone may not poll at all on a
    // loaded machine: its 20 ms can pass before the first poll), then make
    // sure no second one follows.
    CHECK(pump({ta.get(), tb.get()}, [&] { return a->count(CKind::kLinkDown) >= 1; }, 5000ms));
    settle({ta.get(), tb.get()}, 20ms);
    CHECK(a->count(CKind::kLinkDown) == 1);
    CHECK(a->link->down_reason() == "test closes a");
  }
  // Once the stale completions of the closed links are drained, it sleeps.
  CHECK(verbs_test::wait_until([&] { return ta->prepare_sleep(); }, 2000ms));
  CHECK(ta->srq_committed() == 0);  // every link gave its reservation back
 }
}

TEST_CASE("verbs link: inline up to max_inline, larger messages read from the send slot") {
  auto t = make_transport();
  constexpr uint32_t kSlots = 16, kSize = 8192;
  auto a = make_end(*t, kSlots, kSize, "a");
  auto b = make_end(*t, kSlots, kSize, "b");
  connect_pair(*a, *b);
  const uint32_t mi = a->link->max_inline();
  MESSAGE("max_inline_data of the queue pair: " << mi);
  CHECK(mi > 0);
  CHECK(mi <= test_config().inline_bytes);
  CHECK(a->link->stats().max_inline == mi);
  const std::vector<uint32_t> sizes = {1, 31, 32, 33, mi - 1, mi, mi + 1, 1000, 4096, kSize - 1, kSize};
  uint32_t want_inline = 0, want_copy = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const uint32_t len = sizes[i];
    CAPTURE(len);
    const auto before = a->link->stats();
    a->link->post(std::vector<Outgoing>{slot_message(*a, static_cast<uint16_t>(i), len, 7)});
    const auto after = a->link->stats();
    if (len <= mi) {
      ++want_inline;
      CHECK(after.inline_sends == before.inline_sends + 1);
    } else {
      ++want_copy;
      CHECK(after.noninline_sends == before.noninline_sends + 1);
    }
    REQUIRE(pump({t.get()}, [&] { return b->got.size() == i + 1; }));
    CHECK(b->got.back().length == len);
    CHECK(slot_holds(*b, static_cast<uint16_t>(i), len, 7));
    // Nothing past the message was touched.
    if (len < kSize) CHECK(b->rslot(static_cast<uint32_t>(i))[len] == kFill);
  }
  CHECK(a->link->stats().inline_sends == want_inline);
  CHECK(a->link->stats().noninline_sends == want_copy);
  CHECK(a->link->stats().slot_sends == sizes.size());
}

TEST_CASE("verbs link: the configured inline size falls back to what the device accepts") {
  Config cfg = test_config();
  cfg.inline_bytes = 4096;
  auto t = make_transport(cfg);
  auto a = make_end(*t, 4, 8192, "a");
  const uint32_t mi = a->link->max_inline();
  MESSAGE("inline_bytes 4096 -> max_inline " << mi);
  // The probe halves from what was asked until the device agrees: the
  // result is 4096 >> k, never a rounded or device-reported odd size.
  CHECK(mi > 0);
  CHECK(std::has_single_bit(mi));
  CHECK(4096 % mi == 0);
  // rxe refuses 4096, 2048 and 1024 (its limit is its SGE area) and takes 512.
  if (verbs_test::in_rxe_vm()) CHECK(mi == 512);
  CHECK(a->link->stats().max_inline == mi);
  // The queue pair itself can inline that much: it was created with it.
  ibv_qp_attr qa{};
  ibv_qp_init_attr qi{};
  REQUIRE(ibv_query_qp(a->link->queue_pair(), &qa, IBV_QP_CAP, &qi) == 0);
  CHECK(qa.cap.max_inline_data >= mi);
  // Asking for what the device took gives that at once.
  cfg.inline_bytes = mi;
  auto te = make_transport(cfg);
  auto e = make_end(*te, 4, 8192, "e");
  CHECK(e->link->max_inline() == mi);
  cfg.inline_bytes = 0;
  auto t0 = make_transport(cfg);
  auto z = make_end(*t0, 4, 8192, "z");
  CHECK(z->link->max_inline() == 0);
}

TEST_CASE("verbs link: one doorbell per batch, selective signaling, overflow waits in order") {
  for (uint32_t inline_bytes : {256u, 0u}) {
    CAPTURE(inline_bytes);
    Config cfg = test_config();
    cfg.inline_bytes = inline_bytes;  // 0: control headers go through the link's send buffers
    auto t = make_transport(cfg);
    constexpr uint32_t kSlots = 64;
    auto a = make_end(*t, kSlots, 1024, "a");
    auto b = make_end(*t, kSlots, 1024, "b");
    connect_pair(*a, *b);
    const uint32_t sq = a->link->send_queue_depth();
    const uint32_t rq = b->link->receive_queue_depth();
    MESSAGE("send queue " << sq << ", receive queue " << rq);
    // More than the send queue holds, within what the receiver has posted
    // (as the credit protocol guarantees): the rest waits and goes out as
    // completions free room, in order.
    const uint32_t n = std::min(rq, sq + sq / 4);
    REQUIRE(n > sq);
    std::vector<std::array<std::byte, 32>> bodies;
    for (uint32_t i = 0; i < n; ++i) bodies.push_back(control_bytes(i));
    std::vector<Outgoing> batch;
    for (auto& body : bodies) batch.push_back(Outgoing{body.data(), 32, 0, Delivery::kControl});
    a->link->post(batch);
    for (auto& body : bodies) body.fill(std::byte{0});  // copied by post()
    const auto s1 = a->link->stats();
    CHECK(s1.doorbells == 1);
    CHECK(s1.backlogged == n - sq);
    REQUIRE(pump({t.get()}, [&] { return b->got.size() == n; }));
    for (uint32_t i = 0; i < n; ++i) {
      CAPTURE(i);
      CHECK(b->got[i].kind == CKind::kControl);
      CHECK(b->got[i].control == control_bytes(i));
    }
    const auto s2 = a->link->stats();
    CHECK(s2.doorbells >= 2);
    CHECK(s2.control_sends == n);
    CHECK(s2.signaled < n / 2);  // only every k-th request reports
    CHECK(s2.signaled >= n / 64);
    if (inline_bytes == 0) CHECK(s2.noninline_sends == n);
    CHECK(a->count(CKind::kLinkDown) == 0);
  }
}

TEST_CASE("verbs link: a write with another session's rkey fails and corrupts nothing") {
 // Server side: two sessions on one transport (one CQ, one device context):
 // shared PD with each ring behind a window bound to its own queue pair, or
 // each link in its own protection domain.  The attacker also tries the
 // ring's MR key itself.
 for (const auto mode : kModes) {
 for (const bool use_mr_key : {false, true}) {
  CAPTURE(mode);
  CAPTURE(use_mr_key);
  auto ts = make_transport(with_srq(mode));
  auto tc = make_transport(with_srq(mode));
  constexpr uint32_t kSlots = 4, kSize = 4096;
  auto a1 = make_end(*tc, kSlots, kSize, "a1");
  auto a2 = make_end(*ts, kSlots, kSize, "a2");
  auto b1 = make_end(*tc, kSlots, kSize, "b1");
  auto b2 = make_end(*ts, kSlots, kSize, "b2");
  connect_pair(*a1, *a2);
  connect_pair(*b1, *b2);
  std::byte* src = a1->sslot(0);
  std::memset(src, 0xab, 256);

  // The raw write itself works with the right rkey (a2's ring)...
  REQUIRE(a1->link->post_raw_write(src, 256, reinterpret_cast<uintptr_t>(a2->recv_mr.base), a2->recv_mr.rkey,
                                   slotrpc::core::make_imm(0, 1)).ok());
  REQUIRE(pump({ts.get(), tc.get()}, [&] { return a2->got.size() == 1; }));
  CHECK(a2->got[0].kind == CKind::kMessage);
  CHECK(a2->rslot(0)[255] == std::byte{0xab});

  // ...and fails with b2's: the responder (a2's QP) refuses a window bound
  // to another queue pair, an MR without remote access, or a key of
  // another protection domain.
  const uint32_t b2_mr_key = static_cast<ibv_mr*>(b2->recv_mr.handle)->rkey;
  if (mode == slotrpc::SharedReceiveQueue::kOn) CHECK(b2_mr_key != b2->recv_mr.rkey);
  REQUIRE(a1->link->post_raw_write(src, 256, reinterpret_cast<uintptr_t>(b2->recv_mr.base) + kSize,
                                   use_mr_key ? b2_mr_key : b2->recv_mr.rkey,
                                   slotrpc::core::make_imm(1, 1)).ok());
  REQUIRE(pump({ts.get(), tc.get()}, [&] { return a1->count(CKind::kLinkDown) == 1; }));
  const std::string why = a1->link->down_reason();
  MESSAGE("a1: " << why);
  CHECK_MESSAGE(contains(why, ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR)), why);
  CHECK(contains(why, "send completion failed"));
  settle({ts.get(), tc.get()}, 300ms);
  CHECK(a1->count(CKind::kLinkDown) == 1);  // later flush errors are ignored
  if (a2->count(CKind::kLinkDown) == 1) MESSAGE("a2 (responder): " << a2->link->down_reason());

  // b2's ring is untouched, b2 saw nothing, and session b still works.
  CHECK(std::all_of(b2->recv.begin(), b2->recv.end(), [](std::byte x) { return x == kFill; }));
  CHECK(b2->got.empty());
  b1->link->post(std::vector<Outgoing>{slot_message(*b1, 2, 300, 9)});
  REQUIRE(pump({ts.get(), tc.get()}, [&] { return b2->got.size() == 1; }));
  CHECK(b2->got[0].kind == CKind::kMessage);
  CHECK(slot_holds(*b2, 2, 300, 9));
  CHECK(b1->count(CKind::kLinkDown) == 0);
  CHECK(b2->count(CKind::kLinkDown) == 0);
 }
 }
}

TEST_CASE("verbs link: sessions share one SRQ up to its depth, then get their own receive queue") {
  Config cfg = with_srq(slotrpc::SharedReceiveQueue::kOn);
  constexpr uint32_t kSlots = 4, kSize = 1024;
  constexpr uint32_t kWant = 3 * kSlots + 16;  // receive requests a link reserves
  cfg.srq_depth = 2 * kWant + kWant / 2;       // room for two links
  auto ts = make_transport(cfg);
  auto tc = make_transport(with_srq(slotrpc::SharedReceiveQueue::kOff));
  REQUIRE(ts->shared_mode());
  REQUIRE(ts->srq_depth() == cfg.srq_depth);
  auto c1 = make_end(*tc, kSlots, kSize, "c1");
  auto c2 = make_end(*tc, kSlots, kSize, "c2");
  auto c3 = make_end(*tc, kSlots, kSize, "c3");
  auto s1 = make_end(*ts, kSlots, kSize, "s1");
  auto s2 = make_end(*ts, kSlots, kSize, "s2");
  auto s3 = make_end(*ts, kSlots, kSize, "s3");
  CHECK(s1->link->shared_receive_queue());
  CHECK(s2->link->shared_receive_queue());
  CHECK_FALSE(s3->link->shared_receive_queue());  // the SRQ is fully reserved
  CHECK(s3->link->memory_window());                // still the shared PD
  CHECK(ts->srq_committed() == 2 * kWant);
  CHECK_FALSE(c1->link->shared_receive_queue());
  CHECK_FALSE(c1->link->memory_window());
  connect_pair(*c1, *s1);
  connect_pair(*c2, *s2);
  connect_pair(*c3, *s3);

  // Far more messages than the SRQ holds, on all three sessions at once, so
  // its buffers go round many times; replies come back the same way.
  End* clients[] = {c1.get(), c2.get(), c3.get()};
  End* servers[] = {s1.get(), s2.get(), s3.get()};
  constexpr uint32_t kRounds = 150;
  for (uint32_t r = 0; r < kRounds; ++r) {
    for (int i = 0; i < 3; ++i) {
      std::vector<Outgoing> batch;
      for (uint16_t k = 0; k < kSlots; ++k) batch.push_back(slot_message(*clients[i], k, 40 + 10 * k + i, r));
      auto ctl = control_bytes(r * 3 + i);
      batch.push_back(Outgoing{ctl.data(), 32, 0, Delivery::kControl});
      clients[i]->link->post(batch);
    }
    const size_t want = size_t{r + 1} * (kSlots + 1);
    REQUIRE(pump({ts.get(), tc.get()}, [&] {
      return s1->got.size() == want && s2->got.size() == want && s3->got.size() == want;
    }));
    for (int i = 0; i < 3; ++i) {
      CAPTURE(i);
      End& s = *servers[i];
      for (uint16_t k = 0; k < kSlots; ++k) {
        const Completion& c = s.got[want - kSlots - 1 + k];
        REQUIRE(c.kind == CKind::kMessage);
        CHECK(c.link == s.link.get());  // the SRQ completion found its own link
        CHECK(slot_holds(s, k, 40 + 10 * k + i, r));
        s.link->arm(k);
      }
      REQUIRE(s.got.back().kind == CKind::kControl);
      CHECK(s.got.back().control == control_bytes(r * 3 + i));
      // A reply per slot, into the client's ring.
      std::vector<Outgoing> replies;
      for (uint16_t k = 0; k < kSlots; ++k) replies.push_back(slot_message(s, k, 20 + k, r + 7));
      s.link->post(replies);
    }
    REQUIRE(pump({ts.get(), tc.get()}, [&] {
      return c1->got.size() == size_t{r + 1} * kSlots && c2->got.size() == size_t{r + 1} * kSlots &&
             c3->got.size() == size_t{r + 1} * kSlots;
    }));
    for (End* c : clients)
      for (uint16_t k = 0; k < kSlots; ++k) {
        CHECK(slot_holds(*c, k, 20 + k, r + 7));
        c->link->arm(k);
      }
  }
  for (End* e : servers) CHECK(e->count(CKind::kLinkDown) == 0);

  // A link leaves: its reservation comes back and the next link shares again.
  s1->destroy();
  c1->destroy();
  CHECK(ts->srq_committed() == kWant);
  auto s4 = make_end(*ts, kSlots, kSize, "s4");
  auto c4 = make_end(*tc, kSlots, kSize, "c4");
  CHECK(s4->link->shared_receive_queue());
  connect_pair(*c4, *s4);
  c4->link->post(std::vector<Outgoing>{slot_message(*c4, 3, 77, 5)});
  REQUIRE(pump({ts.get(), tc.get()}, [&] { return s4->got.size() == 1; }));
  CHECK(s4->got[0].link == s4->link.get());
  CHECK(slot_holds(*s4, 3, 77, 5));
}

TEST_CASE("verbs link: with an SRQ, a torn-down queue pair's messages never reach a new link") {
  // SRQ completions are matched by queue-pair number, and a device may
  // reuse a destroyed queue pair's number at once: messages that landed but
  // were never polled must leave with their link.
  auto ts = make_transport(with_srq(slotrpc::SharedReceiveQueue::kOn));
  auto tc = make_transport(with_srq(slotrpc::SharedReceiveQueue::kOn));
  constexpr uint32_t kSlots = 8, kSize = 512;
  for (int round = 0; round < 30; ++round) {
    CAPTURE(round);
    auto c = make_end(*tc, kSlots, kSize, "c");
    auto s = make_end(*ts, kSlots, kSize, "s");
    connect_pair(*c, *s);
    std::vector<Outgoing> batch;
    for (uint16_t k = 0; k < kSlots; ++k) batch.push_back(slot_message(*c, k, 64, round));
    auto ctl = control_bytes(round);
    batch.push_back(Outgoing{ctl.data(), 32, 0, Delivery::kControl});
    c->link->post(batch);
    // Let them land in the server's CQ without polling it, then tear down.
    settle({tc.get()}, 10ms);  // the client's sends complete: they have landed
    const uint32_t old_qpn = s->link->qp_num();
    s.reset();  // never polled: its completions are in ts's CQ
    auto fresh = make_end(*ts, kSlots, kSize, "fresh");
    if (fresh->link->qp_num() == old_qpn) MESSAGE("queue-pair number " << old_qpn << " reused");
    settle({ts.get()}, 20ms);
    CHECK(fresh->got.empty());
  }
  CHECK(ts->srq_committed() == 0);
}

TEST_CASE("verbs link: a write into a slot that was not armed fails the receiving link") {
  auto t = make_transport();
  auto a = make_end(*t, 4, 1024, "a");
  auto b = make_end(*t, 4, 1024, "b");
  connect_pair(*a, *b);
  a->link->post(std::vector<Outgoing>{slot_message(*a, 1, 64, 1)});
  REQUIRE(pump({t.get()}, [&] { return b->got.size() == 1; }));
  a->link->post(std::vector<Outgoing>{slot_message(*a, 1, 64, 2)});  // slot 1 not re-armed
  REQUIRE(pump({t.get()}, [&] { return b->count(CKind::kLinkDown) == 1; }));
  CHECK_MESSAGE(contains(b->link->down_reason(), "slot 1 which was not armed"), b->link->down_reason());
}

TEST_CASE("verbs link: EOF or stray bytes on the control connection fail the link at once") {
  auto t = make_transport();
  for (bool stray : {false, true}) {
    CAPTURE(stray);
    int sa[2], sb[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sa) == 0);
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sb) == 0);
    auto a = make_end(*t, 4, 1024, "a");
    auto b = make_end(*t, 4, 1024, "b");
    connect_pair(*a, *b, sa[0], sb[0]);  // the links own sa[0], sb[0]
    if (stray) {
      REQUIRE(::write(sa[1], "x", 1) == 1);
    } else {
      ::close(sa[1]);
    }
    const auto t0 = std::chrono::steady_clock::now();
    REQUIRE(pump({t.get()}, [&] { return a->count(CKind::kLinkDown) == 1; }, 2000ms));
    CHECK(std::chrono::steady_clock::now() - t0 < 500ms);
    CHECK_MESSAGE(contains(a->link->down_reason(), stray ? "unexpected" : "peer closed the connection"),
                  a->link->down_reason());
    if (stray) {
      // The failed link shut its socket down: the other end sees EOF.
      char c;
      CHECK(::read(sa[1], &c, 1) == 0);
      ::close(sa[1]);
    }
    CHECK(b->count(CKind::kLinkDown) == 0);
    ::close(sb[1]);
  }
}

TEST_CASE("verbs transport: wait_fd wakes a sleeping loop; a completion before the arm is not lost") {
  auto ta = make_transport();
  auto tb = make_transport();
  auto a = make_end(*ta, 4, 1024, "a");
  auto b = make_end(*tb, 4, 1024, "b");
  connect_pair(*a, *b);
  auto readable = [&](int ms) {
    pollfd p{tb->wait_fd(), POLLIN, 0};
    return ::poll(&p, 1, ms) == 1;
  };
  std::array<Completion, 8> out;

  // Idle: it may sleep, and nothing wakes it.
  REQUIRE(tb->prepare_sleep());
  (void)tb->poll(out);  // consume anything left from the setup
  REQUIRE(tb->prepare_sleep());
  CHECK_FALSE(readable(50));

  // Armed, then a message: the completion channel wakes the fd.
  a->link->post(std::vector<Outgoing>{slot_message(*a, 0, 100, 1)});
  CHECK(readable(5000));
  size_t n = 0;
  REQUIRE(verbs_test::wait_until([&] { return (n = tb->poll(out)) > 0; }));
  CHECK(out[0].kind == CKind::kMessage);
  CHECK(out[0].slot == 0);
  CHECK(tb->prepare_sleep());
  CHECK_FALSE(readable(20));  // the event was consumed

  // A completion already in the CQ when the loop prepares to sleep.
  b->link->arm(1);
  a->link->post(std::vector<Outgoing>{slot_message(*a, 1, 100, 2)});
  std::this_thread::sleep_for(100ms);  // it has arrived, unpolled
  CHECK_FALSE(tb->prepare_sleep());
  n = tb->poll(out);
  REQUIRE(n == 1);
  CHECK(out[0].slot == 1);
}

TEST_CASE("verbs link: queue-pair settings from Config are accepted") {
  struct Case {
    uint32_t timeout, retry, rnr, min_rnr, tc, sl;
  };
  for (const Case& k : {Case{0, 0, 0, 0, 0, 0}, Case{31, 7, 7, 31, 255, 15}, Case{1, 3, 1, 1, 32, 3},
                        Case{14, 7, 7, 12, 0, 0}}) {
    CAPTURE(k.timeout);
    CAPTURE(k.sl);
    Config cfg = test_config();
    cfg.qp_timeout = k.timeout;
    cfg.retry_count = k.retry;
    cfg.rnr_retry = k.rnr;
    cfg.min_rnr_timer = k.min_rnr;
    cfg.traffic_class = k.tc;
    cfg.service_level = k.sl;
    REQUIRE(cfg.validate().ok());
    auto t = make_transport(cfg);
    auto a = make_end(*t, 2, 512, "a");
    auto b = make_end(*t, 2, 512, "b");
    connect_pair(*a, *b);
    a->link->post(std::vector<Outgoing>{slot_message(*a, 0, 200, 3)});
    REQUIRE(pump({t.get()}, [&] { return b->got.size() == 1; }));
    CHECK(slot_holds(*b, 0, 200, 3));
    // What the queue pair really holds, read back from it.
    for (End* e : {a.get(), b.get()}) {
      ibv_qp_attr qa{};
      ibv_qp_init_attr qi{};
      REQUIRE(ibv_query_qp(e->link->queue_pair(), &qa,
                           IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                               IBV_QP_RNR_RETRY | IBV_QP_MIN_RNR_TIMER,
                           &qi) == 0);
      CHECK(qa.qp_state == IBV_QPS_RTS);
      CHECK(unsigned{qa.timeout} == k.timeout);
      CHECK(unsigned{qa.retry_cnt} == k.retry);
      CHECK(unsigned{qa.rnr_retry} == k.rnr);
      CHECK(unsigned{qa.min_rnr_timer} == k.min_rnr);
      // rxe keeps no service level in its address vector (RoCE carries
      // priority in the traffic class): it reads back 0 there.
      if (t->device().name().rfind("rxe", 0) != 0) CHECK(unsigned{qa.ah_attr.sl} == k.sl);
      // Both ends on one port: the path MTU is the port's active MTU.
      CHECK(qa.path_mtu == t->device().active_mtu());
      if (t->device().ethernet()) {
        CHECK(qa.ah_attr.is_global == 1);
        CHECK(unsigned{qa.ah_attr.grh.traffic_class} == k.tc);
        CHECK(unsigned{qa.ah_attr.grh.sgid_index} == t->device().gid_index());
      }
    }
  }
}

TEST_CASE("verbs link: the path MTU is the smaller of both ports'") {
  auto t = make_transport();
  auto a = make_end(*t, 2, 512, "a");
  auto b = make_end(*t, 2, 512, "b");
  const ibv_mtu port_mtu = t->device().active_mtu();
  REQUIRE(port_mtu > IBV_MTU_256);
  // Each end hears that the other's port runs 256 (our port is larger):
  // both queue pairs must use 256, not their own port's MTU.
  QpInfo ia = a->link->local_info();
  QpInfo ib = b->link->local_info();
  ia.mtu = IBV_MTU_256;
  ib.mtu = IBV_MTU_256;
  REQUIRE(a->link->connect(ib, -1, "b").ok());
  REQUIRE(b->link->connect(ia, -1, "a").ok());
  for (End* e : {a.get(), b.get()}) {
    ibv_qp_attr qa{};
    ibv_qp_init_attr qi{};
    REQUIRE(ibv_query_qp(e->link->queue_pair(), &qa, IBV_QP_PATH_MTU, &qi) == 0);
    CHECK(qa.path_mtu == IBV_MTU_256);
  }
  // Messages larger than 256 bytes still arrive whole (several packets).
  a->link->post(std::vector<Outgoing>{slot_message(*a, 0, 500, 9)});
  REQUIRE(pump({t.get()}, [&] { return b->got.size() == 1; }));
  CHECK(slot_holds(*b, 0, 500, 9));
}

TEST_CASE("verbs transport: under load one poll takes several completions, one doorbell several messages") {
  // A sender keeps many slot messages in flight, posting them the way the
  // core does (a batch per loop turn, here 8); the receiver echoes nothing
  // back, it only consumes.  Completions pile up between polls, so a poll
  // that takes one completion at a time shows here as polls ~= completions.
  auto t = make_transport();
  auto r = make_transport();
  constexpr uint32_t kSlots = 64, kSize = 256, kBatch = 8;
  constexpr uint64_t kMessages = 20000;
  auto a = make_end(*t, kSlots, kSize, "a");
  auto b = make_end(*r, kSlots, kSize, "b");
  connect_pair(*a, *b);
  const auto p0 = r->poll_stats();
  const auto s0 = a->link->stats();
  uint64_t sent = 0;
  size_t received = 0;
  std::array<Completion, 64> buf;
  const auto until = std::chrono::steady_clock::now() + 60s;
  while (received < kMessages && std::chrono::steady_clock::now() < until) {
    // Keep up to kSlots in flight: slot i is reused once its message arrived.
    while (sent < kMessages && sent - received + kBatch <= kSlots) {
      std::array<Outgoing, kBatch> batch;
      for (uint32_t j = 0; j < kBatch; ++j) {
        const auto slot = static_cast<uint16_t>((sent + j) % kSlots);
        batch[j] = slot_message(*a, slot, 64, static_cast<uint32_t>(sent + j));
      }
      a->link->post(batch);
      sent += kBatch;
    }
    (void)t->poll(buf);  // the sender's send completions
    const size_t n = r->poll(buf);
    for (size_t i = 0; i < n; ++i) {
      if (buf[i].kind != CKind::kMessage) continue;
      ++received;
      b->link->arm(buf[i].slot);
    }
  }
  REQUIRE(received == kMessages);
  const auto p1 = r->poll_stats();
  const auto s1 = a->link->stats();
  const double per_poll = double(p1.completions - p0.completions) / double(p1.polls - p0.polls);
  const double doorbells_per_msg = double(s1.doorbells - s0.doorbells) / double(s1.slot_sends - s0.slot_sends);
  MESSAGE(kMessages << " messages: " << per_poll << " completions per non-empty poll at the receiver, "
                    << doorbells_per_msg << " doorbells per message at the sender");
  CHECK(per_poll > 1.5);
  CHECK(doorbells_per_msg <= 1.0 / kBatch + 0.01);
  CHECK(a->count(CKind::kLinkDown) == 0);
  CHECK(b->count(CKind::kLinkDown) == 0);
}

TEST_CASE("verbs link: connect and attach refuse what does not match") {
  auto t = make_transport();
  auto a = make_end(*t, 4, 1024, "a");
  auto b = make_end(*t, 8, 1024, "b");
  auto st = a->link->connect(b->link->local_info(), -1, "b");
  CHECK_FALSE(st.ok());
  CHECK_MESSAGE(contains(st.message(), "8 slots"), st.message());
  // Posting before connect waits; after a close it is dropped.
  auto c = make_end(*t, 4, 1024, "c");
  a->link->post(std::vector<Outgoing>{slot_message(*a, 0, 64, 1)});
  CHECK(a->link->stats().backlogged == 1);
  connect_pair(*a, *c);
  REQUIRE(pump({t.get()}, [&] { return c->got.size() == 1; }));
  CHECK(slot_holds(*c, 0, 64, 1));

  // attach: rings from another link are refused.
  auto l = t->create_link("d", 4);
  REQUIRE(l.ok());
  auto st2 = l.value()->attach(a->recv_mr, a->send_mr, 4, 1024, nullptr);
  CHECK(st2.code() == StatusCode::kInvalidArgument);
  // Queues are sized at creation: more slots than that are refused.
  std::vector<std::byte> mem(8 * 1024);
  auto r = l.value()->register_memory(mem, Access::kRemoteWrite);
  REQUIRE(r.ok());
  CHECK(l.value()->attach(r.value(), r.value(), 8, 1024, nullptr).code() == StatusCode::kInvalidArgument);
  CHECK(l.value()->attach(r.value(), r.value(), 4, 1024, nullptr).ok());
  l.value()->deregister(r.value());
}

TEST_CASE("verbs link: a peer that takes none of our sends fails the link at the backlog budget") {
  // The receiver's transport is never polled, so it never reposts the
  // receives its queue pair consumes: once they are gone, every further send
  // waits on RNR forever (rnr_retry 7), the send queue fills, and the rest
  // piles up in the backlog.  A peer that follows the credit rules can never
  // leave more than 5 x slots + 64 messages unacknowledged; past that the
  // link must fail, not grow.
  Config sender_cfg = with_srq(slotrpc::SharedReceiveQueue::kOff);
  sender_cfg.rnr_retry = 7;
  auto ta = make_transport(sender_cfg);
  auto tb = make_transport(with_srq(slotrpc::SharedReceiveQueue::kOff));
  constexpr uint32_t kSlots = 16;
  auto a = make_end(*ta, kSlots, 1024, "a");
  auto b = make_end(*tb, kSlots, 1024, "b");
  connect_pair(*a, *b);
  const size_t budget = 5 * kSlots + 64;
  const size_t most = b->link->receive_queue_depth() + a->link->send_queue_depth() + budget;
  std::vector<std::array<std::byte, 32>> bodies;
  for (uint32_t i = 0; i < 16; ++i) bodies.push_back(control_bytes(i));
  std::vector<Outgoing> batch;
  for (auto& body : bodies) batch.push_back(Outgoing{body.data(), 32, 0, Delivery::kControl});
  size_t posted = 0;
  while (a->count(CKind::kLinkDown) == 0 && posted < 4 * most) {
    a->link->post(batch);
    posted += batch.size();
    pump({ta.get()}, [&] { return a->count(CKind::kLinkDown) != 0; }, 5ms);
  }
  MESSAGE("posted " << posted << " messages; receive queue " << b->link->receive_queue_depth()
                    << ", send queue " << a->link->send_queue_depth() << ", budget " << budget);
  REQUIRE(a->count(CKind::kLinkDown) == 1);
  CHECK_MESSAGE(contains(a->link->down_reason(), "send backlog over budget"), a->link->down_reason());
  // It failed at the budget: once the receives the peer had posted were used
  // up and the send queue was full, within one batch of the budget.
  CHECK(posted <= most + batch.size());
  // The scenario was the one described: the receiver took exactly the
  // receives it had posted (its completions wait in its unpolled queue).
  CHECK(pump({tb.get()}, [&] { return b->count(CKind::kControl) >= b->link->receive_queue_depth(); }, 5000ms));
  CHECK(b->count(CKind::kControl) == b->link->receive_queue_depth());
}
