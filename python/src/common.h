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
// own (FiberPython), created on entry and deleted on return: to Python, a
// fiber looks like a short-lived thread.
#pragma once

#include <pybind11/pybind11.h>

#include <slotrpc/call.h>
#include <slotrpc/channel.h>
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

// Holds the GIL with a thread state of its own, on a thread (or fiber) that
// has none: an event loop's fiber running a handler, or a loop callback.
class FiberPython {
 public:
  FiberPython() : ts_(PyThreadState_New(g_interp)) { PyEval_RestoreThread(ts_); }
  ~FiberPython() {
    PyThreadState_Clear(ts_);
    PyThreadState_DeleteCurrent();  // also releases the GIL
  }
  FiberPython(const FiberPython&) = delete;
  FiberPython& operator=(const FiberPython&) = delete;

 private:
  PyThreadState* ts_;
};

// Releases the GIL for a wait (whatever thread state holds it).
class Unlocked {
 public:
  Unlocked() : ts_(PyEval_SaveThread()) {}
  ~Unlocked() { PyEval_RestoreThread(ts_); }
  Unlocked(const Unlocked&) = delete;
  Unlocked& operator=(const Unlocked&) = delete;

 private:
  PyThreadState* ts_;
};

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

// A message in its slot: a client's reply (owning its RawReply, hence the
// slot, until the object dies or release()), or a handler's request
// (borrowed: valid until the next stream read or until the handler
// returns).  `.data` is a read-only memoryview over the slot; once the
// message is released the view is released too, so a stale read raises
// ValueError instead of seeing another call's bytes.
class Message {
 public:
  Message(slotrpc::RawReply reply, py::object type);
  Message(std::span<const std::byte> borrowed, py::object type);
  ~Message();

  py::object data();
  py::bytes copy() const;
  py::object message(py::object type);
  size_t size() const { return bytes_.size(); }
  uint64_t bulk_received(size_t i) const { return reply_.bulk_received(i); }
  bool valid() const { return valid_; }
  py::object type() const { return type_; }
  void set_type(py::object type) { type_ = std::move(type); }
  void release();

 private:
  void check() const;
  slotrpc::RawReply reply_;
  std::span<const std::byte> bytes_;
  py::object type_;
  py::object view_;  // the memoryview handed out, released with the message
  bool valid_ = true;
};

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
void bind_server(py::module_& m);

}  // namespace slotrpc_py
