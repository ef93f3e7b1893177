// The CUDA driver API as this code uses it, found at run time (dlopen of
// libcuda.so.1), so that neither libtiermem nor the daemon needs CUDA at
// build time or a driver at run time: without one, driver() is null and the
// callers take their paths that need no GPU.
//
// The names and structures are cuda.h's (CUDA 12 and 13 keep them stable);
// tiers/vram_tier.cpp, which is built with cuda.h, checks the layouts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tiermem::cuda {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = void*;
using CUstream = void*;
using CUmemGenericAllocationHandle = unsigned long long;

constexpr CUresult k_success = 0;
constexpr CUresult k_invalid_value = 1;
constexpr CUresult k_out_of_memory = 2;
constexpr CUresult k_not_initialized = 3;

constexpr int k_attribute_context = 1;      // CU_POINTER_ATTRIBUTE_CONTEXT
constexpr int k_attribute_memory_type = 2;  // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr int k_attribute_is_managed = 8;   // CU_POINTER_ATTRIBUTE_IS_MANAGED
constexpr unsigned k_memory_type_device = 2;  // CU_MEMORYTYPE_DEVICE

constexpr int k_device_vmm_supported = 102;       // CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
constexpr int k_device_posix_fd_supported = 103;  // CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
constexpr int k_allocation_pinned = 1;            // CU_MEM_ALLOCATION_TYPE_PINNED
constexpr int k_handle_posix_fd = 1;              // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
constexpr int k_location_device = 1;              // CU_MEM_LOCATION_TYPE_DEVICE
constexpr int k_access_read_write = 3;            // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
constexpr unsigned k_stream_non_blocking = 1;     // CU_STREAM_NON_BLOCKING
constexpr unsigned k_host_alloc_portable = 1;     // CU_MEMHOSTALLOC_PORTABLE

struct MemLocation {  // CUmemLocation
  int type = 0;
  int id = 0;
};
struct MemAllocationProp {  // CUmemAllocationProp
  int type = 0;
  int requested_handle_types = 0;
  MemLocation location;
  void* win32_metadata = nullptr;
  struct {
    unsigned char compression_type = 0;
    unsigned char gpu_direct_rdma_capable = 0;
    unsigned short usage = 0;
    unsigned char reserved[4] = {};
  } alloc_flags;
};
struct MemAccessDesc {  // CUmemAccessDesc
  MemLocation location;
  int flags = 0;
};

struct Driver {
  CUresult (*init)(unsigned flags) = nullptr;
  CUresult (*device_get_count)(int* count) = nullptr;
  CUresult (*device_get)(CUdevice* device, int ordinal) = nullptr;
  CUresult (*device_get_uuid)(char uuid[16], CUdevice device) = nullptr;
  CUresult (*device_get_attribute)(int* value, int attribute, CUdevice device) = nullptr;
  CUresult (*device_can_access_peer)(int* can, CUdevice device, CUdevice peer) = nullptr;
  CUresult (*primary_ctx_retain)(CUcontext* ctx, CUdevice device) = nullptr;
  CUresult (*ctx_push)(CUcontext ctx) = nullptr;
  CUresult (*ctx_pop)(CUcontext* ctx) = nullptr;
  CUresult (*pointer_get_attribute)(void* data, int attribute, CUdeviceptr ptr) = nullptr;
  CUresult (*memcpy)(CUdeviceptr dst, CUdeviceptr src, size_t n) = nullptr;
  CUresult (*memcpy_async)(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream) = nullptr;
  CUresult (*memcpy_dtoh)(void* dst, CUdeviceptr src, size_t n) = nullptr;
  CUresult (*memcpy_htod)(CUdeviceptr dst, const void* src, size_t n) = nullptr;
  CUresult (*memset_d8)(CUdeviceptr dst, unsigned char value, size_t n) = nullptr;
  CUresult (*stream_create)(CUstream* stream, unsigned flags) = nullptr;
  CUresult (*stream_synchronize)(CUstream stream) = nullptr;
  CUresult (*mem_get_allocation_granularity)(size_t* granularity, const MemAllocationProp* prop, int option) = nullptr;
  CUresult (*mem_create)(CUmemGenericAllocationHandle* handle, size_t size, const MemAllocationProp* prop,
                         unsigned long long flags) = nullptr;
  CUresult (*mem_release)(CUmemGenericAllocationHandle handle) = nullptr;
  CUresult (*mem_address_reserve)(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                  unsigned long long flags) = nullptr;
  CUresult (*mem_address_free)(CUdeviceptr ptr, size_t size) = nullptr;
  CUresult (*mem_map)(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                      unsigned long long flags) = nullptr;
  CUresult (*mem_unmap)(CUdeviceptr ptr, size_t size) = nullptr;
  CUresult (*mem_set_access)(CUdeviceptr ptr, size_t size, const MemAccessDesc* desc, size_t count) = nullptr;
  CUresult (*mem_export)(void* shareable, CUmemGenericAllocationHandle handle, int type,
                         unsigned long long flags) = nullptr;
  CUresult (*mem_import)(CUmemGenericAllocationHandle* handle, void* shareable, int type) = nullptr;
  CUresult (*mem_host_alloc)(void** p, size_t size, unsigned flags) = nullptr;
  CUresult (*mem_free_host)(void* p) = nullptr;
  CUresult (*error_string)(CUresult error, const char** text) = nullptr;

  // "CUDA error 2 (out of memory)".
  std::string error(CUresult r) const;
};

// The driver the process has loaded already, or null (a check of the loaded
// libraries, repeated only when the process loaded another one since: about
// 20 ns). Never loads it.
const Driver* loaded_driver();
// The driver, loaded if need be and initialised (cuInit), or null when the
// machine has none; *why then says what failed.
const Driver* load_driver(std::string* why);

// Runs `f` with `ctx` current on this thread, restoring what was current.
template <typename F>
CUresult in_context(const Driver& d, CUcontext ctx, F&& f) {
  CUresult r = d.ctx_push(ctx);
  if (r != k_success) return r;
  r = f();
  CUcontext popped = nullptr;
  (void)d.ctx_pop(&popped);
  return r;
}

}  // namespace tiermem::cuda
