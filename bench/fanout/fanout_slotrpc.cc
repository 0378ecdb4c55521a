// The fan-out benchmark's slotrpc side: the three backends, the frontend
// and the load target, from fanout.fbs through slotrpc-gen.
//
// The frontend's handler runs on a fiber: it starts the three backend calls,
// then waits on each Future, which suspends only that fiber.  So the three
// calls are in flight together and the loop serves other requests meanwhile:
// the code reads like blocking calls, the way a user would write it.
#include <cstdio>

#include "bench_common.h"
#include "fanout.h"
#include "fanout.slotrpc.h"
#include "fanout_content.h"

namespace bench::fanout {
namespace {

class Timeline final : public fo::TimelineService {
  slotrpc::Status Get(const fo::UserRequest& req, slotrpc::ReplyBuilder<fo::TimelineReply>& reply,
                      slotrpc::ServerCall&) override {
    reply.Finish(build_timeline(reply.fbb(), req.user_id()));
    return {};
  }
};

class Posts final : public fo::PostsService {
  slotrpc::Status Get(const fo::UserRequest& req, slotrpc::ReplyBuilder<fo::PostsReply>& reply,
                      slotrpc::ServerCall&) override {
    reply.Finish(build_posts(reply.fbb(), req.user_id()));
    return {};
  }
};

class Media final : public fo::MediaService {
  slotrpc::Status Get(const fo::UserRequest& req, slotrpc::ReplyBuilder<fo::MediaReply>& reply,
                      slotrpc::ServerCall&) override {
    reply.Finish(build_media(reply.fbb(), req.user_id()));
    return {};
  }
};

class Frontend final : public fo::FrontendService {
 public:
  Frontend(slotrpc::Channel& t, slotrpc::Channel& p, slotrpc::Channel& m) : timeline_(t), posts_(p), media_(m) {}

 private:
  slotrpc::Status Home(const fo::UserRequest& req, slotrpc::ReplyBuilder<fo::HomeReply>& reply,
                       slotrpc::ServerCall& call) override {
    const uint64_t uid = req.user_id();
    auto build = [uid](flatbuffers::FlatBufferBuilder& fbb) { return build_user(fbb, uid); };
    // The backend calls inherit the frontend call's deadline, as gRPC's
    // side propagates its own.
    slotrpc::CallOptions opts;
    opts.deadline = call.deadline();
    auto ft = timeline_.Get(build, opts);
    auto fp = posts_.Get(build, opts);
    auto fm = media_.Get(build, opts);
    auto t = ft.get();
    auto p = fp.get();
    auto m = fm.get();
    if (!t.ok()) return t.status();
    if (!p.ok()) return p.status();
    if (!m.ok()) return m.status();
    reply.Finish(build_home(reply.fbb(), uid, *t, *p, *m));
    return {};
  }

  fo::TimelineClient timeline_;
  fo::PostsClient posts_;
  fo::MediaClient media_;
};

class Target final : public LoadTarget {
 public:
  explicit Target(std::unique_ptr<slotrpc::Channel> ch) : channel_(std::move(ch)), client_(*channel_) {}

  // Replies run on the channel's event loop; the loader thread only issues.
  void issue(uint64_t i, Clock::time_point due, std::chrono::milliseconds deadline,
             const std::shared_ptr<StepState>& state) override {
    const uint64_t uid = user_of(i);
    client_.Home([uid](flatbuffers::FlatBufferBuilder& fbb) { return build_user(fbb, uid); },
                 slotrpc::CallOptions::with_timeout(deadline),
                 [state, i, due, uid](slotrpc::Reply<fo::HomeReply>&& r) {
                   state->complete(i, due, r.ok() ? check_home(&*r, uid) : r.status().to_string());
                 });
  }

 private:
  std::unique_ptr<slotrpc::Channel> channel_;
  fo::FrontendClient client_;
};

int fail(const slotrpc::Status& st) {
  std::fprintf(stderr, "slotrpc-fanout: %s\n", st.to_string().c_str());
  return 1;
}

}  // namespace

std::unique_ptr<LoadTarget> slotrpc_target(const std::string& address, const std::string& transport,
                                           std::string& error) {
  auto ch = slotrpc::Channel::connect(address);
  if (!ch.ok()) {
    error = ch.status().to_string();
    return nullptr;
  }
  if (slotrpc::to_string((*ch)->transport()) != transport) {
    error = "connected over " + std::string(slotrpc::to_string((*ch)->transport())) + ", not " + transport;
    return nullptr;
  }
  return std::make_unique<Target>(std::move(*ch));
}

int serve_slotrpc(const std::string& role, const std::vector<std::string>& backends, const std::string& port_file) {
  Timeline timeline;
  Posts posts;
  Media media;
  // The frontend's server and its channels share one event loop: a
  // handler's backend calls are sent from that loop, and their replies wake
  // the handler's fiber there, with no thread hand-off either way.  (On the
  // two default runtimes, servers' and channels', each call crossed loops
  // twice: a post and an eventfd wake-up each, and two loops to spin.)
  slotrpc::Runtime runtime;
  std::vector<std::unique_ptr<slotrpc::Channel>> channels;
  std::unique_ptr<Frontend> frontend;
  slotrpc::Server server(runtime);
  slotrpc::Status st;
  if (role == "timeline") {
    st = server.add_service(timeline.definition());
  } else if (role == "posts") {
    st = server.add_service(posts.definition());
  } else if (role == "media") {
    st = server.add_service(media.definition());
  } else {
    for (const std::string& a : backends) {
      // Replicas ("a,b,c"): one channel balancing them (Config::lb_policy,
      // round_robin unless SLOTRPC_LB_POLICY says otherwise).
      auto ch = slotrpc::Channel::connect(a.find(',') == std::string::npos ? a : "list://" + a, runtime);
      if (!ch.ok()) return fail(ch.status());
      channels.push_back(std::move(*ch));
    }
    frontend = std::make_unique<Frontend>(*channels[0], *channels[1], *channels[2]);
    st = server.add_service(frontend->definition());
  }
  if (!st.ok()) return fail(st);
  if (st = server.start("127.0.0.1:0"); !st.ok()) return fail(st);
  if (!write_port_file(port_file, server.port())) return 1;
  wait_for_termination();
  server.stop();  // before the handlers and channels it calls go
  return 0;
}

}  // namespace bench::fanout
