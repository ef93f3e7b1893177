// VRAM tier on CUDA. One range of device addresses is reserved for all
// domains (domain d at d * span, as the host tiers lay theirs out), and
// physical memory is created in chunks (cuMemCreate) as frames are handed
// out (commit), mapped into the range, and exported as a file descriptor
// each. A co-located client of a tenant gets the descriptors of the chunks
// of its own domain only (device_chunks), imports them into its own address
// range and copies with the copy engines: the memory of other tenants is
// never mapped into it, unlike a cudaIpcMemHandle of one arena, which opens
// all of it to whoever holds the 64 bytes. Compiled only when CUDA is found.
// Chunks stay until the daemon exits (a chunk freed of all frames is not
// given back: see docs/ARCHITECTURE.md).
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include <tiermem/status_macros.h>
#include <tiermem/units.h>

#include "common/cuda_driver.hpp"
#include "common/unique_fd.hpp"
#include "tiers/tier_backend.hpp"

namespace tiermem {
namespace {

// The driver shim's copies of cuda.h's structures must match it.
static_assert(sizeof(cuda::MemAllocationProp) == sizeof(CUmemAllocationProp));
static_assert(offsetof(cuda::MemAllocationProp, location) == offsetof(CUmemAllocationProp, location));
static_assert(offsetof(cuda::MemAllocationProp, alloc_flags) == offsetof(CUmemAllocationProp, allocFlags));
static_assert(sizeof(cuda::MemAccessDesc) == sizeof(CUmemAccessDesc));
static_assert(cuda::k_handle_posix_fd == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
static_assert(cuda::k_access_read_write == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
static_assert(cuda::k_device_vmm_supported == CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED);
static_assert(cuda::k_device_posix_fd_supported == CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED);

// Physical memory is created this much at a time (rounded up to the
// device's granularity): few descriptors per tenant, little left unused.
constexpr uint64_t k_chunk_bytes = 64ull << 20;

Status cuda_error(const std::string& what, cudaError_t err) {
  return Status(ErrorCode::io_error, what + ": " + cudaGetErrorName(err) + " (" +
                                         cudaGetErrorString(err) + ")");
}

Status driver_error(const cuda::Driver& d, const std::string& what, cuda::CUresult r) {
  return Status(r == cuda::k_out_of_memory ? ErrorCode::tier_exhausted : ErrorCode::io_error, what + ": " + d.error(r));
}

struct Device {
  int ordinal = 0;
  const cuda::Driver* driver = nullptr;
  cuda::CUcontext ctx = nullptr;
  cuda::MemAllocationProp prop;
  std::string uuid;
};

class VramTier final : public TierBackend {
 public:
  VramTier(Device device, uint64_t capacity, uint64_t chunk, uint64_t span, uint32_t domains, cuda::CUdeviceptr base)
      : m_dev(std::move(device)), m_capacity(capacity), m_chunk(chunk), m_span(span), m_bytes(domains, 0),
        m_base(base) {}
  ~VramTier() override {
    const cuda::Driver& d = *m_dev.driver;
    (void)cuda::in_context(d, m_dev.ctx, [&] {
      for (const auto& [index, fd] : m_chunks) (void)d.mem_unmap(m_base + index * m_chunk, m_chunk);
      return d.mem_address_free(m_base, m_span * m_bytes.size());
    });
  }

  Tier tier() const override { return Tier::vram; }
  uint64_t capacity() const override { return m_capacity; }
  bool persistent() const override { return false; }
  bool keeps_memory() const override { return false; }
  std::string backing() const override { return "cuda:" + std::to_string(m_dev.ordinal); }
  uint32_t domains() const override { return static_cast<uint32_t>(m_bytes.size()); }
  bool per_domain() const override { return true; }
  uint64_t domain_span() const override { return m_span; }
  uint64_t domain_bytes(uint32_t d) const override {
    std::lock_guard lock(m_mutex);
    return d < m_bytes.size() ? m_bytes[d] : 0;
  }
  Status open_domain(uint32_t d, uint64_t bytes) override {
    std::lock_guard lock(m_mutex);
    bool done = false;
    TIERMEM_RETURN_IF_ERROR(
        check_open_domain("VRAM", d, bytes, m_bytes.size(), m_span, d < m_bytes.size() ? m_bytes[d] : 0, &done));
    if (!done) m_bytes[d] = bytes;  // chunks come with the frames (commit)
    return Status();
  }
  std::byte* host_base() const override { return nullptr; }
  void* region_base() const override { return reinterpret_cast<void*>(m_base); }
  std::string device_uuid() const override { return m_dev.uuid; }
  HostPinner host_pinner() const override {
    const int device = m_dev.ordinal;
    return [device](std::byte* p, size_t length) {
      cudaSetDevice(device);
      const cudaError_t err = cudaHostRegister(p, length, cudaHostRegisterPortable);
      return err == cudaSuccess ? Status() : cuda_error("pinning " + format_size(length) + " of host memory", err);
    };
  }
  uint64_t chunk_bytes() const override { return m_chunk; }
  std::vector<DeviceChunk> device_chunks(uint64_t offset, uint64_t length, size_t limit) const override {
    std::vector<DeviceChunk> out;
    if (length == 0) return out;
    std::lock_guard lock(m_mutex);
    for (auto it = m_chunks.lower_bound(offset / m_chunk); it != m_chunks.end() && out.size() < limit; ++it) {
      if (it->first * m_chunk >= offset + length) break;
      out.push_back({it->first * m_chunk, it->second.get()});
    }
    return out;
  }

  Status write(uint64_t offset, const void* src, size_t length) override {
    return copy(address(offset), src, length, cudaMemcpyHostToDevice, "write to VRAM");
  }
  Status read(uint64_t offset, void* dst, size_t length) const override {
    return copy(dst, address(offset), length, cudaMemcpyDeviceToHost, "read from VRAM");
  }
  Status persist(uint64_t, size_t) override { return Status(); }
  Status discard(uint64_t offset, size_t length) override {
    cudaSetDevice(m_dev.ordinal);
    // Only what has memory (frames are cleared before they are committed).
    for (uint64_t at = offset; at < offset + length;) {
      const uint64_t index = at / m_chunk;
      const uint64_t end = std::min(offset + length, (index + 1) * m_chunk);
      if (mapped(index)) {
        cudaError_t err = cudaMemset(address(at), 0, end - at);
        // cudaMemset may return before the device is done: a client's copy
        // (another process, another stream) must come after it.
        if (err == cudaSuccess) err = cudaStreamSynchronize(nullptr);
        if (err != cudaSuccess) return cuda_error("clearing VRAM", err);
      }
      at = end;
    }
    return Status();
  }
  // Chunks stay mapped: a released frame is cleared when it is handed out again.
  Status release(uint64_t, size_t) override { return Status(); }
  Status commit(uint64_t offset, size_t length) override {
    if (length == 0) return Status();
    std::lock_guard lock(m_mutex);
    for (uint64_t index = offset / m_chunk; index <= (offset + length - 1) / m_chunk; ++index) {
      if (m_chunks.count(index) == 0) TIERMEM_RETURN_IF_ERROR(create_chunk(index));
    }
    return Status();
  }
  Status copy_from(const TierBackend& source, uint64_t source_offset, uint64_t offset,
                   size_t length) override {
    if (source.tier() == Tier::vram) {
      return copy(address(offset), static_cast<const std::byte*>(source.region_base()) + source_offset, length,
                  cudaMemcpyDeviceToDevice, "VRAM to VRAM copy");
    }
    return TierBackend::copy_from(source, source_offset, offset, length);
  }
  Status copy_from_many(const TierBackend& source, std::span<const FrameCopy> copies) override {
    const auto* from = static_cast<const std::byte*>(
        source.tier() == Tier::vram ? source.region_base() : static_cast<void*>(source.host_base()));
    if (from == nullptr) return TierBackend::copy_from_many(source, copies);
    const cudaMemcpyKind kind = source.tier() == Tier::vram ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice;
    return queued(copies.size(), [&](size_t i) {
      return cudaMemcpyAsync(address(copies[i].offset), from + copies[i].source_offset, copies[i].length, kind, nullptr);
    }, "copy into VRAM");
  }
  Status read_many(std::span<const FrameRead> reads) const override {
    return queued(reads.size(), [&](size_t i) {
      return cudaMemcpyAsync(reads[i].dst, address(reads[i].offset), reads[i].length, cudaMemcpyDeviceToHost, nullptr);
    }, "read from VRAM");
  }

 private:
  std::byte* address(uint64_t offset) const { return reinterpret_cast<std::byte*>(m_base + offset); }
  bool mapped(uint64_t index) const {
    std::lock_guard lock(m_mutex);
    return m_chunks.count(index) != 0;
  }

  // Physical memory for chunk `index`: created, mapped (read-write for the
  // device), zeroed and exported. Caller holds m_mutex.
  Status create_chunk(uint64_t index) {
    const cuda::Driver& d = *m_dev.driver;
    const cuda::CUdeviceptr at = m_base + index * m_chunk;
    int fd = -1;
    bool is_mapped = false;
    cuda::CUmemGenericAllocationHandle handle = 0;
    const std::string what = "a " + format_size(m_chunk) + " chunk of VRAM on device " + std::to_string(m_dev.ordinal);
    Status s;
    (void)cuda::in_context(d, m_dev.ctx, [&] {
      cuda::CUresult r = d.mem_create(&handle, m_chunk, &m_dev.prop, 0);
      if (r != cuda::k_success) {
        s = driver_error(d, "creating " + what, r);
        return r;
      }
      cuda::MemAccessDesc access;
      access.location = m_dev.prop.location;
      access.flags = cuda::k_access_read_write;
      if ((r = d.mem_map(at, m_chunk, 0, handle, 0)) == cuda::k_success) {
        is_mapped = true;
        if ((r = d.mem_set_access(at, m_chunk, &access, 1)) == cuda::k_success &&
            (r = d.memset_d8(at, 0, m_chunk)) == cuda::k_success) {
          // Cleared before any client can import it.
          if (cudaStreamSynchronize(nullptr) != cudaSuccess) r = cuda::k_invalid_value;
          if (r == cuda::k_success) r = d.mem_export(&fd, handle, cuda::k_handle_posix_fd, 0);
        }
      }
      if (r != cuda::k_success) {
        s = driver_error(d, "mapping " + what, r);
        if (is_mapped) (void)d.mem_unmap(at, m_chunk);
      }
      // The mapping and the exported descriptor hold the memory now.
      (void)d.mem_release(handle);
      return r;
    });
    if (!s.ok()) {
      if (fd >= 0) ::close(fd);
      return s;
    }
    m_chunks.emplace(index, UniqueFd(fd));
    return Status();
  }

  // Queues `count` copies on the legacy default stream (from page-locked
  // host memory they run on the copy engines while the next is queued) and
  // waits once for all of them.
  template <typename Enqueue>
  Status queued(size_t count, Enqueue enqueue, const char* what) const {
    cudaSetDevice(m_dev.ordinal);
    cudaError_t err = cudaSuccess;
    for (size_t i = 0; i < count && err == cudaSuccess; ++i) err = enqueue(i);
    // Waited for also after a failed enqueue: nothing may still be copying
    // into frames the caller gives back.
    const cudaError_t done = cudaStreamSynchronize(nullptr);
    if (err == cudaSuccess) err = done;
    return err == cudaSuccess ? Status() : cuda_error(what, err);
  }

  Status copy(void* dst, const void* src, size_t length, cudaMemcpyKind kind, const char* what) const {
    cudaSetDevice(m_dev.ordinal);
    cudaError_t err = cudaMemcpy(dst, src, length, kind);
    // From pageable memory cudaMemcpy may return before the DMA is done:
    // the bytes must be in VRAM before the page is unlocked.
    if (err == cudaSuccess && kind != cudaMemcpyDeviceToHost) err = cudaStreamSynchronize(nullptr);
    return err == cudaSuccess ? Status() : cuda_error(what, err);
  }

  Device m_dev;
  uint64_t m_capacity;
  uint64_t m_chunk;
  uint64_t m_span;
  mutable std::mutex m_mutex;  // chunks and domains
  std::vector<uint64_t> m_bytes;
  std::map<uint64_t, UniqueFd> m_chunks;  // by chunk index: the exported descriptor
  cuda::CUdeviceptr m_base;
};

}  // namespace

Result<std::unique_ptr<TierBackend>> make_vram_tier(int device, uint64_t capacity, uint32_t domains) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    return Status(ErrorCode::tier_unavailable,
                  err != cudaSuccess ? std::string("no usable CUDA device: ") + cudaGetErrorString(err)
                                     : std::string("no CUDA device present"));
  }
  if (device < 0 || device >= count) {
    return Status(ErrorCode::invalid_argument, "CUDA device " + std::to_string(device) +
                                                   " does not exist (" + std::to_string(count) +
                                                   " present)");
  }
  if (domains == 0) return Status(ErrorCode::invalid_argument, "the VRAM tier needs at least one domain");
  if ((err = cudaSetDevice(device)) != cudaSuccess) return cuda_error("cudaSetDevice", err);
  if ((err = cudaFree(nullptr)) != cudaSuccess) return cuda_error("initialising CUDA", err);
  Device dev;
  dev.ordinal = device;
  std::string why;
  dev.driver = cuda::load_driver(&why);
  if (dev.driver == nullptr) return Status(ErrorCode::tier_unavailable, why);
  const cuda::Driver& d = *dev.driver;
  cuda::CUdevice cu = 0;
  cuda::CUresult r = d.device_get(&cu, device);
  int vmm = 0, fds = 0;
  if (r == cuda::k_success) r = d.device_get_attribute(&vmm, cuda::k_device_vmm_supported, cu);
  if (r == cuda::k_success) r = d.device_get_attribute(&fds, cuda::k_device_posix_fd_supported, cu);
  if (r != cuda::k_success) return driver_error(d, "asking CUDA device " + std::to_string(device), r);
  if (vmm == 0 || fds == 0) {
    return Status(ErrorCode::not_supported,
                  "CUDA device " + std::to_string(device) +
                      " has no virtual memory management with file-descriptor export, which the VRAM tier needs to "
                      "give each tenant its own memory");
  }
  char uuid[16] = {};
  if ((r = d.device_get_uuid(uuid, cu)) != cuda::k_success) return driver_error(d, "device UUID", r);
  dev.uuid.assign(uuid, sizeof uuid);
  if ((r = d.primary_ctx_retain(&dev.ctx, cu)) != cuda::k_success) return driver_error(d, "primary context", r);
  dev.prop.type = cuda::k_allocation_pinned;
  dev.prop.requested_handle_types = cuda::k_handle_posix_fd;
  dev.prop.location = {cuda::k_location_device, cu};
  size_t granularity = 0;
  if ((r = d.mem_get_allocation_granularity(&granularity, &dev.prop, 0)) != cuda::k_success || granularity == 0) {
    return driver_error(d, "allocation granularity", r);
  }
  const uint64_t chunk = (k_chunk_bytes + granularity - 1) / granularity * granularity;
  if (capacity == 0) {
    size_t free_bytes = 0, total = 0;
    if ((err = cudaMemGetInfo(&free_bytes, &total)) != cudaSuccess) return cuda_error("cudaMemGetInfo", err);
    capacity = free_bytes / 2;  // "auto": half of what is free, leave room for kernels
  }
  const uint64_t span = (capacity + chunk - 1) / chunk * chunk;
  cuda::CUdeviceptr base = 0;
  r = cuda::in_context(d, dev.ctx, [&] { return d.mem_address_reserve(&base, span * domains, chunk, 0, 0); });
  if (r != cuda::k_success) {
    return driver_error(d, "reserving " + format_size(span * domains) + " of device addresses", r);
  }
  return std::unique_ptr<TierBackend>(new VramTier(std::move(dev), capacity, chunk, span, domains, base));
}

}  // namespace tiermem
