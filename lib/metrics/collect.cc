#include "metrics/collect.h"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "core/loop.h"

namespace slotrpc::metrics {

LoopReading read_loop(core::Loop& loop, const std::vector<const transport::Link*>& links,
                      uint64_t client_queued) {
  LoopReading r;
  r.counters = loop.counters();
  r.client_queued = client_queued;
  for (const transport::Link* link : links) {
    if (link == nullptr) continue;
    switch (LoopCounters::kind_of(*link)) {
      case LoopCounters::Kind::kVerbs: {
        const transport::LinkStats s = link->stats();
        LoopCounters::add(r.verbs_live, s);
        ++r.verbs_sessions;
        r.verbs_max_inline = std::max(r.verbs_max_inline, s.max_inline);
        r.verbs_srq += s.shared_receive_queue ? 1 : 0;
        r.verbs_memory_window += s.memory_window ? 1 : 0;
        break;
      }
      case LoopCounters::Kind::kShm:
        LoopCounters::add(r.shm_live, link->stats());
        ++r.shm_sessions;
        break;
      case LoopCounters::Kind::kTcp: {
        const transport::LinkStats s = link->stats();
        LoopCounters::add(r.tcp_live, s);
        ++r.tcp_sessions;
        if (s.attached) ++r.tcp_lanes;  // a tcp link's attached connection is its bulk lane
        break;
      }
    }
  }
  return r;
}

LoopReading read_loop(core::Loop& loop, const LoopCounters& owner,
                      const std::vector<const transport::Link*>& links, uint64_t client_queued) {
  LoopReading r = read_loop(loop, links, client_queued);
  const LoopCounters& shared = r.counters;
  LoopCounters mine = owner;
  mine.tcp.completions_per_poll = shared.tcp.completions_per_poll;
  mine.verbs.completions_per_poll = shared.verbs.completions_per_poll;
  mine.shm.completions_per_poll = shared.shm.completions_per_poll;
  r.counters = std::move(mine);
  return r;
}

std::string method_display_name(const std::string& full_name) {
  const size_t dot = full_name.rfind('.');
  if (dot == std::string::npos) return full_name;
  std::string out = full_name;
  out[dot] = '/';
  return out;
}

void Collector::add(const LoopReading& r) {
  ++out_.loops;
  auto add_calls = [](CallCounters& into, const CallCounters& c) {
    into.started += c.started;
    for (size_t i = 0; i < CallCounters::kCodes; ++i) into.finished[i] += c.finished[i];
    into.bytes_in += c.bytes_in;
    into.bytes_out += c.bytes_out;
    into.bulk_bytes_in += c.bulk_bytes_in;
    into.bulk_bytes_out += c.bulk_bytes_out;
    into.credit_stalls += c.credit_stalls;
  };
  add_calls(out_.server, r.counters.server.calls);
  add_calls(out_.client, r.counters.client.calls);
  out_.client.queued += r.client_queued;
  for (int side = 0; side < 2; ++side) {
    const SideCounters& sc = side == 0 ? r.counters.server : r.counters.client;
    for (const auto& [id, m] : sc.methods) {
      MethodCounters& into = methods_[{side == 1, id}];
      into.started += m.started;
      for (size_t i = 0; i < CallCounters::kCodes; ++i) into.finished[i] += m.finished[i];
      into.bytes_in += m.bytes_in;
      into.bytes_out += m.bytes_out;
      into.bulk_bytes_in += m.bulk_bytes_in;
      into.bulk_bytes_out += m.bulk_bytes_out;
      if (into.name == nullptr) into.name = m.name;
      into.latency_us.merge(m.latency_us);
    }
  }
  LoopCounters::add(tcp_, r.counters.tcp.retired);
  LoopCounters::add(tcp_, r.tcp_live);
  LoopCounters::add(verbs_, r.counters.verbs.retired);
  LoopCounters::add(verbs_, r.verbs_live);
  LoopCounters::add(shm_, r.counters.shm.retired);
  LoopCounters::add(shm_, r.shm_live);
  tcp_sessions_ += r.tcp_sessions;
  tcp_lanes_ += r.tcp_lanes;
  verbs_max_inline_ = std::max(verbs_max_inline_, r.verbs_max_inline);
  verbs_srq_ += r.verbs_srq;
  verbs_memory_window_ += r.verbs_memory_window;
  verbs_sessions_ += r.verbs_sessions;
  shm_sessions_ += r.shm_sessions;
  tcp_polls_.merge(r.counters.tcp.completions_per_poll);
  verbs_polls_.merge(r.counters.verbs.completions_per_poll);
  shm_polls_.merge(r.counters.shm.completions_per_poll);
  const MetricsSnapshot& m = r.monitor;
  out_.hw_counters.insert(out_.hw_counters.end(), m.hw_counters.begin(), m.hw_counters.end());
  for (const std::string& a : m.hw_counters_absent) {
    if (std::find(out_.hw_counters_absent.begin(), out_.hw_counters_absent.end(), a) ==
        out_.hw_counters_absent.end()) {
      out_.hw_counters_absent.push_back(a);
    }
  }
  out_.receive_pools.insert(out_.receive_pools.end(), m.receive_pools.begin(),
                            m.receive_pools.end());
}

MetricsSnapshot Collector::finish(const Namer& name) {
  MetricsSnapshot out = std::move(out_);
  out.taken = std::chrono::system_clock::now();
  for (const auto& [key, m] : methods_) {
    MethodMetrics mm;
    mm.server = !key.first;
    mm.id = key.second;
    std::string n = name ? name(mm.id, mm.server) : std::string();
    if (n.empty() && m.name != nullptr) n = m.name;  // a generated client's
    mm.name = n.empty() ? fmt::format("0x{:08x}", mm.id) : method_display_name(n);
    mm.started = m.started;
    mm.finished = m.finished;
    mm.bytes_in = m.bytes_in;
    mm.bytes_out = m.bytes_out;
    mm.bulk_bytes_in = m.bulk_bytes_in;
    mm.bulk_bytes_out = m.bulk_bytes_out;
    mm.latency_us = m.latency_us.snapshot();
    out.methods.push_back(std::move(mm));
  }
  std::sort(out.methods.begin(), out.methods.end(), [](const MethodMetrics& a, const MethodMetrics& b) {
    if (a.server != b.server) return a.server;
    return a.name < b.name;
  });
  auto transport = [](std::string kind, const transport::LinkStats& s, uint64_t sessions,
                      const Histogram& polls) {
    TransportMetrics t;
    t.transport = std::move(kind);
    t.sessions = sessions;
    t.slot_sends = s.slot_sends;
    t.control_sends = s.control_sends;
    t.inline_sends = s.inline_sends;
    t.noninline_sends = s.noninline_sends;
    t.doorbells = s.doorbells;
    t.messages = s.messages;
    t.packs = s.packs;
    t.packets = s.packets;
    t.bulk_requests = s.bulk_requests;
    t.bulk_pushes = s.bulk_pushes;
    t.bulk_pushes_dropped = s.bulk_pushes_dropped;
    t.signaled = s.signaled;
    t.backlogged = s.backlogged;
    t.bulk_lane_bytes_sent = s.attached_bytes_sent;
    t.bulk_lane_bytes_received = s.attached_bytes_received;
    t.completions_per_poll = polls.snapshot();
    return t;
  };
  out.transports.push_back(transport("tcp", tcp_, tcp_sessions_, tcp_polls_));
  out.transports.back().bulk_lanes = tcp_lanes_;
  if (verbs_sessions_ != 0 || verbs_.slot_sends != 0 || verbs_polls_.count() != 0) {
    out.transports.push_back(transport("verbs", verbs_, verbs_sessions_, verbs_polls_));
    out.transports.back().max_inline = verbs_max_inline_;
    out.transports.back().srq_sessions = verbs_srq_;
    out.transports.back().memory_window_sessions = verbs_memory_window_;
  }
  // Like verbs, only once it was used: a TCP-only process shows tcp alone.
  if (shm_sessions_ != 0 || shm_.slot_sends != 0 || shm_polls_.count() != 0) {
    out.transports.push_back(transport("shm", shm_, shm_sessions_, shm_polls_));
  }
  *this = Collector();
  return out;
}

namespace {
std::mutex names_mu;
std::unordered_map<uint32_t, std::string>& names() {
  static auto* m = new std::unordered_map<uint32_t, std::string>();  // never destroyed
  return *m;
}
}  // namespace

void remember_method_name(uint32_t id, const std::string& full_name) {
  std::lock_guard<std::mutex> lock(names_mu);
  names().try_emplace(id, full_name);
}

std::string known_method_name(uint32_t id) {
  std::lock_guard<std::mutex> lock(names_mu);
  auto it = names().find(id);
  return it == names().end() ? std::string() : it->second;
}

}  // namespace slotrpc::metrics
