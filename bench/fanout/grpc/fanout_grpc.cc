// The fan-out benchmark's gRPC side: the same schema (fanout.fbs through
// `flatc --cpp --grpc`), the same topology and the same messages
// (fanout_content.h), configured the way a careful user would:
//  - backends and frontend: gRPC's synchronous server (its thread pool runs
//    handlers concurrently), the form flatc 2.0.8 generates services for;
//  - the frontend's handler starts the three backend calls on the async
//    stubs, then waits for all three on a completion queue of its thread
//    (one per handler thread, reused): the calls are in flight together,
//    and their deadline is the incoming call's;
//  - the load target: async stub, one completion queue drained by its own
//    thread, so issuing never waits for a reply (open loop).
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <thread>

#include "bench_common.h"
#include "fanout.grpc.fb.h"
#include "fanout.h"
#include "fanout_content.h"

namespace bench::fanout {
namespace {

template <typename T>
using Msg = flatbuffers::grpc::Message<T>;

Msg<fo::UserRequest> user_message(uint64_t uid) {
  flatbuffers::grpc::MessageBuilder mb(64);
  mb.Finish(build_user(mb, uid));
  return mb.ReleaseMessage<fo::UserRequest>();
}

uint64_t user_id(const Msg<fo::UserRequest>* m) {
  const fo::UserRequest* r = m->GetRoot();
  return r != nullptr ? r->user_id() : 0;
}

class Timeline final : public fo::Timeline::Service {
  grpc::Status Get(grpc::ServerContext*, const Msg<fo::UserRequest>* req, Msg<fo::TimelineReply>* out) override {
    flatbuffers::grpc::MessageBuilder mb(256);
    mb.Finish(build_timeline(mb, user_id(req)));
    *out = mb.ReleaseMessage<fo::TimelineReply>();
    return grpc::Status::OK;
  }
};

class Posts final : public fo::Posts::Service {
  grpc::Status Get(grpc::ServerContext*, const Msg<fo::UserRequest>* req, Msg<fo::PostsReply>* out) override {
    flatbuffers::grpc::MessageBuilder mb(1024);
    mb.Finish(build_posts(mb, user_id(req)));
    *out = mb.ReleaseMessage<fo::PostsReply>();
    return grpc::Status::OK;
  }
};

class Media final : public fo::Media::Service {
  grpc::Status Get(grpc::ServerContext*, const Msg<fo::UserRequest>* req, Msg<fo::MediaReply>* out) override {
    flatbuffers::grpc::MessageBuilder mb(512);
    mb.Finish(build_media(mb, user_id(req)));
    *out = mb.ReleaseMessage<fo::MediaReply>();
    return grpc::Status::OK;
  }
};

// A completion queue per handler thread.  gRPC requires a queue to be shut
// down and drained before it is destroyed: the thread's exit does both.
struct ThreadQueue {
  grpc::CompletionQueue cq;
  ~ThreadQueue() {
    cq.Shutdown();
    void* tag = nullptr;
    bool ok = false;
    while (cq.Next(&tag, &ok)) {
    }
  }
};

std::shared_ptr<grpc::Channel> connect(const std::string& target) {
  grpc::ChannelArguments args;
  // Each channel its own connection (otherwise gRPC shares one among
  // channels with equal arguments), as slotrpc's channels are.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // Replicas ("a,b,c"): gRPC's own round_robin over an ipv4: target.
  const bool replicas = target.find(',') != std::string::npos;
  if (replicas) args.SetLoadBalancingPolicyName("round_robin");
  auto ch = grpc::CreateCustomChannel(replicas ? "ipv4:" + target : target, grpc::InsecureChannelCredentials(), args);
  if (!ch->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) return nullptr;
  return ch;
}

class Frontend final : public fo::Frontend::Service {
 public:
  Frontend(std::shared_ptr<grpc::Channel> t, std::shared_ptr<grpc::Channel> p, std::shared_ptr<grpc::Channel> m)
      : timeline_(fo::Timeline::NewStub(t)), posts_(fo::Posts::NewStub(p)), media_(fo::Media::NewStub(m)) {}

 private:
  grpc::Status Home(grpc::ServerContext* ctx, const Msg<fo::UserRequest>* req, Msg<fo::HomeReply>* out) override {
    thread_local ThreadQueue q;
    const uint64_t uid = user_id(req);
    const Msg<fo::UserRequest> request = user_message(uid);
    grpc::ClientContext ct, cp, cm;
    for (grpc::ClientContext* c : {&ct, &cp, &cm}) c->set_deadline(ctx->deadline());
    Msg<fo::TimelineReply> t;
    Msg<fo::PostsReply> p;
    Msg<fo::MediaReply> m;
    grpc::Status st[3];
    auto rt = timeline_->AsyncGet(&ct, request, &q.cq);
    auto rp = posts_->AsyncGet(&cp, request, &q.cq);
    auto rm = media_->AsyncGet(&cm, request, &q.cq);
    rt->Finish(&t, &st[0], &st[0]);
    rp->Finish(&p, &st[1], &st[1]);
    rm->Finish(&m, &st[2], &st[2]);
    for (int k = 0; k < 3; ++k) {
      void* tag = nullptr;
      bool ok = false;
      q.cq.Next(&tag, &ok);  // a unary Finish always completes with ok
    }
    for (const grpc::Status& s : st) {
      if (!s.ok()) return s;
    }
    if (t.GetRoot() == nullptr || p.GetRoot() == nullptr || m.GetRoot() == nullptr) {
      return grpc::Status(grpc::StatusCode::INTERNAL, "empty backend reply");
    }
    flatbuffers::grpc::MessageBuilder mb(2048);
    mb.Finish(build_home(mb, uid, *t.GetRoot(), *p.GetRoot(), *m.GetRoot()));
    *out = mb.ReleaseMessage<fo::HomeReply>();
    return grpc::Status::OK;
  }

  std::unique_ptr<fo::Timeline::Stub> timeline_;
  std::unique_ptr<fo::Posts::Stub> posts_;
  std::unique_ptr<fo::Media::Stub> media_;
};

class Target final : public LoadTarget {
 public:
  explicit Target(std::shared_ptr<grpc::Channel> ch) : stub_(fo::Frontend::NewStub(ch)), drainer_([this] { drain(); }) {}
  ~Target() override {
    cq_.Shutdown();  // Next returns false once every call in flight is done
    drainer_.join();
  }

  void issue(uint64_t i, Clock::time_point due, std::chrono::milliseconds deadline,
             const std::shared_ptr<StepState>& state) override {
    auto* call = new Call;  // freed by the drainer; a ClientContext serves one call
    call->i = i;
    call->due = due;
    call->state = state;
    call->ctx.set_deadline(std::chrono::system_clock::now() + deadline);
    call->rpc = stub_->AsyncHome(&call->ctx, user_message(user_of(i)), &cq_);
    call->rpc->Finish(&call->reply, &call->status, call);
  }

 private:
  struct Call {
    uint64_t i = 0;
    Clock::time_point due;
    std::shared_ptr<StepState> state;
    grpc::ClientContext ctx;
    Msg<fo::HomeReply> reply;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncResponseReader<Msg<fo::HomeReply>>> rpc;
  };

  void drain() {
    void* tag = nullptr;
    bool ok = false;
    while (cq_.Next(&tag, &ok)) {
      std::unique_ptr<Call> call(static_cast<Call*>(tag));
      std::string error;
      if (!call->status.ok()) {
        error = "status " + std::to_string(call->status.error_code()) + ": " + call->status.error_message();
      } else {
        error = check_home(call->reply.GetRoot(), user_of(call->i));
      }
      call->state->complete(call->i, call->due, error);
    }
  }

  std::unique_ptr<fo::Frontend::Stub> stub_;
  grpc::CompletionQueue cq_;
  std::thread drainer_;
};

}  // namespace

bool grpc_available() { return true; }

std::unique_ptr<LoadTarget> grpc_target(const std::string& address, std::string& error) {
  auto ch = connect(address);
  if (ch == nullptr) {
    error = "gRPC channel to " + address + " not connected within 10 s";
    return nullptr;
  }
  return std::make_unique<Target>(ch);
}

int serve_grpc(const std::string& role, const std::vector<std::string>& backends, const std::string& port_file) {
  Timeline timeline;
  Posts posts;
  Media media;
  std::unique_ptr<Frontend> frontend;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  if (role == "timeline") {
    builder.RegisterService(&timeline);
  } else if (role == "posts") {
    builder.RegisterService(&posts);
  } else if (role == "media") {
    builder.RegisterService(&media);
  } else {
    std::shared_ptr<grpc::Channel> ch[3];
    for (int k = 0; k < 3; ++k) {
      if ((ch[k] = connect(backends[k])) == nullptr) {
        std::fprintf(stderr, "slotrpc-fanout: gRPC backend %s not reachable\n", backends[k].c_str());
        return 1;
      }
    }
    frontend = std::make_unique<Frontend>(ch[0], ch[1], ch[2]);
    builder.RegisterService(frontend.get());
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "slotrpc-fanout: gRPC server could not listen\n");
    return 1;
  }
  if (!write_port_file(port_file, static_cast<uint16_t>(port))) return 1;
  wait_for_termination();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  return 0;
}

}  // namespace bench::fanout
