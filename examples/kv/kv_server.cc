// kv_server --listen HOST:PORT [--port-file FILE]
// Serves slotrpc.examples.kv.KV (kv.fbs), an in-memory ordered map, until
// SIGINT or SIGTERM.
#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kv.slotrpc.h"  // generated from kv.fbs by slotrpc-gen

namespace {

namespace kv = slotrpc::examples::kv;
namespace common = slotrpc::examples::common;

// One entry as the store keeps it (the request's buffer is gone once the
// handler returns, so values are copied out of it).
struct Stored {
  kv::Value kind = kv::Value_NONE;
  std::vector<uint8_t> bytes;
  std::string text;
  double number = 0;
  std::vector<std::pair<std::string, std::string>> labels;
  int64_t modified = 0;
};

slotrpc::Status invalid(std::string message) {
  return slotrpc::Status(slotrpc::StatusCode::kInvalidArgument, std::move(message));
}

std::string str(const flatbuffers::String* s) { return s == nullptr ? std::string() : s->str(); }

// Copies a request's entry; false (with `error` set) if it is unusable.
bool parse_entry(const kv::Entry& e, Stored& out, std::string& error) {
  if (e.key() == nullptr || e.key()->size() == 0) {
    error = "an entry has no key";
    return false;
  }
  out.kind = e.value_type();
  switch (e.value_type()) {
    case kv::Value_NONE:
      break;
    case kv::Value_Bytes:
      if (const auto* data = e.value_as_Bytes()->data()) out.bytes.assign(data->begin(), data->end());
      break;
    case kv::Value_Text:
      out.text = str(e.value_as_Text()->text());
      break;
    case kv::Value_Number:
      out.number = e.value_as_Number()->value();
      break;
    default:
      error = "entry " + e.key()->str() + " has a value of unknown type";
      return false;
  }
  if (e.labels() != nullptr) {
    for (const common::Label* label : *e.labels()) out.labels.emplace_back(str(label->name()), str(label->value()));
  }
  if (e.modified() != nullptr) out.modified = e.modified()->unix_nanos();
  return true;
}

flatbuffers::Offset<kv::Entry> build_entry(flatbuffers::FlatBufferBuilder& fbb, const std::string& key,
                                           const Stored& s) {
  const auto k = fbb.CreateString(key);
  flatbuffers::Offset<void> value;
  switch (s.kind) {
    case kv::Value_Bytes:
      value = kv::CreateBytes(fbb, fbb.CreateVector(s.bytes)).Union();
      break;
    case kv::Value_Text:
      value = kv::CreateText(fbb, fbb.CreateString(s.text)).Union();
      break;
    case kv::Value_Number:
      value = kv::CreateNumber(fbb, s.number).Union();
      break;
    default:
      break;
  }
  std::vector<flatbuffers::Offset<common::Label>> labels;
  labels.reserve(s.labels.size());
  for (const auto& [name, v] : s.labels)
    labels.push_back(common::CreateLabel(fbb, fbb.CreateString(name), fbb.CreateString(v)));
  const auto label_vector = fbb.CreateVector(labels);
  const common::Timestamp modified(s.modified);
  return kv::CreateEntry(fbb, k, s.kind, value, label_vector, &modified);
}

// The service: generated KVService with its five methods filled in.
// Handlers run on the server's event-loop fibers, possibly on several
// threads: the map is behind a mutex, which is never held across a
// suspension (a stream Write()).
class Store final : public kv::KVService {
 public:
  slotrpc::Status Get(const kv::GetRequest& request, slotrpc::ReplyBuilder<kv::GetReply>& reply,
                      slotrpc::ServerCall&) override {
    if (request.key() == nullptr) return invalid("GetRequest.key is missing");
    flatbuffers::FlatBufferBuilder& fbb = reply.fbb();
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(request.key()->str());
    if (it == map_.end()) {
      reply.Finish(kv::CreateGetReply(fbb, common::Outcome_NotFound));
    } else {
      reply.Finish(kv::CreateGetReply(fbb, common::Outcome_Ok, build_entry(fbb, it->first, it->second)));
    }
    return {};
  }

  slotrpc::Status Put(const kv::PutRequest& request, slotrpc::ReplyBuilder<kv::PutReply>& reply,
                      slotrpc::ServerCall&) override {
    // All or nothing: check every entry before storing any.
    std::vector<std::pair<std::string, Stored>> parsed;
    if (request.entries() != nullptr) {
      parsed.reserve(request.entries()->size());
      for (const kv::Entry* e : *request.entries()) {
        Stored s;
        std::string error;
        if (!parse_entry(*e, s, error)) return invalid(error);
        parsed.emplace_back(e->key()->str(), std::move(s));
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [key, s] : parsed) map_.insert_or_assign(std::move(key), std::move(s));
    }
    reply.Finish(kv::CreatePutReply(reply.fbb(), static_cast<uint32_t>(parsed.size())));
    return {};
  }

  slotrpc::Status Delete(const kv::DeleteRequest& request, slotrpc::ReplyBuilder<kv::DeleteReply>& reply,
                         slotrpc::ServerCall&) override {
    std::vector<uint8_t> outcomes;
    if (request.keys() != nullptr) {
      std::lock_guard<std::mutex> lock(mu_);
      for (const flatbuffers::String* key : *request.keys())
        outcomes.push_back(map_.erase(key->str()) != 0 ? common::Outcome_Ok : common::Outcome_NotFound);
    }
    flatbuffers::FlatBufferBuilder& fbb = reply.fbb();
    reply.Finish(kv::CreateDeleteReply(fbb, fbb.CreateVector(outcomes)));
    return {};
  }

  // Client streaming: each Entry is read in place in its receive slot and
  // copied into the map; the slot goes back to the client at the next
  // Read(), so a fast client is held to the stream's window.
  slotrpc::Status PutMany(slotrpc::ServerReader<kv::Entry>& reader, slotrpc::ReplyBuilder<kv::PutReply>& reply,
                          slotrpc::ServerCall&) override {
    uint32_t stored = 0;
    while (const kv::Entry* e = reader.Read()) {
      Stored s;
      std::string error;
      if (!parse_entry(*e, s, error)) return invalid(error);
      std::lock_guard<std::mutex> lock(mu_);
      map_.insert_or_assign(e->key()->str(), std::move(s));
      ++stored;
    }
    if (!reader.status().ok()) return reader.status();  // cancelled, deadline, session lost
    reply.Finish(kv::CreatePutReply(reply.fbb(), stored));
    return {};
  }

  slotrpc::Status Scan(const kv::ScanRequest& request, slotrpc::ServerWriter<kv::Entry>& writer,
                       slotrpc::ServerCall&) override {
    const std::string end = str(request.end());
    uint64_t left = request.limit() == 0 ? UINT64_MAX : request.limit();
    std::string next = str(request.start());
    std::vector<std::pair<std::string, Stored>> batch;
    // Copy a batch under the lock, then write it without: Write() waits
    // for the client's credits.
    for (;;) {
      batch.clear();
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (auto it = map_.lower_bound(next);
             it != map_.end() && (end.empty() || it->first < end) && batch.size() < std::min<uint64_t>(left, kBatch);
             ++it)
          batch.emplace_back(*it);
      }
      for (const auto& [key, s] : batch) {
        if (!writer.Write([&](flatbuffers::FlatBufferBuilder& fbb) { return build_entry(fbb, key, s); }))
          return writer.error();  // the client went away or cancelled
      }
      left -= batch.size();
      if (batch.size() < kBatch || left == 0) return {};
      next = batch.back().first + '\0';  // the smallest key after the last one sent
    }
  }

 private:
  static constexpr uint64_t kBatch = 256;
  std::mutex mu_;
  std::map<std::string, Stored> map_;
};

}  // namespace

int main(int argc, char** argv) {
  std::string listen = "127.0.0.1:7001";
  std::string port_file;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--listen" && i + 1 < argc) {
      listen = argv[++i];
    } else if (a == "--port-file" && i + 1 < argc) {
      port_file = argv[++i];
    } else {
      std::fprintf(stderr, "usage: kv_server [--listen HOST:PORT] [--port-file FILE]\n");
      return 2;
    }
  }

  // Block the signals before any thread starts, then wait for them here.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  Store store;  // outlives the server, which calls it
  slotrpc::Server server;
  if (auto st = server.add_service(store.definition()); !st.ok()) {
    std::fprintf(stderr, "kv_server: %s\n", st.to_string().c_str());
    return 1;
  }
  if (auto st = server.start(listen); !st.ok()) {
    std::fprintf(stderr, "kv_server: %s\n", st.to_string().c_str());
    return 1;
  }
  std::printf("kv_server: listening on port %u\n", server.port());
  std::fflush(stdout);
  if (!port_file.empty()) {
    // Written whole under a temporary name, so a reader never sees half of it.
    const std::string tmp = port_file + ".tmp";
    std::ofstream(tmp) << server.port() << "\n";
    std::rename(tmp.c_str(), port_file.c_str());
  }
  int sig = 0;
  sigwait(&signals, &sig);
  std::printf("kv_server: %s, stopping\n", strsignal(sig));
  server.stop();
  return 0;
}
