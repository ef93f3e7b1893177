// Host memory of Python objects: the buffer protocol first (bytes,
// bytearray, memoryview, numpy), else DLPack (torch tensors). The device is
// asked before any pointer is taken: a CUDA tensor's memory is never touched
// on the host.
#include <dlpack/dlpack.h>

#include <cstdint>
#include <string>

#include "client/python/tiermem/py_common.hpp"

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
    const int type = device[0].cast<int>();
    const int id = device[1].cast<int>();
    if (type != kDLCPU && type != kDLCUDAHost) {
      PyErr_Clear();
      raise(Status(ErrorCode::not_supported,
                   std::string(what) + ": a tensor on " + device_text(type, id) +
                       ": this build of tiermem takes host memory only and never reads device memory on the "
                       "host; copy it to the host first (tensor.cpu())"));
    }
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
  if (t.device.device_type != kDLCPU && t.device.device_type != kDLCUDAHost) {
    raise(Status(ErrorCode::not_supported,
                 std::string(what) + ": a tensor on " + device_text(t.device.device_type, t.device.device_id) +
                     ": this build of tiermem takes host memory only; copy it to the host first (tensor.cpu())"));
  }
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
