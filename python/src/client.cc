// The client half of the binding: Channel, calls of the four kinds, their
// futures and streams.  Every wait releases the GIL; a wait on a plain
// thread wakes every 100 ms to let Python handle a signal (Ctrl-C cancels
// the call), a wait in a handler's fiber suspends only the fiber.
#include <slotrpc/fiber.h>
#include <slotrpc/stream.h>

#include <pybind11/stl.h>

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <mutex>
#include <system_error>

#include "common.h"

namespace slotrpc_py {

namespace {

using namespace std::chrono_literals;
using slotrpc::RawReply;
using slotrpc::Status;
using slotrpc::StatusCode;

// -------------------------------------------------------------- settings

template <class T>
void set_uint(T& field, const py::handle& value) {
  field = value.cast<T>();
}

}  // namespace

slotrpc::Config config_from(const py::dict& settings) {
  slotrpc::Config c;
  for (auto [key_obj, value] : settings) {
    const std::string key = py::str(key_obj);
    if (key == "transport") {
      const std::string t = py::str(value);
      if (t == "auto") c.transport = slotrpc::TransportKind::kAuto;
      else if (t == "tcp") c.transport = slotrpc::TransportKind::kTcp;
      else if (t == "verbs") c.transport = slotrpc::TransportKind::kVerbs;
      else if (t == "shm") c.transport = slotrpc::TransportKind::kShm;
      else throw py::value_error("invalid setting transport='" + t + "' (allowed: auto, tcp, verbs, shm)");
    } else if (key == "slot_count") set_uint(c.slot_count, value);
    else if (key == "slot_size") set_uint(c.slot_size, value);
    else if (key == "stream_window") set_uint(c.stream_window, value);
    else if (key == "connect_timeout_ms") set_uint(c.connect_timeout_ms, value);
    else if (key == "keepalive_ms") set_uint(c.keepalive_ms, value);
    else if (key == "peer_timeout_ms") set_uint(c.peer_timeout_ms, value);
    else if (key == "reactor_threads") set_uint(c.reactor_threads, value);
    else if (key == "max_bulk_bytes") set_uint(c.max_bulk_bytes, value);
    else if (key == "log_level") c.log_level = py::str(value);
    else
      throw py::type_error("unknown setting '" + key +
                           "' (known: transport, slot_count, slot_size, stream_window, "
                           "connect_timeout_ms, keepalive_ms, peer_timeout_ms, reactor_threads, "
                           "max_bulk_bytes, log_level; every setting also reads its SLOTRPC_* "
                           "environment variable, docs/tuning.md)");
  }
  return c;
}

namespace {

// Copies a finished FlatBuffer into the send slot's builder: offsets in a
// FlatBuffer are relative, so the finished bytes are a valid buffer wherever
// they land, and flatbuffers.Builder.Output() is padded to its alignment.
slotrpc::RequestWriter writer_of(std::shared_ptr<const std::string> bytes) {
  return [bytes = std::move(bytes)](flatbuffers::FlatBufferBuilder& fbb) {
    fbb.PushFlatBuffer(reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size());
  };
}

// Waits for `ready` (checked under `mu`, signalled on `cv`) with the GIL
// released.  On a plain thread it wakes every 100 ms for Python's signal
// handlers; one that raises runs `cancel` and propagates.
template <class Ready>
void wait_ready(std::mutex& mu, std::condition_variable& cv, Ready ready,
                const std::function<void()>& cancel) {
  for (;;) {
    {
      Unlocked unlocked;
      std::unique_lock<std::mutex> lock(mu);
      if (cv.wait_for(lock, 100ms, ready)) return;
    }
    if (PyErr_CheckSignals() != 0) {
      py::error_already_set error;
      if (cancel) cancel();
      {
        // The call's buffers stay in use until it completes.
        Unlocked unlocked;
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, ready);
      }
      throw error;
    }
  }
}

}  // namespace

// The same for a call's state, through the library's public wait
// (Future::wait_for in 100 ms slices), so that a caller waits as a C++
// client's Future does.
void wait_future(const slotrpc::Future<RawReply>& f, const std::function<void()>& cancel) {
  for (;;) {
    {
      Unlocked unlocked;
      if (f.wait_for(100ms)) return;
    }
    if (PyErr_CheckSignals() != 0) {
      py::error_already_set error;
      if (cancel) cancel();
      {
        // The call's buffers stay in use until it completes.
        Unlocked unlocked;
        while (!f.wait_for(1h)) {
        }
      }
      throw error;
    }
  }
}

namespace {

// Where an asyncio loop learns that calls completed (slotrpc/aio.py): the
// channel's loop pushes the call's token and writes the eventfd only when
// the queue was empty, without the GIL; the asyncio loop reads the fd
// (add_reader) and drains every token at once.  One wake-up then serves
// all the replies that arrived meanwhile, and the channel's loop never
// waits for the GIL to post one.
struct CompletionQueue {
  int fd = -1;
  std::mutex mu;
  std::vector<uint64_t> ready;

  CompletionQueue() : fd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    if (fd < 0) throw std::system_error(errno, std::generic_category(), "eventfd");
  }
  ~CompletionQueue() { ::close(fd); }

  void post(uint64_t token) {
    bool wake = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      wake = ready.empty();
      ready.push_back(token);
    }
    if (wake) {
      const uint64_t one = 1;
      [[maybe_unused]] ssize_t n = ::write(fd, &one, sizeof one);
    }
  }
  // The tokens posted since the last drain (the asyncio loop, with the GIL).
  py::list drain() {
    uint64_t count = 0;
    [[maybe_unused]] ssize_t n = ::read(fd, &count, sizeof count);
    std::vector<uint64_t> got;
    {
      std::lock_guard<std::mutex> lock(mu);
      got.swap(ready);
    }
    py::list out(got.size());
    for (size_t i = 0; i < got.size(); ++i) out[i] = py::int_(got[i]);
    return out;
  }
};

// One unary or client-stream reply, as a future.
struct CallState : std::enable_shared_from_this<CallState> {
  slotrpc::detail::SharedState<RawReply> reply;
  slotrpc::CallHandle handle;
  bool taken = false;  // result() moved the reply out (the Python wrapper caches it)
  // Python objects, touched only with the GIL held: on the loop, complete()
  // drops them under the GIL, so the state never frees one without it.
  std::vector<py::object> callbacks;
  std::unique_ptr<BulkHold> bulk;
  std::atomic<bool> needs_python{false};

  // An asyncio waiter's queue and token (notify_queue); under reply.mu.
  std::shared_ptr<CompletionQueue> queue;
  uint64_t token = 0;

  // The channel's loop: the reply arrived.
  void complete(RawReply&& raw) {
    reply.set(std::move(raw));
    std::shared_ptr<CompletionQueue> q;
    {
      std::lock_guard<std::mutex> lock(reply.mu);
      q = queue;
    }
    if (q) q->post(token);
    if (!needs_python.load()) return;
    FiberPython python;
    std::vector<py::object> run;
    {
      std::lock_guard<std::mutex> lock(reply.mu);
      run.swap(callbacks);
      bulk.reset();  // the server can no longer reach the buffers
    }
    for (py::object& fn : run) {
      try {
        fn();
      } catch (py::error_already_set& e) {
        e.discard_as_unraisable("slotrpc: a done callback");
      }
    }
    run.clear();
  }

  bool done() { return reply.ready(); }

  void wait() {
    if (slotrpc::this_fiber::in_fiber()) {
      Unlocked unlocked;
      reply.wait();
      return;
    }
    if (reply.ready()) return;
    // A Future over this state (sharing its ownership) for the public wait.
    const slotrpc::Future<RawReply> f(
        std::shared_ptr<slotrpc::detail::SharedState<RawReply>>(shared_from_this(), &reply));
    wait_future(f, [this] { handle.cancel(); });
  }

  py::object result(py::object reply_type) {
    wait();
    RawReply* raw = nullptr;
    {
      std::lock_guard<std::mutex> lock(reply.mu);
      raw = &*reply.value;
    }
    if (!raw->ok()) raise_status(raw->status());
    if (taken) throw py::value_error("result() already taken");
    taken = true;
    // The Message takes the slot.
    return wrap_message(new Message(std::move(*raw), std::move(reply_type)));
  }
};

std::shared_ptr<CallState> start_call(PyChannel& self, uint32_t id, const py::object& request,
                                      const py::object& timeout, const py::object& send_bulk,
                                      const py::object& receive_bulk, bool idempotent,
                                      uint32_t max_retries, std::shared_ptr<CompletionQueue> queue = nullptr,
                                      uint64_t token = 0) {
  std::shared_ptr<slotrpc::Channel> keep = self.get();
  slotrpc::Channel& ch = *keep;
  auto bytes = std::make_shared<const std::string>(request_bytes(request));
  slotrpc::CallOptions options = options_for(timeout);
  options.idempotent = idempotent;
  options.max_retries = max_retries;
  auto state = std::make_shared<CallState>();
  state->queue = std::move(queue);  // before the call: no reply can precede it
  state->token = token;
  if (!send_bulk.is_none() || !receive_bulk.is_none()) {
    state->bulk = std::make_unique<BulkHold>();
    add_bulk(options, send_bulk, receive_bulk, *state->bulk);
    state->needs_python = true;
  }
  Unlocked unlocked;
  slotrpc::CallHandle handle =
      slotrpc::raw::call(ch, id, writer_of(std::move(bytes)), std::move(options),
              [state](RawReply&& raw) { state->complete(std::move(raw)); });
  keep.reset();  // without the GIL: it may be the last reference (close() raced)
  std::lock_guard<std::mutex> lock(state->reply.mu);
  state->handle = handle;
  return state;
}

// -------------------------------------------------------------- streams

// An asyncio reader's wake-up for a stream (slotrpc/aio.py): armed when the
// reader found nothing to read, fired (once) by the next message or the
// end, which posts the token to the reader's CompletionQueue.  Both sides
// hold `mu`, and the arming side checks the stream under it, so a message
// that lands in between is not missed.
struct StreamNotify {
  std::mutex mu;
  std::shared_ptr<CompletionQueue> queue;  // set while armed
  uint64_t token = 0;

  void fire() {
    std::shared_ptr<CompletionQueue> q;
    uint64_t t = 0;
    {
      std::lock_guard<std::mutex> lock(mu);
      q.swap(queue);
      t = token;
    }
    if (q) q->post(t);
  }
};

// A server stream's messages, or a bidi call's replies.
struct InStream {
  std::shared_ptr<slotrpc::detail::StreamState> state = std::make_shared<slotrpc::detail::StreamState>();
  std::shared_ptr<StreamNotify> notify = std::make_shared<StreamNotify>();
  std::function<void()> cancel;

  // What the channel's loop calls: the state, then an armed reader.
  std::function<void(RawReply&&)> on_message() {
    return [st = state, n = notify](RawReply&& m) {
      st->push(std::move(m));
      n->fire();
    };
  }
  std::function<void(Status)> on_end() {
    return [st = state, n = notify](Status s) {
      st->finish(std::move(s));
      n->fire();
    };
  }

  bool ready() {
    std::lock_guard<std::mutex> lock(state->mu);
    return !state->messages.empty() || state->end.has_value();
  }
  // Posts `token` to `q` once a message or the end is there (now, if it is).
  void arm(std::shared_ptr<CompletionQueue> q, uint64_t token) {
    {
      std::lock_guard<std::mutex> lock(notify->mu);
      if (!ready()) {
        notify->queue = std::move(q);
        notify->token = token;
        return;
      }
    }
    q->post(token);
  }
  // The next message without waiting: a Message, None at an OK end,
  // Ellipsis when nothing has arrived yet; RpcError at an error end.
  py::object try_next(py::object reply_type) {
    if (!ready()) return py::ellipsis();
    return next(std::move(reply_type));  // does not wait
  }

  // The next message, or None at an OK end; raises RpcError at another.
  py::object next(py::object reply_type) {
    auto& st = *state;
    // In a handler's fiber pop() below suspends the fiber.
    if (!slotrpc::this_fiber::in_fiber())
      wait_ready(st.mu, st.cv, [&st] { return !st.messages.empty() || st.end.has_value(); }, cancel);
    std::optional<RawReply> m;
    {
      Unlocked unlocked;
      m = st.pop();
    }
    if (!m) {
      Status end;
      {
        std::lock_guard<std::mutex> lock(st.mu);
        end = *st.end;
      }
      if (!end.ok()) raise_status(end);
      return py::none();
    }
    if (!m->ok()) raise_status(m->status());
    return wrap_message(new Message(std::move(*m), std::move(reply_type)));
  }
};

// A client-streaming or bidi call's outgoing half, with its reply (client
// streaming) or its incoming stream (bidi).
struct OutCall {
  std::shared_ptr<slotrpc::detail::OutStreamState> out;
  std::shared_ptr<CallState> reply;  // client streaming
  std::shared_ptr<InStream> in;      // bidi
  Status write_status;
  bool writes_done = false;

  // False once the stream is over (the reply or the end status says why).
  bool write(const py::object& request) {
    if (writes_done) throw py::value_error("write() after writes_done()");
    PyBytes b(request, false, "a request");
    Unlocked unlocked;
    flatbuffers::FlatBufferBuilder* fbb = slotrpc::detail::out_begin(*out, &write_status);
    if (fbb == nullptr) return false;
    try {
      fbb->PushFlatBuffer(reinterpret_cast<const uint8_t*>(b.data), b.size);
    } catch (...) {
      slotrpc::detail::out_abandon(*out, std::current_exception(), &write_status);
      return false;
    }
    return slotrpc::detail::out_commit(*out, &write_status);
  }
  void done_writing() {
    if (writes_done) return;
    writes_done = true;
    Unlocked unlocked;
    slotrpc::detail::out_writes_done(*out);
  }
  void cancel() {
    Unlocked unlocked;
    out->post_cancel();
  }
};

}  // namespace

void bind_client(py::module_& m) {
  py::class_<CallState, std::shared_ptr<CallState>>(m, "CallFuture",
                                                    "A unary or client-streaming call in flight")
      .def("result", &CallState::result, py::arg("reply_type") = py::none(),
           "waits; the reply Message, or raises RpcError")
      .def("done", &CallState::done)
      .def("cancel",
           [](CallState& s) {
             s.handle.cancel();
             return !s.done();
           })
      .def(
          "notify_queue",
          [](CallState& s, std::shared_ptr<CompletionQueue> q, uint64_t token) {
            // Posts `token` to `q` when the call completes (now, if it has).
            {
              std::lock_guard<std::mutex> lock(s.reply.mu);
              if (!s.reply.value) {
                s.queue = std::move(q);
                s.token = token;
                return;
              }
            }
            q->post(token);
          },
          py::arg("queue"), py::arg("token"))
      .def("add_done_callback",
           [](CallState& s, py::object fn) {
             // Runs on the channel's event loop (with the GIL), or at once
             // when the call is already done.
             s.needs_python = true;
             {
               std::lock_guard<std::mutex> lock(s.reply.mu);
               if (!s.reply.value) {
                 s.callbacks.push_back(std::move(fn));
                 return;
               }
             }
             fn();
           });

  py::class_<CompletionQueue, std::shared_ptr<CompletionQueue>>(m, "CompletionQueue")
      .def(py::init<>())
      .def("fileno", [](CompletionQueue& q) { return q.fd; })
      .def("post", &CompletionQueue::post, py::arg("token"),
           "queues token; wakes the reader only if the queue was empty")
      .def("drain", &CompletionQueue::drain, "the tokens of the calls completed since the last drain");

  py::class_<InStream, std::shared_ptr<InStream>>(m, "InStream")
      .def("next", &InStream::next, py::arg("reply_type") = py::none(), "the next Message; None at the end; RpcError on an error end")
      .def("try_next", &InStream::try_next, py::arg("reply_type") = py::none(),
           "as next(), but Ellipsis instead of waiting")
      .def("notify_queue", &InStream::arm, py::arg("queue"), py::arg("token"),
           "posts token to queue once a message or the end is there")
      .def("cancel", [](InStream& s) {
        if (s.cancel) {
          Unlocked unlocked;
          s.cancel();
        }
      });

  py::class_<OutCall, std::shared_ptr<OutCall>>(m, "OutCall")
      .def("write", &OutCall::write, py::arg("request"))
      .def("writes_done", &OutCall::done_writing)
      .def("cancel", &OutCall::cancel)
      .def_property_readonly("reply", [](OutCall& c) { return c.reply; })
      .def_property_readonly("replies", [](OutCall& c) { return c.in; })
      .def_property_readonly("write_status", [](OutCall& c) {
        return py::make_tuple(static_cast<int>(c.write_status.code()), c.write_status.message());
      });

  py::class_<PyChannel>(m, "Channel")
      .def(py::init([](const std::string& address, const py::dict& settings) {
             slotrpc::Config config = config_from(settings);
             slotrpc::Result<std::unique_ptr<slotrpc::Channel>> r = [&] {
               Unlocked unlocked;
               return slotrpc::Channel::connect(address, config);
             }();
             if (!r.ok()) raise_status(r.status());
             auto* c = new PyChannel;
             c->channel = std::shared_ptr<slotrpc::Channel>(std::move(r.value()));
             return c;
           }),
           py::arg("address"), py::arg("settings") = py::dict())
      .def("call",
           [](PyChannel& self, uint32_t id, const py::object& request, const py::object& timeout,
              const py::object& send_bulk, const py::object& receive_bulk, bool idempotent, uint32_t max_retries) {
             return start_call(self, id, request, timeout, send_bulk, receive_bulk, idempotent, max_retries);
           },
           py::arg("method_id"), py::arg("request"), py::arg("timeout") = py::none(),
           py::arg("send_bulk") = py::none(), py::arg("receive_bulk") = py::none(),
           py::arg("idempotent") = false, py::arg("max_retries") = 0)
      .def(
          "call_queued",
          [](PyChannel& self, uint32_t id, const py::object& request, std::shared_ptr<CompletionQueue> queue,
             uint64_t token, const py::object& timeout, const py::object& send_bulk, const py::object& receive_bulk,
             bool idempotent, uint32_t max_retries) {
            // call() and notify_queue() in one: the asyncio client's per-call path.
            return start_call(self, id, request, timeout, send_bulk, receive_bulk, idempotent, max_retries,
                              std::move(queue), token);
          },
          "call() that posts `token` to `queue` when it completes")
      .def(
          "call_stream",
          [](PyChannel& self, uint32_t id, const py::object& request, const py::object& timeout) {
            std::shared_ptr<slotrpc::Channel> keep = self.get();
            slotrpc::Channel& ch = *keep;
            auto bytes = std::make_shared<const std::string>(request_bytes(request));
            slotrpc::CallOptions options = options_for(timeout);
            auto in = std::make_shared<InStream>();
            Unlocked unlocked;
            slotrpc::CallHandle h = slotrpc::raw::call_stream(ch,
                id, writer_of(std::move(bytes)), std::move(options),
                in->on_message(), in->on_end());
            in->cancel = [h] { h.cancel(); };
            keep.reset();  // without the GIL, as in call()
            return in;
          },
          py::arg("method_id"), py::arg("request"), py::arg("timeout") = py::none())
      .def(
          "open_stream",
          [](PyChannel& self, uint32_t id, bool bidi, const py::object& timeout) {
            std::shared_ptr<slotrpc::Channel> keep = self.get();
            slotrpc::Channel& ch = *keep;
            slotrpc::CallOptions options = options_for(timeout);
            auto call = std::make_shared<OutCall>();
            if (bidi) {
              call->in = std::make_shared<InStream>();
              Unlocked unlocked;
              call->out = slotrpc::raw::open_stream(
                  ch, id, true, std::move(options), call->in->on_message(), call->in->on_end());
              keep.reset();  // without the GIL, as in call()
              std::weak_ptr<slotrpc::detail::OutStreamState> out = call->out;
              call->in->cancel = [out] {
                if (auto o = out.lock()) o->post_cancel();
              };
            } else {
              call->reply = std::make_shared<CallState>();
              auto st = call->reply;
              Unlocked unlocked;
              call->out = slotrpc::raw::open_stream(ch,
                  id, false, std::move(options), [st](RawReply&& m) { st->complete(std::move(m)); },
                  nullptr);
              keep.reset();  // without the GIL, as in call()
              std::weak_ptr<slotrpc::detail::OutStreamState> out = call->out;
              st->handle = slotrpc::CallHandle([out] {
                if (auto o = out.lock()) o->post_cancel();
              });
            }
            return call;
          },
          py::arg("method_id"), py::arg("bidi"), py::arg("timeout") = py::none())
      .def(
          "register_memory",
          [](PyChannel& self, const py::object& obj) {
            auto r = std::make_unique<Region>();
            r->bytes.emplace(obj, false, "register_memory");
            slotrpc::Result<slotrpc::MemoryRegion> mr =
                self.get()->register_memory(std::span<std::byte>(r->bytes->data, r->bytes->size));
            if (!mr.ok()) raise_status(mr.status());
            r->region = std::move(mr.value());
            return r;
          },
          py::arg("obj"))
      .def_property_readonly("transport",
                             [](PyChannel& self) { return std::string(slotrpc::to_string(self.get()->transport())); })
      .def_property_readonly("peer", [](PyChannel& self) { return self.get()->peer(); })
      .def_property_readonly("slot_size", [](PyChannel& self) { return self.get()->slot_size(); })
      .def("close", [](PyChannel& self) {
        // Fails what is outstanding with CANCELLED; waits for the loop
        // (here, or in the last call still being issued).
        std::shared_ptr<slotrpc::Channel> ch = std::move(self.channel);
        Unlocked unlocked;
        ch.reset();
      });
}

}  // namespace slotrpc_py
