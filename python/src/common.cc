// The binding's shared pieces (common.h) and the module's entry point.
#include "common.h"

#include <slotrpc/fiber.h>
#include <slotrpc/service.h>

#include <cstring>
#include <stdexcept>

namespace slotrpc_py {

PyInterpreterState* g_interp = nullptr;

void raise_status(const slotrpc::Status& status) {
  py::object make = py::module_::import("slotrpc._status").attr("_error");
  py::object error =
      make(static_cast<int>(status.code()), py::str(status.message()));
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
  throw py::error_already_set();
}

slotrpc::Status status_of(py::error_already_set& error, const std::string& where) {
  py::object rpc_error = py::module_::import("slotrpc._status").attr("RpcError");
  slotrpc::Status status;
  if (error.matches(rpc_error)) {
    py::object value = error.value();
    const int code = py::cast<int>(value.attr("code")());
    py::object details = value.attr("details")();
    status = slotrpc::Status(slotrpc::is_known_status_code(static_cast<uint16_t>(code))
                                 ? static_cast<slotrpc::StatusCode>(code)
                                 : slotrpc::StatusCode::kUnknown,
                             details.is_none() ? std::string() : py::str(details).cast<std::string>());
  } else {
    status = slotrpc::Status(slotrpc::StatusCode::kUnknown,
                             "exception in " + where + ": " + std::string(error.what()));
  }
  error.restore();
  PyErr_Clear();
  return status;
}

slotrpc::CallOptions options_for(const py::object& timeout) {
  slotrpc::CallOptions o;
  if (!timeout.is_none()) {
    const double seconds = py::cast<double>(timeout);
    if (!(seconds >= 0)) throw py::value_error("timeout must be a number of seconds >= 0, got " +
                                               py::repr(timeout).cast<std::string>());
    o.deadline = slotrpc::Clock::now() + std::chrono::duration_cast<slotrpc::Clock::duration>(
                                             std::chrono::duration<double>(seconds));
  }
  return o;
}

PyBytes::PyBytes(const py::handle& obj, bool need_writable, const char* what)
    : owner(py::reinterpret_borrow<py::object>(obj)) {
  const int flags = PyBUF_ANY_CONTIGUOUS | (need_writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(obj.ptr(), &view, flags) != 0) {
    PyErr_Clear();
    throw py::type_error(std::string(what) + ": " + py::repr(py::type::of(obj)).cast<std::string>() +
                         (need_writable ? " is not a writable contiguous buffer"
                                        : " is not a contiguous buffer") +
                         " (numpy arrays, bytearray, memoryview and CPU torch tensors are)");
  }
  have_view = true;
  data = static_cast<std::byte*>(view.buf);
  size = static_cast<size_t>(view.len);
  writable = !view.readonly;
}

PyBytes::~PyBytes() {
  if (have_view) PyBuffer_Release(&view);
}

PyBytes::PyBytes(PyBytes&& o) noexcept
    : owner(std::move(o.owner)), data(o.data), size(o.size), writable(o.writable), view(o.view),
      have_view(o.have_view) {
  o.have_view = false;
}

std::string request_bytes(const py::handle& obj) {
  PyBytes b(obj, false, "a request");
  return std::string(reinterpret_cast<const char*>(b.data), b.size);
}

// ------------------------------------------------------------------ Message

Message::Message(slotrpc::RawReply reply, py::object type)
    : owned_(std::move(reply)), bytes_(owned_->payload()), type_(std::move(type)) {
  for (size_t i = slotrpc::kMaxBulkSegments; i-- > 0;) {
    if (const uint64_t n = owned_->bulk_received(i); n != 0) {
      if (bulk_received_.empty()) bulk_received_.resize(i + 1);
      bulk_received_[i] = n;
    }
  }
}

Message::Message(std::span<const std::byte> borrowed, py::object type)
    : bytes_(borrowed), type_(std::move(type)) {}

void Message::check() const {
  if (!valid_)
    throw py::value_error(
        "message released: a reply lives as long as its object or a view of it (or until "
        "release()); a handler's request until it returns or reads the next message (use "
        ".copy() to keep it)");
}

py::object Message::data() {
  check();
  if (!view_) {
    if (!keeper_) {
      // The view holds the keeper, and the keeper the reply, hence the slot.
      auto keeper = std::make_unique<SlotKeeper>();
      if (owned_) {
        keeper->reply = std::move(*owned_);
        owned_.reset();
      }
      keeper->bytes = bytes_;
      keeper_ = wrap_slot(std::move(keeper));
    }
    view_ = py::reinterpret_steal<py::object>(PyMemoryView_FromObject(keeper_.ptr()));
    if (!view_) throw py::error_already_set();
  }
  return view_;
}

py::bytes Message::copy() const {
  check();
  return py::bytes(reinterpret_cast<const char*>(bytes_.data()), bytes_.size());
}

py::object Message::message(py::object type) {
  if (type.is_none()) type = type_;
  if (type.is_none())
    throw py::type_error("message(): no type given and none known for this method; pass the "
                         "flatc --python class, e.g. reply.message(EchoReply)");
  return type.attr("GetRootAs")(data(), 0);
}

void Message::release() {
  if (view_) {
    // Fails (BufferError) only while something still exports the view,
    // e.g. numpy.frombuffer over it: then the slot is kept until that goes.
    if (PyObject_CallMethod(view_.ptr(), "release", nullptr) == nullptr) PyErr_Clear();
    view_ = py::object();
  }
  valid_ = false;
  bytes_ = {};
  keeper_ = py::object();
  owned_.reset();
}

// ------------------------------------------------------------------ bulk

namespace {

void add_segments(std::vector<slotrpc::BulkSegment>& out, const py::object& items, bool writable,
                  BulkHold& hold, const char* what) {
  if (items.is_none()) return;
  py::type region_type = py::type::of<Region>();
  for (py::handle item : items) {
    if (py::isinstance(item, region_type)) {
      Region& r = item.cast<Region&>();
      if (writable && r.bytes && !r.bytes->writable)
        throw py::type_error(std::string(what) + ": the region's memory is read-only");
      out.push_back(slotrpc::BulkSegment::of(r.region, 0, r.size()));
      hold.regions.push_back(py::reinterpret_borrow<py::object>(item));
    } else if (py::isinstance<py::tuple>(item) && py::len(item) == 3 &&
               py::isinstance(item[py::int_(0)], region_type)) {
      py::tuple t = py::reinterpret_borrow<py::tuple>(item);
      Region& r = t[0].cast<Region&>();
      const size_t offset = t[1].cast<size_t>();
      const size_t length = t[2].cast<size_t>();
      if (offset > r.size() || length > r.size() - offset)
        throw py::value_error(std::string(what) + ": range [" + std::to_string(offset) + ", " +
                              std::to_string(offset + length) + ") is beyond the region's " +
                              std::to_string(r.size()) + " bytes");
      out.push_back(slotrpc::BulkSegment::of(r.region, offset, length));
      hold.regions.push_back(py::reinterpret_borrow<py::object>(t[0]));
    } else {
      PyBytes b(item, writable, what);
      out.push_back(slotrpc::BulkSegment::of(std::span<std::byte>(b.data, b.size)));
      hold.buffers.push_back(std::move(b));
    }
  }
}

}  // namespace

void add_bulk(slotrpc::CallOptions& options, const py::object& send, const py::object& receive,
              BulkHold& hold) {
  add_segments(options.send_segments, send, false, hold, "send_bulk");
  add_segments(options.receive_segments, receive, true, hold, "receive_bulk");
}

}  // namespace slotrpc_py

namespace py = pybind11;
using namespace slotrpc_py;

PYBIND11_MODULE(_core, m) {
  m.doc() = "slotrpc's C++ core; use the slotrpc package, not this module";
  g_interp = PyInterpreterState_Get();
  m.def("method_id", [](const std::string& name) { return slotrpc::method_id(name); },
        "FNV-1a of a fully qualified method name, as slotrpc-gen computes it");

  m.def(
      "sleep",
      [](double seconds) {
        Unlocked unlocked;
        slotrpc::this_fiber::sleep_for(std::chrono::duration_cast<std::chrono::nanoseconds>(
            std::chrono::duration<double>(seconds)));
      },
      py::arg("seconds"),
      "sleeps; in a handler suspends only its fiber (its loop serves on), elsewhere the thread");

  bind_message(m);

  py::class_<Region>(m, "Region", "Memory registered for bulk payloads")
      .def_property_readonly("size", &Region::size)
      .def_property_readonly("obj", [](const Region& r) { return r.bytes ? r.bytes->owner : py::none(); })
      .def("release", [](Region& r) { r.region.release(); });

  bind_client(m);
  bind_unary(m);
  bind_server(m);
}
