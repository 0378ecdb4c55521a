// MpscQueue: FIFO order, empty() semantics, ownership of items, and many
// producers against one consumer.
#include "base/mpsc_queue.h"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using slotrpc::base::MpscQueue;

TEST_CASE("mpsc_queue: a new queue is empty") {
  MpscQueue<int> q;
  CHECK(q.empty());
  int out = -7;
  CHECK_FALSE(q.pop(out));
  CHECK(q.empty());
}

TEST_CASE("mpsc_queue: FIFO in a single thread") {
  MpscQueue<int> q;
  for (int i = 0; i < 1000; ++i) q.push(i);
  CHECK_FALSE(q.empty());
  for (int i = 0; i < 1000; ++i) {
    int out = -1;
    REQUIRE(q.pop(out));
    CHECK(out == i);
  }
  int out = -1;
  CHECK_FALSE(q.pop(out));
  CHECK(q.empty());
}

TEST_CASE("mpsc_queue: interleaved push and pop") {
  MpscQueue<int> q;
  int next_in = 0;
  int next_out = 0;
  // Patterns that drain the queue to zero and one element repeatedly, which
  // exercises the stub re-insertion path.
  for (int round = 0; round < 200; ++round) {
    const int pushes = round % 4;
    for (int i = 0; i < pushes; ++i) q.push(next_in++);
    CHECK(q.empty() == (next_in == next_out));
    const int pops = round % 3;
    for (int i = 0; i < pops; ++i) {
      int out = -1;
      if (next_out == next_in) {
        CHECK_FALSE(q.pop(out));
      } else {
        REQUIRE(q.pop(out));
        CHECK(out == next_out);
        ++next_out;
      }
    }
    CHECK(q.empty() == (next_in == next_out));
  }
  for (int out = -1; q.pop(out);) CHECK(out == next_out++);
  CHECK(next_out == next_in);
  CHECK(q.empty());
}

TEST_CASE("mpsc_queue: empty() after each step") {
  MpscQueue<int> q;
  q.push(1);
  CHECK_FALSE(q.empty());
  q.push(2);
  CHECK_FALSE(q.empty());
  int out = 0;
  REQUIRE(q.pop(out));
  CHECK(out == 1);
  CHECK_FALSE(q.empty());
  REQUIRE(q.pop(out));
  CHECK(out == 2);
  CHECK(q.empty());
  q.push(3);
  CHECK_FALSE(q.empty());
  REQUIRE(q.pop(out));
  CHECK(out == 3);
  CHECK(q.empty());
  CHECK_FALSE(q.pop(out));
  CHECK(out == 3);
}

TEST_CASE("mpsc_queue: move-only items") {
  MpscQueue<std::unique_ptr<std::string>> q;
  q.push(std::make_unique<std::string>("a"));
  q.push(std::make_unique<std::string>("b"));
  std::unique_ptr<std::string> out;
  REQUIRE(q.pop(out));
  REQUIRE(out != nullptr);
  CHECK(*out == "a");
  REQUIRE(q.pop(out));
  REQUIRE(out != nullptr);
  CHECK(*out == "b");
  CHECK(q.empty());
}

TEST_CASE("mpsc_queue: items left in the queue are destroyed with it") {
  auto token = std::make_shared<int>(5);
  {
    MpscQueue<std::shared_ptr<int>> q;
    for (int i = 0; i < 10; ++i) q.push(token);
    CHECK(token.use_count() == 11);
    std::shared_ptr<int> out;
    REQUIRE(q.pop(out));
    CHECK(out == token);
    out.reset();
    CHECK(token.use_count() == 10);
  }
  CHECK(token.use_count() == 1);
}

TEST_CASE("mpsc_queue: 4 producers x 100000 items, one consumer") {
  constexpr uint64_t kProducers = 4;
  constexpr uint64_t kPerProducer = 100000;
  MpscQueue<uint64_t> q;

  std::atomic<bool> go{false};
  std::vector<std::thread> producers;
  for (uint64_t p = 0; p < kProducers; ++p) {
    producers.emplace_back([&q, &go, p] {
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      // Item = producer in the high 32 bits, sequence in the low 32; start
      // at 1 so that 0 (the value of a default item) never appears.
      for (uint64_t i = 1; i <= kPerProducer; ++i) q.push((p << 32) | i);
    });
  }
  go.store(true, std::memory_order_release);

  std::vector<uint64_t> last(kProducers, 0);
  std::vector<uint64_t> count(kProducers, 0);
  uint64_t received = 0;
  uint64_t bad_producer = 0;
  uint64_t out_of_order = 0;
  // Bounded: generous for a sanitizer build, and never a hang.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (received < kProducers * kPerProducer && std::chrono::steady_clock::now() < give_up) {
    uint64_t item = 0;
    if (!q.pop(item)) {
      std::this_thread::yield();
      continue;
    }
    ++received;
    const uint64_t p = item >> 32;
    const uint64_t seq = item & 0xffffffffu;
    if (p >= kProducers) {
      ++bad_producer;
      continue;
    }
    // Per-producer order: each producer's items come in sequence 1, 2, 3...
    // which also proves none is lost or duplicated.
    if (seq != last[p] + 1) ++out_of_order;
    last[p] = seq;
    ++count[p];
  }
  for (auto& t : producers) t.join();

  CHECK(received == kProducers * kPerProducer);
  CHECK(bad_producer == 0);
  CHECK(out_of_order == 0);
  for (uint64_t p = 0; p < kProducers; ++p) {
    CAPTURE(p);
    CHECK(count[p] == kPerProducer);
    CHECK(last[p] == kPerProducer);
  }
  // Nothing extra.
  uint64_t extra = 0;
  CHECK_FALSE(q.pop(extra));
  CHECK(q.empty());
}

TEST_CASE("mpsc_queue: consumer keeps up with producers that pause") {
  // The consumer repeatedly empties the queue while producers are still
  // running, so pops often meet a queue with zero or one item.
  constexpr uint64_t kProducers = 4;
  constexpr uint64_t kPerProducer = 20000;
  MpscQueue<uint64_t> q;
  std::vector<std::thread> producers;
  for (uint64_t p = 0; p < kProducers; ++p) {
    producers.emplace_back([&q, p] {
      for (uint64_t i = 1; i <= kPerProducer; ++i) {
        q.push((p << 32) | i);
        if (i % 64 == 0) std::this_thread::yield();
      }
    });
  }
  std::vector<uint64_t> last(kProducers, 0);
  uint64_t received = 0;
  uint64_t errors = 0;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (received < kProducers * kPerProducer && std::chrono::steady_clock::now() < give_up) {
    uint64_t item = 0;
    if (!q.pop(item)) {
      std::this_thread::yield();
      continue;
    }
    ++received;
    const uint64_t p = item >> 32;
    if (p >= kProducers || (item & 0xffffffffu) != last[p] + 1) {
      ++errors;
      continue;
    }
    last[p] = item & 0xffffffffu;
  }
  for (auto& t : producers) t.join();
  CHECK(received == kProducers * kPerProducer);
  CHECK(errors == 0);
  for (uint64_t p = 0; p < kProducers; ++p) CHECK(last[p] == kPerProducer);
  CHECK(q.empty());
}
