#include "common/cuda_driver.hpp"

#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <mutex>

namespace tiermem::cuda {
namespace {

std::atomic<const Driver*> g_driver{nullptr};
std::atomic<unsigned long long> g_seen_loads{~0ull};
std::mutex g_mutex;
bool g_initialised = false;

int count_loads(dl_phdr_info* info, size_t, void* out) {
  *static_cast<unsigned long long*>(out) = info->dlpi_adds;
  return 1;  // the counter is the same in every entry
}

template <typename T>
bool find(void* lib, const char* name, T* out) {
  *out = reinterpret_cast<T>(::dlsym(lib, name));
  return *out != nullptr;
}

// Resolves every entry point from `lib` (kept open: the driver is never
// unloaded). Null when one is missing (a driver older than CUDA 11).
const Driver* resolve(void* lib) {
  static Driver d;
  const bool all =
      find(lib, "cuInit", &d.init) && find(lib, "cuDeviceGetCount", &d.device_get_count) &&
      find(lib, "cuDeviceGet", &d.device_get) && find(lib, "cuDeviceGetUuid_v2", &d.device_get_uuid) &&
      find(lib, "cuDeviceGetAttribute", &d.device_get_attribute) &&
      find(lib, "cuDeviceCanAccessPeer", &d.device_can_access_peer) &&
      find(lib, "cuDevicePrimaryCtxRetain", &d.primary_ctx_retain) && find(lib, "cuCtxPushCurrent_v2", &d.ctx_push) &&
      find(lib, "cuCtxPopCurrent_v2", &d.ctx_pop) && find(lib, "cuPointerGetAttribute", &d.pointer_get_attribute) &&
      find(lib, "cuMemcpy", &d.memcpy) && find(lib, "cuMemcpyAsync", &d.memcpy_async) &&
      find(lib, "cuMemcpyDtoH_v2", &d.memcpy_dtoh) && find(lib, "cuMemcpyHtoD_v2", &d.memcpy_htod) &&
      find(lib, "cuMemsetD8_v2", &d.memset_d8) && find(lib, "cuStreamCreate", &d.stream_create) &&
      find(lib, "cuStreamSynchronize", &d.stream_synchronize) &&
      find(lib, "cuMemGetAllocationGranularity", &d.mem_get_allocation_granularity) &&
      find(lib, "cuMemCreate", &d.mem_create) && find(lib, "cuMemRelease", &d.mem_release) &&
      find(lib, "cuMemAddressReserve", &d.mem_address_reserve) && find(lib, "cuMemAddressFree", &d.mem_address_free) &&
      find(lib, "cuMemMap", &d.mem_map) && find(lib, "cuMemUnmap", &d.mem_unmap) &&
      find(lib, "cuMemSetAccess", &d.mem_set_access) && find(lib, "cuMemExportToShareableHandle", &d.mem_export) &&
      find(lib, "cuMemImportFromShareableHandle", &d.mem_import) &&
      find(lib, "cuMemHostAlloc", &d.mem_host_alloc) && find(lib, "cuMemFreeHost", &d.mem_free_host) && find(lib, "cuGetErrorString", &d.error_string);
  return all ? &d : nullptr;
}

}  // namespace

std::string Driver::error(CUresult r) const {
  const char* text = nullptr;
  if (error_string != nullptr) (void)error_string(r, &text);
  return "CUDA error " + std::to_string(r) + (text != nullptr ? std::string(" (") + text + ")" : "");
}

const Driver* loaded_driver() {
  if (const Driver* d = g_driver.load(std::memory_order_acquire)) return d;
  unsigned long long loads = 0;
  dl_iterate_phdr(count_loads, &loads);
  if (loads == g_seen_loads.load(std::memory_order_relaxed)) return nullptr;
  std::lock_guard lock(g_mutex);
  g_seen_loads.store(loads, std::memory_order_relaxed);
  if (const Driver* d = g_driver.load(std::memory_order_acquire)) return d;
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) return nullptr;
  const Driver* d = resolve(lib);
  // The process loaded the driver, so it initialised it (or will before it
  // hands out a device pointer).
  if (d != nullptr) g_driver.store(d, std::memory_order_release);
  return d;
}

const Driver* load_driver(std::string* why) {
  std::lock_guard lock(g_mutex);
  const Driver* d = g_driver.load(std::memory_order_acquire);
  if (d == nullptr) {
    void* lib = ::dlopen("libcuda.so.1", RTLD_NOW);
    if (lib == nullptr) {
      const char* e = ::dlerror();
      *why = std::string("no CUDA driver: ") + (e != nullptr ? e : "libcuda.so.1 not found");
      return nullptr;
    }
    d = resolve(lib);
    if (d == nullptr) {
      *why = "the CUDA driver lacks entry points this library needs (older than CUDA 11)";
      return nullptr;
    }
    g_driver.store(d, std::memory_order_release);
  }
  if (!g_initialised) {
    if (const CUresult r = d->init(0); r != k_success) {
      *why = "cuInit: " + d->error(r);
      return nullptr;
    }
    g_initialised = true;
  }
  return d;
}

}  // namespace tiermem::cuda
