// The memory of Python objects: the buffer protocol first (bytes,
// bytearray, memoryview, numpy), else DLPack (torch tensors). The device is
// asked before any pointer is taken: a CUDA tensor's pointer goes to the
// library, which copies it with the copy engines and never touches it on the
// host; tensors of other devices are refused.
#include <dlfcn.h>
#include <dlpack/dlpack.h>

#include <cstdint>
#include <string>

#include "py_common.hpp"

namespace tiermem::py {
namespace {

std::string type_name(pyb::handle object) { return pyb::str(pyb::type::handle_of(object).attr("__name__")); }

std::string device_text(int type, int id) {
  switch (type) {
    case kDLCUDA: return "cuda:" + std::to_string(id);
    case kDLCUDAManaged: return "cuda managed:" + std::to_string(id);
    case kDLROCM: return "rocm:" + std::to_string(id);
    default: return "DLPack device type " + std::to_string(type) + ":" + std::to_string(id);
  }
}

// Whether a DLPack tensor's elements are one dense block in row-major order
// (strides null, or those of a C-contiguous array; size-1 dimensions may
// have any stride).
bool compact(const DLTensor& t) {
  if (t.strides == nullptr) return true;
  int64_t expected = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    if (t.shape[i] != 1 && t.strides[i] != expected) return false;
    expected *= t.shape[i];
  }
  return true;
}

// Whether the process has loaded the CUDA driver, as every process holding a
// real CUDA tensor has: a pointer said to be CUDA memory is handed on only
// then (the library asks that driver what it is).
bool cuda_loaded() {
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) return false;
  ::dlclose(lib);
  return true;
}

bool cuda_device(int type) { return type == kDLCUDA || type == kDLCUDAManaged; }

// not_supported unless memory of DLPack device `type` may be handed on.
void check_device(int type, int id, const char* what) {
  if (type == kDLCPU || type == kDLCUDAHost || (cuda_device(type) && cuda_loaded())) return;
  PyErr_Clear();
  raise(Status(ErrorCode::not_supported,
               std::string(what) + ": a tensor on " + device_text(type, id) +
                   (cuda_device(type) ? ", but this process has not loaded the CUDA driver"
                                      : ": tiermem takes host and CUDA memory") +
                   "; copy it to the host first (tensor.cpu())"));
}

}  // namespace

HostBuffer::HostBuffer(pyb::handle object, bool writable, const char* what) {
  if (PyObject_CheckBuffer(object.ptr())) {
    const int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(object.ptr(), &m_view, flags) != 0) {
      PyErr_Clear();
      throw pyb::type_error(std::string(what) + ": a " + type_name(object) + " that is " +
                            (writable ? "read-only or " : "") +
                            "not C-contiguous; pass a contiguous" + (writable ? ", writable" : "") +
                            " buffer (numpy.ascontiguousarray, bytearray)");
    }
    m_have_view = true;
    m_data = m_view.buf;
    m_size = static_cast<size_t>(m_view.len);
    return;
  }
  if (!pyb::hasattr(object, "__dlpack__")) {
    throw pyb::type_error(std::string(what) + ": a " + type_name(object) +
                          " has neither the buffer protocol nor __dlpack__ (bytes, bytearray, memoryview, numpy "
                          "arrays and torch tensors do)");
  }
  if (pyb::hasattr(object, "__dlpack_device__")) {
    auto device = object.attr("__dlpack_device__")().cast<pyb::tuple>();
    check_device(device[0].cast<int>(), device[1].cast<int>(), what);
  }
  try {
    m_capsule = object.attr("__dlpack__")();
  } catch (pyb::error_already_set&) {
    // torch before 2.0 has no DLPack for bool tensors; its numpy() view
    // of a host tensor is the same memory, with the buffer protocol.
    if (!pyb::hasattr(object, "numpy")) throw;
    pyb::object view = object.attr("numpy")();
    if (PyObject_GetBuffer(view.ptr(), &m_view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) != 0) {
      PyErr_Clear();
      throw pyb::type_error(std::string(what) + ": a " + type_name(object) +
                            " that is not contiguous; pass tensor.contiguous()");
    }
    m_have_view = true;
    m_data = m_view.buf;
    m_size = static_cast<size_t>(m_view.len);
    return;
  }
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(m_capsule.ptr(), "dltensor"));
  if (managed == nullptr) {
    PyErr_Clear();
    throw pyb::type_error(std::string(what) + ": " + type_name(object) +
                          ".__dlpack__() did not return an unused DLPack capsule");
  }
  const DLTensor& t = managed->dl_tensor;
  // CUDA tensors too: the library asks the driver what the pointer is and
  // copies device memory with the copy engines (never on the host).
  check_device(t.device.device_type, t.device.device_id, what);
  if (!compact(t)) {
    throw pyb::type_error(std::string(what) + ": a " + type_name(object) +
                          " that is not contiguous; pass tensor.contiguous()");
  }
  uint64_t elements = 1;
  for (int i = 0; i < t.ndim; ++i) elements *= static_cast<uint64_t>(t.shape[i]);
  const uint64_t element_bytes = (uint64_t{t.dtype.bits} * t.dtype.lanes + 7) / 8;
  m_data = static_cast<char*>(t.data) + t.byte_offset;
  m_size = elements * element_bytes;
}

HostBuffer::~HostBuffer() {
  if (m_have_view) PyBuffer_Release(&m_view);
}

}  // namespace tiermem::py
