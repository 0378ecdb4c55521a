// The bulk registration cache (lib/core/bulk/registration_cache.h) and the
// MemoryRegion handle (slotrpc/memory.h): one registration per domain and
// range, lazily; released regions refused; idle entries bounded; a
// domain's entries deregistered through its last link; concurrent
// registration of one range pins it once.
#include <doctest/doctest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "core/bulk/region.h"
#include "core/bulk/registration_cache.h"
#include "slotrpc/channel.h"
#include "slotrpc/server.h"
#include "transport/transport.h"

namespace {

using namespace slotrpc;
using namespace slotrpc::transport;

// A link that only counts bulk registrations in the domain it is given.
class CountingLink final : public Link {
 public:
  explicit CountingLink(const void* domain) : domain_(domain) {}
  Result<transport::MemoryRegion> register_memory(std::span<std::byte>, Access) override {
    return transport::MemoryRegion{};
  }
  void deregister(transport::MemoryRegion&) override {}
  Status attach(const transport::MemoryRegion&, const transport::MemoryRegion&, uint32_t, uint32_t,
                void*) override {
    return Status::ok_status();
  }
  void post(std::span<const Outgoing>) override {}
  void close(std::string) override {}
  std::string describe() const override { return "counting"; }
  bool supports_bulk() const override { return true; }
  const void* bulk_domain() const override { return domain_; }
  Result<BulkRegistration> register_bulk(const BulkSource& s) override {
    std::this_thread::yield();  // widen the window for the concurrency case
    ++registered;
    BulkRegistration r;
    r.base = s.address;
    r.length = s.length;
    r.lkey = 1000 + static_cast<uint32_t>(registered.load());
    r.domain = domain_;
    return r;
  }
  void deregister_bulk(BulkRegistration& r) override {
    ++deregistered;
    r = {};
  }
  std::atomic<int> registered{0};
  std::atomic<int> deregistered{0};

 private:
  const void* domain_;
};

// Each case uses domains of its own, and ends with link_down for every
// link, so the process-wide cache is empty of them afterwards.
struct Domains {
  char d1 = 0, d2 = 0;
};

TEST_CASE("a region registers once per domain, at first use, and never after release") {
  Domains d;
  CountingLink a1(&d.d1), a2(&d.d1), b(&d.d2);
  auto& cache = bulk::RegistrationCache::instance();
  cache.link_up(a1);
  cache.link_up(a2);
  cache.link_up(b);
  std::vector<std::byte> mem(1 << 20);
  auto region = bulk::make_region(BulkSource{mem.data(), mem.size()});
  REQUIRE(region.ok());
  slotrpc::MemoryRegion mr = region.value();
  CHECK(mr.valid());
  CHECK(mr.size() == mem.size());
  CHECK(a1.registered == 0);  // lazy

  auto r1 = mr.impl()->in_domain_of(a1);
  REQUIRE(r1.ok());
  auto r2 = mr.impl()->in_domain_of(a2);  // same domain: the same registration
  REQUIRE(r2.ok());
  CHECK(r2.value().lkey == r1.value().lkey);
  CHECK(a1.registered + a2.registered == 1);
  auto r3 = mr.impl()->in_domain_of(b);  // another domain: its own
  REQUIRE(r3.ok());
  CHECK(b.registered == 1);

  // The domain's last link goes down: its registration is dropped, and a
  // later use registers again (never the dead registration).
  cache.link_down(b);
  CHECK(b.deregistered == 1);
  cache.link_up(b);
  auto r5 = mr.impl()->in_domain_of(b);
  REQUIRE(r5.ok());
  CHECK(b.registered == 2);

  slotrpc::MemoryRegion copy = mr;
  copy.release();
  CHECK_FALSE(mr.valid());
  auto r4 = mr.impl()->in_domain_of(a1);
  REQUIRE_FALSE(r4.ok());
  CHECK(r4.status().code() == StatusCode::kInvalidArgument);
  CHECK(r4.status().message().find("released") != std::string::npos);

  cache.link_down(a1);
  cache.link_down(a2);
  cache.link_down(b);
  // Released, then the domains' last links went down: every registration
  // was deregistered exactly once.
  CHECK(a1.deregistered + a2.deregistered == 1);
  CHECK(b.deregistered == 2);
}

TEST_CASE("an unregistered span is registered while used, shared by concurrent users, dropped after") {
  Domains d;
  CountingLink l(&d.d1);
  auto& cache = bulk::RegistrationCache::instance();
  cache.link_up(l);
  std::vector<std::byte> mem(1 << 17);
  const size_t half = mem.size() / 2;
  auto a = cache.acquire(l, BulkSource{mem.data(), half});
  REQUIRE(a.ok());
  // In use: the same span, and a part of it, hit the entry.
  auto b = cache.acquire(l, BulkSource{mem.data(), half});
  auto c = cache.acquire(l, BulkSource{mem.data() + 100, 1000});
  REQUIRE(b.ok());
  REQUIRE(c.ok());
  CHECK(l.registered == 1);
  CHECK(c.value().registration.lkey == a.value().registration.lkey);
  // A range reaching past the entry is a registration of its own.
  auto e = cache.acquire(l, BulkSource{mem.data() + 100, mem.size() - 100});
  REQUIRE(e.ok());
  CHECK(l.registered == 2);
  for (auto* x : {&a, &b, &c}) cache.release(x->value().entry);
  // The first entry's last user is gone: it is deregistered at once (the
  // memory may be freed and mapped again with other pages at the same
  // address; registration_cache.h, "Why no idle entries").
  CHECK(l.deregistered == 1);
  auto again = cache.acquire(l, BulkSource{mem.data() + 200, 64});
  REQUIRE(again.ok());
  CHECK(l.registered == 2);  // inside e, still in use: served by it
  cache.release(again.value().entry);
  cache.release(e.value().entry);
  CHECK(l.deregistered == 2);
  auto fresh = cache.acquire(l, BulkSource{mem.data(), half});
  REQUIRE(fresh.ok());
  CHECK(l.registered == 3);  // registered afresh, never a dropped entry
  cache.release(fresh.value().entry);
  cache.link_down(l);
  CHECK(l.deregistered == 3);
}

TEST_CASE("idle entries are bounded; entries in use are never dropped") {
  Domains d;
  CountingLink l(&d.d1);
  auto& cache = bulk::RegistrationCache::instance();
  cache.link_up(l);
  const size_t n = bulk::RegistrationCache::kMaxIdle + 10;
  std::vector<std::byte> mem(n * 64);
  auto held = cache.acquire(l, BulkSource{mem.data(), 64});
  REQUIRE(held.ok());
  for (size_t i = 1; i < n; ++i) {
    auto r = cache.acquire(l, BulkSource{mem.data() + i * 64, 64});
    REQUIRE(r.ok());
    cache.release(r.value().entry);
  }
  CHECK(l.registered == static_cast<int>(n));
  // n - 1 idle, kMaxIdle kept: the oldest idle ones went; the held one stays.
  CHECK(l.deregistered == static_cast<int>(n - 1 - bulk::RegistrationCache::kMaxIdle));
  auto again = cache.acquire(l, BulkSource{mem.data(), 64});
  REQUIRE(again.ok());
  CHECK(again.value().entry == held.value().entry);
  cache.release(again.value().entry);
  cache.release(held.value().entry);
  cache.link_down(l);
  CHECK(l.deregistered == l.registered);
}

TEST_CASE("threads registering one range at once pin it once") {
  Domains d;
  CountingLink l(&d.d1);
  auto& cache = bulk::RegistrationCache::instance();
  cache.link_up(l);
  std::vector<std::byte> mem(1 << 20);
  auto region = bulk::make_region(BulkSource{mem.data(), mem.size()});
  REQUIRE(region.ok());
  slotrpc::MemoryRegion mr = region.value();
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 100; ++i) {
        auto r = cache.acquire(l, BulkSource{mem.data(), mem.size()});
        auto m = mr.impl()->in_domain_of(l);
        if (r.ok() && m.ok()) ++ok;
        if (r.ok()) cache.release(r.value().entry);
      }
    });
  for (auto& t : threads) t.join();
  CHECK(ok == 800);
  CHECK(l.registered == 1);
  mr.release();
  cache.link_down(l);
  CHECK(l.deregistered == 1);
}

TEST_CASE("register_memory checks the range; the handle reports it") {
  Server server;
  std::vector<std::byte> mem(4096);
  auto mr = server.register_memory(std::span<std::byte>(mem));
  REQUIRE(mr.ok());
  CHECK(mr.value().valid());
  CHECK(mr.value().data() == mem.data());
  CHECK(mr.value().size() == mem.size());
  CHECK_FALSE(mr.value().device());
  auto empty = server.register_memory(std::span<std::byte>());
  REQUIRE_FALSE(empty.ok());
  CHECK(empty.status().code() == StatusCode::kInvalidArgument);
  auto dev = server.register_memory(DmaBuf{-1, 0, mem.data(), mem.size()});
  REQUIRE_FALSE(dev.ok());
  CHECK(dev.status().code() == StatusCode::kInvalidArgument);
  auto dev2 = server.register_memory(DmaBuf{7, 0, mem.data(), mem.size()});
  REQUIRE(dev2.ok());
  CHECK(dev2.value().device());
  slotrpc::MemoryRegion none;
  CHECK_FALSE(none.valid());
  CHECK(none.size() == 0);
}

}  // namespace
