// The exposure table of the transports that move bulk data in software
// (TCP, shared memory; lib/transport/host_bulk.h): keys handed out once,
// within a link's share of the key space, and every peer access checked
// against the table before a byte moves.  The links' own tests
// (bulk_tcp_link, bulk_tcp_lane, shm_bulk) drive the same checks through
// frames; this one pins the table's rules where a frame cannot reach them
// easily: the end of the key space, and keys of the other half of a split
// connection.
#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <string>

#include "transport/host_bulk.h"

using slotrpc::StatusCode;
using slotrpc::transport::BulkAccess;
using slotrpc::transport::HostExposure;
using slotrpc::transport::HostExposureTable;

namespace {

// The peer's access, with the reason when it is refused ("" when allowed).
std::string refusal(const HostExposureTable& t, uint32_t rkey, BulkAccess want, uint64_t addr,
                    uint64_t length) {
  std::string why;
  const HostExposure* e = t.check_peer_access(rkey, want, addr, length, "read", &why);
  if (e != nullptr) {
    CHECK(why.empty());
    return "";
  }
  CHECK(!why.empty());
  return why;
}

}  // namespace

TEST_CASE("host exposures: keys count up from the range's start and are never handed out again") {
  std::array<std::byte, 64> mem{};
  HostExposureTable t;
  auto a = t.add(mem.data(), 16, BulkAccess::kRemoteRead);
  auto b = t.add(mem.data() + 16, 16, BulkAccess::kRemoteWrite);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a.value() == 1);
  CHECK(b.value() == 2);
  CHECK(t.size() == 2);
  REQUIRE(t.find(b.value()) != nullptr);
  CHECK(t.find(b.value())->base == mem.data() + 16);

  CHECK(t.erase(a.value()));
  CHECK_FALSE(t.erase(a.value()));  // a second revoke finds nothing
  CHECK(t.find(a.value()) == nullptr);
  auto c = t.add(mem.data(), 16, BulkAccess::kRemoteRead);
  REQUIRE(c.ok());
  CHECK(c.value() == 3);  // not 1 again: the peer may still hold key 1
  CHECK(refusal(t, a.value(), BulkAccess::kRemoteRead, 0, 16) == "peer read through rkey 1, which was revoked");
  CHECK(refusal(t, c.value(), BulkAccess::kRemoteRead, 0, 16).empty());
}

TEST_CASE("host exposures: a range of keys ends the link's bulk use, revokes do not give keys back") {
  std::array<std::byte, 16> mem{};
  HostExposureTable t;
  t.set_keys(10, 12);
  auto a = t.add(mem.data(), 16, BulkAccess::kRemoteRead);
  auto b = t.add(mem.data(), 16, BulkAccess::kRemoteRead);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a.value() == 11);
  CHECK(b.value() == 12);
  CHECK(t.erase(a.value()));
  auto c = t.add(mem.data(), 16, BulkAccess::kRemoteRead);
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().code() == StatusCode::kResourceExhausted);
  CHECK(c.status().message() == "expose: the link has used every rkey");
  CHECK(t.size() == 1);  // the refused add left nothing behind
}

TEST_CASE("host exposures: the peer's access is checked against key, access and range") {
  std::array<std::byte, 4096> mem{};
  HostExposureTable t;
  t.set_keys(0x8000'0000u, UINT32_MAX);  // a TCP bulk lane's half
  auto r = t.add(mem.data(), 1000, BulkAccess::kRemoteRead);
  REQUIRE(r.ok());
  const uint32_t key = r.value();
  CHECK(key == 0x8000'0001u);

  CHECK(refusal(t, key, BulkAccess::kRemoteRead, 0, 1000).empty());
  CHECK(refusal(t, key, BulkAccess::kRemoteRead, 999, 1).empty());
  CHECK(refusal(t, key, BulkAccess::kRemoteWrite, 0, 10) ==
        "peer read through rkey 2147483649, exposed for reading only");
  CHECK(refusal(t, key, BulkAccess::kRemoteRead, 999, 2) ==
        "peer read 2 bytes at 999 of rkey 2147483649, which exposes 1000");
  CHECK(refusal(t, key, BulkAccess::kRemoteRead, 0, 0) ==
        "peer read 0 bytes at 0 of rkey 2147483649, which exposes 1000");
  // A sum that would wrap is refused, not wrapped into the range.
  CHECK(refusal(t, key, BulkAccess::kRemoteRead, UINT64_MAX, 2) ==
        "peer read 2 bytes at 18446744073709551615 of rkey 2147483649, which exposes 1000");
  CHECK(refusal(t, key, BulkAccess::kRemoteRead, 1, UINT64_MAX) ==
        "peer read 18446744073709551615 bytes at 1 of rkey 2147483649, which exposes 1000");
  // Keys of the session's half were never handed out by this table, even
  // though they are below the last key it gave: never exposed, not revoked.
  CHECK(refusal(t, 5, BulkAccess::kRemoteRead, 0, 1) == "peer read through rkey 5, which was never exposed");
  CHECK(refusal(t, 0, BulkAccess::kRemoteRead, 0, 1) == "peer read through rkey 0, which was never exposed");
  CHECK(refusal(t, key + 1, BulkAccess::kRemoteRead, 0, 1) ==
        "peer read through rkey 2147483650, which was never exposed");

  // Down: nothing exposed any more, the keys stay used.
  t.clear();
  CHECK(t.empty());
  CHECK(refusal(t, key, BulkAccess::kRemoteRead, 0, 1) == "peer read through rkey 2147483649, which was revoked");
  auto next = t.add(mem.data(), 10, BulkAccess::kRemoteRead);
  REQUIRE(next.ok());
  CHECK(next.value() == key + 1);
}
