// stream_bench: throughput of client and bidi streams, server and client in
// one process over loopback TCP.
//
//   stream_bench [--messages N] [--size BYTES] [--window W] [--slots S] [--modes client,bidi]
//
// One stream per mode: a writer thread Write()s N EchoRequests (seq and a
// payload of BYTES bytes) as fast as the window lets it.  Client streaming:
// the handler reads and checks every message in order and replies once.
// Bidi: the handler echoes each message (seq only) and the main thread reads
// the echoes, checking their order.  Prints messages/s per mode and the
// machine's load; nothing is assumed.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <slotrpc/slotrpc.h>

#include "echo_generated.h"

namespace {

using slotrpc::examples::EchoReply;
using slotrpc::examples::EchoRequest;

const uint32_t kLoad = slotrpc::method_id("slotrpc.bench.Streams.Load");
const uint32_t kSync = slotrpc::method_id("slotrpc.bench.Streams.Sync");

std::string first_line(const char* path, const char* prefix = nullptr) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (prefix == nullptr) return line;
    if (line.rfind(prefix, 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

slotrpc::Build<EchoRequest> request(uint64_t seq, size_t size) {
  return [seq, size](flatbuffers::FlatBufferBuilder& fbb) {
    uint8_t* data = nullptr;
    auto vec = fbb.CreateUninitializedVector(size, &data);
    for (size_t i = 0; i < size; ++i) data[i] = static_cast<uint8_t>(seq + i);
    return slotrpc::examples::CreateEchoRequest(fbb, seq, vec);
  };
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t messages = 1'000'000;
  uint64_t size = 64;
  uint32_t window = 0;  // 0: the Config's (SLOTRPC_STREAM_WINDOW)
  uint32_t slots = 64;
  std::vector<std::string> modes{"client", "bidi"};
  CLI::App app{"stream_bench: client and bidi streaming throughput over loopback TCP"};
  app.add_option("--messages", messages, "messages per stream")->capture_default_str();
  app.add_option("--size", size, "payload bytes per message")->capture_default_str();
  app.add_option("--window", window, "stream window (0: SLOTRPC_STREAM_WINDOW / the default)")
      ->capture_default_str();
  app.add_option("--slots", slots, "slot_count of the session")->capture_default_str();
  app.add_option("--modes", modes, "client, bidi (comma separated)")->delimiter(',')
      ->check(CLI::IsMember({"client", "bidi"}));
  CLI11_PARSE(app, argc, argv);

  slotrpc::Config cfg;
  cfg.slot_count = slots;
  if (window != 0) cfg.stream_window = window;

  slotrpc::ServiceDefinition svc("slotrpc.bench.Streams");
  svc.add_client_stream<EchoRequest, EchoReply>(
      "Load", [](slotrpc::ServerReader<EchoRequest>& in, slotrpc::ReplyBuilder<EchoReply>& out,
                 slotrpc::ServerCall&) -> slotrpc::Status {
        uint64_t next = 0;
        while (const EchoRequest* r = in.Read()) {
          if (r->seq() != next) return slotrpc::Status(slotrpc::StatusCode::kInvalidArgument, "out of order");
          ++next;
        }
        if (!in.status().ok()) return in.status();
        out.Finish(slotrpc::examples::CreateEchoReply(out.fbb(), next));
        return {};
      });
  svc.add_bidi_stream<EchoRequest, EchoReply>(
      "Sync", [](slotrpc::ServerReaderWriter<EchoRequest, EchoReply>& s, slotrpc::ServerCall&) -> slotrpc::Status {
        while (const EchoRequest* r = s.Read()) {
          const uint64_t seq = r->seq();
          if (!s.Write([seq](flatbuffers::FlatBufferBuilder& fbb) {
                return slotrpc::examples::CreateEchoReply(fbb, seq);
              })) {
            return s.write_error();
          }
        }
        return s.read_status();
      });
  slotrpc::Server server(cfg);
  if (auto st = server.add_service(std::move(svc)); !st.ok()) {
    std::fprintf(stderr, "%s\n", st.to_string().c_str());
    return 1;
  }
  if (auto st = server.start("127.0.0.1:0"); !st.ok()) {
    std::fprintf(stderr, "%s\n", st.to_string().c_str());
    return 1;
  }
  auto ch = slotrpc::Channel::connect("127.0.0.1:" + std::to_string(server.port()), cfg);
  if (!ch.ok()) {
    std::fprintf(stderr, "%s\n", ch.status().to_string().c_str());
    return 1;
  }
  slotrpc::Channel& channel = *ch.value();

  std::printf("# %s, %u CPUs, load average %s\n", first_line("/proc/cpuinfo", "model name").c_str(),
              std::thread::hardware_concurrency(), first_line("/proc/loadavg").c_str());
  std::printf("# %llu messages of %llu payload bytes per stream, %u slots, window %u\n",
              static_cast<unsigned long long>(messages), static_cast<unsigned long long>(size), slots,
              channel.config().stream_window);
  int failures = 0;
  for (const std::string& mode : modes) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::clock_t c0 = std::clock();
    bool ok = true;
    std::string why;
    if (mode == "client") {
      auto w = channel.client_stream<EchoRequest, EchoReply>(kLoad);
      for (uint64_t i = 0; i < messages && ok; ++i) ok = w.Write(request(i, size));
      auto reply = w.Finish();
      ok = ok && reply.ok() && reply->seq() == messages;
      if (!ok) why = reply.ok() ? "wrong count" : reply.status().to_string();
    } else {
      auto s = channel.bidi_stream<EchoRequest, EchoReply>(kSync);
      std::thread writer([&] {
        for (uint64_t i = 0; i < messages; ++i) {
          if (!s.Write(request(i, size))) return;
        }
        s.WritesDone();
      });
      uint64_t expected = 0;
      while (auto m = s.Read()) {
        if (!m->ok() || m->message()->seq() != expected) {
          ok = false;
          break;
        }
        ++expected;
      }
      writer.join();
      const slotrpc::Status st = s.Finish();
      ok = ok && st.ok() && expected == messages;
      if (!ok) why = st.ok() ? "wrong count or order" : st.to_string();
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double cpu = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
    if (!ok) {
      std::printf("%-6s FAILED: %s\n", mode.c_str(), why.c_str());
      ++failures;
      continue;
    }
    std::printf("%-6s %10.0f messages/s  (%.3f s wall, %.3f s CPU of the process)\n", mode.c_str(),
                static_cast<double>(messages) / secs, secs, cpu);
  }
  std::printf("# load average after: %s\n", first_line("/proc/loadavg").c_str());
  return failures == 0 ? 0 : 1;
}
