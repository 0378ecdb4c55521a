// kv_server [--listen HOST:PORT] [--port-file FILE]   (--help)
// Serves slotrpc.examples.kv.KV (kv.fbs), an in-memory ordered map, until
// SIGINT or SIGTERM.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
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

// One Watch call: the keys it watches and the events its handler has yet
// to write.  Put/PutMany/Delete handlers (any loop, any thread) append
// events under `mu`, with the store's lock held, so an event is never
// missed between a key's current value and its subscription.
//
// Everything here is bounded, whatever the client does: at most
// kMaxWatchedKeys keys of kMaxWatchedKeyBytes of names (a request past
// either ends the call), and at most kMaxBehind events of kMaxBehindBytes
// queued (past either the queue is dropped and `behind` set: the client is
// sent a Behind event and then every watched key's current value, a batch
// at a time).  All of it is freed when the call ends.
struct Watcher {
  struct Event {
    std::string key;
    kv::WatchKind kind;
    Stored value;  // Current and Changed
  };
  std::mutex mu;
  std::set<std::string> keys;  // under mu
  size_t key_bytes = 0;        // under mu: of the names in `keys`
  std::deque<Event> events;    // under mu
  size_t event_bytes = 0;      // under mu: of `events` (keys and values)
  bool behind = false;         // under mu: events were dropped, resend current values
  slotrpc::Notifier wake;      // the handler's fiber waits on it
};

// The service: generated KVService with its six methods filled in.
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
      for (auto& [key, s] : parsed) {
        publish(key, kv::WatchKind_Changed, &s);
        map_.insert_or_assign(std::move(key), std::move(s));
      }
    }
    reply.Finish(kv::CreatePutReply(reply.fbb(), static_cast<uint32_t>(parsed.size())));
    return {};
  }

  slotrpc::Status Delete(const kv::DeleteRequest& request, slotrpc::ReplyBuilder<kv::DeleteReply>& reply,
                         slotrpc::ServerCall&) override {
    std::vector<uint8_t> outcomes;
    if (request.keys() != nullptr) {
      std::lock_guard<std::mutex> lock(mu_);
      for (const flatbuffers::String* key : *request.keys()) {
        const bool erased = map_.erase(key->str()) != 0;
        if (erased) publish(key->str(), kv::WatchKind_Deleted, nullptr);
        outcomes.push_back(erased ? common::Outcome_Ok : common::Outcome_NotFound);
      }
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
      std::string key = e->key()->str();
      publish(key, kv::WatchKind_Changed, &s);
      map_.insert_or_assign(std::move(key), std::move(s));
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
      // Not a structured binding: lambdas cannot capture those before
      // clang 16 (C++20 allows it; clang 14 and 15 refuse).
      for (const auto& entry : batch) {
        if (!writer.Write([&](flatbuffers::FlatBufferBuilder& fbb) {
              return build_entry(fbb, entry.first, entry.second);
            }))
          return writer.error();  // the client went away or cancelled
      }
      left -= batch.size();
      if (batch.size() < kBatch || left == 0) return {};
      next = batch.back().first + '\0';  // the smallest key after the last one sent
    }
  }

  // Bidi streaming.  The handler must wait for two things: the client's
  // subscription changes and the store's updates.  Read() waits for the
  // client only, so a second fiber on the handler's loop reads the client
  // (this_fiber::spawn) and both it and the writers of the store notify
  // the Watcher, whose Notifier the handler's own fiber waits on before it
  // Write()s what is queued.  Write() waits for the client's credits: a
  // slow client (or one that never reads) holds the handler back while
  // events queue, up to kMaxBehind events or kMaxBehindBytes, after which
  // they are dropped; the client then gets a Behind event and the current
  // value of every watched key (memory stays bounded, the client ends up
  // with the right values).
  slotrpc::Status Watch(slotrpc::ServerReaderWriter<kv::WatchRequest, kv::WatchEvent>& stream,
                        slotrpc::ServerCall&) override {
    Watcher w;
    {
      std::lock_guard<std::mutex> lock(mu_);
      watchers_.insert(&w);
    }
    bool reader_done = false;  // the two fibers share one loop: no lock
    slotrpc::Status read_status;
    const bool spawned = slotrpc::this_fiber::spawn([&] {
      while (const kv::WatchRequest* request = stream.Read()) {
        if (slotrpc::Status st = subscribe(w, *request); !st.ok()) {
          read_status = std::move(st);  // too many keys: the call ends with it
          break;
        }
      }
      if (read_status.ok()) read_status = stream.read_status();
      reader_done = true;
      w.wake.notify();
    });
    slotrpc::Status write_status;
    std::deque<Watcher::Event> batch;
    auto write = [&](const std::string& key, kv::WatchKind kind, const Stored* value) {
      if (!write_status.ok()) return;  // the stream is over; the reader will see it too
      if (reader_done && !read_status.ok()) return;  // refused: the call ends now
      if (!stream.Write([&](flatbuffers::FlatBufferBuilder& fbb) {
            const auto k = fbb.CreateString(key);
            flatbuffers::Offset<kv::Entry> entry;
            if (value != nullptr) entry = build_entry(fbb, key, *value);
            return kv::CreateWatchEvent(fbb, k, kind, entry);
          }))
        write_status = stream.write_error();
    };
    // Until the reader is done (it uses `stream` and `w`): the client
    // half-closed, cancelled, went away, or asked for too many keys.
    while (spawned && !reader_done) {
      w.wake.wait();
      bool resync = false;
      {
        std::lock_guard<std::mutex> lock(w.mu);
        resync = w.behind;
        w.behind = false;
        batch.swap(w.events);
        w.event_bytes = 0;
      }
      if (resync) {
        batch.clear();  // dropped: the current values below replace them
        write({}, kv::WatchKind_Behind, nullptr);
        // Every watched key's value, kBatch keys at a time (copied under the
        // locks, written without): changes meanwhile queue as usual and
        // follow, so the client ends with the right values.
        std::string next;
        bool more = true;
        while (more && write_status.ok() && !reader_done) {
          {
            std::lock_guard<std::mutex> store_lock(mu_);
            std::lock_guard<std::mutex> lock(w.mu);
            auto it = w.keys.lower_bound(next);
            for (; it != w.keys.end() && batch.size() < kBatch; ++it) batch.push_back(current(*it));
            more = it != w.keys.end();
            if (more) next = *it;
          }
          for (const Watcher::Event& e : batch) write(e.key, e.kind, e.kind == kv::WatchKind_Current ? &e.value : nullptr);
          batch.clear();
        }
        continue;  // what queued meanwhile: woken again by whoever queued it
      }
      for (const Watcher::Event& e : batch) {
        const bool has_value = e.kind == kv::WatchKind_Current || e.kind == kv::WatchKind_Changed;
        write(e.key, e.kind, has_value ? &e.value : nullptr);
      }
      batch.clear();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);  // no publish() sees `w` after this
      watchers_.erase(&w);
    }
    if (!spawned) return slotrpc::Status(slotrpc::StatusCode::kInternal, "could not start the watch reader");
    return write_status.ok() ? read_status : write_status;
  }

 private:
  static constexpr uint64_t kBatch = 256;
  // A Watch's queue: past either bound its events are dropped (Behind).
  static constexpr size_t kMaxBehind = 10'000;
  static constexpr size_t kMaxBehindBytes = 16u << 20;
  // A Watch's subscription: a request past either bound ends the call.
  static constexpr size_t kMaxWatchedKeys = 10'000;
  static constexpr size_t kMaxWatchedKeyBytes = 1u << 20;

  // A key's value as a Current (or Missing) event.  Under mu_.
  Watcher::Event current(const std::string& key) const {
    auto it = map_.find(key);
    if (it == map_.end()) return {key, kv::WatchKind_Missing, {}};
    return {key, kv::WatchKind_Current, it->second};
  }

  static size_t bytes_of(const Watcher::Event& e) {
    size_t n = sizeof e + e.key.size() + e.value.bytes.size() + e.value.text.size();
    for (const auto& [name, v] : e.value.labels) n += name.size() + v.size();
    return n;
  }

  // Queues `e` for `w`, or drops the queue once it is past its bounds.
  // Under w.mu.
  static void enqueue(Watcher& w, Watcher::Event e) {
    if (w.behind) return;  // it gets every current value when it catches up
    const size_t bytes = bytes_of(e);
    if (w.events.size() >= kMaxBehind || w.event_bytes + bytes > kMaxBehindBytes) {
      w.behind = true;
      std::deque<Watcher::Event>().swap(w.events);  // the memory too, not just the elements
      w.event_bytes = 0;
      return;
    }
    w.event_bytes += bytes;
    w.events.push_back(std::move(e));
  }

  // The reader fiber: applies one subscription change; every added key gets
  // its current value first, under the store's lock, so no change to it is
  // missed or sent before it.  RESOURCE_EXHAUSTED (nothing applied) when
  // the subscription would pass its bounds.
  slotrpc::Status subscribe(Watcher& w, const kv::WatchRequest& request) {
    {
      std::lock_guard<std::mutex> store_lock(mu_);
      std::lock_guard<std::mutex> lock(w.mu);
      if (request.remove() != nullptr) {
        for (const flatbuffers::String* key : *request.remove()) {
          if (w.keys.erase(key->str()) != 0) w.key_bytes -= key->size();
        }
      }
      if (request.add() != nullptr) {
        // Checked before anything is added: the request is applied whole or not at all.
        size_t keys = w.keys.size();
        size_t bytes = w.key_bytes;
        for (const flatbuffers::String* key : *request.add()) {
          if (w.keys.count(key->str()) != 0) continue;
          ++keys;
          bytes += key->size();
        }
        if (keys > kMaxWatchedKeys || bytes > kMaxWatchedKeyBytes) {
          return slotrpc::Status(
              slotrpc::StatusCode::kResourceExhausted,
              "Watch: one call watches at most " + std::to_string(kMaxWatchedKeys) + " keys of " +
                  std::to_string(kMaxWatchedKeyBytes) + " bytes of names in all; this request would make " +
                  std::to_string(keys) + " keys of " + std::to_string(bytes) + " bytes");
        }
        for (const flatbuffers::String* key : *request.add()) {
          if (!w.keys.insert(key->str()).second) continue;
          w.key_bytes += key->size();
          enqueue(w, current(key->str()));
        }
      }
    }
    w.wake.notify();
    return {};
  }

  // Tells every watcher of `key` that it changed.  Under mu_.
  void publish(const std::string& key, kv::WatchKind kind, const Stored* value) {
    for (Watcher* w : watchers_) {
      {
        std::lock_guard<std::mutex> lock(w->mu);
        if (w->keys.count(key) == 0) continue;
        enqueue(*w, {key, kind, value != nullptr ? *value : Stored{}});
      }
      w->wake.notify();
    }
  }

  std::set<Watcher*> watchers_;  // under mu_
  std::mutex mu_;
  std::map<std::string, Stored> map_;
};

}  // namespace

int main(int argc, char** argv) {
  std::string listen = "127.0.0.1:7001";
  std::string port_file;
  CLI::App app("Serves slotrpc.examples.kv.KV (examples/kv/kv.fbs), an in-memory ordered key-value "
               "store, until SIGINT or SIGTERM.",
               "kv_server");
  app.add_option("--listen", listen, "Address to listen on, HOST:PORT (port 0 picks a free one)")
      ->capture_default_str();
  app.add_option("--port-file", port_file,
                 "Once listening, write the bound port to this file (whole, through a rename)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help exits 0; a bad option 2, the usual usage-error status.
    return app.exit(e) == 0 ? 0 : 2;
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
