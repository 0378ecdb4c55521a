// The Python binding's shared pieces: the GIL on event-loop fibers, errors,
// messages read in place, buffers and bulk segments.
//
// Threads and the GIL.  Every wait on the network (a call, a stream read, a
// stream write's credit, stop()) releases the GIL, so Python threads and the
// event loops run on.  A Python handler runs on a fiber of a server's event
// loop; a loop runs many fibers on one OS thread, and one of them may suspend
// in the middle of Python code (read_bulk, a stream read or write) while
// another starts.  A single PyThreadState per OS thread would then see two
// interleaved Python stacks, so each handler call gets a PyThreadState of its
// own (FiberPython), taken on entry and given back on return: to Python, a
// fiber looks like a short-lived thread.  PyGILState, which keeps one
// thread state per OS thread, does not know about them: PyGILState_Check()
// is false in a handler while another handler of its loop is suspended, and
// C code that calls PyGILState_Ensure() from a handler (a ctypes callback)
// would wait for the GIL it holds.  pybind11's own thread state is kept per
// fiber below, and the module is compiled with NDEBUG so that pybind11 does
// not assert PyGILState_Check().
#pragma once

#include <pybind11/pybind11.h>

#include <slotrpc/call.h>
#include <slotrpc/channel.h>
#include <slotrpc/future.h>
#include <slotrpc/memory.h>
#include <slotrpc/reply.h>
#include <slotrpc/status.h>

#include <chrono>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace slotrpc_py {

namespace py = pybind11;

// The interpreter the module was imported into (set at import).
extern PyInterpreterState* g_interp;

// pybind11 keeps a per-OS-thread stack of its argument-conversion frames
// (loader_life_support) and expects it LIFO.  Fibers of one loop interleave
// on one OS thread, so each fiber keeps its own top: saved where a fiber
// may suspend (Unlocked) and restored when it continues, and started empty
// for a new handler (FiberPython).
inline PYBIND11_TLS_KEY_REF frames_key() {
#if PYBIND11_INTERNALS_VERSION == 4
  return py::detail::get_local_internals().loader_life_support_tls_key;
#else
  return py::detail::get_internals().loader_life_support_tls_key;
#endif
}
inline void* frames_top() { return PYBIND11_TLS_GET_VALUE(frames_key()); }
inline void set_frames_top(void* top) { PYBIND11_TLS_REPLACE_VALUE(frames_key(), top); }
// Likewise the thread state pybind11's gil_scoped_acquire uses on this OS
// thread (an error_already_set's destructor takes one): it must be the
// running fiber's, or pybind11 would wait for the GIL with another
// fiber's thread state while this one holds it.
inline void* pybind_tstate() { return PYBIND11_TLS_GET_VALUE(py::detail::get_internals().tstate); }
inline void set_pybind_tstate(void* ts) {
  if (ts == nullptr) {
    PYBIND11_TLS_DELETE_VALUE(py::detail::get_internals().tstate);
  } else {
    PYBIND11_TLS_REPLACE_VALUE(py::detail::get_internals().tstate, ts);
  }
}

// Thread states of this OS thread (an event loop's) that no fiber uses:
// creating and deleting one per handler call cost about a microsecond
// each, so a finished call's goes back here for the next.  A state is
// reused only on the OS thread that created it, and only when its fiber's
// Python stack has fully unwound.  The interpreter deletes them at exit.
inline std::vector<PyThreadState*>& idle_thread_states() {
  thread_local std::vector<PyThreadState*> idle;
  return idle;
}

// Holds the GIL with a thread state of its own, on a thread (or fiber) that
// has none: an event loop's fiber running a handler, or a loop callback.
class FiberPython {
 public:
  FiberPython() : ts_(take_thread_state()) {
    PyEval_RestoreThread(ts_);
    outer_frames_ = frames_top();
    set_frames_top(nullptr);
    outer_tstate_ = pybind_tstate();
    set_pybind_tstate(ts_);
  }
  ~FiberPython() {
    set_frames_top(outer_frames_);
    set_pybind_tstate(outer_tstate_);
    std::vector<PyThreadState*>& idle = idle_thread_states();
    if (idle.size() < 64 && !_Py_IsFinalizing()) {
      PyEval_SaveThread();
      idle.push_back(ts_);
      return;
    }
    PyThreadState_Clear(ts_);
    PyThreadState_DeleteCurrent();  // also releases the GIL
  }
  FiberPython(const FiberPython&) = delete;
  FiberPython& operator=(const FiberPython&) = delete;

 private:
  static PyThreadState* take_thread_state() {
    std::vector<PyThreadState*>& idle = idle_thread_states();
    if (idle.empty()) return PyThreadState_New(g_interp);
    PyThreadState* ts = idle.back();
    idle.pop_back();
    return ts;
  }

  PyThreadState* ts_;
  void* outer_frames_ = nullptr;
  void* outer_tstate_ = nullptr;
};

// Releases the GIL for a wait (whatever thread state holds it); the wait
// may suspend a fiber, so this fiber's pybind11 frame stack is restored
// afterwards.
class Unlocked {
 public:
  Unlocked() : frames_(frames_top()), pybind_ts_(pybind_tstate()), ts_(PyEval_SaveThread()) {}
  ~Unlocked() {
    PyEval_RestoreThread(ts_);
    set_frames_top(frames_);
    set_pybind_tstate(pybind_ts_);
  }
  Unlocked(const Unlocked&) = delete;
  Unlocked& operator=(const Unlocked&) = delete;

 private:
  void* frames_;
  void* pybind_ts_;
  PyThreadState* ts_;
};

// A Channel as Python holds it.  Shared, so that close() on one thread
// cannot free the channel under a call another thread is issuing (with
// the GIL released).
struct PyChannel {
  std::shared_ptr<slotrpc::Channel> channel;

  std::shared_ptr<slotrpc::Channel> get() {
    if (!channel) throw py::value_error("channel is closed");
    return channel;
  }
};

// Runs `fn` for a plain CPython entry point (unary.cc, message.cc): a C++
// exception becomes the Python error it stands for, and the result null.
template <class Fn>
PyObject* guarded(Fn&& fn) {
  try {
    return fn();
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (py::builtin_exception& e) {
    e.set_error();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

// Waits for a call on a plain thread with the GIL released, through
// Future::wait_for() in 100 ms slices; between slices Python's signal
// handlers run, and one that raises runs `cancel`, waits for the call to
// end (its buffers stay in use until then) and propagates.
void wait_future(const slotrpc::Future<slotrpc::RawReply>& f, const std::function<void()>& cancel);

// Raises slotrpc.RpcError(code, details) (defined in slotrpc/_status.py).
[[noreturn]] void raise_status(const slotrpc::Status& status);
// The status a Python exception stands for: an RpcError's code and
// details, else UNKNOWN naming the exception (grpcio's "Exception calling
// application").  Clears the error.
slotrpc::Status status_of(py::error_already_set& error, const std::string& where);

// A timeout in seconds (None: no deadline) as call options.
slotrpc::CallOptions options_for(const py::object& timeout);

// A contiguous buffer of a Python object, kept alive with it.  `writable`
// asks for a writable one (a destination), and fails clearly otherwise.
struct PyBytes {
  py::object owner;  // keeps the exporter alive
  std::byte* data = nullptr;
  size_t size = 0;
  bool writable = false;
  Py_buffer view{};
  bool have_view = false;

  PyBytes() = default;
  PyBytes(const py::handle& obj, bool need_writable, const char* what);
  ~PyBytes();
  PyBytes(PyBytes&& o) noexcept;
  PyBytes& operator=(PyBytes&&) = delete;
  PyBytes(const PyBytes&) = delete;
};

// The slot behind a Message and the memoryviews over it: a client's reply
// (owning its RawReply, hence the slot) or a handler's request (borrowed).
// The views hold it, so a reply's slot stays reserved while the Message or
// any view of it (a flatc root from message(), say) lives.
struct SlotKeeper {
  slotrpc::RawReply reply;
  std::span<const std::byte> bytes;
};

// A message in its slot: a client's reply, valid while the object or a
// view of it lives (or until release()), or a handler's request (borrowed:
// valid until the next stream read or until the handler returns).  `.data`
// is a read-only memoryview over the slot; release() releases that view,
// so a stale read raises ValueError instead of seeing another call's bytes.
// The SlotKeeper the view exports is made on the first `.data`, not per
// call: a reply that is only copied, measured or dropped costs one Python
// object, not two.
class Message {
 public:
  Message(slotrpc::RawReply reply, py::object type);
  Message(std::span<const std::byte> borrowed, py::object type);

  py::object data();
  py::bytes copy() const;
  py::object message(py::object type);
  size_t size() const { return bytes_.size(); }
  uint64_t bulk_received(size_t i) const { return bulk_received_.size() > i ? bulk_received_[i] : 0; }
  bool valid() const { return valid_; }
  py::object type() const { return type_; }
  void set_type(py::object type) { type_ = std::move(type); }
  void release();

 private:
  void check() const;
  std::optional<slotrpc::RawReply> owned_;  // a reply's, until a view takes it
  py::object keeper_;                       // SlotKeeper, once a view exists
  std::span<const std::byte> bytes_;
  std::vector<uint64_t> bulk_received_;     // empty unless the call had receive_bulk
  py::object type_;
  py::object view_;  // the memoryview handed out
  bool valid_ = true;
};

// The Python object for a new Message (takes ownership), and the Message
// behind one (message.cc: _core.Message is a plain CPython type).
py::object wrap_message(Message* m);
Message& message_of(const py::handle& obj);
// The Python object (_core._Slot, a read-only buffer) owning a SlotKeeper.
py::object wrap_slot(std::unique_ptr<SlotKeeper> keeper);
void bind_message(py::module_& m);

// A registered buffer (Channel/Server.register_memory): the region and
// the Python object whose memory it is, kept alive while the region is.
struct Region {
  std::optional<PyBytes> bytes;
  slotrpc::MemoryRegion region;
  size_t size() const { return region.size(); }
};

// Python objects of a call's bulk attachments, held until it completes.
struct BulkHold {
  std::vector<PyBytes> buffers;
  std::vector<py::object> regions;
};

// Fills options.send_segments / receive_segments from Python lists whose
// items are buffers (numpy arrays, bytearrays...), Regions, or
// (Region, offset, length) tuples.
void add_bulk(slotrpc::CallOptions& options, const py::object& send, const py::object& receive,
              BulkHold& hold);

// The bytes of a request or a reply: a bytes-like object.
std::string request_bytes(const py::handle& obj);

// Config from keyword arguments (transport="tcp", slot_size=..., ...);
// an unknown name is a TypeError listing the known ones.  The library
// validates the values (naming the setting and its range).
slotrpc::Config config_from(const py::dict& settings);

void bind_client(py::module_& m);
// _core.UnaryMethod, a synchronous unary method's callable (unary.cc).
void bind_unary(py::module_& m);
void bind_server(py::module_& m);

}  // namespace slotrpc_py
