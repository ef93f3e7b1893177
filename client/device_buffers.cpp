#include "client/device_buffers.hpp"

#include <dlfcn.h>
#include <link.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

namespace tiermem::detail {
namespace {

// The few driver API names used, as cuda.h declares them (no CUDA headers
// at build time: the driver is looked up in the process at run time).
using CUresult = int;
using CUdeviceptr = unsigned long long;
using CUcontext = void*;
constexpr CUresult k_cuda_success = 0;
constexpr CUresult k_cuda_invalid_value = 1;
constexpr CUresult k_cuda_not_initialized = 3;
constexpr int k_attribute_context = 1;      // CU_POINTER_ATTRIBUTE_CONTEXT
constexpr int k_attribute_memory_type = 2;  // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr int k_attribute_is_managed = 8;   // CU_POINTER_ATTRIBUTE_IS_MANAGED
constexpr unsigned k_memory_type_device = 2;  // CU_MEMORYTYPE_DEVICE

struct Driver {
  CUresult (*pointer_get_attribute)(void* data, int attribute, CUdeviceptr ptr) = nullptr;
  CUresult (*memcpy_dtoh)(void* dst, CUdeviceptr src, size_t n) = nullptr;
  CUresult (*memcpy_htod)(CUdeviceptr dst, const void* src, size_t n) = nullptr;
  CUresult (*ctx_push)(CUcontext ctx) = nullptr;
  CUresult (*ctx_pop)(CUcontext* ctx) = nullptr;
  CUresult (*error_string)(CUresult error, const char** text) = nullptr;
};

std::atomic<const Driver*> g_driver{nullptr};
std::atomic<unsigned long long> g_seen_loads{~0ull};
std::mutex g_load_mutex;

int count_loads(dl_phdr_info* info, size_t, void* out) {
  *static_cast<unsigned long long*>(out) = info->dlpi_adds;
  return 1;  // the counter is the same in every entry
}

// The driver, once the process has loaded it (checked again only when the
// process loaded another library since the last look).
const Driver* driver() {
  if (const Driver* d = g_driver.load(std::memory_order_acquire)) return d;
  unsigned long long loads = 0;
  dl_iterate_phdr(count_loads, &loads);
  if (loads == g_seen_loads.load(std::memory_order_relaxed)) return nullptr;
  std::lock_guard lock(g_load_mutex);
  g_seen_loads.store(loads, std::memory_order_relaxed);
  if (const Driver* d = g_driver.load(std::memory_order_acquire)) return d;
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) return nullptr;
  static Driver d;  // the handle stays open: the driver is never unloaded
  d.pointer_get_attribute = reinterpret_cast<decltype(d.pointer_get_attribute)>(::dlsym(lib, "cuPointerGetAttribute"));
  d.memcpy_dtoh = reinterpret_cast<decltype(d.memcpy_dtoh)>(::dlsym(lib, "cuMemcpyDtoH_v2"));
  d.memcpy_htod = reinterpret_cast<decltype(d.memcpy_htod)>(::dlsym(lib, "cuMemcpyHtoD_v2"));
  d.ctx_push = reinterpret_cast<decltype(d.ctx_push)>(::dlsym(lib, "cuCtxPushCurrent_v2"));
  d.ctx_pop = reinterpret_cast<decltype(d.ctx_pop)>(::dlsym(lib, "cuCtxPopCurrent_v2"));
  d.error_string = reinterpret_cast<decltype(d.error_string)>(::dlsym(lib, "cuGetErrorString"));
  if (d.pointer_get_attribute == nullptr || d.memcpy_dtoh == nullptr || d.memcpy_htod == nullptr ||
      d.ctx_push == nullptr || d.ctx_pop == nullptr) {
    return nullptr;  // not a driver we know
  }
  g_driver.store(&d, std::memory_order_release);
  return &d;
}

std::string cuda_error(const Driver& d, CUresult r) {
  const char* text = nullptr;
  if (d.error_string != nullptr) (void)d.error_string(r, &text);
  return "CUDA error " + std::to_string(r) + (text != nullptr ? std::string(" (") + text + ")" : "");
}

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
Status in_context(const Driver& d, const void* device, const char* what, F&& copy) {
  CUcontext ctx = nullptr;
  CUresult r = d.pointer_get_attribute(&ctx, k_attribute_context, reinterpret_cast<CUdeviceptr>(device));
  if (r != k_cuda_success) return Status(ErrorCode::io_error, std::string(what) + ": " + cuda_error(d, r));
  if ((r = d.ctx_push(ctx)) != k_cuda_success) return Status(ErrorCode::io_error, std::string(what) + ": " + cuda_error(d, r));
  r = copy();
  CUcontext popped = nullptr;
  (void)d.ctx_pop(&popped);
  if (r != k_cuda_success) return Status(ErrorCode::io_error, std::string(what) + ": " + cuda_error(d, r));
  return Status();
}

}  // namespace

Result<BufferKind> classify_buffer(const void* p) {
  const Driver* d = driver();
  if (d == nullptr) return BufferKind::host;  // no CUDA in this process: no device memory
  unsigned type = 0;
  const auto ptr = reinterpret_cast<CUdeviceptr>(p);
  const CUresult r = d->pointer_get_attribute(&type, k_attribute_memory_type, ptr);
  if (r == k_cuda_success) {
    if (type != k_memory_type_device) return BufferKind::host;  // pinned host memory
    int managed = 0;
    if (d->pointer_get_attribute(&managed, k_attribute_is_managed, ptr) == k_cuda_success && managed != 0) {
      return BufferKind::host;  // managed memory: the CPU may touch it
    }
    return BufferKind::device;
  }
  if (r == k_cuda_invalid_value || r == k_cuda_not_initialized) {
    // Not CUDA's: plain host memory, unless it is not mapped at all (a
    // device pointer freed already, which the driver no longer knows).
    if (host_readable(p)) return BufferKind::host;
    return Status(ErrorCode::invalid_argument, "buffer " + address(p) +
                                                   " is neither memory of a CUDA device nor host memory this process "
                                                   "can read (a freed device pointer?)");
  }
  return Status(ErrorCode::invalid_argument,
                "cannot tell whether buffer " + address(p) + " is host or CUDA device memory: " + cuda_error(*d, r));
}

Status copy_from_device(void* host, const void* device, size_t length) {
  const Driver* d = driver();
  if (d == nullptr) return Status(ErrorCode::internal, "no CUDA driver in this process");
  return in_context(*d, device, "copying from device memory",
                    [&] { return d->memcpy_dtoh(host, reinterpret_cast<CUdeviceptr>(device), length); });
}

Status copy_to_device(void* device, const void* host, size_t length) {
  const Driver* d = driver();
  if (d == nullptr) return Status(ErrorCode::internal, "no CUDA driver in this process");
  return in_context(*d, device, "copying to device memory",
                    [&] { return d->memcpy_htod(reinterpret_cast<CUdeviceptr>(device), host, length); });
}

}  // namespace tiermem::detail
