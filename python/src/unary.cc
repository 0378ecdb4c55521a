// _core.UnaryMethod: what `stub.Method(request)` calls on a synchronous
// channel.  It is a plain CPython type with a vectorcall entry rather than
// a pybind11 function, because this is the per-call path of every
// synchronous unary call and pybind11's dispatcher, its argument casters
// and its type lookups (a hash of the type's name per cast) cost more
// than the call's own work (callgrind: docs/benchmarks.md, "Python
// binding beside grpcio").
//
// One call issues the request and waits for its reply under a single
// release of the GIL, with the request read in place from the caller's
// bytes (it lives until the call returns, and the call does not return
// before its reply is in), through the library's Future and its public
// wait: Future::wait_for() in 100 ms slices on a plain thread, so that
// Python's signal handlers run (Ctrl-C cancels the call), and
// Future::get() on a handler's fiber, which suspends only the fiber.
#include <slotrpc/fiber.h>
#include <slotrpc/future.h>
#include <slotrpc/raw.h>

#include <chrono>

#include "common.h"  // Python.h first, through pybind11

#include <structmember.h>

namespace slotrpc_py {

namespace {

using namespace std::chrono_literals;
using slotrpc::RawReply;

struct UnaryMethod {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* channel_obj;  // the _core.Channel
  PyChannel* channel;     // inside channel_obj
  PyObject* reply_type;
  PyObject* future;       // future(request, ...): the Future form, in Python
  uint32_t method_id;
  bool idempotent;
};

// Holds the GIL released on a plain thread; restores it on every way out.
class NoGil {
 public:
  NoGil() : ts_(PyEval_SaveThread()) {}
  ~NoGil() { PyEval_RestoreThread(ts_); }
  NoGil(const NoGil&) = delete;
  NoGil& operator=(const NoGil&) = delete;

 private:
  PyThreadState* ts_;
};

// slotrpc._bulk's helpers, for the calls that need them (not the common one).
py::object bulk_helper(const char* name) {
  return py::module_::import("slotrpc._bulk").attr(name);
}

PyObject* call(UnaryMethod* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  // request, timeout=None, send_bulk=None, receive_bulk=None, max_retries=0
  static const char* const kNames[] = {"request", "timeout", "send_bulk", "receive_bulk", "max_retries"};
  constexpr Py_ssize_t kMax = 5;
  PyObject* arg[kMax] = {nullptr, Py_None, Py_None, Py_None, nullptr};
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  if (nargs > kMax) {
    PyErr_Format(PyExc_TypeError, "a unary call takes at most %d arguments (%zd given)", int(kMax), nargs);
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < nargs; ++i) arg[i] = args[i];
  if (kwnames != nullptr) {
    const Py_ssize_t nkw = PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t k = 0; k < nkw; ++k) {
      PyObject* key = PyTuple_GET_ITEM(kwnames, k);
      Py_ssize_t at = -1;
      for (Py_ssize_t i = 0; i < kMax; ++i)
        if (PyUnicode_CompareWithASCIIString(key, kNames[i]) == 0) at = i;
      if (at < 0) {
        PyErr_Format(PyExc_TypeError,
                     "a unary call got an unexpected keyword argument '%U' (known: request, timeout, "
                     "send_bulk, receive_bulk, max_retries)",
                     key);
        return nullptr;
      }
      if (at < nargs) {
        PyErr_Format(PyExc_TypeError, "a unary call got multiple values for argument '%s'", kNames[at]);
        return nullptr;
      }
      arg[at] = args[nargs + k];
    }
  }
  if (arg[0] == nullptr) {
    PyErr_SetString(PyExc_TypeError, "a unary call needs its request");
    return nullptr;
  }
  return guarded([&]() -> PyObject* {
    // The request's bytes, read in place: bytes directly, any other
    // buffer through the buffer protocol, a Builder or a build callback
    // through slotrpc._bulk.message_bytes.
    PyObject* request = arg[0];
    const uint8_t* data = nullptr;
    size_t size = 0;
    std::optional<PyBytes> held;
    py::object built;
    if (PyBytes_CheckExact(request)) {
      data = reinterpret_cast<const uint8_t*>(PyBytes_AS_STRING(request));
      size = static_cast<size_t>(PyBytes_GET_SIZE(request));
    } else {
      if (!PyObject_CheckBuffer(request)) {
        static PyObject* message_bytes = bulk_helper("message_bytes").release().ptr();
        built = py::reinterpret_borrow<py::object>(message_bytes)(py::handle(request));
        request = built.ptr();
      }
      held.emplace(request, false, "a request");
      data = reinterpret_cast<const uint8_t*>(held->data);
      size = held->size;
    }

    slotrpc::CallOptions options = options_for(py::reinterpret_borrow<py::object>(arg[1]));
    options.idempotent = self->idempotent;
    if (arg[4] != nullptr) options.max_retries = py::cast<uint32_t>(py::handle(arg[4]));
    BulkHold bulk;  // destroyed with the GIL held, after the call ended
    if (arg[2] != Py_None || arg[3] != Py_None) {
      static PyObject* bulk_list = bulk_helper("bulk_list").release().ptr();
      py::object send = py::reinterpret_borrow<py::object>(bulk_list)(py::handle(arg[2]));
      py::object receive = py::reinterpret_borrow<py::object>(bulk_list)(py::handle(arg[3]));
      add_bulk(options, send, receive, bulk);
    }

    std::shared_ptr<slotrpc::Channel> keep = self->channel->get();
    // The builder copies the finished request into the send slot; the
    // bytes outlive the call (see the top of the file), so only their
    // address is captured (no allocation: std::function holds it inline).
    auto writer = [data, size](flatbuffers::FlatBufferBuilder& fbb) { fbb.PushFlatBuffer(data, size); };
    slotrpc::Future<RawReply> f;
    RawReply reply;
    if (slotrpc::this_fiber::in_fiber()) {
      // A handler calling out: only its fiber waits.
      Unlocked unlocked;
      f = slotrpc::raw::call(*keep, self->method_id, writer, std::move(options));
      keep.reset();
      reply = f.get();
    } else {
      bool ready = false;
      {
        NoGil unlocked;
        f = slotrpc::raw::call(*keep, self->method_id, writer, std::move(options));
        keep.reset();  // without the GIL: it may be the last reference (close() raced)
        ready = f.wait_for(100ms);
      }
      if (!ready) wait_future(f, [&f] { f.cancel(); });
      reply = f.get();  // ready: does not wait
    }
    if (!reply.ok()) raise_status(reply.status());
    return wrap_message(new Message(std::move(reply), py::reinterpret_borrow<py::object>(self->reply_type)))
        .release()
        .ptr();
  });
}

PyObject* unary_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  static const char* kw[] = {"channel", "method_id", "reply_type", "idempotent", "future", nullptr};
  PyObject* channel = nullptr;
  unsigned long id = 0;
  PyObject* reply_type = Py_None;
  int idempotent = 0;
  PyObject* future = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Ok|OpO:UnaryMethod", const_cast<char**>(kw), &channel, &id,
                                   &reply_type, &idempotent, &future))
    return nullptr;
  PyChannel* ch = nullptr;
  try {
    ch = py::cast<PyChannel*>(py::handle(channel));
  } catch (py::cast_error&) {
    PyErr_SetString(PyExc_TypeError, "UnaryMethod: channel must be a _core.Channel");
    return nullptr;
  }
  auto* self = reinterpret_cast<UnaryMethod*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  self->vectorcall = reinterpret_cast<vectorcallfunc>(&call);
  self->channel_obj = Py_NewRef(channel);
  self->channel = ch;
  self->reply_type = Py_NewRef(reply_type);
  self->future = Py_NewRef(future);
  self->method_id = static_cast<uint32_t>(id);
  self->idempotent = idempotent != 0;
  return reinterpret_cast<PyObject*>(self);
}

int unary_traverse(UnaryMethod* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(self->channel_obj);
  Py_VISIT(self->reply_type);
  Py_VISIT(self->future);
  return 0;
}

int unary_clear(UnaryMethod* self) {
  Py_CLEAR(self->channel_obj);
  Py_CLEAR(self->reply_type);
  Py_CLEAR(self->future);
  return 0;
}

void unary_dealloc(UnaryMethod* self) {
  PyTypeObject* type = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  unary_clear(self);
  type->tp_free(self);
  Py_DECREF(type);
}

PyObject* get_future(UnaryMethod* self, void*) { return Py_NewRef(self->future); }
PyObject* get_reply_type(UnaryMethod* self, void*) { return Py_NewRef(self->reply_type); }
PyObject* get_method_id(UnaryMethod* self, void*) { return PyLong_FromUnsignedLong(self->method_id); }

PyMemberDef unary_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(UnaryMethod, vectorcall), READONLY, nullptr},
    {},
};

PyGetSetDef unary_getset[] = {
    {"future", reinterpret_cast<getter>(get_future), nullptr,
     "future(request, timeout=None, send_bulk=None, receive_bulk=None, max_retries=0): a Future", nullptr},
    {"reply_type", reinterpret_cast<getter>(get_reply_type), nullptr, "the flatc --python reply class", nullptr},
    {"method_id", reinterpret_cast<getter>(get_method_id), nullptr, "the method's id", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

}  // namespace

void bind_unary(py::module_& m) {
  static PyType_Slot slots[] = {
      {Py_tp_new, reinterpret_cast<void*>(&unary_new)},
      {Py_tp_dealloc, reinterpret_cast<void*>(&unary_dealloc)},
      {Py_tp_traverse, reinterpret_cast<void*>(&unary_traverse)},
      {Py_tp_clear, reinterpret_cast<void*>(&unary_clear)},
      {Py_tp_call, reinterpret_cast<void*>(&PyVectorcall_Call)},
      {Py_tp_members, unary_members},
      {Py_tp_getset, unary_getset},
      {Py_tp_doc, const_cast<char*>(
                      "A unary method of a Channel: call it with the request (and timeout=, "
                      "send_bulk=, receive_bulk=, max_retries=) for the reply Message, or RpcError")},
      {0, nullptr},
  };
  static PyType_Spec spec = {"slotrpc._core.UnaryMethod", sizeof(UnaryMethod), 0,
                             Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL, slots};
  PyObject* type = PyType_FromSpec(&spec);
  if (type == nullptr) throw py::error_already_set();
  m.add_object("UnaryMethod", py::reinterpret_steal<py::object>(type));
}

}  // namespace slotrpc_py
