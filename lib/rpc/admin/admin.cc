#include "rpc/admin/admin.h"

#include "admin.slotrpc.h"  // slotrpc-gen admin.fbs, at build time

namespace slotrpc::admin {

namespace fb = flatbuffers;

class AdminServiceImpl final : public AdminService {
 public:
  explicit AdminServiceImpl(std::function<MetricsSnapshot()> snapshot) : snapshot_(std::move(snapshot)) {}
  Status Metrics(const AdminMetricsRequest& request, ReplyBuilder<AdminMetricsReply>& reply,
                 ServerCall& call) override;

 private:
  std::function<MetricsSnapshot()> snapshot_;
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

Status AdminServiceImpl::Metrics(const AdminMetricsRequest&, ReplyBuilder<AdminMetricsReply>& reply,
                                 ServerCall&) {
  const MetricsSnapshot m = snapshot_();
  fb::FlatBufferBuilder& b = reply.fbb();
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
