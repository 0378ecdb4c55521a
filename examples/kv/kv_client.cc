// kv_client [--connect HOST:PORT] [--count N] [--batch B]   (--help)
//
// Exercises every method of slotrpc.examples.kv.KV through the generated
// KVClient: Puts the first half of N keys (B per call), streams the second
// half with PutMany (one message per key), Gets each one back and checks it,
// Deletes every tenth, then Scans the whole store (a server stream of
// N - N/10 entries) checking order, count and content, and a few ranges;
// last, Watches keys (a bidi stream) while it changes them and its
// subscription.  Prints a summary; exits 1 on the first failed check.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <deque>
#include <future>
#include <optional>
#include <string>
#include <vector>

#include "kv.slotrpc.h"  // generated from kv.fbs by slotrpc-gen

namespace {

namespace kv = slotrpc::examples::kv;
namespace common = slotrpc::examples::common;
using Clock = std::chrono::steady_clock;

constexpr size_t kWindow = 32;  // calls kept in flight

[[noreturn]] void fail(const char* fmt, ...) {
  std::va_list args;
  va_start(args, fmt);
  std::fputs("kv_client: ", stderr);
  std::vfprintf(stderr, fmt, args);
  std::fputc('\n', stderr);
  va_end(args);
  std::exit(1);
}

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Key i and what it holds: its kind of value rotates through the union's
// members, it has i % 3 labels and a made-up modification time.
std::string key_of(uint64_t i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "key-%08llu", static_cast<unsigned long long>(i));
  return buf;
}
bool deleted(uint64_t i) { return i % 10 == 3; }

flatbuffers::Offset<kv::Entry> build_entry(flatbuffers::FlatBufferBuilder& fbb, uint64_t i) {
  const auto key = fbb.CreateString(key_of(i));
  kv::Value kind = kv::Value_NONE;
  flatbuffers::Offset<void> value;
  switch (i % 3) {
    case 0: {
      const std::vector<uint8_t> data(i % 17, static_cast<uint8_t>(i));
      kind = kv::Value_Bytes;
      value = kv::CreateBytes(fbb, fbb.CreateVector(data)).Union();
      break;
    }
    case 1:
      kind = kv::Value_Text;
      value = kv::CreateText(fbb, fbb.CreateString("text of " + std::to_string(i))).Union();
      break;
    default:
      kind = kv::Value_Number;
      value = kv::CreateNumber(fbb, static_cast<double>(i) / 4).Union();
  }
  std::vector<flatbuffers::Offset<common::Label>> labels;
  for (uint64_t l = 0; l < i % 3; ++l)
    labels.push_back(common::CreateLabel(fbb, fbb.CreateString("label" + std::to_string(l)),
                                         fbb.CreateString(std::to_string(i * 10 + l))));
  const auto label_vector = fbb.CreateVector(labels);
  const common::Timestamp modified(static_cast<int64_t>(i) * 1000);
  return kv::CreateEntry(fbb, key, kind, value, label_vector, &modified);
}

// Empty if `e` is what key i should hold, else what differs.
std::string check_entry(const kv::Entry* e, uint64_t i) {
  if (e == nullptr) return "no entry";
  if (e->key() == nullptr || e->key()->str() != key_of(i)) return "wrong key";
  switch (i % 3) {
    case 0: {
      const auto* b = e->value_as_Bytes();
      if (b == nullptr || b->data() == nullptr || b->data()->size() != i % 17) return "wrong bytes";
      for (uint8_t x : *b->data())
        if (x != static_cast<uint8_t>(i)) return "wrong bytes";
      break;
    }
    case 1: {
      const auto* t = e->value_as_Text();
      if (t == nullptr || t->text() == nullptr || t->text()->str() != "text of " + std::to_string(i))
        return "wrong text";
      break;
    }
    default: {
      const auto* n = e->value_as_Number();
      if (n == nullptr || n->value() != static_cast<double>(i) / 4) return "wrong number";
    }
  }
  if (e->labels() == nullptr || e->labels()->size() != i % 3) return "wrong label count";
  for (uint32_t l = 0; l < e->labels()->size(); ++l) {
    const common::Label* label = e->labels()->Get(l);
    if (label->name() == nullptr || label->name()->str() != "label" + std::to_string(l) ||
        label->value() == nullptr || label->value()->str() != std::to_string(i * 10 + l))
      return "wrong label " + std::to_string(l);
  }
  if (e->modified() == nullptr || e->modified()->unix_nanos() != static_cast<int64_t>(i) * 1000)
    return "wrong timestamp";
  return "";
}

// Calls `issue(k)` for k in [0, n) with up to kWindow futures in flight,
// handing each reply to `check(k, reply)` in order.
template <class Resp, class Issue, class Check>
void pipelined(uint64_t n, Issue issue, Check check) {
  std::deque<std::pair<uint64_t, slotrpc::Future<slotrpc::Reply<Resp>>>> window;
  for (uint64_t k = 0; k < n || !window.empty();) {
    if (k < n && window.size() < kWindow) {
      window.emplace_back(k, issue(k));
      ++k;
      continue;
    }
    auto [j, future] = std::move(window.front());
    window.pop_front();
    slotrpc::Reply<Resp> reply = future.get();
    if (!reply.ok()) fail("call %llu failed: %s", static_cast<unsigned long long>(j), reply.status().to_string().c_str());
    check(j, reply);
  }
}

// Reads a whole Scan stream; checks it holds exactly `expect`, in order.
// `window`: how many messages the server may have in flight (0: the
// channel's default).
uint64_t scan_and_check(kv::KVClient& client, const std::string& start, const std::string& end,
                        uint32_t limit, const std::vector<uint64_t>& expect, uint32_t window = 0) {
  slotrpc::CallOptions options;
  options.stream_window = window;
  slotrpc::ClientReader<kv::Entry> reader = client.Scan(
      [start, end, limit](flatbuffers::FlatBufferBuilder& fbb) {
        return kv::CreateScanRequestDirect(fbb, start.c_str(), end.c_str(), limit);
      },
      options);
  uint64_t n = 0;
  std::string previous;
  while (std::optional<slotrpc::Reply<kv::Entry>> entry = reader.Read()) {
    if (!entry->ok()) fail("scan message %llu: %s", static_cast<unsigned long long>(n), entry->status().to_string().c_str());
    const std::string key = (*entry)->key() != nullptr ? (*entry)->key()->str() : "";
    if (n > 0 && !(previous < key)) fail("scan out of order: %s after %s", key.c_str(), previous.c_str());
    if (n >= expect.size()) fail("scan [%s, %s) returned more than %zu entries", start.c_str(), end.c_str(), expect.size());
    if (const std::string e = check_entry(entry->message(), expect[n]); !e.empty())
      fail("scan entry %llu (%s): %s", static_cast<unsigned long long>(n), key.c_str(), e.c_str());
    previous = key;
    ++n;
  }
  if (!reader.status().ok()) fail("scan ended with %s", reader.status().to_string().c_str());
  if (n != expect.size())
    fail("scan [%s, %s) returned %llu entries, expected %zu", start.c_str(), end.c_str(),
         static_cast<unsigned long long>(n), expect.size());
  return n;
}

// Watch, against a store holding what main() left (keys 0..count-1 but
// every tenth): the client watches a live key and a deleted one, changes
// them through Put and Delete on the same channel, then changes its
// subscription mid-stream (drops one key, adds another) and checks that
// only watched keys report.  Returns the number of events checked.
uint64_t watch_and_check(kv::KVClient& client) {
  const std::string live = key_of(1), gone = key_of(3), other = key_of(2);
  slotrpc::ClientReaderWriter<kv::WatchRequest, kv::WatchEvent> watch = client.Watch();
  auto subscribe = [&](std::vector<std::string> add, std::vector<std::string> remove) {
    if (!watch.Write([&](flatbuffers::FlatBufferBuilder& fbb) {
          return kv::CreateWatchRequest(fbb, fbb.CreateVectorOfStrings(add), fbb.CreateVectorOfStrings(remove));
        }))
      fail("watch: write failed: %s", watch.write_status().to_string().c_str());
  };
  uint64_t events = 0;
  auto expect = [&](const std::string& key, kv::WatchKind kind, uint64_t value_of) {
    std::optional<slotrpc::Reply<kv::WatchEvent>> e = watch.Read();
    if (!e) fail("watch ended early: %s", watch.Finish().to_string().c_str());
    if (!e->ok()) fail("watch event: %s", e->status().to_string().c_str());
    const std::string got = (*e)->key() != nullptr ? (*e)->key()->str() : "";
    if (got != key || (*e)->kind() != kind)
      fail("watch: got %s %s, expected %s %s", kv::EnumNameWatchKind((*e)->kind()), got.c_str(),
           kv::EnumNameWatchKind(kind), key.c_str());
    if (kind == kv::WatchKind_Current || kind == kv::WatchKind_Changed) {
      if (const std::string why = check_entry((*e)->entry(), value_of); !why.empty())
        fail("watch %s: %s", key.c_str(), why.c_str());
    }
    ++events;
  };
  auto put = [&](uint64_t i) {  // key i with its usual value
    auto r = client.Put([i](flatbuffers::FlatBufferBuilder& fbb) {
                   std::vector<flatbuffers::Offset<kv::Entry>> entries{build_entry(fbb, i)};
                   return kv::CreatePutRequest(fbb, fbb.CreateVector(entries));
                 }).get();
    if (!r.ok()) fail("put during watch: %s", r.status().to_string().c_str());
  };
  auto remove = [&](const std::string& key) {
    auto r = client.Delete([&](flatbuffers::FlatBufferBuilder& fbb) {
                     return kv::CreateDeleteRequest(fbb, fbb.CreateVectorOfStrings(std::vector<std::string>{key}));
                   }).get();
    if (!r.ok()) fail("delete during watch: %s", r.status().to_string().c_str());
  };

  subscribe({live, gone}, {});
  expect(live, kv::WatchKind_Current, 1);
  expect(gone, kv::WatchKind_Missing, 0);
  put(3);  // the store writes each event before the Put replies
  expect(gone, kv::WatchKind_Changed, 3);
  remove(live);
  expect(live, kv::WatchKind_Deleted, 0);
  // A new subscription while the stream flows: drop `live`, add `other`.
  // Its Current event says the change is in place.
  subscribe({other}, {live});
  expect(other, kv::WatchKind_Current, 2);
  put(1);  // no longer watched: no event
  put(2);  // watched: Changed
  expect(other, kv::WatchKind_Changed, 2);
  watch.WritesDone();  // the server ends the call when the client half-closes
  if (auto extra = watch.Read()) fail("watch: an event after the half-close (or for an unwatched key)");
  if (const slotrpc::Status st = watch.Finish(); !st.ok()) fail("watch ended with %s", st.to_string().c_str());
  return events;
}

}  // namespace

int main(int argc, char** argv) {
  std::string address = "127.0.0.1:7001";
  uint64_t count = 20000, batch = 100;
  CLI::App app("Exercises every method of slotrpc.examples.kv.KV against a kv_server: Put, PutMany "
               "(client stream), Get, Delete, Scan (server stream) and Watch (bidi stream), checking "
               "every answer; exits 1 on the first wrong one.",
               "kv_client");
  app.add_option("--connect", address, "Server address, HOST:PORT")->capture_default_str();
  app.add_option("--count", count, "Keys to store (half by Put, half by one PutMany stream)")
      ->check(CLI::Range(uint64_t{20}, uint64_t{10'000'000}))->capture_default_str();
  app.add_option("--batch", batch, "Entries per Put call")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1000}))->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help exits 0; a bad option 2, the usual usage-error status.
    return app.exit(e) == 0 ? 0 : 2;
  }

  auto channel = slotrpc::Channel::connect(address);
  if (!channel.ok()) fail("%s", channel.status().to_string().c_str());
  kv::KVClient client(**channel);

  // Put: N keys, `batch` per call.  Put is (idempotent) in the schema, so
  // max_retries lets the channel retry it across a reconnect.
  auto t0 = Clock::now();
  slotrpc::CallOptions put_options;
  put_options.max_retries = 2;
  const uint64_t half = count / 2;
  const uint64_t put_calls = (half + batch - 1) / batch;
  pipelined<kv::PutReply>(
      put_calls,
      [&](uint64_t c) {
        const uint64_t lo = c * batch, hi = std::min(half, lo + batch);
        return client.Put(
            [lo, hi](flatbuffers::FlatBufferBuilder& fbb) {
              std::vector<flatbuffers::Offset<kv::Entry>> entries;
              for (uint64_t i = lo; i < hi; ++i) entries.push_back(build_entry(fbb, i));
              return kv::CreatePutRequest(fbb, fbb.CreateVector(entries));
            },
            put_options);
      },
      [&](uint64_t c, const slotrpc::Reply<kv::PutReply>& reply) {
        const uint64_t expect = std::min(half, (c + 1) * batch) - c * batch;
        if (reply->stored() != expect) fail("put %llu stored %u entries, expected %llu", static_cast<unsigned long long>(c), reply->stored(), static_cast<unsigned long long>(expect));
      });
  // PutMany: the second half as one client stream, a key per message.
  // Write() waits whenever the server is a window behind.
  {
    slotrpc::ClientWriter<kv::Entry, kv::PutReply> writer = client.PutMany();
    for (uint64_t i = half; i < count; ++i) {
      if (!writer.Write([i](flatbuffers::FlatBufferBuilder& fbb) { return build_entry(fbb, i); }))
        break;  // the server ended the call: Finish() says why
    }
    slotrpc::Reply<kv::PutReply> reply = writer.Finish();
    if (!reply.ok()) fail("put-many: %s", reply.status().to_string().c_str());
    if (reply->stored() != count - half)
      fail("put-many stored %u entries, expected %llu", reply->stored(), static_cast<unsigned long long>(count - half));
  }
  const double put_ms = ms_since(t0);

  // Get: every key back.
  t0 = Clock::now();
  pipelined<kv::GetReply>(
      count,
      [&](uint64_t i) {
        return client.Get([key = key_of(i)](flatbuffers::FlatBufferBuilder& fbb) {
          return kv::CreateGetRequestDirect(fbb, key.c_str());
        });
      },
      [&](uint64_t i, const slotrpc::Reply<kv::GetReply>& reply) {
        if (reply->outcome() != common::Outcome_Ok) fail("get %s: not found", key_of(i).c_str());
        if (const std::string e = check_entry(reply->entry(), i); !e.empty()) fail("get %s: %s", key_of(i).c_str(), e.c_str());
      });
  const double get_ms = ms_since(t0);

  // Delete every tenth key, `batch` keys per call; the callback form.
  t0 = Clock::now();
  std::vector<std::string> doomed;
  for (uint64_t i = 0; i < count; ++i)
    if (deleted(i)) doomed.push_back(key_of(i));
  auto delete_keys = [&](uint64_t lo, uint64_t hi, common::Outcome expect) {
    std::vector<std::string> keys(doomed.begin() + static_cast<std::ptrdiff_t>(lo),
                                  doomed.begin() + static_cast<std::ptrdiff_t>(hi));
    std::promise<slotrpc::Reply<kv::DeleteReply>> done;
    std::future<slotrpc::Reply<kv::DeleteReply>> result = done.get_future();
    client.Delete(
        [keys](flatbuffers::FlatBufferBuilder& fbb) {
          return kv::CreateDeleteRequest(fbb, fbb.CreateVectorOfStrings(keys));
        },
        {}, [&done](slotrpc::Reply<kv::DeleteReply>&& reply) { done.set_value(std::move(reply)); });
    slotrpc::Reply<kv::DeleteReply> reply = result.get();
    if (!reply.ok()) fail("delete: %s", reply.status().to_string().c_str());
    if (reply->outcomes() == nullptr || reply->outcomes()->size() != keys.size()) fail("delete: wrong number of outcomes");
    for (uint32_t k = 0; k < keys.size(); ++k) {
      const auto outcome = static_cast<common::Outcome>(reply->outcomes()->Get(k));
      if (outcome != expect)
        fail("delete %s: outcome %s, expected %s", keys[k].c_str(), common::EnumNameOutcome(outcome),
             common::EnumNameOutcome(expect));
    }
  };
  for (uint64_t lo = 0; lo < doomed.size(); lo += batch)
    delete_keys(lo, std::min<uint64_t>(doomed.size(), lo + batch), common::Outcome_Ok);
  delete_keys(0, std::min<uint64_t>(doomed.size(), batch), common::Outcome_NotFound);  // again: gone
  {
    auto reply = client.Get([key = doomed.front()](flatbuffers::FlatBufferBuilder& fbb) {
                   return kv::CreateGetRequestDirect(fbb, key.c_str());
                 }).get();
    if (!reply.ok() || reply->outcome() != common::Outcome_NotFound) fail("get of a deleted key did not say NotFound");
  }
  const double delete_ms = ms_since(t0);

  // Scan: the whole store in one server stream, then ranges and a limit.
  t0 = Clock::now();
  std::vector<uint64_t> live;
  for (uint64_t i = 0; i < count; ++i)
    if (!deleted(i)) live.push_back(i);
  const uint64_t scanned = scan_and_check(client, "", "", 0, live, /*window=*/32);
  const double scan_ms = ms_since(t0);
  std::vector<uint64_t> range;
  for (uint64_t i = 5; i < 15; ++i)
    if (!deleted(i)) range.push_back(i);
  scan_and_check(client, key_of(5), key_of(15), 0, range);
  scan_and_check(client, key_of(5), "", 3, {5, 6, 7});
  scan_and_check(client, key_of(count), "", 0, {});

  const uint64_t watched = watch_and_check(client);

  std::printf("kv_client: %s over %s\n", address.c_str(), std::string(slotrpc::to_string((*channel)->transport())).c_str());
  std::printf("kv_client: put %llu keys in %llu calls and %llu in one put-many stream (%.0f ms); got all %llu back, verified (%.0f ms)\n",
              static_cast<unsigned long long>(half), static_cast<unsigned long long>(put_calls),
              static_cast<unsigned long long>(count - half), put_ms,
              static_cast<unsigned long long>(count), get_ms);
  std::printf("kv_client: deleted %zu keys (%.0f ms); a second delete and a get report NotFound\n", doomed.size(),
              delete_ms);
  std::printf("kv_client: scan streamed %llu entries in key order, every one verified (%.0f ms); range scans ok\n",
              static_cast<unsigned long long>(scanned), scan_ms);
  std::printf("kv_client: watch: %llu events checked while keys and the subscription changed\n",
              static_cast<unsigned long long>(watched));
  std::printf("kv_client: all checks passed\n");
  return 0;
}
