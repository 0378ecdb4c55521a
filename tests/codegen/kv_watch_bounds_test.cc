// examples/kv's Watch against clients that would make the server hold
// without limit: one that keeps adding keys, and one that never reads while
// its keys change.  A kv_server process (KV_SERVER), driven through the
// generated KVClient.
#include <doctest/doctest.h>
#include <slotrpc/slotrpc.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "../process_util.h"
#include "kv.slotrpc.h"

namespace {

namespace kv = slotrpc::examples::kv;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

struct KvServer {
  test_process::TempDir dir{"slotrpc-kv-watch"};
  std::unique_ptr<test_process::Child> child;
  uint16_t port = 0;

  KvServer() {
    const std::string port_file = (dir.path / "port").string();
    child = std::make_unique<test_process::Child>(
        std::vector<std::string>{KV_SERVER, "--listen", "127.0.0.1:0", "--port-file", port_file},
        test_process::SpawnOptions::to_file(dir.path / "log"));
    const auto up = test_process::wait_for_port_file(port_file, *child, 15000ms);
    REQUIRE_MESSAGE(up.port != 0, "kv_server did not start: " << child->stdout_text());
    port = up.port;
  }
};

slotrpc::CallOptions within(std::chrono::seconds s) {
  slotrpc::CallOptions o;
  o.deadline = Clock::now() + s;
  return o;
}

void put(kv::KVClient& client, const std::string& key, const std::string& text, int times = 1) {
  auto r = client.Put([&](flatbuffers::FlatBufferBuilder& fbb) {
    std::vector<flatbuffers::Offset<kv::Entry>> entries;
    for (int i = 0; i < times; ++i) {
      const auto value = kv::CreateText(fbb, fbb.CreateString(text)).Union();
      entries.push_back(kv::CreateEntry(fbb, fbb.CreateString(key), kv::Value_Text, value));
    }
    return kv::CreatePutRequest(fbb, fbb.CreateVector(entries));
  }, within(10s)).get();
  REQUIRE_MESSAGE(r.ok(), r.status().to_string());
}

}  // namespace

TEST_CASE("kv Watch: a subscription past 10,000 keys ends the call with RESOURCE_EXHAUSTED") {
  KvServer server;
  auto channel = slotrpc::Channel::connect("127.0.0.1:" + std::to_string(server.port));
  REQUIRE_MESSAGE(channel.ok(), channel.status().to_string());
  kv::KVClient client(**channel);
  // 500 new keys per request.  The events are read (and dropped) on a
  // thread: a client that reads nothing stalls its own writes once the
  // server stops reading them, which bounds it too, but says nothing.
  auto watch = client.Watch(within(20s));
  std::thread drain([&] {
    while (watch.Read()) {
    }
  });
  int sent = 0;
  for (int r = 0; r < 40; ++r) {
    std::vector<std::string> add;
    for (int i = 0; i < 500; ++i) add.push_back("k-" + std::to_string(r) + "-" + std::to_string(i));
    if (!watch.Write([&](flatbuffers::FlatBufferBuilder& fbb) {
          return kv::CreateWatchRequest(fbb, fbb.CreateVectorOfStrings(add));
        }))
      break;  // the server ended the call
    ++sent;
  }
  drain.join();
  const slotrpc::Status st = watch.Finish();
  CHECK(sent >= 20);  // the first 10,000 keys are fine
  CHECK_MESSAGE(st.code() == slotrpc::StatusCode::kResourceExhausted, st.to_string());
  CHECK_MESSAGE(contains(st.message(), "at most 10000 keys"), st.to_string());

  // Long names count too: 1 MiB of them in all.
  auto big = client.Watch(within(20s));
  std::thread drain_big([&] {
    while (big.Read()) {
    }
  });
  for (int r = 0; r < 40; ++r) {
    std::vector<std::string> add;
    for (int i = 0; i < 5; ++i) add.push_back(std::string(8000, 'a' + (i % 26)) + std::to_string(r * 10 + i));
    if (!big.Write([&](flatbuffers::FlatBufferBuilder& fbb) {
          return kv::CreateWatchRequest(fbb, fbb.CreateVectorOfStrings(add));
        }))
      break;
  }
  drain_big.join();
  const slotrpc::Status st2 = big.Finish();
  CHECK_MESSAGE(contains(st2.message(), "bytes of names"), st2.to_string());
  CHECK_MESSAGE(st2.code() == slotrpc::StatusCode::kResourceExhausted, st2.to_string());

  // The server goes on: a fresh watch of a few keys works.
  put(client, "x", "1");
  auto fine = client.Watch(within(10s));
  REQUIRE(fine.Write([](flatbuffers::FlatBufferBuilder& fbb) {
    return kv::CreateWatchRequest(fbb, fbb.CreateVectorOfStrings(std::vector<std::string>{"x"}));
  }));
  auto e = fine.Read();
  REQUIRE(e.has_value());
  REQUIRE(e->ok());
  CHECK((*e)->kind() == kv::WatchKind_Current);
  CHECK(fine.Finish().ok());
}

TEST_CASE("kv Watch: a watcher that does not read is told it fell behind, then gets the current values") {
  KvServer server;
  auto channel = slotrpc::Channel::connect("127.0.0.1:" + std::to_string(server.port));
  REQUIRE_MESSAGE(channel.ok(), channel.status().to_string());
  kv::KVClient client(**channel);
  put(client, "a", "a0");
  auto watch = client.Watch(within(60s));
  REQUIRE(watch.Write([](flatbuffers::FlatBufferBuilder& fbb) {
    return kv::CreateWatchRequest(fbb, fbb.CreateVectorOfStrings(std::vector<std::string>{"a", "b"}));
  }));
  // 24,000 changes of "a" while the watcher reads nothing: more than the
  // 10,000 events its queue holds (the stream's window holds a few more).
  for (int i = 0; i < 24; ++i) put(client, "a", "a-" + std::to_string(i), 1000);
  put(client, "a", "a-final");
  put(client, "b", "b-final");

  // Now read: somewhere a Behind, and the values end right.
  std::map<std::string, std::string> state;
  bool behind = false;
  uint64_t events = 0;
  while (!(behind && state["a"] == "a-final" && state["b"] == "b-final")) {
    auto e = watch.Read();
    REQUIRE_MESSAGE(e.has_value(), "the watch ended: " << watch.Finish().to_string());
    REQUIRE_MESSAGE(e->ok(), e->status().to_string());
    ++events;
    const kv::WatchEvent& ev = **e;
    const std::string key = ev.key() != nullptr ? ev.key()->str() : std::string();
    switch (ev.kind()) {
      case kv::WatchKind_Behind:
        behind = true;
        break;
      case kv::WatchKind_Current:
      case kv::WatchKind_Changed:
        REQUIRE(ev.entry() != nullptr);
        state[key] = ev.entry()->value_as_Text()->text()->str();
        break;
      case kv::WatchKind_Missing:
      case kv::WatchKind_Deleted:
        state[key] = "";
        break;
    }
  }
  CAPTURE(events);
  // Fewer events than changes: the dropped ones were not sent.
  CHECK(events < 24'000);
  CHECK(watch.Finish().ok());
}
