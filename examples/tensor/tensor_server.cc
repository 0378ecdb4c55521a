// tensor_server: keeps named float32 tensors for tensor_client
// (examples/tensor/tensor.fbs), the slotrpc example of bulk payloads.
//
//   build/examples/tensor/tensor_server --listen 0.0.0.0:7002
//
// Where the bytes go: a Put's data is pulled by the handler straight into
// the tensor's own memory (read_bulk: RDMA READ on verbs, recv into it on
// TCP); a Get pushes the tensor straight into the client's buffer
// (write_bulk: RDMA WRITE); a Reduce pulls the addend through a bounded
// scratch buffer, chunk by chunk (the offset argument of read_bulk), so a
// 1 GiB reduce needs 64 MiB of scratch, not another gigabyte.  Tensors and
// scratch buffers are registered once with Server::register_memory, so no
// call pays a registration.
#include <CLI/CLI.hpp>
#include <signal.h>
#include <sys/mman.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <slotrpc/slotrpc.h>

#include "tensor.slotrpc.h"

namespace tensor = slotrpc::examples::tensor;

namespace {

slotrpc::Status invalid(std::string message) {
  return slotrpc::Status(slotrpc::StatusCode::kInvalidArgument, std::move(message));
}

// Tensor memory straight from mmap: untouched pages cost nothing until
// the Put's data lands in them, so the handler (which runs on the event
// loop) never spends a second writing a gigabyte it is about to overwrite
// (operator new may, e.g. under MALLOC_PERTURB_).
struct Tensor {
  float* data = nullptr;
  uint64_t elements = 0;
  slotrpc::MemoryRegion region;  // the NIC reads and writes it in place
  std::mutex mu;                 // a Reduce adds under it
  bool allocate(uint64_t n) {
    void* p = ::mmap(nullptr, n * sizeof(float), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return false;
    data = static_cast<float*>(p);
    elements = n;
    return true;
  }
  ~Tensor() {
    region.release();  // before the memory goes
    if (data != nullptr) ::munmap(data, elements * sizeof(float));
  }
};

class Store final : public tensor::TensorsService {
 public:
  explicit Store(slotrpc::Server& server) : server_(server) {}

  slotrpc::Status Put(const tensor::PutRequest& request,
                      slotrpc::ReplyBuilder<tensor::PutReply>& reply,
                      slotrpc::ServerCall& call) override {
    if (request.name() == nullptr || request.name()->size() == 0) return invalid("Put: no name");
    const uint64_t n = request.elements();
    if (n == 0) return invalid("Put: an empty tensor");
    if (call.bulk_in_count() != 1 || call.bulk_in(0) != n * sizeof(float))
      return invalid("Put: send the tensor as one bulk segment of elements * 4 bytes (" +
                     std::to_string(n * sizeof(float)) + "), got " +
                     std::to_string(call.bulk_in_count()) + " segment(s) of " +
                     std::to_string(call.bulk_in(0)) + " bytes");
    auto t = std::make_shared<Tensor>();
    if (!t->allocate(n))
      return slotrpc::Status(slotrpc::StatusCode::kResourceExhausted,
                             "Put: cannot allocate " + std::to_string(n * sizeof(float)) + " bytes");
    auto region = server_.register_memory(
        {reinterpret_cast<std::byte*>(t->data), n * sizeof(float)});
    if (!region.ok()) return region.status();
    t->region = region.value();
    // The data lands in the tensor itself: no staging, no copy.
    if (auto st = call.read_bulk(0, t->region, 0, n * sizeof(float)); !st.ok()) return st;
    {
      std::lock_guard<std::mutex> lock(mu_);
      tensors_[request.name()->str()] = t;
    }
    reply.Finish(tensor::CreatePutReply(reply.fbb(), n));
    return {};
  }

  slotrpc::Status Get(const tensor::GetRequest& request,
                      slotrpc::ReplyBuilder<tensor::GetReply>& reply,
                      slotrpc::ServerCall& call) override {
    auto t = find(request.name());
    if (!t) return invalid("Get: no tensor named '" + name_of(request.name()) + "'");
    const uint64_t bytes = t->elements * sizeof(float);
    if (call.bulk_out_count() != 1)
      return invalid("Get: offer one receive_bulk destination for the tensor");
    if (call.bulk_out(0) < bytes)
      return invalid("Get: the destination holds " + std::to_string(call.bulk_out(0)) +
                     " bytes; tensor '" + name_of(request.name()) + "' has " + std::to_string(bytes));
    if (auto st = call.write_bulk(0, t->region, 0, bytes); !st.ok()) return st;
    reply.Finish(tensor::CreateGetReply(reply.fbb(), t->elements));
    return {};
  }

  slotrpc::Status Reduce(const tensor::ReduceRequest& request,
                         slotrpc::ReplyBuilder<tensor::ReduceReply>& reply,
                         slotrpc::ServerCall& call) override {
    auto t = find(request.name());
    if (!t) return invalid("Reduce: no tensor named '" + name_of(request.name()) + "'");
    const uint64_t bytes = t->elements * sizeof(float);
    if (request.elements() != t->elements || call.bulk_in_count() != 1 || call.bulk_in(0) != bytes)
      return invalid("Reduce: tensor '" + name_of(request.name()) + "' has " +
                     std::to_string(t->elements) + " elements; send as many (" +
                     std::to_string(bytes) + " bytes) as one bulk segment");
    Scratch scratch = take_scratch();
    if (!scratch.region.valid()) return scratch.status;
    const uint64_t chunk_elements = kScratchBytes / sizeof(float);
    slotrpc::Status st;
    for (uint64_t first = 0; first < t->elements && st.ok(); first += chunk_elements) {
      const uint64_t n = std::min(chunk_elements, t->elements - first);
      st = call.read_bulk(0, scratch.region, 0, n * sizeof(float), first * sizeof(float));
      if (!st.ok()) break;
      const float* add = reinterpret_cast<const float*>(scratch.region.data());
      std::lock_guard<std::mutex> lock(t->mu);
      float* into = t->data + first;
      for (uint64_t i = 0; i < n; ++i) into[i] += add[i];
    }
    give_scratch(std::move(scratch));
    if (!st.ok()) return st;
    reply.Finish(tensor::CreateReduceReply(reply.fbb(), t->elements));
    return {};
  }

 private:
  static constexpr uint64_t kScratchBytes = 64ull << 20;

  struct Scratch {
    std::shared_ptr<std::vector<std::byte>> memory;
    slotrpc::MemoryRegion region;
    slotrpc::Status status;
  };

  static std::string name_of(const flatbuffers::String* s) { return s ? s->str() : std::string(); }

  std::shared_ptr<Tensor> find(const flatbuffers::String* name) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = tensors_.find(name_of(name));
    return it == tensors_.end() ? nullptr : it->second;
  }

  // Scratch buffers: one per concurrent Reduce (handlers of one loop
  // interleave while their reads are in flight), registered once, reused.
  Scratch take_scratch() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!scratch_.empty()) {
        Scratch s = std::move(scratch_.back());
        scratch_.pop_back();
        return s;
      }
    }
    Scratch s;
    s.memory = std::make_shared<std::vector<std::byte>>(kScratchBytes);
    auto region = server_.register_memory(*s.memory);
    if (!region.ok()) {
      s.status = region.status();
      return s;
    }
    s.region = region.value();
    return s;
  }
  void give_scratch(Scratch s) {
    std::lock_guard<std::mutex> lock(mu_);
    scratch_.push_back(std::move(s));
  }

  slotrpc::Server& server_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Tensor>> tensors_;
  std::vector<Scratch> scratch_;
};

}  // namespace

int main(int argc, char** argv) {
  std::string listen = "127.0.0.1:7002";
  std::string port_file;
  CLI::App app("Serves slotrpc.examples.tensor.Tensors (examples/tensor/tensor.fbs): named float32 "
               "tensors moved as bulk payloads, until SIGINT or SIGTERM.",
               "tensor_server");
  app.add_option("--listen", listen, "Address to listen on, HOST:PORT (port 0 picks a free one)")
      ->capture_default_str();
  app.add_option("--port-file", port_file,
                 "Once listening, write the bound port to this file (whole, through a rename)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  slotrpc::Server server;
  {
    Store store(server);  // destroyed after the server stops (below)
    if (auto st = server.add_service(store.definition()); !st.ok()) {
      std::fprintf(stderr, "tensor_server: %s\n", st.to_string().c_str());
      return 1;
    }
    if (auto st = server.start(listen); !st.ok()) {
      std::fprintf(stderr, "tensor_server: %s\n", st.to_string().c_str());
      return 1;
    }
    std::printf("tensor_server: listening on port %u\n", server.port());
    std::fflush(stdout);
    if (!port_file.empty()) {
      const std::string tmp = port_file + ".tmp";
      std::ofstream(tmp) << server.port() << "\n";
      std::rename(tmp.c_str(), port_file.c_str());
    }
    int sig = 0;
    sigwait(&signals, &sig);
    std::printf("tensor_server: %s, stopping\n", strsignal(sig));
    server.stop();
  }
  return 0;
}
