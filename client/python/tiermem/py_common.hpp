// Shared by the translation units of the `tiermem._tiermem` extension
// module (pybind11 over libtiermem): the exception mapping, buffers taken
// from Python objects (buffer protocol, DLPack), and the binding functions
// module.cpp calls.
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include <tiermem/client.h>

namespace tiermem::py {

namespace pyb = pybind11;

// --- errors (errors.cpp) -------------------------------------------------------
// tiermem.Error and one subclass per error area (the hundreds of ErrorCode):
// RequestError (1xx), AddressError (2xx), TransportError (3xx),
// ProtocolError (4xx), ConfigError (5xx). Each instance has .code (the
// code's name, "not_allocated"), .errno (its number) and .message.
void bind_errors(pyb::module_& m);
// Raises the exception of `status`'s area (throws pybind11::error_already_set).
[[noreturn]] void raise(const Status& status);
inline void check(const Status& status) {
  if (!status.ok()) raise(status);
}
template <typename T>
T unwrap(Result<T>&& result) {
  if (!result.ok()) raise(result.status());
  return std::move(result).value();
}

// --- buffers (buffers.cpp) -------------------------------------------------------
// Host memory of a Python object, held for as long as this lives: anything
// with the buffer protocol (bytes, bytearray, memoryview, numpy arrays), or
// with __dlpack__ (torch tensors) on a host device. Never dereferenced here;
// refuses device memory, non-contiguous layouts and (when `writable`)
// read-only buffers with a clear error, before any byte moves.
class HostBuffer {
 public:
  HostBuffer(pyb::handle object, bool writable, const char* what);
  ~HostBuffer();
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  void* data() const { return m_data; }
  size_t size() const { return m_size; }

 private:
  Py_buffer m_view{};
  bool m_have_view = false;
  pyb::object m_capsule;  // a DLPack capsule (its deleter runs when it goes)
  void* m_data = nullptr;
  size_t m_size = 0;
};

// --- bindings -----------------------------------------------------------------------
void bind_gva(pyb::module_& m);      // types.cpp: Gva, AllocationInfo
void bind_client(pyb::module_& m);   // client.cpp: Client, connect()
void bind_mapping(pyb::module_& m);  // mapping.cpp: Mapping (buffer protocol, DLPack)
void bind_batch(pyb::module_& m);    // batch.cpp: Batch
// A tiermem.Batch on `client` (batch.cpp).
pyb::object batch_object(std::shared_ptr<Client> client, std::optional<QosClass> qos);

// From a Gva, an Allocation (its start) or the text form.
Gva as_gva(pyb::handle object);
// Python objects of library values (types.cpp).
pyb::object allocation_object(const AllocationInfo& info, pyb::object client);
pyb::dict node_stat_dict(const NodeStat& stat);
pyb::dict node_info_dict(const NodeInfo& info);
pyb::dict health_dict(const HealthGraph& graph);
// The Mapping object of a mapped allocation (mapping.cpp).
pyb::object mapping_object(Mapping mapping);

}  // namespace tiermem::py
