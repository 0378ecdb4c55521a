// _core.Message: the Python face of a Message (common.h).  A plain CPython
// type holding a pointer to the C++ Message, not a pybind11 class: every
// reply and every handler's request is one, and a pybind11 instance cost
// about 1,700 instructions to create and free (its instance registry, its
// holder and value layout), more than the rest of the binding's share of
// a call.
#include "common.h"

namespace slotrpc_py {

namespace {

struct MessageObject {
  PyObject_HEAD
  Message* impl;
};

PyTypeObject* g_type = nullptr;

Message& impl_of(PyObject* self) { return *reinterpret_cast<MessageObject*>(self)->impl; }

void message_dealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  delete reinterpret_cast<MessageObject*>(self)->impl;
  type->tp_free(self);
  Py_DECREF(type);
}

PyObject* m_data(PyObject* self, void*) {
  return guarded([&] { return impl_of(self).data().release().ptr(); });
}
PyObject* m_copy(PyObject* self, PyObject*) {
  return guarded([&] { return impl_of(self).copy().release().ptr(); });
}
PyObject* m_message(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  PyObject* type = Py_None;
  if (nargs > 1 || (kwnames != nullptr && (nargs + PyTuple_GET_SIZE(kwnames) > 1))) {
    PyErr_SetString(PyExc_TypeError, "message() takes at most one argument, the type");
    return nullptr;
  }
  if (nargs == 1) type = args[0];
  if (kwnames != nullptr && PyTuple_GET_SIZE(kwnames) == 1) {
    if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "type") != 0) {
      PyErr_Format(PyExc_TypeError, "message() got an unexpected keyword argument '%U'",
                   PyTuple_GET_ITEM(kwnames, 0));
      return nullptr;
    }
    type = args[0];
  }
  return guarded([&] { return impl_of(self).message(py::reinterpret_borrow<py::object>(type)).release().ptr(); });
}
PyObject* m_bulk_received(PyObject* self, PyObject* arg) {
  const size_t i = PyLong_AsSize_t(arg);
  if (i == static_cast<size_t>(-1) && PyErr_Occurred()) return nullptr;
  return PyLong_FromUnsignedLongLong(impl_of(self).bulk_received(i));
}
PyObject* m_release(PyObject* self, PyObject*) {
  return guarded([&] {
    impl_of(self).release();
    Py_RETURN_NONE;
  });
}
PyObject* m_valid(PyObject* self, void*) { return PyBool_FromLong(impl_of(self).valid()); }
PyObject* m_type(PyObject* self, void*) { return impl_of(self).type().release().ptr(); }
int m_set_type(PyObject* self, PyObject* value, void*) {
  impl_of(self).set_type(py::reinterpret_borrow<py::object>(value == nullptr ? Py_None : value));
  return 0;
}
Py_ssize_t m_len(PyObject* self) { return static_cast<Py_ssize_t>(impl_of(self).size()); }

PyMethodDef message_methods[] = {
    {"copy", m_copy, METH_NOARGS, "the bytes, copied: keep these"},
    {"__bytes__", m_copy, METH_NOARGS, "the bytes, copied"},
    {"message", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(m_message)),
     METH_FASTCALL | METH_KEYWORDS, "message(type=None): type.GetRootAs(self.data, 0), the flatc --python root"},
    {"bulk_received", m_bulk_received, METH_O, "bytes the handler wrote into receive_bulk segment i"},
    {"release", m_release, METH_NOARGS, "gives the slot back now"},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef message_getset[] = {
    {"data", m_data, nullptr, "read-only memoryview over the slot (released with the message)", nullptr},
    {"valid", m_valid, nullptr, "False once released", nullptr},
    {"type", m_type, m_set_type, "the flatc --python class message() uses by default", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

// _core._Slot: what a Message's memoryview exports, holding the slot.
struct SlotObject {
  PyObject_HEAD
  SlotKeeper* keeper;
};

PyTypeObject* g_slot_type = nullptr;

void slot_dealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  delete reinterpret_cast<SlotObject*>(self)->keeper;
  type->tp_free(self);
  Py_DECREF(type);
}

int slot_getbuffer(PyObject* self, Py_buffer* view, int flags) {
  const SlotKeeper& k = *reinterpret_cast<SlotObject*>(self)->keeper;
  return PyBuffer_FillInfo(view, self, const_cast<std::byte*>(k.bytes.data()),
                           static_cast<Py_ssize_t>(k.bytes.size()), /*readonly=*/1, flags);
}

}  // namespace

py::object wrap_slot(std::unique_ptr<SlotKeeper> keeper) {
  PyObject* self = g_slot_type->tp_alloc(g_slot_type, 0);
  if (self == nullptr) throw py::error_already_set();
  reinterpret_cast<SlotObject*>(self)->keeper = keeper.release();
  return py::reinterpret_steal<py::object>(self);
}

py::object wrap_message(Message* m) {
  std::unique_ptr<Message> owned(m);
  PyObject* self = g_type->tp_alloc(g_type, 0);
  if (self == nullptr) throw py::error_already_set();
  reinterpret_cast<MessageObject*>(self)->impl = owned.release();
  return py::reinterpret_steal<py::object>(self);
}

Message& message_of(const py::handle& obj) {
  if (Py_TYPE(obj.ptr()) != g_type) throw py::type_error("not a slotrpc.Message");
  return impl_of(obj.ptr());
}

void bind_message(py::module_& m) {
  static PyType_Slot slots[] = {
      {Py_tp_dealloc, reinterpret_cast<void*>(&message_dealloc)},
      {Py_tp_methods, message_methods},
      {Py_tp_getset, message_getset},
      {Py_sq_length, reinterpret_cast<void*>(&m_len)},
      {Py_tp_doc, const_cast<char*>("A message read in place in its slot (replies: while the object lives)")},
      {0, nullptr},
  };
  // Not subclassable, not made from Python: the binding makes them.
  static PyType_Spec spec = {"slotrpc._core.Message", sizeof(MessageObject), 0,
                             Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, slots};
  PyObject* type = PyType_FromSpec(&spec);
  if (type == nullptr) throw py::error_already_set();
  g_type = reinterpret_cast<PyTypeObject*>(type);
  Py_INCREF(type);  // g_type's own reference: the module may be torn down before the last Message
  m.add_object("Message", py::reinterpret_steal<py::object>(type));

  static PyType_Slot slot_slots[] = {
      {Py_tp_dealloc, reinterpret_cast<void*>(&slot_dealloc)},
      {Py_bf_getbuffer, reinterpret_cast<void*>(&slot_getbuffer)},
      {Py_tp_doc, const_cast<char*>("The slot behind a Message's memoryview")},
      {0, nullptr},
  };
  static PyType_Spec slot_spec = {"slotrpc._core._Slot", sizeof(SlotObject), 0,
                                  Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, slot_slots};
  PyObject* slot_type = PyType_FromSpec(&slot_spec);
  if (slot_type == nullptr) throw py::error_already_set();
  g_slot_type = reinterpret_cast<PyTypeObject*>(slot_type);
  Py_INCREF(slot_type);
  m.add_object("_Slot", py::reinterpret_steal<py::object>(slot_type));
}

}  // namespace slotrpc_py
