// The gRPC baseline: the Echo service of examples/echo/echo.fbs compiled by
// `flatc --cpp --grpc` (FlatBuffers messages over gRPC 1.51), configured the
// way a careful user would:
//  - message-size limits raised on both ends (gRPC's 4 MB default receive
//    limit would reject the 1 MiB+ points);
//  - each client channel its own TCP connection (a local subchannel pool;
//    otherwise gRPC shares one connection among channels with equal args);
//  - one outstanding call: the synchronous stub, the simplest and fastest
//    path for a blocking caller;
//  - more outstanding calls: the asynchronous stub on one completion queue,
//    drained by the calling thread (flatc 2.0.8 generates no callback-API
//    stubs; the completion-queue API is gRPC's fastest client API);
//  - the server: gRPC's synchronous server (its thread pool runs handlers
//    concurrently), the form flatc generates a service base class for.
//  - builders sized for the payload up front, so neither end regrows.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "bench_driver.h"
#include "echo.grpc.fb.h"

namespace bench {
namespace {

// A PEM file's text (empty when it cannot be read: gRPC then fails the
// connection, naming TLS).
std::string read_pem(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

using slotrpc::examples::EchoReply;
using slotrpc::examples::EchoRequest;
using Clock = std::chrono::steady_clock;

int clamp_int(uint64_t v) { return v > 0x7fffffff ? 0x7fffffff : static_cast<int>(v); }

flatbuffers::grpc::Message<EchoRequest> make_request(uint64_t seq, uint64_t size) {
  flatbuffers::grpc::MessageBuilder mb(static_cast<flatbuffers::uoffset_t>(size + 256));
  uint8_t* bytes = nullptr;
  auto payload = mb.CreateUninitializedVector(size, &bytes);
  if (size != 0) std::memset(bytes, kFill, size);
  mb.Finish(slotrpc::examples::CreateEchoRequest(mb, seq, payload));
  return mb.ReleaseMessage<EchoRequest>();
}

// Empty when the reply is the echo of a `size`-byte request.
std::string check_reply(const grpc::Status& st, const flatbuffers::grpc::Message<EchoReply>& reply,
                        uint64_t size) {
  if (!st.ok()) return "status " + std::to_string(st.error_code()) + ": " + st.error_message();
  const EchoReply* r = reply.GetRoot();
  if (r == nullptr || r->payload() == nullptr || r->payload()->size() != size) return "wrong payload size";
  if (size != 0 && (r->payload()->Get(0) != kFill || r->payload()->Get(size - 1) != kFill)) return "wrong payload bytes";
  return {};
}

class EchoServiceImpl final : public slotrpc::examples::Echo::Service {
  grpc::Status Echo(grpc::ServerContext*, const flatbuffers::grpc::Message<EchoRequest>* request,
                    flatbuffers::grpc::Message<EchoReply>* response) override {
    const EchoRequest* req = request->GetRoot();
    const auto* p = req->payload();
    const size_t n = p != nullptr ? p->size() : 0;
    flatbuffers::grpc::MessageBuilder mb(static_cast<flatbuffers::uoffset_t>(n + 256));
    auto payload = mb.CreateVector(p != nullptr ? p->data() : nullptr, n);
    mb.Finish(slotrpc::examples::CreateEchoReply(mb, req->seq(), payload));
    *response = mb.ReleaseMessage<EchoReply>();
    return grpc::Status::OK;
  }
};

class GrpcDriver final : public EchoDriver {
 public:
  GrpcDriver(std::string target, uint64_t max_message) : target_(std::move(target)), max_(max_message) {}
  void set_tls_ca(std::string path) { tls_ca_ = std::move(path); }

  Point run(uint64_t size, uint64_t calls, uint64_t outstanding, uint32_t channels,
            std::atomic<uint64_t>& done) override {
    while (stubs_.size() < channels) connect();
    return outstanding == 1 && channels == 1 ? run_sync(size, calls, done)
                                             : run_async(size, calls, outstanding, channels, done);
  }

 private:
  void connect() {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(clamp_int(max_));
    args.SetMaxSendMessageSize(clamp_int(max_));
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
    if (!tls_ca_.empty()) {
      grpc::SslCredentialsOptions tls;
      tls.pem_root_certs = read_pem(tls_ca_);
      creds = grpc::SslCredentials(tls);
      args.SetSslTargetNameOverride("localhost");  // a SAN of the bench's certificate
    }
    auto ch = grpc::CreateCustomChannel(target_, creds, args);
    ch->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10));
    stubs_.push_back(slotrpc::examples::Echo::NewStub(ch));
  }

  Point run_sync(uint64_t size, uint64_t calls, std::atomic<uint64_t>& done) {
    Point pt;
    const auto t0 = Clock::now();
    for (uint64_t seq = 0; seq < calls; ++seq) {
      const auto start = Clock::now();
      grpc::ClientContext ctx;
      flatbuffers::grpc::Message<EchoReply> reply;
      const grpc::Status st = stubs_[0]->Echo(&ctx, make_request(seq, size), &reply);
      pt.latency_ns.record(static_cast<uint64_t>((Clock::now() - start).count()));
      if (auto err = check_reply(st, reply, size); !err.empty() && pt.failed++ == 0) pt.first_error = err;
      done.fetch_add(1, std::memory_order_relaxed);
    }
    pt.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    pt.calls = calls;
    return pt;
  }

  struct Call {
    grpc::ClientContext ctx;
    flatbuffers::grpc::Message<EchoReply> reply;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncResponseReader<flatbuffers::grpc::Message<EchoReply>>> rpc;
    Clock::time_point start;
    uint32_t channel = 0;
  };

  Point run_async(uint64_t size, uint64_t calls, uint64_t outstanding, uint32_t channels,
                  std::atomic<uint64_t>& done) {
    Point pt;
    grpc::CompletionQueue cq;
    uint64_t issued = 0, completed = 0;
    auto issue = [&](uint32_t channel) {
      auto* call = new Call;  // one ClientContext per call: gRPC forbids reuse
      call->channel = channel;
      call->start = Clock::now();
      call->rpc = stubs_[channel]->AsyncEcho(&call->ctx, make_request(issued++, size), &cq);
      call->rpc->Finish(&call->reply, &call->status, call);
    };
    const auto t0 = Clock::now();
    for (uint64_t k = 0; k < outstanding && issued < calls; ++k) issue(static_cast<uint32_t>(k % channels));
    while (completed < calls) {
      void* tag = nullptr;
      bool ok = false;
      if (!cq.Next(&tag, &ok)) break;
      std::unique_ptr<Call> call(static_cast<Call*>(tag));
      pt.latency_ns.record(static_cast<uint64_t>((Clock::now() - call->start).count()));
      std::string err = ok ? check_reply(call->status, call->reply, size) : "completion queue: not ok";
      if (!err.empty() && pt.failed++ == 0) pt.first_error = err;
      ++completed;
      done.fetch_add(1, std::memory_order_relaxed);
      if (issued < calls) issue(call->channel);
    }
    pt.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    pt.calls = completed;
    cq.Shutdown();
    void* tag = nullptr;
    bool ok = false;
    while (cq.Next(&tag, &ok)) delete static_cast<Call*>(tag);
    return pt;
  }

  std::string target_;
  std::string tls_ca_;  // TLS: the CA bundle (PEM); empty: plaintext
  uint64_t max_;
  std::vector<std::unique_ptr<slotrpc::examples::Echo::Stub>> stubs_;
};

}  // namespace

bool grpc_available() { return true; }

std::unique_ptr<EchoDriver> make_grpc_driver(const std::string& target, uint64_t max_message,
                                             const std::string& tls_ca) {
  auto d = std::make_unique<GrpcDriver>(target, max_message);
  d->set_tls_ca(tls_ca);
  return d;
}

int serve_grpc(const std::string& address, const std::string& port_file, uint64_t max_message,
               const std::string& tls_cert, const std::string& tls_key) {
  EchoServiceImpl service;
  grpc::ServerBuilder builder;
  int port = 0;
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (!tls_cert.empty()) {
    grpc::SslServerCredentialsOptions tls;
    tls.pem_key_cert_pairs.push_back({read_pem(tls_key), read_pem(tls_cert)});
    creds = grpc::SslServerCredentials(tls);
  }
  builder.AddListeningPort(address, creds, &port);
  builder.SetMaxReceiveMessageSize(clamp_int(max_message));
  builder.SetMaxSendMessageSize(clamp_int(max_message));
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "slotrpc-bench: gRPC server could not listen on %s\n", address.c_str());
    return 1;
  }
  if (!write_port_file(port_file, static_cast<uint16_t>(port))) return 1;
  wait_for_termination();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  return 0;
}

}  // namespace bench
