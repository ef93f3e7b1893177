// VRAM tier on CUDA: one device arena from cudaMalloc, shared with co-located
// processes by a CUDA IPC handle. Compiled only when CUDA is found.
#include <cuda_runtime_api.h>

#include <string>

#include "mapping/tier_backend.hpp"

namespace tiermem {
namespace {

Status cuda_error(const std::string& what, cudaError_t err) {
  return Status(ErrorCode::io_error, what + ": " + cudaGetErrorName(err) + " (" +
                                         cudaGetErrorString(err) + ")");
}

class VramTier final : public TierBackend {
 public:
  VramTier(int device, void* base, uint64_t capacity, cudaIpcMemHandle_t handle)
      : m_device(device), m_base(static_cast<std::byte*>(base)), m_capacity(capacity),
        m_handle(handle) {}
  ~VramTier() override {
    cudaSetDevice(m_device);
    cudaFree(m_base);
  }

  Tier tier() const override { return Tier::vram; }
  uint64_t capacity() const override { return m_capacity; }
  bool persistent() const override { return false; }
  std::string backing() const override { return "cuda:" + std::to_string(m_device); }
  std::byte* host_base() const override { return nullptr; }
  void* region_base() const override { return m_base; }
  std::string ipc_handle() const override {
    return std::string(reinterpret_cast<const char*>(&m_handle), sizeof m_handle);
  }

  Status write(uint64_t offset, const void* src, size_t length) override {
    return copy(m_base + offset, src, length, cudaMemcpyHostToDevice, "write to VRAM");
  }
  Status read(uint64_t offset, void* dst, size_t length) const override {
    return copy(dst, m_base + offset, length, cudaMemcpyDeviceToHost, "read from VRAM");
  }
  Status persist(uint64_t, size_t) override { return Status(); }
  Status discard(uint64_t offset, size_t length) override {
    cudaSetDevice(m_device);
    const cudaError_t err = cudaMemset(m_base + offset, 0, length);
    return err == cudaSuccess ? Status() : cuda_error("clearing VRAM", err);
  }
  Status copy_from(const TierBackend& source, uint64_t source_offset, uint64_t offset,
                   size_t length) override {
    if (source.tier() == Tier::vram) {
      return copy(m_base + offset, static_cast<const std::byte*>(source.region_base()) + source_offset,
                  length, cudaMemcpyDeviceToDevice, "VRAM to VRAM copy");
    }
    return TierBackend::copy_from(source, source_offset, offset, length);
  }

 private:
  Status copy(void* dst, const void* src, size_t length, cudaMemcpyKind kind,
              const char* what) const {
    cudaSetDevice(m_device);
    const cudaError_t err = cudaMemcpy(dst, src, length, kind);
    return err == cudaSuccess ? Status() : cuda_error(what, err);
  }

  int m_device;
  std::byte* m_base;
  uint64_t m_capacity;
  cudaIpcMemHandle_t m_handle;
};

}  // namespace

Result<std::unique_ptr<TierBackend>> make_vram_tier(int device, uint64_t capacity) {
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
  if ((err = cudaSetDevice(device)) != cudaSuccess) return cuda_error("cudaSetDevice", err);
  if (capacity == 0) {
    size_t free_bytes = 0, total = 0;
    if ((err = cudaMemGetInfo(&free_bytes, &total)) != cudaSuccess) return cuda_error("cudaMemGetInfo", err);
    capacity = free_bytes / 2;  // "auto": half of what is free, leave room for kernels
  }
  void* base = nullptr;
  if ((err = cudaMalloc(&base, capacity)) != cudaSuccess) {
    return cuda_error("allocating " + std::to_string(capacity) + " bytes of VRAM", err);
  }
  cudaMemset(base, 0, capacity);
  cudaIpcMemHandle_t handle{};
  if ((err = cudaIpcGetMemHandle(&handle, base)) != cudaSuccess) {
    cudaFree(base);
    return cuda_error("cudaIpcGetMemHandle", err);
  }
  return std::unique_ptr<TierBackend>(new VramTier(device, base, capacity, handle));
}

}  // namespace tiermem
