// Idempotent calls with CallOptions::max_retries: sent again after
// UNAVAILABLE, through a reconnect, until the retries or the deadline run out.
#include "rpc/channel_impl.h"

#include "base/logging.h"
#include "rpc/fleet/fleet.h"

#include <memory>
#include <utility>

namespace slotrpc {

namespace {

// An idempotent call that may be sent again after UNAVAILABLE.
struct RetryingCall : std::enable_shared_from_this<RetryingCall> {
  std::weak_ptr<Channel::Impl> channel;
  uint32_t method_id = 0;
  RequestWriter writer;  // kept: every attempt builds the request afresh
  CallOptions options;
  ReplySink sink;
  uint32_t retries_left = 0;
  std::atomic<bool> cancelled{false};
  std::atomic<uint64_t> current_id{0};
  // Loop thread.  Between attempts the call waits for a session (a
  // reconnect, bounded by connect_timeout_ms); a cancel or its deadline
  // ends it there and then, not when the reconnect is over (before, a
  // cancelled call was sent again after the reconnect, and a 300 ms
  // deadline waited out the whole connect timeout).
  bool finished = false;  // the caller's sink has run
  bool waiting = false;   // between attempts, in with_session
  reactor::Reactor* loop = nullptr;
  base::TimerHeap::TimerId deadline_timer = 0;
  std::shared_ptr<RetryingCall> keep;  // alive while the timer is armed

  void finish(RawReply&& reply) {
    if (finished) return;
    finished = true;
    stop_waiting();
    sink(std::move(reply));
  }
  // Ends the call with a status of its own (not an attempt's outcome).
  void fail(Status status) {
    finish(RawReply(core::ClientSession::named_status(options.method_name, std::move(status))));
  }
  void stop_waiting() {
    waiting = false;
    if (deadline_timer != 0) loop->timers().cancel(deadline_timer);
    deadline_timer = 0;
    keep.reset();
  }
  // Waits for a session until the deadline, if any.
  void start_waiting(reactor::Reactor& on) {
    waiting = true;
    loop = &on;
    if (!options.deadline) return;
    keep = shared_from_this();
    deadline_timer = on.timers().add(*options.deadline, &RetryingCall::on_deadline, this, 0);
  }
  static void on_deadline(void* self_ptr, uint64_t) {
    auto* self = static_cast<RetryingCall*>(self_ptr);
    self->deadline_timer = 0;
    auto hold = std::move(self->keep);  // `self` lives to the end of this function
    if (!self->waiting) return;
    self->fail(Status(StatusCode::kDeadlineExceeded,
                      "deadline passed while the channel reconnected for a retry"));
  }
};

}  // namespace

CallHandle Channel::call(uint32_t method_id, RequestWriter writer, CallOptions options,
                         ReplySink sink) {
  // Once per call, not per attempt: retries repeat the call as it was let go.
  if (Status st = impl_->intercept(method_id, options); !st.ok()) {
    auto* pc = new core::PendingCall;
    pc->method_id = method_id;
    pc->sink = std::move(sink);
    return refuse(pc, st);
  }
  // A fleet routes the call to one of its endpoints' channels.
  if (impl_->fleet) return impl_->fleet->call(method_id, std::move(writer), std::move(options), std::move(sink));
  if (options.idempotent && options.max_retries > 0) {
    auto r = std::make_shared<RetryingCall>();
    r->channel = impl_;
    r->method_id = method_id;
    r->writer = std::move(writer);
    r->options = options;
    r->sink = std::move(sink);
    r->retries_left = options.max_retries;
    // Each attempt is an ordinary call whose sink decides whether to retry.
    auto attempt = std::make_shared<std::function<void()>>();
    *attempt = [r, weak_attempt = std::weak_ptr<std::function<void()>>(attempt)]() {
      auto impl = r->channel.lock();
      if (!impl) return r->fail(Status(StatusCode::kCancelled, "channel closed"));
      auto* pc = new core::PendingCall;
      pc->method_id = r->method_id;
      pc->method_name = r->options.method_name;
      pc->writer = r->writer;
      pc->deadline = r->options.deadline;
      pc->take_options(r->options.metadata, r->options.send_segments, r->options.receive_segments);
      pc->request_id = impl->last_request_id.fetch_add(1, std::memory_order_relaxed) + 1;
      r->current_id = pc->request_id;
      auto again = weak_attempt.lock();
      pc->sink = [r, again](RawReply&& reply) {
        auto impl = r->channel.lock();
        const bool retry = reply.status().code() == StatusCode::kUnavailable &&
                           r->retries_left > 0 && !r->cancelled && impl && again &&
                           !impl->closing.load() &&
                           (!r->options.deadline || Clock::now() < *r->options.deadline);
        if (!retry) return r->finish(std::move(reply));
        --r->retries_left;
        if (r->options.method_name != nullptr) {
          base::log().info("slotrpc: retrying idempotent call to {} after: {}", r->options.method_name,
                           reply.status().message());
        } else {
          base::log().info("slotrpc: retrying idempotent call (method id 0x{:08x}) after: {}", r->method_id,
                           reply.status().message());
        }
        r->start_waiting(*impl->loop);
        impl->with_session([r, again, failed = Status(reply.status())](const Status& st) {
          if (r->finished) return;  // its deadline or a cancel ended it while it waited
          r->stop_waiting();
          if (r->cancelled) return r->fail(Status(StatusCode::kCancelled, "cancelled by the caller"));
          if (!st.ok()) {
            return r->fail(Status(StatusCode::kUnavailable,
                                  fmt::format("{}; reconnect failed: {}", failed.message(), st.message())));
          }
          (*again)();
        });
      };
      if (!impl->session) {
        return core::ClientSession::fail_later(*impl->loop, pc, Status(StatusCode::kCancelled, "channel closed"));
      }
      impl->session->submit(pc);
    };
    // The attempt chain keeps itself alive through the pending call's sink.
    if (!impl_->loop->on_this_thread()) impl_->handoffs.fetch_add(1, std::memory_order_relaxed);
    impl_->loop->run_or_post([attempt, keep = attempt] { (*attempt)(); });
    std::weak_ptr<Impl> weak = impl_;
    return CallHandle([weak, r] {
      r->cancelled = true;
      auto impl = weak.lock();
      if (!impl || impl->closing.load()) return;
      impl->loop->run_or_post([impl, r] {
        if (r->waiting) {  // between attempts: no call of it is in a session
          r->fail(Status(StatusCode::kCancelled, "cancelled by the caller"));
          return;
        }
        if (impl->session)
          impl->session->cancel(r->current_id.load(), Status(StatusCode::kCancelled, "cancelled by the caller"));
      });
    });
  }
  auto* pc = new core::PendingCall;
  pc->method_id = method_id;
  pc->method_name = options.method_name;
  pc->writer = std::move(writer);
  pc->sink = std::move(sink);
  pc->deadline = options.deadline;
  pc->take_options(std::move(options.metadata), std::move(options.send_segments),
                   std::move(options.receive_segments));
  return submit(pc);
}

}  // namespace slotrpc
