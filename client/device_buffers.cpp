#include "client/device_buffers.hpp"

#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <string>

#include "common/cuda_driver.hpp"

namespace tiermem::detail {
namespace {

using cuda::CUcontext;
using cuda::CUdeviceptr;
using cuda::CUresult;
using cuda::Driver;

std::string address(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

// Whether this process can read the byte at `p` (without touching it).
bool host_readable(const void* p) {
  char byte = 0;
  iovec local{&byte, 1};
  iovec remote{const_cast<void*>(p), 1};
  return ::process_vm_readv(::getpid(), &local, 1, &remote, 1, 0) == 1 || errno == EPERM || errno == ENOSYS;
}

// Runs `copy` in the context of `device` (the caller's thread may have none).
template <typename F>
Status in_device_context(const Driver& d, const void* device, const char* what, F&& copy) {
  CUcontext ctx = nullptr;
  CUresult r = d.pointer_get_attribute(&ctx, cuda::k_attribute_context, reinterpret_cast<CUdeviceptr>(device));
  if (r == cuda::k_success) r = cuda::in_context(d, ctx, copy);
  if (r != cuda::k_success) return Status(ErrorCode::io_error, std::string(what) + ": " + d.error(r));
  return Status();
}

}  // namespace

Result<BufferKind> classify_buffer(const void* p) {
  const Driver* d = cuda::loaded_driver();
  if (d == nullptr) return BufferKind::host;  // no CUDA in this process: no device memory
  unsigned type = 0;
  const auto ptr = reinterpret_cast<CUdeviceptr>(p);
  const CUresult r = d->pointer_get_attribute(&type, cuda::k_attribute_memory_type, ptr);
  if (r == cuda::k_success) {
    if (type != cuda::k_memory_type_device) return BufferKind::host;  // pinned host memory
    int managed = 0;
    if (d->pointer_get_attribute(&managed, cuda::k_attribute_is_managed, ptr) == cuda::k_success && managed != 0) {
      return BufferKind::host;  // managed memory: the CPU may touch it
    }
    return BufferKind::device;
  }
  if (r == cuda::k_invalid_value || r == cuda::k_not_initialized) {
    // Not CUDA's: plain host memory, unless it is not mapped at all (a
    // device pointer freed already, which the driver no longer knows).
    if (host_readable(p)) return BufferKind::host;
    return Status(ErrorCode::invalid_argument, "buffer " + address(p) +
                                                   " is neither memory of a CUDA device nor host memory this process "
                                                   "can read (a freed device pointer?)");
  }
  return Status(ErrorCode::invalid_argument,
                "cannot tell whether buffer " + address(p) + " is host or CUDA device memory: " + d->error(r));
}

Status copy_from_device(void* host, const void* device, size_t length) {
  const Driver* d = cuda::loaded_driver();
  if (d == nullptr) return Status(ErrorCode::internal, "no CUDA driver in this process");
  return in_device_context(*d, device, "copying from device memory",
                    [&] { return d->memcpy_dtoh(host, reinterpret_cast<CUdeviceptr>(device), length); });
}

Status copy_to_device(void* device, const void* host, size_t length) {
  const Driver* d = cuda::loaded_driver();
  if (d == nullptr) return Status(ErrorCode::internal, "no CUDA driver in this process");
  return in_device_context(*d, device, "copying to device memory",
                    [&] { return d->memcpy_htod(reinterpret_cast<CUdeviceptr>(device), host, length); });
}

namespace {

constexpr size_t k_most_pinned = size_t{256} << 20;

// One thread's pinned staging buffer (portable: usable from every context).
struct PinnedBuffer {
  void* p = nullptr;
  size_t size = 0;
  ~PinnedBuffer() {
    if (p == nullptr) return;
    if (const Driver* d = cuda::loaded_driver()) (void)d->mem_free_host(p);
  }
};

}  // namespace

std::byte* pinned_staging(const void* device, size_t length) {
  if (length > k_most_pinned) return nullptr;
  const Driver* d = cuda::loaded_driver();
  if (d == nullptr) return nullptr;
  thread_local PinnedBuffer buffer;
  if (buffer.size >= length) return static_cast<std::byte*>(buffer.p);
  // Grow in powers of two from 1 MiB: few reallocations, little unused.
  size_t size = size_t{1} << 20;
  while (size < length) size <<= 1;
  void* p = nullptr;
  const Status s = in_device_context(*d, device, "pinning a staging buffer", [&] {
    return d->mem_host_alloc(&p, size, cuda::k_host_alloc_portable);
  });
  if (!s.ok() || p == nullptr) return nullptr;
  if (buffer.p != nullptr) (void)d->mem_free_host(buffer.p);
  buffer.p = p;
  buffer.size = size;
  return static_cast<std::byte*>(p);
}

}  // namespace tiermem::detail
