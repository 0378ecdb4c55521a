// slotrpc::Histogram against known distributions: every reported quantile
// lies within the documented bound of the exact sample quantile (never
// below it, at most 1/16 above), count/sum/min/max are exact, merges equal
// recording everything in one, and snapshots round-trip.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "slotrpc/histogram.h"

using slotrpc::Histogram;

namespace {

// The exact sample quantile with the same rank rule: the ceil(q*n)-th smallest.
uint64_t exact_quantile(std::vector<uint64_t> v, double q) {
  std::sort(v.begin(), v.end());
  const auto n = static_cast<uint64_t>(v.size());
  uint64_t rank = static_cast<uint64_t>(std::ceil(q * double(n)));
  rank = std::clamp<uint64_t>(rank, 1, n);
  return v[rank - 1];
}

void check_bounds(const std::vector<uint64_t>& values, const Histogram& h) {
  for (double q : {0.01, 0.1, 0.5, 0.9, 0.99, 0.999, 1.0}) {
    const uint64_t exact = exact_quantile(values, q);
    const uint64_t got = h.quantile(q);
    INFO("q=" << q << " exact=" << exact << " got=" << got);
    CHECK(got >= exact);
    if (exact < Histogram::kSub) {
      CHECK(got == exact);
    } else {
      CHECK(double(got) <= double(exact) * (1.0 + 1.0 / 16.0));
    }
    CHECK(Histogram::quantile(h.snapshot(), q) == got);
  }
  CHECK(h.count() == values.size());
  CHECK(h.max() == *std::max_element(values.begin(), values.end()));
  CHECK(h.min() == *std::min_element(values.begin(), values.end()));
  uint64_t sum = 0;
  for (uint64_t v : values) sum += v;
  CHECK(h.sum() == sum);
  CHECK(h.quantile(1.0) == h.max());
}

}  // namespace

TEST_CASE("histogram: bucket layout is contiguous and bounded") {
  for (size_t i = 0; i + 1 < Histogram::kBuckets; ++i) {
    REQUIRE(Histogram::bucket_high(i) + 1 == Histogram::bucket_low(i + 1));
    REQUIRE(Histogram::bucket_of(Histogram::bucket_low(i)) == i);
    REQUIRE(Histogram::bucket_of(Histogram::bucket_high(i)) == i);
    const uint64_t low = Histogram::bucket_low(i);
    const uint64_t width = Histogram::bucket_high(i) - low + 1;
    if (low >= Histogram::kSub) REQUIRE(width * 16 <= low);
    else REQUIRE(width == 1);
  }
  CHECK(Histogram::bucket_of(UINT64_MAX) == Histogram::kBuckets - 1);
  CHECK(Histogram::bucket_high(Histogram::kBuckets - 1) == UINT64_MAX);
}

TEST_CASE("histogram: empty") {
  Histogram h;
  CHECK(h.count() == 0);
  CHECK(h.quantile(0.5) == 0);
  CHECK(h.max() == 0);
  CHECK(h.min() == 0);
  const auto s = h.snapshot();
  CHECK(s.count == 0);
  CHECK(s.buckets.empty());
  CHECK(Histogram::quantile(s, 0.99) == 0);
}

TEST_CASE("histogram: constant") {
  for (uint64_t c : {uint64_t{0}, uint64_t{7}, uint64_t{1000}, uint64_t{123456789}}) {
    Histogram h;
    std::vector<uint64_t> v(1000, c);
    for (uint64_t x : v) h.record(x);
    check_bounds(v, h);
    // Clamped to [min, max]: a constant is reported exactly.
    CHECK(h.quantile(0.5) == c);
    CHECK(h.quantile(0.999) == c);
  }
}

TEST_CASE("histogram: uniform") {
  std::mt19937_64 rng(1);
  std::uniform_int_distribution<uint64_t> d(1, 1'000'000);
  std::vector<uint64_t> v(200'000);
  Histogram h;
  for (auto& x : v) h.record(x = d(rng));
  check_bounds(v, h);
}

TEST_CASE("histogram: two-point") {
  // 99% at 10 us, 1% at 5000 us: p50 and p90 are 10, p99 still 10 (rank
  // 99,000 of 100,000), p99.9 in the 5000 bucket.
  std::vector<uint64_t> v;
  for (int i = 0; i < 99'000; ++i) v.push_back(10);
  for (int i = 0; i < 1'000; ++i) v.push_back(5000);
  Histogram h;
  for (uint64_t x : v) h.record(x);
  check_bounds(v, h);
  CHECK(h.quantile(0.5) == 10);
  CHECK(h.quantile(0.99) == 10);
  CHECK(h.quantile(0.991) == 5000);  // clamped to max
  CHECK(h.quantile(0.999) == 5000);
}

TEST_CASE("histogram: exponential, and huge values") {
  std::mt19937_64 rng(2);
  std::exponential_distribution<double> d(1.0 / 50'000);
  std::vector<uint64_t> v(100'000);
  Histogram h;
  for (auto& x : v) h.record(x = static_cast<uint64_t>(d(rng)));
  check_bounds(v, h);

  std::vector<uint64_t> big = {UINT64_MAX, UINT64_MAX / 3, uint64_t{1} << 40, 17};
  Histogram b;
  for (uint64_t x : big) b.record(x);
  CHECK(b.max() == UINT64_MAX);
  CHECK(b.quantile(1.0) == UINT64_MAX);
  CHECK(b.quantile(0.25) == 17);
}

TEST_CASE("histogram: merge equals recording everything in one") {
  std::mt19937_64 rng(3);
  std::uniform_int_distribution<uint64_t> d(0, 100'000);
  Histogram all, a, b, via_snapshot;
  std::vector<uint64_t> v;
  for (int i = 0; i < 50'000; ++i) {
    const uint64_t x = d(rng) * (i % 2 == 0 ? 1 : 7);
    v.push_back(x);
    all.record(x);
    (i % 3 == 0 ? a : b).record(x);
  }
  Histogram merged = a;
  merged.merge(b);
  via_snapshot.merge(a.snapshot());
  via_snapshot.merge(b.snapshot());
  for (const Histogram* m : {&merged, &via_snapshot}) {
    CHECK(m->count() == all.count());
    CHECK(m->sum() == all.sum());
    CHECK(m->min() == all.min());
    CHECK(m->max() == all.max());
    CHECK(m->snapshot().buckets == all.snapshot().buckets);
  }
  check_bounds(v, merged);
  // Merging an empty one changes nothing; into an empty one copies.
  Histogram empty;
  merged.merge(empty);
  CHECK(merged.count() == all.count());
  empty.merge(all);
  CHECK(empty.min() == all.min());
  CHECK(empty.quantile(0.9) == all.quantile(0.9));
}

TEST_CASE("histogram: weighted record and snapshot buckets are non-empty, ascending") {
  Histogram h;
  h.record(3, 5);
  h.record(100);
  h.record(0, 0);  // no-op
  const auto s = h.snapshot();
  CHECK(s.count == 6);
  CHECK(s.sum == 115);
  REQUIRE(s.buckets.size() == 2);
  CHECK(s.buckets[0] == std::pair<uint64_t, uint64_t>{3, 5});
  CHECK(s.buckets[1].first >= 100);
  CHECK(s.buckets[1].second == 1);
}
