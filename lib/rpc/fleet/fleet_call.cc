// A fleet's unary call: sent on the endpoint the policy picks; moved to
// another one when its session died and it may be retried (idempotent,
// CallOptions::max_retries, no bulk segments: those stay where they
// started); parked while no endpoint is usable.
#include <fmt/format.h>

#include <mutex>
#include <utility>

#include "base/logging.h"
#include "core/client_session.h"
#include "rpc/fleet/fleet.h"

namespace slotrpc::fleet {

struct UnaryCall : std::enable_shared_from_this<UnaryCall> {
  std::weak_ptr<Fleet> fleet;
  uint32_t method_id = 0;
  uint64_t service = 0;  // Fleet::service_bit
  RequestWriter writer;
  CallOptions options;
  ReplySink sink;
  uint32_t retries_left = 0;
  std::mutex mu;  // current, cancelled, finished: the caller's cancel against an attempt
  CallHandle current;
  bool cancelled = false;
  bool finished = false;

  // Once: the caller's sink.
  void finish(RawReply&& reply) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (finished) return;
      finished = true;
    }
    sink(std::move(reply));
  }
};

namespace {

void attempt(const std::shared_ptr<UnaryCall>& c, Fleet& f, const Endpoint* avoid) {
  std::shared_ptr<Endpoint> ep = f.pick(avoid, c->service);
  if (!ep) return f.park(c);
  ep->outstanding.fetch_add(1, std::memory_order_relaxed);
  // A call that cannot move keeps its writer and options in one attempt.
  const bool last = c->retries_left == 0;
  CallOptions o = last ? std::move(c->options) : c->options;
  o.max_retries = 0;  // the fleet retries, on another endpoint
  RequestWriter w = last ? std::move(c->writer) : c->writer;
  CallHandle h = raw::call(*ep->channel, c->method_id, std::move(w), std::move(o), [c, ep](RawReply&& reply) {
    ep->outstanding.fetch_sub(1, std::memory_order_relaxed);
    if (reply.status().code() == StatusCode::kUnavailable) {
      if (auto f = c->fleet.lock()) {
        f->report_failure(ep, reply.status());
        bool again = false;
        {
          std::lock_guard<std::mutex> lock(c->mu);
          again = c->retries_left > 0 && !c->cancelled && !c->finished &&
                  (!c->options.deadline || Clock::now() < *c->options.deadline);
          if (again) --c->retries_left;
        }
        if (again) {
          base::log().info("slotrpc: {}: retrying idempotent call (method id 0x{:08x}) on another "
                           "endpoint after {}: {}",
                           f->target(), c->method_id, ep->address, reply.status().message());
          return attempt(c, *f, ep.get());
        }
      }
    }
    c->finish(std::move(reply));
  });
  std::unique_lock<std::mutex> lock(c->mu);
  if (c->cancelled && !c->finished) {
    lock.unlock();
    h.cancel();
    return;
  }
  c->current = std::move(h);
}

void finish_unsent(const std::shared_ptr<UnaryCall>& c, reactor::Reactor& home, Status why) {
  // Completed on a loop like any early failure: never on the caller's stack.
  home.post([c, why = core::ClientSession::named_status(c->options.method_name, std::move(why))]() mutable {
    c->finish(RawReply(std::move(why)));
  });
}

}  // namespace

CallHandle Fleet::call(uint32_t method_id, RequestWriter writer, CallOptions options, ReplySink sink) {
  const bool movable = options.idempotent && options.max_retries > 0 && options.send_segments.empty() &&
                       options.receive_segments.empty();
  const uint64_t service = service_bit(method_id, options.method_name);
  if (!movable) {
    // A call that cannot move to another endpoint (most calls): straight
    // to the endpoint's channel, with no state of the fleet's own and no
    // lock.  A bulk call keeps its own retry rule, on its endpoint.
    if (std::shared_ptr<Endpoint> ep = pick(nullptr, service)) {
      ep->outstanding.fetch_add(1, std::memory_order_relaxed);
      return raw::call(*ep->channel, method_id, std::move(writer), std::move(options),
                               [weak = weak_from_this(), ep, sink = std::move(sink)](RawReply&& reply) {
                                 ep->outstanding.fetch_sub(1, std::memory_order_relaxed);
                                 if (reply.status().code() == StatusCode::kUnavailable) {
                                   if (auto f = weak.lock()) f->report_failure(ep, reply.status());
                                 }
                                 sink(std::move(reply));
                               });
    }
  }
  auto c = std::make_shared<UnaryCall>();
  c->fleet = weak_from_this();
  c->method_id = method_id;
  c->service = service;
  c->retries_left = movable ? options.max_retries : 0;
  c->writer = std::move(writer);
  c->options = std::move(options);
  c->sink = std::move(sink);
  attempt(c, *this, nullptr);
  return CallHandle([weak = std::weak_ptr<UnaryCall>(c)] {
    auto c = weak.lock();
    if (!c) return;
    CallHandle current;
    {
      std::lock_guard<std::mutex> lock(c->mu);
      if (c->finished || c->cancelled) return;
      c->cancelled = true;
      current = c->current;
    }
    // A parked call is failed by the maintainer's next look at it.
    current.cancel();
  });
}

void Fleet::park(std::shared_ptr<UnaryCall> c) {
  Parked p;
  p.deadline = c->options.deadline.has_value();
  p.give_up = p.deadline ? *c->options.deadline
                         : Clock::now() + std::chrono::milliseconds(opt_.connect_timeout_ms);
  p.call = std::move(c);
  std::lock_guard<std::mutex> lock(mu_);
  if (closing_) return finish_unsent(p.call, *opt_.home, Status(StatusCode::kCancelled, "channel closed"));
  parked_.push_back(std::move(p));
  cv_.notify_all();
}

void Fleet::finish_parked(const std::shared_ptr<UnaryCall>& c, Status why) {
  finish_unsent(c, *opt_.home, std::move(why));
}

void Fleet::settle_parked() {
  std::deque<Parked> parked;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (parked_.empty()) return;
    parked.swap(parked_);
  }
  const auto now = Clock::now();
  std::string why;
  for (Parked& p : parked) {
    bool cancelled = false;
    {
      std::lock_guard<std::mutex> lock(p.call->mu);
      cancelled = p.call->cancelled;
    }
    if (cancelled) {
      finish_parked(p.call, Status(StatusCode::kCancelled, "cancelled by the caller"));
    } else if (pick(nullptr, p.call->service) != nullptr) {
      attempt(p.call, *this, nullptr);  // parks it again if that endpoint went meanwhile
    } else if (now >= p.give_up) {
      why = describe(p.call->service);
      finish_parked(p.call, p.deadline ? Status(StatusCode::kDeadlineExceeded,
                                                fmt::format("deadline passed while no endpoint of {} was usable ({})",
                                                            opt_.target, why))
                                       : Status(StatusCode::kUnavailable,
                                                fmt::format("no endpoint of {} became usable within {} ms "
                                                            "(connect_timeout_ms): {}",
                                                            opt_.target, opt_.connect_timeout_ms, why)));
    } else {
      std::lock_guard<std::mutex> lock(mu_);
      parked_.push_back(std::move(p));
    }
  }
}

std::shared_ptr<Endpoint> Fleet::start_stream(uint32_t method_id, const CallOptions& options, ReplySink* reply_ends,
                                               std::function<void(Status)>& on_end) {
  std::shared_ptr<Endpoint> ep = pick(nullptr, service_bit(method_id, options.method_name));
  if (!ep) return nullptr;
  // Counted until the callback that ends the stream is gone (run, or
  // dropped with the call): a stream holds its endpoint's slots as long as
  // a call would, often far longer, so p2c must see it.
  struct Count {
    std::shared_ptr<Endpoint> ep;
    explicit Count(std::shared_ptr<Endpoint> e) : ep(std::move(e)) { ep->outstanding.fetch_add(1, std::memory_order_relaxed); }
    ~Count() { ep->outstanding.fetch_sub(1, std::memory_order_relaxed); }
  };
  auto count = std::make_shared<Count>(ep);
  if (reply_ends != nullptr) {
    *reply_ends = [count, inner = std::move(*reply_ends)](RawReply&& reply) {
      if (inner) inner(std::move(reply));
    };
  } else {
    on_end = [count, inner = std::move(on_end)](Status st) {
      if (inner) inner(std::move(st));
    };
  }
  return ep;
}

}  // namespace slotrpc::fleet
