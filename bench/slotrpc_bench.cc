// slotrpc-bench: slotrpc beside gRPC and beside the physical limit, in one
// run on one machine, two processes (this binary re-executes itself as the
// server, as a user would run a client and a server).
//
//   slotrpc-bench --modes latency,throughput --transports tcp,shm,grpc,socket
//                 --warmup 1000 --calls 20000 --json out.json
//
// Systems (--transports): slotrpc over tcp, shm or verbs; tls (slotrpc over
// TCP with TLS: --tls-cert, --tls-key, --tls-ca; grpc-tls the same for
// gRPC, the certificate naming localhost); grpc (gRPC 1.51 +
// FlatBuffers, built from the same examples/echo/echo.fbs); socket (a
// busy-polling TCP ping-pong of the same payloads: the limit a TCP RPC can
// approach on this host; latency only).  Every system echoes the same
// EchoRequest { seq, payload } (socket: the raw payload) through the same
// loop: `outstanding` calls in flight over `channels` connections, each
// reply re-issuing the next call.
//
// latency:    outstanding 1, one channel, each --sizes point: p50, p99,
//             p99.9, mean, max.  "max" = the largest payload a slot holds.
// throughput: --throughput-size bytes at each --outstanding over each
//             --channels: calls/s and MB/s (request payload bytes, 10^6).
//
// Each slotrpc figure is printed as a ratio to gRPC's and to the limit's.
// Poll mode and other slotrpc settings: SLOTRPC_* in the environment, which
// the server process inherits.
#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <sched.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <arpa/inet.h>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <tuple>
#include <vector>

#include "bench_driver.h"
#include "echo_service.h"
#include "slotrpc/slotrpc.h"

namespace bench {

using Clock = std::chrono::steady_clock;

namespace {

// --- slotrpc ---------------------------------------------------------------

using slotrpc::examples::EchoClient;
using slotrpc::examples::EchoReply;
using slotrpc::examples::EchoRequest;

flatbuffers::Offset<EchoRequest> build_request(flatbuffers::FlatBufferBuilder& fbb, uint64_t seq, uint64_t size) {
  uint8_t* bytes = nullptr;
  auto payload = fbb.CreateUninitializedVector(size, &bytes);
  if (size != 0) std::memset(bytes, kFill, size);
  return slotrpc::examples::CreateEchoRequest(fbb, seq, payload);
}

// The largest payload whose EchoRequest fits one slot of `slot_size` bytes:
// built, as the library does, by a builder that owns the slot after its
// 32-byte header and may not grow (its scratch space, the vtable
// bookkeeping at the front, shares the slot with the message).
struct FixedAllocator final : flatbuffers::Allocator {
  struct Overflow {};
  explicit FixedAllocator(size_t cap) : mem(cap) {}
  uint8_t* allocate(size_t size) override {
    if (size > mem.size()) throw Overflow{};
    return mem.data();
  }
  void deallocate(uint8_t*, size_t) override {}
  uint8_t* reallocate_downward(uint8_t*, size_t, size_t, size_t, size_t) override { throw Overflow{}; }
  std::vector<uint8_t> mem;
};

uint64_t largest_payload(uint32_t slot_size) {
  FixedAllocator alloc(slot_size - 32);
  auto fits = [&](uint64_t n) {
    flatbuffers::FlatBufferBuilder fbb(slot_size - 32, &alloc, false);
    try {
      // Twice: a slot's builder is reused (Clear()), and a cleared builder
      // has a few bytes less room than a fresh one.
      fbb.Finish(build_request(fbb, 0, n));
      fbb.Clear();
      fbb.Finish(build_request(fbb, 1, n));
      return true;
    } catch (const FixedAllocator::Overflow&) {
      return false;
    }
  };
  uint64_t lo = 0, hi = slot_size;  // fits(lo), !fits(hi)
  while (hi - lo > 1) {
    const uint64_t mid = (lo + hi) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

// --wait future: the calls wait with Future::get() on the benchmark's
// thread (a window of futures, oldest first) instead of a callback chain on
// the loop: what a program that writes `.get()` sees.  --wait poll spins on
// Future::ready() before each get().
bool g_wait_future = false;
bool g_wait_poll = false;  // --wait poll: spin on Future::ready() first

class SlotrpcDriver final : public EchoDriver {
 public:
  SlotrpcDriver(std::string address, slotrpc::Config cfg) : address_(std::move(address)), cfg_(std::move(cfg)) {}

  slotrpc::Status connect_to(uint32_t channels) {
    while (channels_.size() < channels) {
      auto ch = slotrpc::Channel::connect(address_, cfg_);
      if (!ch.ok()) return ch.status();
      if ((*ch)->transport() != cfg_.transport) {
        return slotrpc::Status(slotrpc::StatusCode::kUnavailable,
                               "connected over " + std::string(slotrpc::to_string((*ch)->transport())));
      }
      clients_.push_back(std::make_unique<EchoClient>(**ch));
      channels_.push_back(std::move(*ch));
    }
    return {};
  }
  slotrpc::Channel& channel() { return *channels_.front(); }

  Point run(uint64_t size, uint64_t calls, uint64_t outstanding, uint32_t channels,
            std::atomic<uint64_t>& done) override {
    Point pt;
    if (auto st = connect_to(channels); !st.ok()) {
      pt.failed = calls;
      pt.first_error = st.to_string();
      return pt;
    }
    if (g_wait_future) return run_futures(size, calls, outstanding, channels, done);
    // Reply callbacks run on the channels' event loop (all channels share
    // the default runtime's one loop): they record, check and re-issue.
    struct State {
      std::atomic<uint64_t> issued{0}, completed{0};
      slotrpc::Histogram lat;  // loop only
      uint64_t failed = 0;
      std::string first_error;
      std::mutex mu;
      std::condition_variable cv;
      bool finished = false;
    } s;
    std::function<void(uint32_t)> issue = [&](uint32_t c) {
      const uint64_t seq = s.issued.fetch_add(1);
      if (seq >= calls) return;
      const auto start = Clock::now();
      clients_[c]->Echo(
          [seq, size](flatbuffers::FlatBufferBuilder& fbb) { return build_request(fbb, seq, size); }, {},
          [&, c, start, size](slotrpc::Reply<EchoReply>&& r) {
            s.lat.record(static_cast<uint64_t>((Clock::now() - start).count()));
            std::string err;
            if (!r.ok()) {
              err = r.status().to_string();
            } else if (r->payload() == nullptr || r->payload()->size() != size) {
              err = "wrong payload size";
            } else if (size != 0 && (r->payload()->Get(0) != kFill || r->payload()->Get(size - 1) != kFill)) {
              err = "wrong payload bytes";
            }
            if (!err.empty() && s.failed++ == 0) s.first_error = err;
            done.fetch_add(1, std::memory_order_relaxed);
            if (s.completed.fetch_add(1) + 1 == calls) {
              std::lock_guard<std::mutex> lock(s.mu);
              s.finished = true;
              s.cv.notify_all();
              return;
            }
            issue(c);
          });
    };
    const auto t0 = Clock::now();
    for (uint64_t k = 0; k < std::min(outstanding, calls); ++k) issue(static_cast<uint32_t>(k % channels));
    {
      std::unique_lock<std::mutex> lock(s.mu);
      s.cv.wait(lock, [&] { return s.finished; });
    }
    pt.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    pt.latency_ns = s.lat;
    pt.calls = calls;
    pt.failed = s.failed;
    pt.first_error = s.first_error;
    return pt;
  }

  // --wait future: `outstanding` futures in flight, each waited for with
  // get() in the order issued, and replaced by a new call.
  Point run_futures(uint64_t size, uint64_t calls, uint64_t outstanding, uint32_t channels,
                    std::atomic<uint64_t>& done) {
    Point pt;
    struct InFlight {
      slotrpc::Future<slotrpc::Reply<EchoReply>> f;
      Clock::time_point start;
    };
    std::deque<InFlight> window;
    uint64_t issued = 0;
    auto issue = [&] {
      const uint64_t seq = issued++;
      const auto start = Clock::now();
      window.push_back({clients_[seq % channels]->Echo(
                            [seq, size](flatbuffers::FlatBufferBuilder& fbb) { return build_request(fbb, seq, size); }),
                        start});
    };
    const auto t0 = Clock::now();
    while (issued < std::min(outstanding, calls)) issue();
    while (!window.empty()) {
      if (g_wait_poll) {
        while (!window.front().f.ready()) {
        }
      }
      auto r = window.front().f.get();
      pt.latency_ns.record(static_cast<uint64_t>((Clock::now() - window.front().start).count()));
      window.pop_front();
      std::string err;
      if (!r.ok()) {
        err = r.status().to_string();
      } else if (r->payload() == nullptr || r->payload()->size() != size) {
        err = "wrong payload size";
      }
      if (!err.empty() && pt.failed++ == 0) pt.first_error = err;
      done.fetch_add(1, std::memory_order_relaxed);
      if (issued < calls) issue();
    }
    pt.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    pt.calls = calls;
    return pt;
  }

 private:
  std::string address_;
  slotrpc::Config cfg_;
  std::vector<std::unique_ptr<slotrpc::Channel>> channels_;
  std::vector<std::unique_ptr<EchoClient>> clients_;
};

// --- slotrpc bulk payloads ------------------------------------------------
// slotrpc.bench.Bulk.Echo: the request's bulk segment 0 is pulled into a
// server buffer (read_bulk: RDMA READ on verbs, recv into it on TCP) and
// pushed back into the client's receive segment 0 (write_bulk), then a
// small reply: the payload crosses the network twice, like an echo, but
// never a slot.  Server buffers are mmap'd and registered once, pooled.
constexpr uint32_t kBulkEcho = slotrpc::method_id("slotrpc.bench.Bulk.Echo");

class BulkPool {
 public:
  explicit BulkPool(slotrpc::Server& server) : server_(server) {}
  ~BulkPool() {
    for (Buffer& b : all_) {
      b.region.release();
      ::munmap(b.data, b.size);
    }
  }
  struct Buffer {
    std::byte* data = nullptr;
    size_t size = 0;
    slotrpc::MemoryRegion region;
  };
  // A registered buffer of at least `n` bytes (index into all_), or -1.
  int take(size_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < all_.size(); ++i)
      if (!busy_[i] && all_[i].size >= n) {
        busy_[i] = true;
        return static_cast<int>(i);
      }
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return -1;
    // Not filled here: this runs on the server's event loop, where touching
    // a fresh gigabyte took 4 s on the development VM (and the client's
    // peer timeout is 5 s).  A read fills the buffer; a write-only call
    // marks just the bytes the client checks (below).
    auto r = server_.register_memory({static_cast<std::byte*>(p), n});
    if (!r.ok()) {
      ::munmap(p, n);
      return -1;
    }
    all_.push_back(Buffer{static_cast<std::byte*>(p), n, r.value()});
    busy_.push_back(true);
    return static_cast<int>(all_.size() - 1);
  }
  const Buffer& at(int i) {
    std::lock_guard<std::mutex> lock(mu_);
    return all_[static_cast<size_t>(i)];
  }
  void give(int i) {
    std::lock_guard<std::mutex> lock(mu_);
    busy_[static_cast<size_t>(i)] = false;
  }

 private:
  slotrpc::Server& server_;
  std::mutex mu_;
  std::deque<Buffer> all_;  // stable addresses
  std::vector<bool> busy_;
};

slotrpc::ServiceDefinition bulk_service(BulkPool& pool) {
  slotrpc::ServiceDefinition svc("slotrpc.bench.Bulk");
  svc.add_method("Echo", [&pool](slotrpc::ServerCall& call) -> slotrpc::Status {
    // One send segment: pulled (RDMA READ); one receive segment: filled
    // (RDMA WRITE); both: an echo.
    const bool in = call.bulk_in_count() == 1, out = call.bulk_out_count() == 1;
    if (call.bulk_in_count() > 1 || call.bulk_out_count() > 1 || (!in && !out) ||
        (in && out && call.bulk_out(0) < call.bulk_in(0)))
      return slotrpc::Status(slotrpc::StatusCode::kInvalidArgument, "want a send and/or a large enough receive segment");
    const uint64_t n = in ? call.bulk_in(0) : call.bulk_out(0);
    const int i = pool.take(n);
    if (i < 0) return slotrpc::Status(slotrpc::StatusCode::kResourceExhausted, "no buffer");
    const BulkPool::Buffer& b = pool.at(i);
    slotrpc::Status st;
    if (!in) b.data[0] = b.data[n - 1] = std::byte{kFill};
    // The request: {page bytes, per page}.  With pages, the buffer is a
    // scatter list of adjacent pages (--bulk-pages), moved by one scatter
    // read_bulk / gather write_bulk, or by one call per page
    // (--bulk-per-page: a handler that moves each page on its own).
    uint64_t page = 0, per_page = 0;
    if (call.request().size() >= 8) {
      const auto* v = flatbuffers::GetRoot<flatbuffers::Vector<uint64_t>>(call.request().data());
      if (v->size() >= 2) {
        page = v->Get(0);
        per_page = v->Get(1);
      }
    }
    std::vector<slotrpc::BulkSegment> pages;
    if (page != 0) {
      for (uint64_t at = 0; at < n; at += page)
        pages.push_back(slotrpc::BulkSegment::of(b.region, at, std::min(page, n - at)));
    }
    auto move = [&](bool reading) {
      if (pages.empty())
        return reading ? call.read_bulk(0, b.region, 0, n) : call.write_bulk(0, b.region, 0, n);
      if (per_page == 0) return reading ? call.read_bulk(0, pages) : call.write_bulk(0, pages);
      for (size_t k = 0; k < pages.size(); ++k) {
        const std::span<const slotrpc::BulkSegment> one(&pages[k], 1);
        const uint64_t at = k * page;
        slotrpc::Status s = reading ? call.read_bulk(0, one, at) : call.write_bulk(0, one, at);
        if (!s.ok()) return s;
      }
      return slotrpc::Status();
    };
    if (in) st = move(true);
    if (st.ok() && out) st = move(false);
    pool.give(i);
    if (!st.ok()) return st;
    auto& reply = call.reply();
    reply.Finish(reply.CreateVector(std::vector<uint64_t>{n}));
    return {};
  });
  return svc;
}

// One bulk echo per call: `outstanding` pairs of registered client buffers
// (source filled with kFill, destination checked at both ends and cleared
// again), so the NIC reads and writes them in place.
class BulkDriver final : public EchoDriver {
 public:
  BulkDriver(std::string address, slotrpc::Config cfg) : address_(std::move(address)), cfg_(std::move(cfg)) {}
  ~BulkDriver() override { free_buffers(); }
  // What each call moves: both ways (an echo), or one way: pulled by the
  // server (read: RDMA READ) or pushed by it (write: RDMA WRITE).
  enum class Direction { kEcho, kRead, kWrite };
  void set_direction(Direction d) { direction_ = d; }
  // The server moves its buffer as pages of `page` bytes (0: one range),
  // in one scatter / gather call or one call per page.
  void set_pages(uint64_t page, bool per_page) {
    page_ = page;
    per_page_ = per_page;
  }

  slotrpc::Status connect() {
    if (channel_) return {};
    auto ch = slotrpc::Channel::connect(address_, cfg_);
    if (!ch.ok()) return ch.status();
    if ((*ch)->transport() != cfg_.transport)
      return slotrpc::Status(slotrpc::StatusCode::kUnavailable,
                             "connected over " + std::string(slotrpc::to_string((*ch)->transport())));
    channel_ = std::move(*ch);
    echo_ = std::make_unique<EchoClient>(*channel_);
    return {};
  }
  slotrpc::Channel& channel() { return *channel_; }

  // One bulk echo issued now; `done` runs on the channel's loop.
  void issue(size_t k, uint64_t size, std::function<void(std::string error)> done) {
    Pair& p = pairs_[k];
    slotrpc::CallOptions o;
    if (direction_ != Direction::kWrite) o.send_bulk(p.src_region, 0, size);
    if (direction_ != Direction::kRead) o.receive_bulk(p.dst_region, 0, size);
    const bool check = direction_ != Direction::kRead;
    slotrpc::raw::call(*channel_,
        kBulkEcho,
        [page = page_, per_page = per_page_](flatbuffers::FlatBufferBuilder& fbb) {
          fbb.Finish(fbb.CreateVector(std::vector<uint64_t>{page, per_page ? 1u : 0u}));
        },
        std::move(o), [&p, size, check, done = std::move(done)](slotrpc::RawReply&& r) {
          std::string err;
          if (!r.ok()) {
            err = r.status().to_string();
          } else if (!check) {
          } else if (r.bulk_received(0) != size) {
            err = "received " + std::to_string(r.bulk_received(0)) + " bytes";
          } else if (p.dst[0] != std::byte{kFill} || p.dst[size - 1] != std::byte{kFill}) {
            err = "wrong payload bytes";
          }
          p.dst[0] = p.dst[size - 1] = std::byte{0};
          done(std::move(err));
        });
  }

  bool prepare(uint64_t size, uint64_t outstanding, std::string* error) {
    if (size == size_ && pairs_.size() >= outstanding) return true;
    free_buffers();
    for (uint64_t k = 0; k < outstanding; ++k) {
      Pair p;
      p.bytes = size;
      p.src = map(size);
      p.dst = map(size);
      if (p.src == nullptr || p.dst == nullptr) {
        *error = "cannot map " + std::to_string(size) + " bytes";
        return false;
      }
      std::memset(p.src, kFill, size);
      std::memset(p.dst, 0, size);
      auto rs = channel_->register_memory({p.src, size});
      auto rd = channel_->register_memory({p.dst, size});
      if (!rs.ok() || !rd.ok()) {
        *error = (rs.ok() ? rd.status() : rs.status()).to_string();
        return false;
      }
      p.src_region = rs.value();
      p.dst_region = rd.value();
      pairs_.push_back(std::move(p));
    }
    size_ = size;
    return true;
  }

  Point run(uint64_t size, uint64_t calls, uint64_t outstanding, uint32_t, std::atomic<uint64_t>& done) override {
    Point pt;
    std::string err;
    if (auto st = connect(); !st.ok()) err = st.to_string();
    if (err.empty() && size == 0) err = "bulk payloads are at least 1 byte";
    if (err.empty()) prepare(size, outstanding, &err);
    if (!err.empty()) {
      pt.failed = calls;
      pt.first_error = err;
      return pt;
    }
    struct State {
      std::atomic<uint64_t> issued{0}, completed{0};
      slotrpc::Histogram lat;  // loop only
      uint64_t failed = 0;
      std::string first_error;
      std::mutex mu;
      std::condition_variable cv;
      bool finished = false;
    } s;
    std::function<void(size_t)> next = [&](size_t k) {
      if (s.issued.fetch_add(1) >= calls) return;
      const auto start = Clock::now();
      issue(k, size, [&, k, start](std::string e) {
        s.lat.record(static_cast<uint64_t>((Clock::now() - start).count()));
        if (!e.empty() && s.failed++ == 0) s.first_error = e;
        done.fetch_add(1, std::memory_order_relaxed);
        if (s.completed.fetch_add(1) + 1 == calls) {
          std::lock_guard<std::mutex> lock(s.mu);
          s.finished = true;
          s.cv.notify_all();
          return;
        }
        next(k);
      });
    };
    const auto t0 = Clock::now();
    for (uint64_t k = 0; k < std::min(outstanding, calls); ++k) next(k);
    {
      std::unique_lock<std::mutex> lock(s.mu);
      s.cv.wait(lock, [&] { return s.finished; });
    }
    pt.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    pt.latency_ns = s.lat;
    pt.calls = calls;
    pt.failed = s.failed;
    pt.first_error = s.first_error;
    return pt;
  }

  // Small calls during large transfers on the same channel: 64 B echo
  // calls, one at a time, for as long as `repeat` bulk echoes of `load`
  // bytes run, one after the other.  `idle` first gets `idle_calls` of the
  // same small calls alone.
  bool interference(uint64_t load, uint64_t repeat, uint64_t idle_calls, Point* idle, Point* during,
                    std::string* error) {
    if (auto st = connect(); !st.ok()) {
      *error = st.to_string();
      return false;
    }
    if (!prepare(load, 1, error)) return false;
    auto small = [&](Point& pt, const std::function<bool()>& more) {
      const auto t0 = Clock::now();
      uint64_t n = 0;
      while (more()) {
        const auto start = Clock::now();
        auto r = echo_->Echo([n](flatbuffers::FlatBufferBuilder& fbb) { return build_request(fbb, n, 64); }).get();
        pt.latency_ns.record(static_cast<uint64_t>((Clock::now() - start).count()));
        if (!r.ok() && pt.failed++ == 0) pt.first_error = r.status().to_string();
        ++n;
      }
      pt.calls = n;
      pt.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    };
    uint64_t k = 0;
    small(*idle, [&] { return k++ < idle_calls; });
    std::atomic<bool> big_done{false};
    std::string big_error;
    uint64_t left = repeat;
    // Each echo issues the next from its completion (the loop thread), so
    // the transfers follow each other with no gap the small calls could use.
    std::function<void(std::string)> next = [&](std::string e) {
      if (e.empty() && --left > 0) {
        issue(0, load, next);
        return;
      }
      big_error = std::move(e);
      big_done.store(true);
    };
    issue(0, load, next);
    small(*during, [&] { return !big_done.load(); });
    if (!big_error.empty()) {
      *error = "the large transfer failed: " + big_error;
      return false;
    }
    return true;
  }

 private:
  struct Pair {
    std::byte* src = nullptr;
    std::byte* dst = nullptr;
    size_t bytes = 0;
    slotrpc::MemoryRegion src_region, dst_region;
  };
  static std::byte* map(size_t n) {
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : static_cast<std::byte*>(p);
  }
  void free_buffers() {
    for (Pair& p : pairs_) {
      p.src_region.release();
      p.dst_region.release();
      if (p.src) ::munmap(p.src, p.bytes);
      if (p.dst) ::munmap(p.dst, p.bytes);
    }
    pairs_.clear();
    size_ = 0;
  }

  std::string address_;
  slotrpc::Config cfg_;
  std::unique_ptr<slotrpc::Channel> channel_;
  std::unique_ptr<EchoClient> echo_;
  std::deque<Pair> pairs_;
  uint64_t size_ = 0;
  Direction direction_ = Direction::kEcho;
  uint64_t page_ = 0;
  bool per_page_ = false;
};

// TLS files of system "tls" (--tls-cert, --tls-key, --tls-ca): the
// server's certificate and key, the CA the client trusts.
struct TlsFiles {
  std::string cert, key, ca;
};

int serve_slotrpc(const std::string& host, const std::string& port_file, uint32_t slot_size,
                  const TlsFiles& tls) {
  slotrpc::Config cfg;
  cfg.slot_size = slot_size;  // the most a client may ask for
  if (!tls.cert.empty()) {
    cfg.tls = true;
    cfg.tls_cert = tls.cert;
    cfg.tls_key = tls.key;
  }
  echo::EchoHandler handler;  // outlives the server, which calls it
  slotrpc::Server server(cfg);
  BulkPool pool(server);  // server.stop() below comes first
  if (auto st = server.add_service(bulk_service(pool)); !st.ok()) {
    std::fprintf(stderr, "slotrpc-bench: %s\n", st.to_string().c_str());
    return 1;
  }
  if (auto st = server.add_service(handler.definition()); !st.ok()) {
    std::fprintf(stderr, "slotrpc-bench: %s\n", st.to_string().c_str());
    return 1;
  }
  if (auto st = server.start(host + ":0"); !st.ok()) {
    std::fprintf(stderr, "slotrpc-bench: %s\n", st.to_string().c_str());
    return 1;
  }
  if (!write_port_file(port_file, server.port())) return 1;
  wait_for_termination();
  server.stop();  // no handler uses the pool's buffers after this
  return 0;
}

// --- the limit: a busy-polling TCP ping-pong ---------------------------------
// A 4-byte length and the payload each way, TCP_NODELAY, non-blocking
// sockets spun on (never a sleep in the kernel): no framing, no
// serialization, no copies beyond the socket's.  What a TCP RPC can approach.
//
// One way (the limit of modes bulk-read and bulk-write): the length word
// kOneWay, then a u32 direction and a u64 size.  kToServer: the client
// sends the size's bytes and the server answers with one byte once it has
// them all; kToClient: the server sends them.  The payload crosses once per
// call, as a bulk-read's or bulk-write's does.
constexpr uint32_t kOneWay = 0xFFFF'FFFFu;
constexpr uint32_t kToServer = 1, kToClient = 2;

// Spins on a non-blocking socket; after 20 us without progress it yields
// the CPU between polls (sched_yield, never a sleep), as slotrpc's busy mode
// does by default (SLOTRPC_BUSY_YIELD_US=20): on a machine with more
// spinners than cores, a spinner that never yields holds the core its peer
// needs for a whole time slice, and the "limit" would measure the scheduler.
bool spin_io(int fd, uint8_t* p, size_t n, bool send_side) {
  auto idle_since = Clock::now();
  while (n > 0) {
    const ssize_t k = send_side ? ::send(fd, p, n, MSG_NOSIGNAL) : ::recv(fd, p, n, 0);
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
      idle_since = Clock::now();
    } else if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      return false;
    } else if (Clock::now() - idle_since > std::chrono::microseconds(20)) {
      sched_yield();
    }
  }
  return true;
}

void tune_socket(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

int serve_socket(const std::string& host, const std::string& port_file) {
  const int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
  socklen_t len = sizeof addr;
  if (lfd < 0 || ::bind(lfd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(lfd, 16) != 0 ||
      ::getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::fprintf(stderr, "slotrpc-bench: socket server: %s\n", std::strerror(errno));
    return 1;
  }
  if (!write_port_file(port_file, ntohs(addr.sin_port))) return 1;
  std::thread([lfd] {
    for (;;) {
      const int fd = ::accept(lfd, nullptr, nullptr);
      if (fd < 0) return;
      tune_socket(fd);
      std::thread([fd] {
        std::vector<uint8_t> buf;
        uint32_t n = 0;
        while (spin_io(fd, reinterpret_cast<uint8_t*>(&n), 4, false)) {
          if (n == kOneWay) {
            uint8_t head[12];
            if (!spin_io(fd, head, sizeof head, false)) break;
            uint32_t dir;
            uint64_t size;
            std::memcpy(&dir, head, 4);
            std::memcpy(&size, head + 4, 8);
            if (buf.size() < size) buf.resize(size, kFill);
            uint8_t ack = 1;
            const bool ok = dir == kToServer ? spin_io(fd, buf.data(), size, false) && spin_io(fd, &ack, 1, true)
                                             : spin_io(fd, buf.data(), size, true);
            if (!ok) break;
            continue;
          }
          buf.resize(n + 4);
          std::memcpy(buf.data(), &n, 4);
          if (!spin_io(fd, buf.data() + 4, n, false) || !spin_io(fd, buf.data(), n + 4, true)) break;
        }
        ::close(fd);
      }).detach();
    }
  }).detach();
  wait_for_termination();
  return 0;
}

class SocketDriver final : public EchoDriver {
 public:
  // kEcho: the ping-pong; kToServer / kToClient: one way (above).
  enum class Direction { kEcho, kToServer, kToClient };
  SocketDriver(std::string host, uint16_t port, Direction dir = Direction::kEcho)
      : host_(std::move(host)), port_(port), dir_(dir) {}
  ~SocketDriver() override {
    if (fd_ >= 0) ::close(fd_);
  }

  Point run(uint64_t size, uint64_t calls, uint64_t, uint32_t, std::atomic<uint64_t>& done) override {
    Point pt;
    if (fd_ < 0 && !connect()) {
      pt.failed = calls;
      pt.first_error = std::string("connect: ") + std::strerror(errno);
      return pt;
    }
    if (dir_ != Direction::kEcho) return run_one_way(size, calls, done);
    std::vector<uint8_t> out(size + 4, kFill), in(size + 4);
    const uint32_t n = static_cast<uint32_t>(size);
    std::memcpy(out.data(), &n, 4);
    const auto t0 = Clock::now();
    for (uint64_t i = 0; i < calls; ++i) {
      const auto start = Clock::now();
      const bool ok = spin_io(fd_, out.data(), out.size(), true) && spin_io(fd_, in.data(), in.size(), false);
      pt.latency_ns.record(static_cast<uint64_t>((Clock::now() - start).count()));
      if ((!ok || (size != 0 && (in[4] != kFill || in[size + 3] != kFill))) && pt.failed++ == 0) {
        pt.first_error = ok ? "wrong payload bytes" : std::string("socket: ") + std::strerror(errno);
      }
      done.fetch_add(1, std::memory_order_relaxed);
      if (!ok) break;
    }
    pt.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    pt.calls = calls;
    return pt;
  }

 private:
  Point run_one_way(uint64_t size, uint64_t calls, std::atomic<uint64_t>& done) {
    Point pt;
    const bool to_server = dir_ == Direction::kToServer;
    std::vector<uint8_t> data(size, to_server ? kFill : 0);
    uint8_t head[16];
    const uint32_t dir = to_server ? kToServer : kToClient;
    std::memcpy(head, &kOneWay, 4);
    std::memcpy(head + 4, &dir, 4);
    std::memcpy(head + 8, &size, 8);
    const auto t0 = Clock::now();
    for (uint64_t i = 0; i < calls; ++i) {
      const auto start = Clock::now();
      uint8_t ack = 0;
      bool ok = spin_io(fd_, head, sizeof head, true);
      if (to_server) {
        ok = ok && spin_io(fd_, data.data(), size, true) && spin_io(fd_, &ack, 1, false);
      } else {
        ok = ok && spin_io(fd_, data.data(), size, false);
      }
      pt.latency_ns.record(static_cast<uint64_t>((Clock::now() - start).count()));
      const bool bytes_ok = to_server ? ack == 1 : size == 0 || (data[0] == kFill && data[size - 1] == kFill);
      if ((!ok || !bytes_ok) && pt.failed++ == 0) {
        pt.first_error = ok ? "wrong payload bytes" : std::string("socket: ") + std::strerror(errno);
      }
      if (!to_server && size != 0) data[0] = data[size - 1] = 0;
      done.fetch_add(1, std::memory_order_relaxed);
      if (!ok) break;
    }
    pt.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    pt.calls = calls;
    return pt;
  }

  bool connect() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port_);
    inet_pton(AF_INET, host_.c_str(), &addr.sin_addr);
    if (fd_ < 0 || ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return false;
    tune_socket(fd_);
    return true;
  }
  std::string host_;
  uint16_t port_;
  Direction dir_;
  int fd_ = -1;
};

// --- the server process --------------------------------------------------------

// --- results -------------------------------------------------------------------

struct Row {
  std::string mode, system;
  uint64_t size = 0, outstanding = 1, channels = 1;
  uint64_t calls = 0, failed = 0;
  double p50 = 0, p99 = 0, p999 = 0, mean = 0, max = 0;  // microseconds
  double calls_per_s = 0, mb_per_s = 0;
  double ratio_grpc = 0, ratio_limit = 0;  // 0: no such figure
  std::string error;
};

Row to_row(const std::string& mode, const std::string& system, uint64_t size, uint64_t outstanding,
           uint64_t channels, const Point& pt) {
  Row r;
  r.mode = mode;
  r.system = system;
  r.size = size;
  r.outstanding = outstanding;
  r.channels = channels;
  r.calls = pt.calls;
  r.failed = pt.failed;
  r.error = pt.first_error;
  const auto& h = pt.latency_ns;
  r.p50 = h.quantile(0.50) / 1e3;
  r.p99 = h.quantile(0.99) / 1e3;
  r.p999 = h.quantile(0.999) / 1e3;
  r.mean = h.mean() / 1e3;
  r.max = h.max() / 1e3;
  if (pt.seconds > 0) {
    r.calls_per_s = pt.calls / pt.seconds;
    r.mb_per_s = r.calls_per_s * double(size) / 1e6;
  }
  return r;
}

// Latency: p50 over the other system's p50 at the same size (lower is
// better, so < 1 beats it).  Throughput: calls/s over gRPC's at the same
// point (higher is better).
void add_ratios(std::vector<Row>& rows) {
  auto find = [&](const Row& like, const std::string& system) -> const Row* {
    for (const Row& o : rows) {
      if (o.system == system && o.mode == like.mode && o.size == like.size && o.outstanding == like.outstanding &&
          o.channels == like.channels && o.failed == 0 && o.calls > 0)
        return &o;
    }
    return nullptr;
  };
  for (Row& r : rows) {
    if (r.system.rfind("slotrpc-", 0) != 0 || r.failed != 0) continue;
    const Row* g = find(r, "grpc");
    const Row* l = find(r, "socket");
    if (r.mode == "latency" || r.mode == "bulk") {
      if (g != nullptr && g->p50 > 0) r.ratio_grpc = r.p50 / g->p50;
      if (l != nullptr && l->p50 > 0) r.ratio_limit = r.p50 / l->p50;
    } else {
      if (g != nullptr && g->calls_per_s > 0) r.ratio_grpc = r.calls_per_s / g->calls_per_s;
      if (l != nullptr && l->calls_per_s > 0) r.ratio_limit = r.calls_per_s / l->calls_per_s;
    }
  }
}

std::string ratio_text(double v) {
  if (v == 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fx", v);
  return buf;
}

void print_table(const std::vector<Row>& rows, const std::string& mode) {
  bool any = false;
  for (const Row& r : rows) any |= r.mode == mode;
  if (!any) return;
  if (mode == "bulk" || mode == "bulk-read" || mode == "bulk-write") {
    if (mode == "bulk")
      std::printf("\nbulk payloads (echo of SIZE bytes as bulk segments; microseconds; "
                  "MB/s counts one direction; vs_limit: p50 over the socket ping-pong's)\n");
    else
      std::printf("\n%s (SIZE bytes one way per call, %s by the handler; microseconds; vs_limit: "
                  "calls/s over a busy-polling socket's one-way transfer, %s)\n",
                  mode.c_str(), mode == "bulk-read" ? "pulled (read_bulk)" : "pushed (write_bulk)",
                  mode == "bulk-read" ? "client to server" : "server to client");
    std::printf("%-18s %11s %11s %9s %9s %9s %9s %9s %6s\n", "system", "size_B", "outstanding", "p50", "p99", "max",
                "MB_per_s", "vs_limit", "failed");
    for (const Row& r : rows) {
      if (r.mode != mode) continue;
      std::printf("%-18s %11llu %11llu %9.1f %9.1f %9.1f %9.1f %9s %6llu\n", r.system.c_str(),
                  (unsigned long long)r.size, (unsigned long long)r.outstanding, r.p50, r.p99, r.max, r.mb_per_s,
                  ratio_text(r.ratio_limit).c_str(), (unsigned long long)r.failed);
    }
    std::fflush(stdout);
    return;
  }
  if (mode == "bulk-load") {
    std::printf("\n64 B calls on a channel alone and while one bulk echo of SIZE bytes runs on it "
                "(microseconds; vs_idle: p99 over the idle p99)\n");
    std::printf("%-26s %11s %9s %9s %9s %9s %9s %6s\n", "system", "size_B", "calls", "p50", "p99", "max",
                "vs_idle", "failed");
    for (const Row& r : rows) {
      if (r.mode != mode) continue;
      std::printf("%-26s %11llu %9llu %9.1f %9.1f %9.1f %9s %6llu\n", r.system.c_str(), (unsigned long long)r.size,
                  (unsigned long long)r.calls, r.p50, r.p99, r.max, ratio_text(r.ratio_limit).c_str(),
                  (unsigned long long)r.failed);
    }
    std::fflush(stdout);
    return;
  }
  if (mode == "latency") {
    std::printf("\nlatency (one call outstanding, one channel; microseconds; ratios of p50: <1 is faster)\n");
    std::printf("%-20s %9s %9s %9s %9s %9s %9s %9s %9s %6s\n", "system", "size_B", "p50", "p99", "p99.9", "mean",
                "max", "vs_grpc", "vs_limit", "failed");
    for (const Row& r : rows) {
      if (r.mode != mode) continue;
      std::printf("%-20s %9llu %9.1f %9.1f %9.1f %9.1f %9.1f %9s %9s %6llu\n", r.system.c_str(),
                  (unsigned long long)r.size, r.p50, r.p99, r.p999, r.mean, r.max, ratio_text(r.ratio_grpc).c_str(),
                  ratio_text(r.ratio_limit).c_str(), (unsigned long long)r.failed);
    }
  } else {
    std::printf("\nthroughput (ratio: calls/s over gRPC's at the same point: >1 is faster)\n");
    std::printf("%-14s %7s %8s %11s %12s %9s %9s %9s %6s\n", "system", "size_B", "channels", "outstanding",
                "calls_per_s", "MB_per_s", "p50_us", "vs_grpc", "failed");
    for (const Row& r : rows) {
      if (r.mode != mode) continue;
      std::printf("%-14s %7llu %8llu %11llu %12.0f %9.1f %9.1f %9s %6llu\n", r.system.c_str(),
                  (unsigned long long)r.size, (unsigned long long)r.channels, (unsigned long long)r.outstanding,
                  r.calls_per_s, r.mb_per_s, r.p50, ratio_text(r.ratio_grpc).c_str(), (unsigned long long)r.failed);
    }
  }
  std::fflush(stdout);
}

// --wait with several modes: each future/poll row's p50 over the p50 of
// the callback row of its system and size (the target: get() at most 1.5x).
void print_wait_table(const std::vector<Row>& rows) {
  std::printf("\nwait (latency rows by --wait mode; p50 over the callback form's at the same point)\n");
  std::printf("%-22s %9s %9s %9s %9s\n", "system", "size_B", "p50", "callback", "ratio");
  for (const Row& r : rows) {
    const size_t slash = r.system.find('/');
    if (r.mode != "latency" || slash == std::string::npos) continue;
    const std::string base = r.system.substr(0, slash);
    for (const Row& c : rows) {
      if (c.mode != "latency" || c.system != base || c.size != r.size || c.p50 <= 0) continue;
      std::printf("%-22s %9llu %9.1f %9.1f %9s\n", r.system.c_str(), (unsigned long long)r.size, r.p50, c.p50,
                  ratio_text(r.p50 / c.p50).c_str());
    }
  }
  std::fflush(stdout);
}

bool write_json(const std::string& path, const std::vector<Row>& rows, const std::map<std::string, std::string>& run) {
  std::ostringstream o;
  o << "{\n  \"tool\": \"slotrpc-bench\",\n  \"format\": 1,\n";
  o << "  \"machine\": " << machine_json() << ",\n";
  o << "  \"run\": {";
  bool first = true;
  for (const auto& [k, v] : run) {
    o << (first ? "" : ", ") << json_string(k) << ": " << json_string(v);
    first = false;
  }
  o << "},\n  \"results\": [";
  first = true;
  for (const Row& r : rows) {
    o << (first ? "\n" : ",\n") << "    {\"mode\": " << json_string(r.mode) << ", \"system\": " << json_string(r.system)
      << ", \"size\": " << r.size << ", \"outstanding\": " << r.outstanding << ", \"channels\": " << r.channels
      << ", \"calls\": " << r.calls << ", \"failed\": " << r.failed << ", \"p50_us\": " << json_number(r.p50)
      << ", \"p99_us\": " << json_number(r.p99) << ", \"p999_us\": " << json_number(r.p999)
      << ", \"mean_us\": " << json_number(r.mean) << ", \"max_us\": " << json_number(r.max)
      << ", \"calls_per_s\": " << json_number(r.calls_per_s) << ", \"mb_per_s\": " << json_number(r.mb_per_s)
      << ", \"ratio_to_grpc\": " << (r.ratio_grpc == 0 ? "null" : json_number(r.ratio_grpc))
      << ", \"ratio_to_limit\": " << (r.ratio_limit == 0 ? "null" : json_number(r.ratio_limit));
    if (!r.error.empty()) o << ", \"error\": " << json_string(r.error);
    o << "}";
    first = false;
  }
  return finish_results_file(o.str(), path);
}

// Runs one point with a progress line on stderr (rewritten in place, about
// four times a second) while the driver works on this thread's behalf.
Point measure(EchoDriver& d, const std::string& label, uint64_t size, uint64_t warmup, uint64_t calls,
              uint64_t outstanding, uint32_t channels) {
  std::atomic<uint64_t> done{0};
  std::atomic<bool> running{true};
  std::mutex mu;
  std::condition_variable cv;
  const uint64_t total = warmup + calls;
  std::thread progress([&] {
    std::unique_lock<std::mutex> lock(mu);
    while (running.load()) {
      std::fprintf(stderr, "\r%-48s %llu/%llu calls", label.c_str(), (unsigned long long)done.load(),
                   (unsigned long long)total);
      cv.wait_for(lock, std::chrono::milliseconds(250), [&] { return !running.load(); });
    }
  });
  if (warmup != 0) d.run(size, warmup, outstanding, channels, done);
  Point pt = d.run(size, calls, outstanding, channels, done);
  {
    std::lock_guard<std::mutex> lock(mu);
    running.store(false);
  }
  cv.notify_all();
  progress.join();
  std::fprintf(stderr, "\r%-48s %llu/%llu calls, %llu failed\n", label.c_str(), (unsigned long long)done.load(),
               (unsigned long long)total, (unsigned long long)pt.failed);
  return pt;
}

std::string size_text(uint64_t n) {
  if (n >= (1u << 20) && n % (1u << 20) == 0) return std::to_string(n >> 20) + " MiB";
  if (n >= 1024 && n % 1024 == 0) return std::to_string(n >> 10) + " KiB";
  return std::to_string(n) + " B";
}

}  // namespace
}  // namespace bench

int main(int argc, char** argv) {
  using namespace bench;
  std::vector<std::string> modes = {"latency", "throughput"};
  std::vector<std::string> systems = {"tcp", "shm", "grpc", "socket"};
  std::vector<std::string> sizes_text = {"64", "1024", "4096", "65536", "1048576", "max"};
  std::vector<uint64_t> outstanding = {1, 8, 32, 128};
  std::vector<uint32_t> channels = {1, 4};
  uint64_t warmup = 1000, calls = 20000, throughput_calls = 0, throughput_size = 64;
  uint32_t slot_size = 2u << 20;
  uint64_t max_message = 0;
  std::string host = "127.0.0.1", json_path, serve, port_file;
  std::vector<uint64_t> bulk_sizes = {65536, 1u << 20, 16u << 20, 256u << 20};
  uint64_t bulk_calls = 20, bulk_outstanding = 1, load_size = 1ull << 30, load_idle_calls = 2000, load_repeat = 1;
  uint64_t bulk_pages = 0;
  bool bulk_per_page = false;
  TlsFiles tls;
  uint32_t rounds = 1;

  CLI::App app("slotrpc beside gRPC (same schema, same loop) and a busy-polling socket ping-pong, client and "
               "server in two processes: latency per payload size, throughput per outstanding calls and channels.",
               "slotrpc-bench");
  app.add_option("--modes", modes,
                 "latency, throughput (slot path); bulk (echo of --bulk-sizes as bulk payloads, beside the socket "
                 "ping-pong of the same sizes), bulk-read / bulk-write (one way: the server pulls / pushes "
                 "--bulk-sizes), bulk-load (64 B calls while a --load-size bulk echo runs)")
      ->delimiter(',')->check(CLI::IsMember({"latency", "throughput", "bulk", "bulk-read", "bulk-write", "bulk-load"}))
      ->capture_default_str();
  app.add_option("--transports", systems,
                 "Systems: tcp, shm, verbs (slotrpc), grpc, socket (the limit; in modes bulk, bulk-read and "
                 "bulk-write a ping-pong or one-way transfer of the same sizes); bulk-tcp, bulk-shm, bulk-verbs (slotrpc "
                 "bulk payloads: modes bulk, bulk-read, bulk-write and bulk-load only)")
      ->delimiter(',')->check(CLI::IsMember({"tcp", "tls", "shm", "verbs", "grpc", "grpc-tls", "socket", "bulk-tcp", "bulk-tls",
                              "bulk-shm", "bulk-verbs"}))
      ->capture_default_str();
  app.add_option("--bulk-sizes", bulk_sizes, "Mode bulk: payload bytes")->delimiter(',')
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 31))->capture_default_str();
  app.add_option("--bulk-calls", bulk_calls, "Mode bulk: counted calls per size (and 2 warm-up calls)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1'000'000}))->capture_default_str();
  app.add_option("--bulk-outstanding", bulk_outstanding,
                 "Modes bulk, bulk-read, bulk-write: slotrpc calls in flight, each with buffers of its own "
                 "(2 x SIZE bytes a call; the socket ping-pong keeps one)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{256}))->capture_default_str();
  app.add_option("--bulk-pages", bulk_pages,
                 "Modes bulk, bulk-read, bulk-write: the server moves its buffer as a scatter list of pages "
                 "of this many bytes, adjacent in one registered region (0: one range)")
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 31))->capture_default_str();
  app.add_flag("--bulk-per-page", bulk_per_page,
               "With --bulk-pages: one read_bulk / write_bulk per page instead of one for the list");
  app.add_option("--load-size", load_size, "Mode bulk-load: bytes of the large bulk echo")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 31))->capture_default_str();
  app.add_option("--load-repeat", load_repeat,
                 "Mode bulk-load: bulk echoes of --load-size run one after the other while the 64 B calls go on")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1000000}))->capture_default_str();
  app.add_option("--load-idle-calls", load_idle_calls, "Mode bulk-load: 64 B calls measured alone first")
      ->check(CLI::Range(uint64_t{1}, uint64_t{10000000}))->capture_default_str();
  app.add_option("--sizes", sizes_text, "Latency payload sizes in bytes; 'max' = the largest a slot holds")
      ->delimiter(',')->capture_default_str();
  app.add_option("--outstanding", outstanding, "Throughput: calls in flight")->delimiter(',')
      ->check(CLI::Range(uint64_t{1}, uint64_t{4096}))->capture_default_str();
  app.add_option("--channels", channels, "Throughput: connections the calls are spread over")->delimiter(',')
      ->check(CLI::Range(1u, 64u))->capture_default_str();
  app.add_option("--warmup", warmup, "Uncounted calls before each point")->capture_default_str();
  app.add_option("--calls", calls, "Counted calls per latency point")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--throughput-calls", throughput_calls, "Counted calls per throughput point (default: --calls)");
  app.add_option("--throughput-size", throughput_size, "Throughput payload bytes")->capture_default_str();
  app.add_option("--slot-size", slot_size, "slotrpc slot size of the latency channels (bytes, multiple of 64)")
      ->check(CLI::Range(4096u, 64u << 20))->capture_default_str();
  std::vector<std::string> wait_modes = {"callback"};
  app.add_option("--wait", wait_modes,
                 "How slotrpc's latency calls wait: callback (a chain of reply callbacks on the loop) or future "
                 "(Future::get() on the benchmark's thread) or poll (spin on Future::ready(), then get()); "
                 "several: each latency point once per mode in turn on one channel (rows system/future, "
                 "system/poll) and a table of their p50 over the callback form's")
      ->delimiter(',')->check(CLI::IsMember({"callback", "future", "poll"}))->capture_default_str();
  app.add_option("--address", host, "IPv4 address the servers listen on and clients connect to")->capture_default_str();
  app.add_option("--json", json_path, "Write every figure to this JSON file");
  app.add_option("--tls-cert", tls.cert, "Systems tls, bulk-tls: the server's certificate chain (PEM)");
  app.add_option("--tls-key", tls.key, "Systems tls, bulk-tls: the server's private key (PEM)");
  app.add_option("--tls-ca", tls.ca, "Systems tls, bulk-tls: the CA the client verifies the server with (PEM)");
  app.add_option("--rounds", rounds,
                 "Run the systems this many times, one after the other each round (tcp, tls, tcp, tls, ...): "
                 "rows of round i > 1 are named system#i")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--serve", serve, "(internal) run the server of one system")->group("");
  app.add_option("--port-file", port_file, "(internal) where --serve writes its port")->group("");
  app.add_option("--max-message", max_message, "(internal) gRPC message-size limit")->group("");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  auto set_wait = [](const std::string& mode) {
    g_wait_future = mode == "future" || mode == "poll";
    g_wait_poll = mode == "poll";
  };
  set_wait(wait_modes.front());

  if (!serve.empty()) {
    // Block the termination signals before any thread starts, so only
    // wait_for_termination() receives them.
    block_termination_signals();
    if (serve == "slotrpc") return serve_slotrpc(host, port_file, slot_size, tls);
    if (serve == "grpc") return serve_grpc(host + ":0", port_file, max_message, tls.cert, tls.key);
    if (serve == "socket") return serve_socket(host, port_file);
    std::fprintf(stderr, "slotrpc-bench: unknown --serve %s\n", serve.c_str());
    return 2;
  }
  if (throughput_calls == 0) throughput_calls = calls;
  // The library's connection notices would interleave with the tables.
  ::setenv("SLOTRPC_LOG_LEVEL", "warn", 0);
  if (slot_size % 64 != 0) {
    std::fprintf(stderr, "slotrpc-bench: --slot-size %u is not a multiple of 64\n", slot_size);
    return 2;
  }
  const uint64_t largest = largest_payload(slot_size);
  std::vector<uint64_t> sizes;
  for (const auto& s : sizes_text) {
    if (s == "max") {
      sizes.push_back(largest);
      continue;
    }
    char* end = nullptr;
    const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
    if (end == s.c_str() || *end != '\0' || v > largest) {
      std::fprintf(stderr, "slotrpc-bench: --sizes %s: not a size up to %llu (the largest a %u-byte slot holds; "
                   "raise --slot-size)\n", s.c_str(), (unsigned long long)largest, slot_size);
      return 2;
    }
    sizes.push_back(v);
  }
  if (throughput_size > largest_payload(64 * 1024)) {
    std::fprintf(stderr, "slotrpc-bench: --throughput-size %llu does not fit the default 64 KiB slot\n",
                 (unsigned long long)throughput_size);
    return 2;
  }
  if (max_message == 0) max_message = std::max<uint64_t>(uint64_t{slot_size} * 2, 4u << 20);
  if ((std::find(systems.begin(), systems.end(), "grpc") != systems.end() ||
       std::find(systems.begin(), systems.end(), "grpc-tls") != systems.end()) &&
      !grpc_available()) {
    std::fprintf(stderr, "slotrpc-bench: this build has no gRPC (grpc++ was not found at meson setup)\n");
    return 2;
  }
  // --transports chooses the transport of each run; SLOTRPC_TRANSPORT
  // would override it (the environment wins over Config).
  if (std::getenv("SLOTRPC_TRANSPORT") != nullptr) {
    std::fprintf(stderr, "slotrpc-bench: ignoring SLOTRPC_TRANSPORT (--transports chooses)\n");
    ::unsetenv("SLOTRPC_TRANSPORT");
  }
  const bool wants_tls = std::find(systems.begin(), systems.end(), "tls") != systems.end() ||
                         std::find(systems.begin(), systems.end(), "bulk-tls") != systems.end() ||
                         std::find(systems.begin(), systems.end(), "grpc-tls") != systems.end();
  if (wants_tls && (tls.cert.empty() || tls.key.empty() || tls.ca.empty())) {
    std::fprintf(stderr, "slotrpc-bench: systems tls, bulk-tls and grpc-tls need --tls-cert, --tls-key and --tls-ca\n");
    return 2;
  }
  // The client takes SIGPIPE as an error return, not a death.
  ::signal(SIGPIPE, SIG_IGN);

  const bool do_latency = std::find(modes.begin(), modes.end(), "latency") != modes.end();
  const bool do_throughput = std::find(modes.begin(), modes.end(), "throughput") != modes.end();
  const bool do_bulk = std::find(modes.begin(), modes.end(), "bulk") != modes.end();
  const bool do_bulk_read = std::find(modes.begin(), modes.end(), "bulk-read") != modes.end();
  const bool do_bulk_write = std::find(modes.begin(), modes.end(), "bulk-write") != modes.end();
  const bool do_bulk_load = std::find(modes.begin(), modes.end(), "bulk-load") != modes.end();
  std::vector<Row> rows;
  std::map<std::string, std::string> run_info = {
      {"warmup", std::to_string(warmup)},
      {"calls", std::to_string(calls)},
      {"throughput_calls", std::to_string(throughput_calls)},
      {"slot_size", std::to_string(slot_size)},
      {"largest_payload", std::to_string(largest)},
      {"address", host},
  };
  int rc = 0;
  // The socket limit first and gRPC next, so slotrpc's rows get their ratios
  // as soon as they are printed... they are computed at the end anyway; this
  // order only keeps the table grouped the same way every run.
  std::vector<std::string> order;
  for (const char* s : {"socket", "grpc", "grpc-tls", "tcp", "tls", "shm", "verbs", "bulk-tcp", "bulk-tls",
                        "bulk-shm", "bulk-verbs"}) {
    if (std::find(systems.begin(), systems.end(), s) != systems.end()) order.push_back(s);
  }
  for (uint32_t round = 1; round <= rounds; ++round)
  for (const std::string& sys : order) {
    const bool is_bulk = sys == "bulk-tcp" || sys == "bulk-tls" || sys == "bulk-shm" || sys == "bulk-verbs";
    const bool is_slotrpc = is_bulk || sys == "tcp" || sys == "tls" || sys == "shm" || sys == "verbs";
    const bool is_tls = sys == "tls" || sys == "bulk-tls" || sys == "grpc-tls";
    const std::string name = (is_slotrpc ? "slotrpc-" + sys : sys) + (round > 1 ? "#" + std::to_string(round) : "");
    // TLS on the client: the server's certificate verified against the CA.
    auto with_tls = [&](slotrpc::Config& cfg) {
      if (!is_tls) return;
      cfg.tls = true;
      cfg.tls_ca = tls.ca;
    };
    std::vector<std::string> server_args = {"--serve", is_slotrpc ? "slotrpc" : sys == "grpc-tls" ? "grpc" : sys,
                                            "--address", host,
                                            "--slot-size", std::to_string(slot_size), "--max-message",
                                            std::to_string(max_message)};
    if (is_tls) server_args.insert(server_args.end(), {"--tls-cert", tls.cert, "--tls-key", tls.key});
    ChildProcess server;
    if (auto err = server.start(server_args); !err.empty()) {
      std::fprintf(stderr, "slotrpc-bench: %s server: %s\n", name.c_str(), err.c_str());
      rc = 1;
      continue;
    }
    const std::string target = host + ":" + std::to_string(server.port());
    auto make = [&](bool latency) -> std::unique_ptr<EchoDriver> {
      if (sys == "socket") return std::make_unique<SocketDriver>(host, server.port());
      if (sys == "grpc" || sys == "grpc-tls") return make_grpc_driver(target, max_message, is_tls ? tls.ca : "");
      slotrpc::Config cfg;
      cfg.transport = sys == "tcp" || sys == "tls" ? slotrpc::TransportKind::kTcp
                    : sys == "shm"                 ? slotrpc::TransportKind::kShm
                                                   : slotrpc::TransportKind::kVerbs;
      with_tls(cfg);
      // Latency channels: slots large enough for the largest size, few of
      // them (one call is out at a time).  Throughput channels: the default
      // geometry (64 slots of 64 KiB).
      if (latency) {
        cfg.slot_size = slot_size;
        cfg.slot_count = 8;
      }
      auto d = std::make_unique<SlotrpcDriver>(target, cfg);
      if (auto st = d->connect_to(1); !st.ok()) {
        std::fprintf(stderr, "slotrpc-bench: %s: %s\n", name.c_str(), st.to_string().c_str());
        return nullptr;
      }
      run_info["poll_mode"] = std::string(slotrpc::to_string(d->channel().config().poll_mode));
      return d;
    };
    auto record = [&](Row row) {
      if (row.failed != 0) {
        std::fprintf(stderr, "slotrpc-bench: %s: %llu calls failed, first: %s\n", name.c_str(),
                     (unsigned long long)row.failed, row.error.c_str());
        rc = 1;
      }
      rows.push_back(std::move(row));
    };
    auto record_bulk = [&](const std::string& mode, const std::string& label, uint64_t size, const Point& pt,
                           uint64_t in_flight) {
      Row row = to_row(mode, label, size, in_flight, 1, pt);
      // MB/s of one direction; the echo moves the payload both ways.
      record(std::move(row));
    };
    if (is_bulk) {
      slotrpc::Config cfg;
      cfg.transport = sys == "bulk-tcp" || sys == "bulk-tls" ? slotrpc::TransportKind::kTcp
                    : sys == "bulk-shm"                      ? slotrpc::TransportKind::kShm
                                                             : slotrpc::TransportKind::kVerbs;
      with_tls(cfg);
      BulkDriver d(target, cfg);
      if (auto st = d.connect(); !st.ok()) {
        std::fprintf(stderr, "slotrpc-bench: %s: %s\n", name.c_str(), st.to_string().c_str());
        rc = 1;
        continue;
      }
      run_info["poll_mode"] = std::string(slotrpc::to_string(d.channel().config().poll_mode));
      d.set_pages(bulk_pages, bulk_per_page);
      run_info["bulk_pages"] = std::to_string(bulk_pages);
      run_info["bulk_per_page"] = bulk_per_page ? "yes" : "no";
      for (const auto& [mode, on, dir] : {std::tuple{"bulk", do_bulk, BulkDriver::Direction::kEcho},
                                          std::tuple{"bulk-read", do_bulk_read, BulkDriver::Direction::kRead},
                                          std::tuple{"bulk-write", do_bulk_write, BulkDriver::Direction::kWrite}}) {
        if (!on) continue;
        d.set_direction(dir);
        for (uint64_t size : bulk_sizes) {
          const Point pt = measure(d, std::string(mode) + " " + name + " " + size_text(size), size,
                                   2 * bulk_outstanding, bulk_calls, bulk_outstanding, 1);
          record_bulk(mode, name, size, pt, bulk_outstanding);
        }
      }
      d.set_direction(BulkDriver::Direction::kEcho);
      if (do_bulk_load) {
        Point idle, during;
        std::string err;
        std::fprintf(stderr, "bulk-load %s: %llu idle 64 B calls, then 64 B calls during %llu %s echo(es)\n",
                     name.c_str(), (unsigned long long)load_idle_calls, (unsigned long long)load_repeat,
                     size_text(load_size).c_str());
        run_info["load_repeat"] = std::to_string(load_repeat);
        if (!d.interference(load_size, load_repeat, load_idle_calls, &idle, &during, &err)) {
          std::fprintf(stderr, "slotrpc-bench: %s bulk-load: %s\n", name.c_str(), err.c_str());
          rc = 1;
        } else {
          Row a = to_row("bulk-load", name + " idle", load_size, 1, 1, idle);
          Row b = to_row("bulk-load", name + " during", load_size, 1, 1, during);
          if (a.p99 > 0) b.ratio_limit = b.p99 / a.p99;
          record(std::move(a));
          record(std::move(b));
        }
      }
      continue;
    }
    if (sys == "socket") {
      // The ping-pong for mode bulk; one-way transfers for bulk-read (the
      // payload goes to the server, as a pulled request segment does) and
      // bulk-write (it comes back, as a pushed reply segment does).
      for (const auto& [mode, on, dir] :
           {std::tuple{"bulk", do_bulk, SocketDriver::Direction::kEcho},
            std::tuple{"bulk-read", do_bulk_read, SocketDriver::Direction::kToServer},
            std::tuple{"bulk-write", do_bulk_write, SocketDriver::Direction::kToClient}}) {
        if (!on) continue;
        SocketDriver d(host, server.port(), dir);
        for (uint64_t size : bulk_sizes) {
          const Point pt = measure(d, std::string(mode) + " socket " + size_text(size), size, 2, bulk_calls, 1, 1);
          record_bulk(mode, name, size, pt, 1);
        }
      }
    }
    if (do_latency) {
      auto d = make(true);
      if (d == nullptr) {
        rc = 1;
        continue;
      }
      for (uint64_t size : sizes) {
        // --wait with several modes: each in turn at this point, on the
        // same channel and server, so their ratio holds on a drifting host.
        for (size_t w = 0; w < (is_slotrpc ? wait_modes.size() : 1); ++w) {
          const std::string row_name =
              name + (is_slotrpc && wait_modes.size() > 1 && wait_modes[w] != "callback" ? "/" + wait_modes[w] : "");
          set_wait(wait_modes[w]);
          const Point pt = measure(*d, "latency " + row_name + " " + size_text(size), size, warmup, calls, 1, 1);
          record(to_row("latency", row_name, size, 1, 1, pt));
        }
      }
    }
    if (do_throughput && sys != "socket") {
      auto d = make(false);
      if (d == nullptr) {
        rc = 1;
        continue;
      }
      for (uint32_t c : channels) {
        for (uint64_t k : outstanding) {
          const Point pt = measure(*d, "throughput " + name + " " + std::to_string(c) + " ch " + std::to_string(k) +
                                           " out", throughput_size, warmup, throughput_calls, k, c);
          record(to_row("throughput", name, throughput_size, k, c, pt));
        }
      }
    }
  }
  add_ratios(rows);
  std::printf("machine: %s\n", machine_line().c_str());
  print_table(rows, "latency");
  if (wait_modes.size() > 1) print_wait_table(rows);
  print_table(rows, "throughput");
  print_table(rows, "bulk");
  print_table(rows, "bulk-read");
  print_table(rows, "bulk-write");
  print_table(rows, "bulk-load");
  if (!json_path.empty() && !write_json(json_path, rows, run_info)) {
    std::fprintf(stderr, "slotrpc-bench: cannot write %s\n", json_path.c_str());
    rc = 1;
  }
  return rc;
}
