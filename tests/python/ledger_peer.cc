// The C++ side of the Python binding's cross-language check
// (tests/python/test_ledger.py), on tests/python/ledger.fbs:
//
//   ledger_peer serve        serves orchard.ledger.Ledger on 127.0.0.1:0,
//                            prints "PORT <n>", stops at EOF on stdin
//   ledger_peer call ADDR    calls all four methods of a Ledger at ADDR (a
//                            Python server in the test) and checks every
//                            answer; exit status 0 when all are right
//
// Ledger's rules, which the Python servicer of the test implements too:
// Post doubles the cents and counts the tags; History streams `cents`
// entries numbered 0.. with one tag each; Sum adds up a client stream;
// Running answers each entry with the running total.
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>

#include "ledger.slotrpc.h"

namespace {

using namespace orchard::ledger;

class Ledger final : public LedgerService {
 public:
  slotrpc::Status Post(const Entry& req, slotrpc::ReplyBuilder<Total>& reply, slotrpc::ServerCall&) override {
    auto& fbb = reply.fbb();
    reply.Finish(CreateTotal(fbb, fbb.CreateString(req.account() ? req.account()->str() : ""), req.cents() * 2,
                             req.tags() ? req.tags()->size() : 0));
    return {};
  }
  slotrpc::Status History(const Entry& req, slotrpc::ServerWriter<Entry>& out, slotrpc::ServerCall&) override {
    if (req.cents() < 0 || req.cents() > 1000)
      return slotrpc::Status(slotrpc::StatusCode::kOutOfRange, "History: cents must be 0..1000");
    const std::string account = req.account() ? req.account()->str() : "";
    for (int64_t i = 0; i < req.cents(); ++i) {
      bool ok = out.Write([&](flatbuffers::FlatBufferBuilder& fbb) {
        auto tag = fbb.CreateString(std::to_string(i));
        return CreateEntry(fbb, fbb.CreateString(account), i, fbb.CreateVector(&tag, 1));
      });
      if (!ok) return out.error();
    }
    return {};
  }
  slotrpc::Status Sum(slotrpc::ServerReader<Entry>& in, slotrpc::ReplyBuilder<Total>& reply,
                      slotrpc::ServerCall&) override {
    std::string account;
    int64_t cents = 0;
    uint32_t n = 0;
    while (const Entry* e = in.Read()) {
      if (n++ == 0 && e->account()) account = e->account()->str();
      cents += e->cents();
    }
    if (!in.status().ok()) return in.status();
    auto& fbb = reply.fbb();
    reply.Finish(CreateTotal(fbb, fbb.CreateString(account), cents, n));
    return {};
  }
  slotrpc::Status Running(slotrpc::ServerReaderWriter<Entry, Total>& s, slotrpc::ServerCall&) override {
    int64_t cents = 0;
    uint32_t n = 0;
    while (const Entry* e = s.Read()) {
      cents += e->cents();
      ++n;
      const std::string account = e->account() ? e->account()->str() : "";
      if (!s.Write([&](flatbuffers::FlatBufferBuilder& fbb) {
            return CreateTotal(fbb, fbb.CreateString(account), cents, n);
          }))
        return s.write_error();
    }
    return s.read_status();
  }
};

int failures = 0;
void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "ledger_peer: FAILED: %s\n", what.c_str());
    ++failures;
  }
}

flatbuffers::Offset<Entry> entry(flatbuffers::FlatBufferBuilder& fbb, const std::string& account, int64_t cents,
                                 std::vector<std::string> tags = {}) {
  std::vector<flatbuffers::Offset<flatbuffers::String>> t;
  for (const auto& s : tags) t.push_back(fbb.CreateString(s));
  return CreateEntry(fbb, fbb.CreateString(account), cents, fbb.CreateVector(t));
}

int call(const std::string& address) {
  slotrpc::Config cfg;
  cfg.transport = slotrpc::TransportKind::kTcp;
  auto ch = slotrpc::Channel::connect(address, cfg).value();
  LedgerClient client(*ch);

  auto post = client.Post([](auto& fbb) { return entry(fbb, "alice", 21, {"a", "b", "c"}); }).get();
  expect(post.ok(), "Post: " + post.status().to_string());
  if (post.ok()) {
    expect(post->account()->str() == "alice", "Post: account");
    expect(post->cents() == 42, "Post: cents " + std::to_string(post->cents()));
    expect(post->entries() == 3, "Post: entries");
  }

  auto history = client.History([](auto& fbb) { return entry(fbb, "bob", 50); });
  int64_t i = 0;
  while (auto m = history.Read()) {
    expect(m->ok() && (*m)->cents() == i && (*m)->account()->str() == "bob" &&
               (*m)->tags()->Get(0)->str() == std::to_string(i),
           "History: message " + std::to_string(i));
    ++i;
  }
  expect(history.status().ok() && i == 50, "History: " + history.status().to_string() + ", " +
                                               std::to_string(i) + " messages");

  auto sum = client.Sum();
  for (int k = 1; k <= 100; ++k) sum.Write([k](auto& fbb) { return entry(fbb, "carol", k); });
  auto total = sum.Finish();
  expect(total.ok() && total->cents() == 5050 && total->entries() == 100 && total->account()->str() == "carol",
         "Sum: " + total.status().to_string());

  auto running = client.Running();
  std::thread writer([&] {
    for (int k = 1; k <= 20; ++k) running.Write([k](auto& fbb) { return entry(fbb, "dave", k); });
    running.WritesDone();
  });
  int64_t expect_cents = 0;
  uint32_t n = 0;
  while (auto m = running.Read()) {
    ++n;
    expect_cents += n;
    expect(m->ok() && (*m)->cents() == expect_cents && (*m)->entries() == n, "Running: message " + std::to_string(n));
  }
  writer.join();
  const slotrpc::Status end = running.Finish();
  expect(end.ok() && n == 20, "Running: " + end.to_string() + ", " + std::to_string(n) + " messages");

  if (failures == 0) std::printf("ledger_peer: all four kinds answered right\n");
  return failures == 0 ? 0 : 1;
}

int serve() {
  Ledger ledger;
  slotrpc::Server server;
  if (auto st = server.add_service(ledger.definition()); !st.ok()) {
    std::fprintf(stderr, "ledger_peer: %s\n", st.to_string().c_str());
    return 1;
  }
  if (auto st = server.start("127.0.0.1:0"); !st.ok()) {
    std::fprintf(stderr, "ledger_peer: %s\n", st.to_string().c_str());
    return 1;
  }
  std::printf("PORT %u\n", server.port());
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  server.stop();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "serve" && argc == 2) return serve();
  if (mode == "call" && argc == 3) return call(argv[2]);
  std::fprintf(stderr, "usage: ledger_peer serve | ledger_peer call HOST:PORT\n");
  return 2;
}
