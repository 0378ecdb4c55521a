#include "core/loop.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "base/logging.h"

namespace slotrpc::core {

namespace {
thread_local Loop* tls_loop = nullptr;
}

Loop::Loop(const Config& config, std::string name)
    : config_(config), name_(std::move(name)), fibers_(size_t{config.fiber_stack_kb} * 1024) {
  event_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (event_fd_ < 0) throw std::runtime_error(std::string("slotrpc loop: ") + std::strerror(errno));
}

Loop::~Loop() { ::close(event_fd_); }

Loop* Loop::current() { return tls_loop; }

void Loop::enter_thread() {
  thread_id_.store(std::this_thread::get_id());
  tls_loop = this;
}

void Loop::leave_thread() { tls_loop = nullptr; }

void Loop::log_dropped(const char* what, const char* message) {
  if (message != nullptr)
    base::log().error("slotrpc: {}: {} threw, dropped: {}", name_, what, message);
  else
    base::log().error("slotrpc: {}: {} threw a non-standard exception, dropped", name_, what);
}

void Loop::post(Task task) {
  inbox_.push(std::move(task));
  wake();
}

void Loop::run_or_post(Task task) {
  if (on_this_thread()) {
    task();
  } else {
    post(std::move(task));
  }
}

void Loop::ring(Doorbell* d) {
  Doorbell* head = doorbells_.load(std::memory_order_relaxed);
  do {
    d->next = head;
  } while (!doorbells_.compare_exchange_weak(head, d, std::memory_order_release,
                                             std::memory_order_relaxed));
  wake();
}

// All rung doorbells at once (a stack: no order between them; each owner
// orders its own queue).  `next` is read before `run`, which may ring the
// doorbell again or free it.
bool Loop::run_doorbells() {
  if (doorbells_.load(std::memory_order_relaxed) == nullptr) return false;
  Doorbell* d = doorbells_.exchange(nullptr, std::memory_order_acquire);
  while (d != nullptr) {
    Doorbell* next = d->next;
    run_guarded("a doorbell", [d] { d->run(d); });
    d = next;
  }
  return true;
}

void Loop::wake() {
  // Pairs with the fence in the reactor's sleep: either the loop sees the
  // new task before sleeping, or we see that it sleeps and wake it.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (sleeping_.load(std::memory_order_relaxed)) ::eventfd_write(event_fd_, 1);
}

// A session going away: its places in this turn's lists are cleared, so
// that no stamp or flush reaches it after it is destroyed.
void Loop::forget(SessionBase* s) {
  if (s->heard_queued) {
    s->heard_queued = false;
    for (auto& p : heard_list_)
      if (p == s) p = nullptr;
  }
  if (!s->flush_queued) return;
  s->flush_queued = false;
  for (auto& p : flush_list_)
    if (p == s) p = nullptr;
  for (auto& p : flushing_)  // forgotten while another session flushes
    if (p == s) p = nullptr;
}

}  // namespace slotrpc::core
