// Co-located VRAM (M5/X12): the frames of this client's domain on its node's
// GPU, imported into this process chunk by chunk (each chunk the daemon
// exports as a file descriptor, cuMemImportFromShareableHandle) and copied
// with the copy engines on a stream of this library's own, so host buffers
// of either kind and device buffers go to and from VRAM without passing
// through the daemon. The page protocol around each copy is the one every
// path follows (seqlock_copy.hpp); a copy returns once its bytes are in
// place (the stream is synchronised), so a page unlocked after it shows
// them to every reader. Chunks are imported on first use and kept.
//
// The driver is loaded the first time VRAM frames are touched (a process
// that never does pays nothing, a process without a driver or without the
// daemon's GPU visible gets not_supported and the daemon's path).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <tiermem/status.h>

#include "common/cuda_driver.hpp"
#include "common/unique_fd.hpp"
#include "pages/seqlock_copy.hpp"

namespace tiermem::detail {

// Frames [first, first + bytes) of one domain on the device.
struct DeviceWindow {
  uint64_t first = 0;
  uint64_t bytes = 0;
};

class DeviceFrameData final : public FrameData {
 public:
  // Asks the daemon for the chunks holding any of frames [offset, +length):
  // their frame offsets and descriptors (possibly fewer than all).
  using Fetch = std::function<Result<std::vector<std::pair<uint64_t, UniqueFd>>>(uint64_t offset, uint64_t length)>;

  // Errors: not_supported (no driver, the device of `uuid` not visible to
  // this process, no virtual memory management), io_error.
  static Result<std::unique_ptr<DeviceFrameData>> open(const std::string& uuid, uint64_t chunk_bytes,
                                                       std::vector<DeviceWindow> windows, Fetch fetch);
  ~DeviceFrameData() override;
  DeviceFrameData(const DeviceFrameData&) = delete;
  DeviceFrameData& operator=(const DeviceFrameData&) = delete;

  Status prepare(uint64_t frame_offset, size_t length) override;
  Status read(uint64_t frame_offset, void* dst, size_t length) override;
  Status write(uint64_t frame_offset, const void* src, size_t length) override;
  // Host atomics cannot reach device memory: the daemon does them.
  Status atomic(uint64_t, WordOp, uint64_t, uint64_t, uint64_t*) override {
    return Status(ErrorCode::not_supported, "atomics on VRAM go through tiermemd");
  }
  bool persistent() const override { return false; }
  // This process's ordinal of the device.
  int device() const { return m_device; }

  // The device address of frames [frame_offset, +length) in this process,
  // imported first. Errors: as prepare.
  Result<std::byte*> address(uint64_t frame_offset, size_t length);

 private:
  struct Window {
    DeviceWindow frames;
    cuda::CUdeviceptr base = 0;  // this process's address of frames.first
    uint64_t reserved = 0;
  };
  DeviceFrameData(const cuda::Driver& d, cuda::CUdevice device, cuda::CUcontext ctx, uint64_t chunk, Fetch fetch)
      : m_driver(d), m_device(device), m_ctx(ctx), m_chunk(chunk), m_fetch(std::move(fetch)) {}
  // The devices whose copies and kernels may touch the frames: the GPU's
  // own and every other of this process that reaches it peer to peer (a
  // copy between two GPUs' tiermem memory runs on either's engines).
  std::vector<cuda::MemAccessDesc> m_access;
  const Window* window_of(uint64_t frame_offset, size_t length) const;
  Status import(const Window& w, uint64_t chunk_offset, int fd);
  Status copy(cuda::CUdeviceptr dst, cuda::CUdeviceptr src, size_t length, const char* what);

  const cuda::Driver& m_driver;
  cuda::CUdevice m_device;
  cuda::CUcontext m_ctx;
  uint64_t m_chunk;
  Fetch m_fetch;
  std::vector<Window> m_windows;
  std::mutex m_mutex;           // imports, streams
  std::set<uint64_t> m_chunks;  // frame offsets of imported chunks
  std::vector<cuda::CUstream> m_idle_streams;
};

}  // namespace tiermem::detail
