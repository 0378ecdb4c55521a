// The server half of the binding: Server, and what a Python handler sees
// of its call (ServerCall).
//
// A Python handler runs on a fiber of the server's event loop with the GIL
// held (a thread state of its own, common.h).  While it runs Python code it
// holds its loop: the loop's other sessions wait, as they would for a C++
// handler that computes.  Whenever it waits on the network (a stream read
// or write, read_bulk, write_bulk, a call it makes) only its fiber suspends
// and the GIL is released, so the loop serves on.  Handlers that compute
// for long should hand the work to a thread and wait for it.
#include <slotrpc/fiber.h>
#include <slotrpc/server.h>
#include <slotrpc/stream.h>
#include <slotrpc/service.h>

#include <map>

#include "common.h"

namespace slotrpc_py {

namespace {

using slotrpc::ServerCall;
using slotrpc::Status;
using slotrpc::StatusCode;

// What a handler sees of its call; valid only while the handler runs.
class PyServerCall {
 public:
  explicit PyServerCall(ServerCall& call) : call_(&call) {}

  ServerCall& call() {
    if (call_ == nullptr)
      throw py::value_error("this ServerCall is over: its handler returned");
    return *call_;
  }
  // What moves data (stream reads and writes, bulk) runs on the handler's
  // fiber only, not on a worker thread (Server(max_workers=...)).
  ServerCall& fiber_call(const char* what) {
    ServerCall& c = call();
    if (!slotrpc::this_fiber::in_fiber())
      throw py::value_error(std::string(what) +
                            ": only on the server's event loop; a handler on a worker thread "
                            "(max_workers) has its request and its reply only");
    return c;
  }
  void end() {
    drop_last();
    call_ = nullptr;
  }

  bool cancelled() { return call().cancelled(); }
  py::object time_remaining() {
    auto d = call().deadline();
    if (!d) return py::none();
    const double s = std::chrono::duration<double>(*d - std::chrono::steady_clock::now()).count();
    return py::float_(s > 0 ? s : 0.0);
  }

  // Client streaming and bidi: the next message (borrowed until the next
  // read() or the handler's return), None once the client half-closed;
  // RpcError when the stream ended otherwise (cancelled, deadline, lost).
  py::object read() {
    ServerCall& c = fiber_call("read()");
    if (c.inbound() == nullptr) throw py::value_error("read(): this call has no client stream");
    drop_last();  // read() gives the previous message's slot back
    std::span<const std::byte> msg;
    Status status;
    bool got = false;
    {
      Unlocked unlocked;
      got = c.inbound()->read(c.inbound(), &msg, &status);
    }
    if (!got) {
      if (!status.ok()) raise_status(status);
      return py::none();
    }
    last_ = wrap_message(new Message(msg, py::none()));
    return last_;
  }

  // Server streaming and bidi: sends one message; False once the stream is
  // over (the client cancelled, the deadline passed, the session closed).
  bool write(const py::object& reply) {
    ServerCall& c = fiber_call("write()");
    if (c.stream() == nullptr) throw py::value_error("write(): this call has no server stream");
    PyBytes b(reply, false, "a reply");
    Unlocked unlocked;
    return c.stream()->write(
        [&b](flatbuffers::FlatBufferBuilder& fbb) {
          fbb.PushFlatBuffer(reinterpret_cast<const uint8_t*>(b.data), b.size);
        },
        &write_error_);
  }

  // Bulk: into / from a buffer, or a Region (all of it).
  uint64_t read_bulk(size_t i, const py::object& into, uint64_t offset) {
    return bulk(true, i, into, offset);
  }
  uint64_t write_bulk(size_t i, const py::object& src, uint64_t offset) {
    return bulk(false, i, src, offset);
  }

 private:
  uint64_t bulk(bool incoming, size_t i, const py::object& buf, uint64_t offset) {
    ServerCall& c = fiber_call(incoming ? "read_bulk()" : "write_bulk()");
    Status st;
    size_t length = 0;
    if (py::isinstance<Region>(buf)) {
      Region& r = buf.cast<Region&>();
      length = r.size();
      Unlocked unlocked;
      st = incoming ? c.read_bulk(i, r.region, 0, length, offset) : c.write_bulk(i, r.region, 0, length, offset);
    } else {
      PyBytes b(buf, incoming, incoming ? "read_bulk(into=)" : "write_bulk");
      length = b.size;
      Unlocked unlocked;
      st = incoming ? c.read_bulk(i, std::span<std::byte>(b.data, b.size), offset)
                    : c.write_bulk(i, std::span<const std::byte>(b.data, b.size), offset);
    }
    if (!st.ok()) raise_status(st);
    return length;
  }
  void drop_last() {
    if (last_) {
      message_of(last_).release();
      last_ = py::object();
    }
  }

  ServerCall* call_;
  py::object last_;
  Status write_error_;
};

struct PyServer {
  std::unique_ptr<slotrpc::Server> server;
  std::map<std::string, slotrpc::ServiceDefinition> pending;
  // The handlers' Python functions: the C++ handlers hold plain pointers,
  // so that nothing on an event loop ever drops a reference.
  std::vector<py::object> handlers;
  bool started = false;

  ~PyServer() {
    if (server) {
      Unlocked unlocked;
      server.reset();
    }
  }
};

slotrpc::Handler make_handler(PyObject* fn, slotrpc::MethodKind kind) {
  return [fn, kind](ServerCall& call) -> Status {
    if (_Py_IsFinalizing())
      return Status(StatusCode::kUnavailable, "the server's Python interpreter is exiting");
    FiberPython python;
    Status status;
    try {
      // Raw pointers kept beside the objects: a cast<T&>() back costs a
      // pybind11 type lookup (a hash of the type's name) per call.
      auto* pcall = new PyServerCall(call);
      static const py::detail::type_info* call_type = py::detail::get_type_info(typeid(PyServerCall));
      py::object ctx = py::reinterpret_steal<py::object>(py::detail::type_caster_generic::cast(
          pcall, py::return_value_policy::take_ownership, py::handle(), call_type, nullptr, nullptr));
      py::object request = py::none();
      Message* msg = nullptr;
      if (kind == slotrpc::MethodKind::kUnary || kind == slotrpc::MethodKind::kServerStream) {
        msg = new Message(call.request(), py::none());
        request = wrap_message(msg);
      }
      try {
        py::object result = py::reinterpret_borrow<py::object>(fn)(request, ctx);
        if (kind == slotrpc::MethodKind::kUnary || kind == slotrpc::MethodKind::kClientStream) {
          if (result.is_none()) {
            status = Status(StatusCode::kInternal, call.method_name() + ": the handler returned no reply");
          } else {
            PyBytes b(result, false, "a handler's reply");
            call.reply().PushFlatBuffer(reinterpret_cast<const uint8_t*>(b.data), b.size);
          }
        }
      } catch (py::error_already_set& e) {
        status = status_of(e, call.method_name());
      }
      if (msg != nullptr) msg->release();
      pcall->end();
    } catch (py::error_already_set& e) {
      status = status_of(e, call.method_name());
    }
    return status;
  };
}

}  // namespace

void bind_server(py::module_& m) {
  // A handler fiber waits for its worker thread without holding the loop.
  py::class_<slotrpc::Notifier>(m, "Notifier")
      .def(py::init<>())
      .def("notify", [](slotrpc::Notifier& n) { n.notify(); })
      .def("wait", [](slotrpc::Notifier& n) {
        Unlocked unlocked;
        n.wait();
      });

  // An async handler's bridge runs a stream read on a fiber of its own, so
  // that a bidi handler can write while a read waits (slotrpc/_aio_server.py).
  m.def(
      "spawn",
      [](py::object fn) {
        if (!slotrpc::this_fiber::in_fiber())
          throw py::value_error("spawn(): only in a handler, on the server's event loop");
        PyObject* f = fn.release().ptr();  // dropped on the new fiber, with the GIL
        const bool ok = slotrpc::this_fiber::spawn([f] {
          FiberPython python;
          py::object run = py::reinterpret_steal<py::object>(f);
          try {
            run();
          } catch (py::error_already_set& e) {
            e.discard_as_unraisable("slotrpc: a handler's fiber");
          }
        });
        if (!ok) {
          Py_DECREF(f);
          throw py::value_error("spawn(): the event loop refused a new fiber");
        }
      },
      py::arg("fn"), "runs fn() on a new fiber of this handler's event loop (in a handler only)");

  py::class_<PyServerCall>(m, "ServerCall", "What a handler sees of its call (valid while it runs)")
      .def("cancelled", &PyServerCall::cancelled)
      .def("time_remaining", &PyServerCall::time_remaining, "seconds to the caller's deadline, or None")
      .def("peer", [](PyServerCall& c) { return c.call().peer(); })
      .def_property_readonly("method_name", [](PyServerCall& c) { return c.call().method_name(); })
      .def("read", &PyServerCall::read)
      .def("write", &PyServerCall::write, py::arg("reply"))
      .def_property_readonly("bulk_in_count", [](PyServerCall& c) { return c.call().bulk_in_count(); })
      .def_property_readonly("bulk_out_count", [](PyServerCall& c) { return c.call().bulk_out_count(); })
      .def("bulk_in", [](PyServerCall& c, size_t i) { return c.call().bulk_in(i); })
      .def("bulk_out", [](PyServerCall& c, size_t i) { return c.call().bulk_out(i); })
      .def("read_bulk", &PyServerCall::read_bulk, py::arg("i"), py::arg("into"), py::arg("offset") = 0)
      .def("write_bulk", &PyServerCall::write_bulk, py::arg("i"), py::arg("src"), py::arg("offset") = 0);

  py::class_<PyServer>(m, "Server")
      .def(py::init([](const py::dict& settings) {
             auto* s = new PyServer;
             s->server = std::make_unique<slotrpc::Server>(config_from(settings));
             return s;
           }),
           py::arg("settings") = py::dict())
      .def(
          "add_method",
          [](PyServer& s, const std::string& service, const std::string& method, int kind, py::object fn) {
            if (s.started) throw py::value_error("add_method() after start()");
            if (kind < 0 || kind > 3) throw py::value_error("kind must be 0..3 (MethodKind)");
            auto it = s.pending.try_emplace(service, service).first;
            s.handlers.push_back(fn);
            const auto k = static_cast<slotrpc::MethodKind>(kind);
            it->second.add_method(method, make_handler(fn.ptr(), k), nullptr, k);
            return slotrpc::method_id(service + "." + method);
          },
          py::arg("service"), py::arg("method"), py::arg("kind"), py::arg("handler"))
      .def("start",
           [](PyServer& s, const std::string& address) {
             if (s.started) throw py::value_error("start() called twice");
             for (auto& [name, def] : s.pending) {
               Status st = s.server->add_service(std::move(def));
               if (!st.ok()) raise_status(st);
             }
             s.pending.clear();
             s.started = true;
             Status st;
             {
               Unlocked unlocked;
               st = s.server->start(address);
             }
             if (!st.ok()) raise_status(st);
           },
           py::arg("address"))
      .def_property_readonly("port", [](PyServer& s) { return s.server->port(); })
      .def_property_readonly("session_count", [](PyServer& s) { return s.server->session_count(); })
      .def("stop",
           [](PyServer& s) {
             Unlocked unlocked;
             s.server->stop();
           })
      .def(
          "register_memory",
          [](PyServer& s, const py::object& obj) {
            auto r = std::make_unique<Region>();
            r->bytes.emplace(obj, false, "register_memory");
            auto mr = s.server->register_memory(std::span<std::byte>(r->bytes->data, r->bytes->size));
            if (!mr.ok()) raise_status(mr.status());
            r->region = std::move(mr.value());
            return r;
          },
          py::arg("obj"));
}

}  // namespace slotrpc_py
