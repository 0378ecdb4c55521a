#include "rpc/loop_transports.h"

#include <mutex>
#include <vector>

#include "base/logging.h"
#include "transport/shm/shm_transport.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/verbs/monitor.h"
#include "transport/verbs/verbs_transport.h"

namespace slotrpc::rpc {

namespace {

// add_monitor_hook()'s holders.  Cold: a mutex, taken once per sample.
struct HookList {
  std::mutex mu;
  std::vector<std::weak_ptr<monitor::SampleHook>> hooks;
};

struct LoopTransports final : reactor::Reactor::Extension {
  LoopTransports() : hook_list(std::make_shared<HookList>()) {
    // The monitor's one hook calls every holder added later (a shared loop
    // serves many channels and servers); holders that died are dropped.
    monitor_hook = std::make_shared<monitor::SampleHook>();
    monitor_hook->set([list = hook_list](const MetricsSnapshot& snapshot) {
      std::vector<std::shared_ptr<monitor::SampleHook>> live;
      {
        std::lock_guard<std::mutex> lock(list->mu);
        std::erase_if(list->hooks, [&](const std::weak_ptr<monitor::SampleHook>& w) {
          auto h = w.lock();
          if (!h) return true;
          live.push_back(std::move(h));  // `h` is empty now: decide before
          return false;
        });
      }
      for (const auto& h : live) h->call(snapshot);
    });
  }

  transport::TcpTransport* tcp = nullptr;
  transport::verbs::VerbsTransport* verbs = nullptr;
  transport::shm::ShmTransport* shm = nullptr;
  std::unique_ptr<monitor::Monitor> monitor;  // with verbs (it samples its receive queues)
  std::shared_ptr<monitor::SampleHook> monitor_hook;
  std::shared_ptr<HookList> hook_list;
};

LoopTransports& of(reactor::Reactor& loop) {
  return static_cast<LoopTransports&>(
      loop.extension([] { return std::unique_ptr<reactor::Reactor::Extension>(new LoopTransports); }));
}

}  // namespace

transport::TcpTransport& loop_tcp(reactor::Reactor& loop) {
  LoopTransports& x = of(loop);
  if (x.tcp == nullptr) {
    auto added = loop.add_transport(std::make_unique<transport::TcpTransport>(loop.config()));
    if (!added.ok()) throw std::runtime_error(added.status().message());
    x.tcp = static_cast<transport::TcpTransport*>(added.value());
  }
  return *x.tcp;
}

Result<transport::verbs::VerbsTransport*> loop_verbs(reactor::Reactor& loop) {
  LoopTransports& x = of(loop);
  if (x.verbs != nullptr) return x.verbs;
  auto created = transport::verbs::VerbsTransport::create(loop.config());
  if (!created.ok()) return created.status();
  auto added = loop.add_transport(std::move(created.value()));
  if (!added.ok()) return added.status();
  x.verbs = static_cast<transport::verbs::VerbsTransport*>(added.value());
  base::log().debug("slotrpc: {}: verbs transport on {}", loop.name(), x.verbs->device().describe());
  // The monitor samples what this loop's verbs sessions use: the device
  // port's counters and the loop's receive queues (transport/verbs/monitor.h).
  if (loop.config().monitor_interval_ms != 0) {
    x.monitor = std::make_unique<monitor::Monitor>(loop, *x.verbs, x.monitor_hook);
  }
  return x.verbs;
}

Result<transport::shm::ShmTransport*> loop_shm(reactor::Reactor& loop) {
  LoopTransports& x = of(loop);
  if (x.shm != nullptr) return x.shm;
  auto added = loop.add_transport(std::make_unique<transport::shm::ShmTransport>(loop.config()));
  if (!added.ok()) return added.status();
  x.shm = static_cast<transport::shm::ShmTransport*>(added.value());
  base::log().debug("slotrpc: {}: shm transport", loop.name());
  return x.shm;
}

monitor::Monitor* loop_monitor(reactor::Reactor& loop) { return of(loop).monitor.get(); }

void set_monitor_hook(reactor::Reactor& loop, std::shared_ptr<monitor::SampleHook> hook) {
  of(loop).monitor_hook = std::move(hook);
}

void add_monitor_hook(reactor::Reactor& loop, const std::shared_ptr<monitor::SampleHook>& hook) {
  HookList& list = *of(loop).hook_list;
  std::lock_guard<std::mutex> lock(list.mu);
  list.hooks.push_back(hook);
}

}  // namespace slotrpc::rpc
