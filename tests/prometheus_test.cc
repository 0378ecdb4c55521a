// slotrpc::to_prometheus against the text exposition format's rules: names,
// one # HELP and # TYPE per family before its contiguous samples, _total on
// counters, label escaping (with hostile method, device and loop names),
// cumulative histogram buckets ending in le="+Inf" equal to _count, _sum.
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "slotrpc/histogram.h"
#include "slotrpc/metrics.h"

namespace {

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;  // unescaped
  std::string value;
};

// Parses one sample line strictly; fails the test on any syntax error.
Sample parse_sample(const std::string& line) {
  Sample s;
  size_t i = 0;
  while (i < line.size() && (std::isalnum(static_cast<unsigned char>(line[i])) || line[i] == '_' || line[i] == ':')) {
    s.name += line[i++];
  }
  REQUIRE_MESSAGE(!s.name.empty(), line);
  if (i < line.size() && line[i] == '{') {
    ++i;
    while (true) {
      REQUIRE_MESSAGE(i < line.size(), line);
      if (line[i] == '}') {
        ++i;
        break;
      }
      std::string key;
      while (i < line.size() && line[i] != '=') key += line[i++];
      REQUIRE_MESSAGE(i + 1 < line.size(), line);
      REQUIRE_MESSAGE(line[i + 1] == '"', line);
      i += 2;
      std::string value;
      while (true) {
        REQUIRE_MESSAGE(i < line.size(), line);
        const char c = line[i++];
        if (c == '"') break;
        if (c == '\\') {
          REQUIRE_MESSAGE(i < line.size(), line);
          const char e = line[i++];
          REQUIRE_MESSAGE((e == '\\' || e == '"' || e == 'n'), "bad escape in " << line);
          value += e == 'n' ? '\n' : e;
        } else {
          value += c;
        }
      }
      CHECK_MESSAGE(s.labels.count(key) == 0, "label twice: " << line);
      s.labels[key] = value;
      if (i < line.size() && line[i] == ',') ++i;
    }
  }
  REQUIRE_MESSAGE(i < line.size(), line);
  REQUIRE_MESSAGE(line[i] == ' ', line);
  s.value = line.substr(i + 1);
  REQUIRE_MESSAGE(!s.value.empty(), line);
  if (s.value != "+Inf" && s.value != "-Inf" && s.value != "NaN") {
    size_t used = 0;
    (void)std::stod(s.value, &used);
    REQUIRE_MESSAGE(used == s.value.size(), line);
  }
  return s;
}

std::string family_of(const std::string& sample_name, const std::map<std::string, std::string>& types) {
  if (types.count(sample_name)) return sample_name;
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    const std::string s(suffix);
    if (sample_name.size() > s.size() && sample_name.compare(sample_name.size() - s.size(), s.size(), s) == 0) {
      const std::string base = sample_name.substr(0, sample_name.size() - s.size());
      if (types.count(base) && types.at(base) == "histogram") return base;
    }
  }
  return "";
}

struct Parsed {
  std::map<std::string, std::string> types;
  std::vector<Sample> samples;
};

// Checks the format's structural rules while parsing.
Parsed check_exposition(const std::string& text) {
  Parsed p;
  REQUIRE(!text.empty());
  REQUIRE(text.back() == '\n');
  std::istringstream in(text);
  std::string line;
  std::set<std::string> helped, finished_families;
  std::string current;
  while (std::getline(in, line)) {
    REQUIRE_MESSAGE(!line.empty(), "empty line");
    if (line.rfind("# HELP ", 0) == 0) {
      const std::string name = line.substr(7, line.find(' ', 7) - 7);
      CHECK_MESSAGE(helped.insert(name).second, "HELP twice for " << name);
      continue;
    }
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream t(line.substr(7));
      std::string name, type;
      t >> name >> type;
      CHECK_MESSAGE(p.types.count(name) == 0, "TYPE twice for " << name);
      CHECK_MESSAGE(helped.count(name) == 1, "TYPE before HELP for " << name);
      CHECK(name.rfind("slotrpc_", 0) == 0);
      CHECK((type == "counter" || type == "gauge" || type == "histogram"));
      if (type == "counter") CHECK_MESSAGE(name.size() > 6, name);
      if (type == "counter") CHECK_MESSAGE(name.compare(name.size() - 6, 6, "_total") == 0, name);
      p.types[name] = type;
      if (!current.empty()) finished_families.insert(current);
      current = name;
      continue;
    }
    REQUIRE_MESSAGE(line[0] != '#', line);
    Sample s = parse_sample(line);
    const std::string fam = family_of(s.name, p.types);
    REQUIRE_MESSAGE(!fam.empty(), "sample without TYPE: " << line);
    CHECK_MESSAGE(fam == current, "samples of " << fam << " are not contiguous");
    p.samples.push_back(std::move(s));
  }
  // Histograms: per label set, cumulative buckets ending in +Inf == _count.
  for (const auto& [name_, type] : p.types) {
    if (type != "histogram") continue;
    const std::string& name = name_;  // clang < 16: no lambda capture of a binding (CHECK_MESSAGE)
    std::map<std::map<std::string, std::string>, std::vector<std::pair<std::string, double>>> buckets;
    std::map<std::map<std::string, std::string>, double> counts, sums;
    for (const Sample& s : p.samples) {
      auto key = s.labels;
      if (s.name == name + "_bucket") {
        REQUIRE(key.count("le"));
        const std::string le = key["le"];
        key.erase("le");
        buckets[key].emplace_back(le, std::stod(s.value));
      } else if (s.name == name + "_count") {
        counts[key] = std::stod(s.value);
      } else if (s.name == name + "_sum") {
        sums[key] = std::stod(s.value);
      }
    }
    for (const auto& [key, bs] : buckets) {
      REQUIRE(!bs.empty());
      CHECK(bs.back().first == "+Inf");
      double prev_le = -1, prev_count = 0;
      for (const auto& [le, n] : bs) {
        if (le != "+Inf") {
          const double x = std::stod(le);
          CHECK_MESSAGE(x > prev_le, name << " le not increasing");
          prev_le = x;
        }
        CHECK_MESSAGE(n >= prev_count, name << " buckets not cumulative");
        prev_count = n;
      }
      REQUIRE(counts.count(key));
      REQUIRE(sums.count(key));
      CHECK(bs.back().second == counts[key]);
    }
  }
  return p;
}

const Sample* find(const Parsed& p, const std::string& name,
                   const std::map<std::string, std::string>& labels) {
  for (const Sample& s : p.samples) {
    if (s.name != name) continue;
    bool all = true;
    for (const auto& [k, v] : labels) {
      auto it = s.labels.find(k);
      if (it == s.labels.end() || it->second != v) all = false;
    }
    if (all) return &s;
  }
  return nullptr;
}

slotrpc::MetricsSnapshot sample_snapshot() {
  slotrpc::MetricsSnapshot m;
  m.loops = 2;
  m.server.started = 10;
  m.server.finished[0] = 7;
  m.server.finished[3] = 2;
  m.server.finished[12] = 1;
  m.server.bytes_in = 1000;
  m.server.bytes_out = 2000;
  m.client.credit_stalls = 4;
  m.client.queued = 3;
  slotrpc::Histogram lat;
  for (uint64_t v : {1, 3, 12, 150, 150, 1500, 3'000'000}) lat.record(v);  // us
  slotrpc::MethodMetrics mm;
  mm.name = "evil\"svc\\x\nnewline/Echo";  // a hostile name
  mm.id = 42;
  mm.server = true;
  mm.started = 7;
  mm.finished[0] = 7;
  mm.latency_us = lat.snapshot();
  m.methods.push_back(mm);
  slotrpc::MethodMetrics cm = mm;
  cm.server = false;
  cm.name = "plain.Svc/Get";
  m.methods.push_back(cm);
  slotrpc::TransportMetrics t;
  t.transport = "verbs";
  t.sessions = 1;
  t.slot_sends = 9;
  t.inline_sends = 6;
  t.noninline_sends = 3;
  t.doorbells = 2;
  slotrpc::Histogram polls;
  for (uint64_t v : {1, 1, 2, 7, 8, 32}) polls.record(v);
  t.completions_per_poll = polls.snapshot();
  m.transports.push_back(t);
  slotrpc::HwCounter hw;
  hw.device = "rxe\"0";
  hw.port = 1;
  hw.name = "rcvd_rnr_err";
  hw.kind = slotrpc::HwCounter::Kind::kRnr;
  hw.value = 17;
  hw.per_second = 2.5;
  m.hw_counters.push_back(hw);
  m.hw_counters_absent.push_back("rxe0/1: duplicate_request");
  slotrpc::ReceivePool pool;
  pool.loop = "slotrpc-srv0\n";
  pool.queue = "srq";
  pool.capacity = 1024;
  pool.posted = 1000;
  pool.low_water = 900;
  m.receive_pools.push_back(pool);
  return m;
}

}  // namespace

TEST_CASE("prometheus: an empty snapshot is valid exposition text") {
  const Parsed p = check_exposition(slotrpc::to_prometheus(slotrpc::MetricsSnapshot{}));
  CHECK(find(p, "slotrpc_calls_started_total", {{"side", "server"}}) != nullptr);
}

TEST_CASE("prometheus: every rule of the format, with hostile label values") {
  const std::string text = slotrpc::to_prometheus(sample_snapshot());
  const Parsed p = check_exposition(text);
  // Escaped on the wire, the original after unescaping.
  CHECK(text.find("method=\"evil\\\"svc\\\\x\\nnewline/Echo\"") != std::string::npos);
  const Sample* s = find(p, "slotrpc_method_calls_started_total",
                         {{"side", "server"}, {"method", "evil\"svc\\x\nnewline/Echo"}});
  REQUIRE(s != nullptr);
  CHECK(s->value == "7");
  CHECK(find(p, "slotrpc_calls_finished_total", {{"side", "server"}, {"code", "INVALID_ARGUMENT"}})->value == "2");
  CHECK(find(p, "slotrpc_calls_finished_total", {{"side", "server"}, {"code", "UNIMPLEMENTED"}})->value == "1");
  CHECK(find(p, "slotrpc_credit_stalls_total", {})->value == "4");
  CHECK(find(p, "slotrpc_queued_calls", {})->value == "3");
  CHECK(find(p, "slotrpc_transport_inline_sends_total", {{"transport", "verbs"}})->value == "6");
  CHECK(find(p, "slotrpc_hw_counter_total", {{"device", "rxe\"0"}, {"port", "1"}, {"counter", "rcvd_rnr_err"}, {"kind", "rnr"}})->value == "17");
  CHECK(find(p, "slotrpc_hw_counter_per_second", {{"counter", "rcvd_rnr_err"}})->value == "2.5");
  CHECK(find(p, "slotrpc_hw_counter_absent", {{"counter", "rxe0/1: duplicate_request"}}) != nullptr);
  CHECK(find(p, "slotrpc_receive_pool_low_water", {{"loop", "slotrpc-srv0\n"}, {"queue", "srq"}})->value == "900");

  // Latency buckets in seconds: le=2^k us holds the values below 2^k us.
  const std::map<std::string, std::string> server_method = {{"side", "server"}, {"method", "evil\"svc\\x\nnewline/Echo"}};
  auto bucket = [&](const std::string& le) {
    auto labels = server_method;
    labels["le"] = le;
    const Sample* b = find(p, "slotrpc_method_latency_seconds_bucket", labels);
    REQUIRE_MESSAGE(b != nullptr, "no bucket le=" << le);
    return std::stod(b->value);
  };
  CHECK(bucket("1e-06") == 0);    // < 1 us: none
  CHECK(bucket("2e-06") == 1);    // 1
  CHECK(bucket("4e-06") == 2);    // 1, 3
  CHECK(bucket("1.6e-05") == 3);  // 12
  CHECK(bucket("0.000256") == 5); // 150 x2
  CHECK(bucket("0.002048") == 6); // 1500
  CHECK(bucket("+Inf") == 7);     // 3 s is beyond 2^20 us: the ladder grew to cover it
  CHECK(bucket("4.194304") == 7);
  CHECK(std::fabs(std::stod(find(p, "slotrpc_method_latency_seconds_sum", server_method)->value) -
                  3001816e-6) < 1e-9);
  CHECK(find(p, "slotrpc_method_latency_seconds_count", server_method)->value == "7");

  // Completions per poll: le = 2^k - 1, exact counts.
  auto poll_bucket = [&](const std::string& le) {
    const Sample* b = find(p, "slotrpc_transport_completions_per_poll_bucket", {{"transport", "verbs"}, {"le", le}});
    REQUIRE_MESSAGE(b != nullptr, "no bucket le=" << le);
    return b->value;
  };
  CHECK(poll_bucket("0") == "0");
  CHECK(poll_bucket("1") == "2");
  CHECK(poll_bucket("3") == "3");
  CHECK(poll_bucket("7") == "4");
  CHECK(poll_bucket("15") == "5");
  CHECK(poll_bucket("31") == "5");
  CHECK(poll_bucket("63") == "6");
  CHECK(find(p, "slotrpc_transport_completions_per_poll_sum", {{"transport", "verbs"}})->value == "51");
}
