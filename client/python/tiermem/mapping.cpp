// tiermem.Mapping: an allocation mapped into this process, exported as a
// buffer (numpy.asarray, memoryview) and through DLPack (torch.from_dlpack,
// numpy.from_dlpack). Every view holds a reference to the Mapping and is
// counted: close() refuses to unmap while one is alive, so no view ever
// points at unmapped memory.
#include <dlpack/dlpack.h>

#include <optional>

#include "py_common.hpp"

namespace tiermem::py {
namespace {

struct PyMapping {
  std::optional<Mapping> mapping;
  uint64_t views = 0;  // buffers and DLPack tensors exported and alive

  Mapping& get() {
    if (!mapping) raise(Status(ErrorCode::failed_precondition, "this tiermem.Mapping is closed"));
    return *mapping;
  }
};

PyMapping* of(PyObject* object) {
  try {
    return pyb::handle(object).cast<PyMapping*>();
  } catch (const pyb::cast_error&) {
    return nullptr;
  }
}

int get_buffer(PyObject* object, Py_buffer* view, int flags) {
  PyMapping* m = of(object);
  if (m == nullptr || !m->mapping) {
    view->obj = nullptr;
    PyErr_SetString(PyExc_BufferError, "this tiermem.Mapping is closed");
    return -1;
  }
  if (Status s = m->mapping->status(); !s.ok()) {
    // Revoked: its memory faults on any access now.
    view->obj = nullptr;
    PyErr_SetString(PyExc_BufferError, s.message().c_str());
    return -1;
  }
  if (m->mapping->device() >= 0) {
    // The host must never touch device memory: DLPack says where it is.
    view->obj = nullptr;
    PyErr_SetString(PyExc_BufferError,
                    "this tiermem.Mapping is VRAM (CUDA device memory), which has no host buffer: use "
                    "torch.from_dlpack(mapping) for a CUDA tensor on it");
    return -1;
  }
  if (PyBuffer_FillInfo(view, object, m->mapping->data(), static_cast<Py_ssize_t>(m->mapping->size()), 0, flags) != 0) {
    return -1;
  }
  ++m->views;
  return 0;
}

void release_buffer(PyObject* object, Py_buffer*) {
  if (PyMapping* m = of(object)) --m->views;
}

// One DLPack export: the tensor, its shape, and the Mapping it keeps alive.
struct Export {
  DLManagedTensor managed{};
  int64_t shape[1] = {0};
  PyObject* owner = nullptr;
};

void delete_export(DLManagedTensor* tensor) {
  auto* e = static_cast<Export*>(tensor->manager_ctx);
  const PyGILState_STATE gil = PyGILState_Ensure();  // a consumer may free its tensor on any thread
  if (PyMapping* m = of(e->owner)) --m->views;
  Py_DECREF(e->owner);
  PyGILState_Release(gil);
  delete e;
}

// A capsule nobody consumed (still named "dltensor") frees its export.
void capsule_destructor(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, "dltensor")) return;
  auto* tensor = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  tensor->deleter(tensor);
}

pyb::object dlpack(pyb::handle self) {
  PyMapping& m = self.cast<PyMapping&>();
  Mapping& mapping = m.get();
  check(mapping.status());  // revoked: no new view of memory that faults
  auto* e = new Export;
  e->shape[0] = static_cast<int64_t>(mapping.size());
  DLTensor& t = e->managed.dl_tensor;
  t.data = mapping.data();
  t.device = mapping.device() >= 0 ? DLDevice{kDLCUDA, mapping.device()} : DLDevice{kDLCPU, 0};
  t.ndim = 1;
  t.dtype = DLDataType{kDLUInt, 8, 1};
  t.shape = e->shape;
  t.strides = nullptr;
  t.byte_offset = 0;
  e->managed.manager_ctx = e;
  e->managed.deleter = delete_export;
  e->owner = self.ptr();
  Py_INCREF(e->owner);
  ++m.views;
  PyObject* capsule = PyCapsule_New(&e->managed, "dltensor", capsule_destructor);
  if (capsule == nullptr) {
    delete_export(&e->managed);
    throw pyb::error_already_set();
  }
  return pyb::reinterpret_steal<pyb::object>(capsule);
}

void close(PyMapping& m) {
  if (!m.mapping) return;
  if (m.views > 0) {
    raise(Status(ErrorCode::failed_precondition,
                 std::to_string(m.views) +
                     " view(s) of this mapping (numpy arrays, memoryviews, tensors) are alive: unmapping would "
                     "leave them pointing at nothing; delete them first"));
  }
  std::optional<Mapping> gone = std::move(m.mapping);
  m.mapping.reset();
  pyb::gil_scoped_release release;
  gone.reset();
}

}  // namespace

pyb::object mapping_object(Mapping mapping) {
  PyMapping m;
  m.mapping.emplace(std::move(mapping));
  return pyb::cast(std::move(m));
}

void bind_mapping(pyb::module_& m) {
  using pyb::arg;
  auto cls = pyb::class_<PyMapping>(
      m, "Mapping", pyb::buffer_protocol(),
      "An allocation mapped into this process (Client.map): the tier's memory itself, as bytes. "
      "numpy.asarray(m) and torch.from_dlpack(m) are zero-copy uint8 views (view them as other dtypes with "
      ".view()). Writes through a view are seen by every mapping at once, unversioned; the allocation is "
      "pinned (never migrated) while mapped. close() (or leaving a with block) unmaps, and refuses while a "
      "view is alive.");
  // pybind11's buffer hooks cannot count releases: our own count every view.
  auto* type = reinterpret_cast<PyHeapTypeObject*>(cls.ptr());
  type->as_buffer.bf_getbuffer = get_buffer;
  type->as_buffer.bf_releasebuffer = release_buffer;
  cls.def_property_readonly("gva", [](PyMapping& self) { return self.get().allocation().gva; })
      .def_property_readonly("size", [](PyMapping& self) { return self.get().size(); })
      .def_property_readonly("tier", [](PyMapping& self) { return std::string(tier_name(self.get().allocation().tier)); })
      .def_property_readonly("closed", [](PyMapping& self) { return !self.mapping; })
      .def_property_readonly(
          "revoked",
          [](PyMapping& self) -> pyb::object {
            const Status s = self.get().status();
            if (s.ok()) return pyb::none();
            return pyb::str(s.to_string());
          },
          "None while the mapping is usable; once revoked (its allocation did not come back after its daemon "
          "restarted), why. Its memory then faults on any access, views made before included.")
      .def("check", [](PyMapping& self) { check(self.get().status()); },
           "Raises the error that revoked the mapping, if it was.")
      .def_property_readonly("views", [](PyMapping& self) { return self.views; },
                             "Views (buffers, DLPack tensors) alive now.")
      .def("__len__", [](PyMapping& self) { return self.get().size(); })
      .def(
          "persist",
          [](PyMapping& self, size_t offset, std::optional<size_t> length) {
            Mapping& mapping = self.get();
            const size_t n = length.value_or(offset <= mapping.size() ? mapping.size() - offset : 0);
            if (offset > mapping.size() || n > mapping.size() - offset) {
              raise(Status(ErrorCode::out_of_range, "persist [" + std::to_string(offset) + ", +" + std::to_string(n) +
                                                        ") is outside the mapping's " +
                                                        std::to_string(mapping.size()) + " bytes"));
            }
            check(mapping.persist(offset, n));
          },
          arg("offset") = 0, arg("length") = pyb::none(),
          "Makes writes in [offset, offset+length) durable (PMEM); a no-op on DRAM.")
      .def("__dlpack__", [](pyb::handle self, const pyb::args&, const pyb::kwargs&) { return dlpack(self); },
           "A DLPack capsule of the mapped bytes (uint8, one dimension; on the CPU, or on the CUDA device for VRAM).")
      .def("__dlpack_device__",
           [](PyMapping& self) {
             const int device = self.get().device();
             return device >= 0 ? pyb::make_tuple(static_cast<int>(kDLCUDA), device)
                                : pyb::make_tuple(static_cast<int>(kDLCPU), 0);
           })
      .def_property_readonly(
          "device", [](PyMapping& self) { return self.get().device(); },
          "The CUDA device (this process's ordinal) of a VRAM mapping, else -1 (host memory).")
      .def("close", [](PyMapping& self) { close(self); }, "Unmaps; refuses while a view is alive.")
      .def("__enter__", [](pyb::object self) { return self; })
      .def("__exit__",
           [](PyMapping& self, pyb::handle, pyb::handle, pyb::handle) {
             close(self);
             return false;
           })
      .def("__repr__", [](PyMapping& self) {
        if (!self.mapping) return std::string("<tiermem.Mapping closed>");
        return "<tiermem.Mapping " + self.mapping->allocation().gva.to_string() + " " +
               std::to_string(self.mapping->size()) + " bytes " +
               std::string(tier_name(self.mapping->allocation().tier)) + ", " + std::to_string(self.views) +
               " views>";
      });
}

}  // namespace tiermem::py
