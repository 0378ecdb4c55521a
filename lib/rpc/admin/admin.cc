#include "rpc/admin/admin.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "admin.slotrpc.h"  // slotrpc-gen admin.fbs, at build time

namespace slotrpc::admin {

namespace fb = flatbuffers;

// A snapshot costs the server far more than an echo: every loop walks its
// sessions, and the reply is KiBs of histograms for a request of a few
// bytes.  Answered for every call, a few clients with Admin calls in flight
// took most of the server (two sessions with 64 each cut a bystander's
// echo rate 24x, where the same load as echo calls cut it 4.8x).  So two
// token buckets, server-wide:
//  * answers: kAnswerBurst, refilled at kAnswersPerSecond; a call finding
//    it empty is refused with RESOURCE_EXHAUSTED, a small error reply that
//    costs what an echo costs;
//  * fresh snapshots: kFreshBurst, refilled at kFreshPerSecond; an
//    answered call finding it empty gets the latest snapshot's reply again
//    (its taken_unix_ns says when it was taken), which costs a copy.
// A client polling at human rates (slotrpc-stat --watch) always gets fresh
// ones.
class AdminServiceImpl final : public AdminService {
 public:
  static constexpr double kAnswerBurst = 64;
  static constexpr double kAnswersPerSecond = 200;
  static constexpr double kFreshBurst = 8;
  static constexpr double kFreshPerSecond = 20;

  explicit AdminServiceImpl(std::function<MetricsSnapshot()> snapshot) : snapshot_(std::move(snapshot)) {}
  Status Metrics(const AdminMetricsRequest& request, ReplyBuilder<AdminMetricsReply>& reply,
                 ServerCall& call) override;

 private:
  using Clock = std::chrono::steady_clock;
  struct Bucket {
    double burst, per_second, tokens;
    Clock::time_point refilled = Clock::now();
    bool take(Clock::time_point now) {
      tokens = std::min(burst, tokens + std::chrono::duration<double>(now - refilled).count() * per_second);
      refilled = now;
      if (tokens < 1) return false;
      tokens -= 1;
      return true;
    }
  };
  enum class Ration { kRefuse, kAgain, kFresh };
  // What this call gets; `again` is set for kAgain.
  Ration ration(std::shared_ptr<const std::vector<uint8_t>>* again);

  std::function<MetricsSnapshot()> snapshot_;
  std::mutex mu_;  // handlers run on every loop of the server
  Bucket answers_{kAnswerBurst, kAnswersPerSecond, kAnswerBurst};  // under mu_
  Bucket fresh_{kFreshBurst, kFreshPerSecond, kFreshBurst};        // under mu_
  std::shared_ptr<const std::vector<uint8_t>> last_;                // under mu_: the latest fresh reply
};

namespace {

fb::Offset<AdminHistogram> encode(fb::FlatBufferBuilder& b, const HistogramSnapshot& h) {
  std::vector<uint64_t> highs, counts;
  highs.reserve(h.buckets.size());
  counts.reserve(h.buckets.size());
  for (const auto& [high, n] : h.buckets) {
    highs.push_back(high);
    counts.push_back(n);
  }
  return CreateAdminHistogram(b, h.count, h.sum, h.min, h.max, b.CreateVector(highs),
                              b.CreateVector(counts));
}

HistogramSnapshot decode(const AdminHistogram* h) {
  HistogramSnapshot out;
  if (h == nullptr) return out;
  out.count = h->count();
  out.sum = h->sum();
  out.min = h->min();
  out.max = h->max();
  if (h->bucket_high() != nullptr && h->bucket_count() != nullptr) {
    const size_t n = std::min(h->bucket_high()->size(), h->bucket_count()->size());
    for (size_t i = 0; i < n; ++i) {
      out.buckets.emplace_back(h->bucket_high()->Get(static_cast<fb::uoffset_t>(i)),
                               h->bucket_count()->Get(static_cast<fb::uoffset_t>(i)));
    }
  }
  return out;
}

fb::Offset<AdminCalls> encode(fb::FlatBufferBuilder& b, const CallCounters& c) {
  return CreateAdminCalls(b, c.started, b.CreateVector(c.finished.data(), c.finished.size()),
                          c.bytes_in, c.bytes_out, c.credit_stalls, c.queued, c.bulk_bytes_in,
                          c.bulk_bytes_out);
}

template <size_t N>
void decode_codes(const fb::Vector<uint64_t>* v, std::array<uint64_t, N>& out) {
  if (v == nullptr) return;
  for (size_t i = 0; i < N && i < v->size(); ++i) out[i] = v->Get(static_cast<fb::uoffset_t>(i));
}

CallCounters decode(const AdminCalls* c) {
  CallCounters out;
  if (c == nullptr) return out;
  out.started = c->started();
  decode_codes(c->finished(), out.finished);
  out.bytes_in = c->bytes_in();
  out.bytes_out = c->bytes_out();
  out.credit_stalls = c->credit_stalls();
  out.queued = c->queued();
  out.bulk_bytes_in = c->bulk_bytes_in();
  out.bulk_bytes_out = c->bulk_bytes_out();
  return out;
}

std::string str(const fb::String* s) { return s == nullptr ? std::string() : s->str(); }

}  // namespace

AdminServiceImpl::Ration AdminServiceImpl::ration(std::shared_ptr<const std::vector<uint8_t>>* again) {
  std::lock_guard<std::mutex> lock(mu_);
  const Clock::time_point now = Clock::now();
  if (!answers_.take(now)) return Ration::kRefuse;
  if (fresh_.take(now) || last_ == nullptr) return Ration::kFresh;
  *again = last_;
  return Ration::kAgain;
}

Status AdminServiceImpl::Metrics(const AdminMetricsRequest&, ReplyBuilder<AdminMetricsReply>& reply,
                                 ServerCall&) {
  fb::FlatBufferBuilder& b = reply.fbb();
  std::shared_ptr<const std::vector<uint8_t>> again;
  switch (ration(&again)) {
    case Ration::kRefuse:
      return Status(StatusCode::kResourceExhausted,
                    fmt::format("slotrpc.Admin/Metrics: this server answers at most {:.0f} calls a "
                                "second (bursts of {:.0f}); retry later",
                                kAnswersPerSecond, kAnswerBurst));
    case Ration::kAgain:
      // A finished buffer is a multiple of its alignment long: pushed whole
      // at the slot's (aligned) end it stays aligned.
      b.PushFlatBuffer(again->data(), again->size());
      return {};
    case Ration::kFresh:
      break;
  }
  const MetricsSnapshot m = snapshot_();
  std::vector<fb::Offset<AdminMethod>> methods;
  for (const MethodMetrics& mm : m.methods) {
    methods.push_back(CreateAdminMethod(b, b.CreateString(mm.name), mm.id, mm.server, mm.started,
                                        b.CreateVector(mm.finished.data(), mm.finished.size()),
                                        encode(b, mm.latency_us), mm.bytes_in, mm.bytes_out,
                                        mm.bulk_bytes_in, mm.bulk_bytes_out));
  }
  std::vector<fb::Offset<AdminTransport>> transports;
  for (const TransportMetrics& t : m.transports) {
    transports.push_back(CreateAdminTransport(
        b, b.CreateString(t.transport), t.sessions, t.slot_sends, t.control_sends, t.inline_sends,
        t.noninline_sends, t.doorbells, t.signaled, t.backlogged, encode(b, t.completions_per_poll),
        t.messages, t.packs, t.packets, t.bulk_requests, t.bulk_pushes, t.bulk_pushes_dropped));
  }
  std::vector<fb::Offset<AdminHwCounter>> hw;
  for (const HwCounter& c : m.hw_counters) {
    hw.push_back(CreateAdminHwCounter(b, b.CreateString(c.device), c.port, b.CreateString(c.name),
                                      static_cast<uint8_t>(c.kind), c.value, c.delta, c.per_second));
  }
  std::vector<fb::Offset<AdminReceivePool>> pools;
  for (const ReceivePool& p : m.receive_pools) {
    pools.push_back(CreateAdminReceivePool(b, b.CreateString(p.loop), b.CreateString(p.queue),
                                           p.capacity, p.posted, p.low_water));
  }
  const auto taken = std::chrono::duration_cast<std::chrono::nanoseconds>(m.taken.time_since_epoch()).count();
  const auto server = encode(b, m.server);
  const auto client = encode(b, m.client);
  reply.Finish(CreateAdminMetricsReply(b, taken, m.loops, server, client, b.CreateVector(methods),
                                       b.CreateVector(transports), b.CreateVector(hw),
                                       b.CreateVectorOfStrings(m.hw_counters_absent),
                                       b.CreateVector(pools)));
  auto copy = std::make_shared<const std::vector<uint8_t>>(b.GetBufferPointer(),
                                                           b.GetBufferPointer() + b.GetSize());
  std::lock_guard<std::mutex> lock(mu_);
  last_ = std::move(copy);
  return {};
}

std::shared_ptr<AdminServiceImpl> make_service(std::function<MetricsSnapshot()> snapshot) {
  return std::make_shared<AdminServiceImpl>(std::move(snapshot));
}

ServiceDefinition definition(AdminServiceImpl& impl) { return impl.definition(); }

Result<MetricsSnapshot> fetch_metrics(Channel& channel, CallOptions options) {
  AdminClient client(channel);
  auto reply = client.Metrics([](fb::FlatBufferBuilder& b) { return CreateAdminMetricsRequest(b); },
                              std::move(options)).get();
  if (!reply.ok()) return reply.status();
  const AdminMetricsReply& r = *reply;
  MetricsSnapshot m;
  m.taken = std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::nanoseconds(r.taken_unix_ns())));
  m.loops = r.loops();
  m.server = decode(r.server());
  m.client = decode(r.client());
  if (r.methods() != nullptr) {
    for (const AdminMethod* x : *r.methods()) {
      MethodMetrics mm;
      mm.name = str(x->name());
      mm.id = x->id();
      mm.server = x->server();
      mm.started = x->started();
      decode_codes(x->finished(), mm.finished);
      mm.latency_us = decode(x->latency_us());
      mm.bytes_in = x->bytes_in();
      mm.bytes_out = x->bytes_out();
      mm.bulk_bytes_in = x->bulk_bytes_in();
      mm.bulk_bytes_out = x->bulk_bytes_out();
      m.methods.push_back(std::move(mm));
    }
  }
  if (r.transports() != nullptr) {
    for (const AdminTransport* x : *r.transports()) {
      TransportMetrics t;
      t.transport = str(x->transport());
      t.sessions = x->sessions();
      t.slot_sends = x->slot_sends();
      t.control_sends = x->control_sends();
      t.inline_sends = x->inline_sends();
      t.noninline_sends = x->noninline_sends();
      t.doorbells = x->doorbells();
      t.signaled = x->signaled();
      t.backlogged = x->backlogged();
      t.messages = x->messages();
      t.packs = x->packs();
      t.packets = x->packets();
      t.bulk_requests = x->bulk_requests();
      t.bulk_pushes = x->bulk_pushes();
      t.bulk_pushes_dropped = x->bulk_pushes_dropped();
      t.completions_per_poll = decode(x->completions_per_poll());
      m.transports.push_back(std::move(t));
    }
  }
  if (r.hw_counters() != nullptr) {
    for (const AdminHwCounter* x : *r.hw_counters()) {
      HwCounter c;
      c.device = str(x->device());
      c.port = x->port();
      c.name = str(x->name());
      c.kind = x->kind() <= static_cast<uint8_t>(HwCounter::Kind::kOther)
                   ? static_cast<HwCounter::Kind>(x->kind())
                   : HwCounter::Kind::kOther;
      c.value = x->value();
      c.delta = x->delta();
      c.per_second = x->per_second();
      m.hw_counters.push_back(std::move(c));
    }
  }
  if (r.hw_counters_absent() != nullptr) {
    for (const fb::String* s : *r.hw_counters_absent()) m.hw_counters_absent.push_back(str(s));
  }
  if (r.receive_pools() != nullptr) {
    for (const AdminReceivePool* x : *r.receive_pools()) {
      ReceivePool p;
      p.loop = str(x->loop());
      p.queue = str(x->queue());
      p.capacity = x->capacity();
      p.posted = x->posted();
      p.low_water = x->low_water();
      m.receive_pools.push_back(std::move(p));
    }
  }
  return m;
}

}  // namespace slotrpc::admin
