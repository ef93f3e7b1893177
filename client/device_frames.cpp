#include "client/device_frames.hpp"

#include <cstring>

#include <tiermem/status_macros.h>

namespace tiermem::detail {

Result<std::unique_ptr<DeviceFrameData>> DeviceFrameData::open(const std::string& uuid, uint64_t chunk_bytes,
                                                               std::vector<DeviceWindow> windows, Fetch fetch) {
  if (uuid.size() != 16 || chunk_bytes == 0) {
    return Status(ErrorCode::malformed_frame, "tiermemd described its VRAM without a device UUID or chunk size");
  }
  std::string why;
  const cuda::Driver* d = cuda::load_driver(&why);
  if (d == nullptr) return Status(ErrorCode::not_supported, "VRAM is reached through tiermemd: " + why);
  int count = 0;
  cuda::CUresult r = d->device_get_count(&count);
  if (r != cuda::k_success) return Status(ErrorCode::not_supported, "no CUDA device: " + d->error(r));
  for (int i = 0; i < count; ++i) {
    cuda::CUdevice device = 0;
    char id[16] = {};
    if (d->device_get(&device, i) != cuda::k_success || d->device_get_uuid(id, device) != cuda::k_success ||
        std::memcmp(id, uuid.data(), sizeof id) != 0) {
      continue;
    }
    cuda::CUcontext ctx = nullptr;
    if ((r = d->primary_ctx_retain(&ctx, device)) != cuda::k_success) {
      return Status(ErrorCode::not_supported, "the daemon's GPU: primary context: " + d->error(r));
    }
    std::unique_ptr<DeviceFrameData> f(new DeviceFrameData(*d, device, ctx, chunk_bytes, std::move(fetch)));
    cuda::MemAccessDesc own;
    own.location = {cuda::k_location_device, device};
    own.flags = cuda::k_access_read_write;
    f->m_access.push_back(own);
    for (int j = 0; j < count; ++j) {
      cuda::CUdevice peer = 0;
      int can = 0;
      if (j == i || d->device_get(&peer, j) != cuda::k_success ||
          d->device_can_access_peer(&can, peer, device) != cuda::k_success || can == 0) {
        continue;
      }
      cuda::MemAccessDesc other = own;
      other.location = {cuda::k_location_device, peer};
      f->m_access.push_back(other);
    }
    for (const DeviceWindow& w : windows) {
      Window win;
      win.frames = w;
      win.reserved = (w.bytes + chunk_bytes - 1) / chunk_bytes * chunk_bytes;
      r = cuda::in_context(*d, ctx, [&] { return d->mem_address_reserve(&win.base, win.reserved, chunk_bytes, 0, 0); });
      if (r != cuda::k_success) {
        return Status(ErrorCode::io_error, "reserving device addresses for VRAM frames: " + d->error(r));
      }
      f->m_windows.push_back(win);
    }
    return f;
  }
  return Status(ErrorCode::not_supported,
                "the daemon's GPU is not visible to this process (CUDA_VISIBLE_DEVICES?): VRAM is reached through "
                "tiermemd");
}

DeviceFrameData::~DeviceFrameData() {
  (void)cuda::in_context(m_driver, m_ctx, [&] {
    for (uint64_t c : m_chunks) {
      if (const Window* w = window_of(c, 1)) (void)m_driver.mem_unmap(w->base + (c - w->frames.first), m_chunk);
    }
    for (const Window& w : m_windows) (void)m_driver.mem_address_free(w.base, w.reserved);
    return cuda::k_success;
  });
  // Streams go with the primary context, which stays retained for the process.
}

const DeviceFrameData::Window* DeviceFrameData::window_of(uint64_t frame_offset, size_t length) const {
  for (const Window& w : m_windows) {
    if (frame_offset >= w.frames.first && length <= w.reserved && frame_offset - w.frames.first <= w.reserved - length) {
      return &w;
    }
  }
  return nullptr;
}

Status DeviceFrameData::import(const Window& w, uint64_t chunk_offset, int fd) {
  const cuda::CUdeviceptr at = w.base + (chunk_offset - w.frames.first);
  const cuda::Driver& d = m_driver;
  const cuda::CUresult r = cuda::in_context(d, m_ctx, [&] {
    cuda::CUmemGenericAllocationHandle handle = 0;
    cuda::CUresult e = d.mem_import(&handle, reinterpret_cast<void*>(static_cast<intptr_t>(fd)), cuda::k_handle_posix_fd);
    if (e != cuda::k_success) return e;
    e = d.mem_map(at, m_chunk, 0, handle, 0);
    (void)d.mem_release(handle);  // the mapping holds the memory
    if (e != cuda::k_success) return e;
    e = d.mem_set_access(at, m_chunk, m_access.data(), m_access.size());
    if (e != cuda::k_success) (void)d.mem_unmap(at, m_chunk);
    return e;
  });
  if (r != cuda::k_success) return Status(ErrorCode::io_error, "importing a chunk of VRAM: " + d.error(r));
  m_chunks.insert(chunk_offset);
  return Status();
}

Status DeviceFrameData::prepare(uint64_t frame_offset, size_t length) {
  if (length == 0) return Status();
  const Window* w = window_of(frame_offset, length);
  if (w == nullptr) {
    return Status(ErrorCode::not_supported, "VRAM frames at " + std::to_string(frame_offset) +
                                                " are not of a domain this client may import");
  }
  const uint64_t end = frame_offset + length;
  std::lock_guard lock(m_mutex);
  for (uint64_t c = frame_offset / m_chunk * m_chunk; c < end; c += m_chunk) {
    if (m_chunks.count(c) != 0) continue;
    // Missing from here: ask for the chunks of the rest of the range.
    TIERMEM_ASSIGN_OR_RETURN(auto got, m_fetch(c, end - c));
    for (auto& [offset, fd] : got) {
      if (offset % m_chunk != 0 || window_of(offset, m_chunk) != w) {
        return Status(ErrorCode::malformed_frame, "tiermemd sent a VRAM chunk outside the domain asked for");
      }
      if (m_chunks.count(offset) == 0) TIERMEM_RETURN_IF_ERROR(import(*w, offset, fd.get()));
    }
    if (m_chunks.count(c) == 0) {
      return Status(ErrorCode::not_supported, "VRAM frames at " + std::to_string(c) + " have no memory yet");
    }
  }
  return Status();
}

Result<std::byte*> DeviceFrameData::address(uint64_t frame_offset, size_t length) {
  TIERMEM_RETURN_IF_ERROR(prepare(frame_offset, length));
  const Window* w = window_of(frame_offset, length);
  return reinterpret_cast<std::byte*>(w->base + (frame_offset - w->frames.first));
}

Status DeviceFrameData::copy(cuda::CUdeviceptr dst, cuda::CUdeviceptr src, size_t length, const char* what) {
  const cuda::Driver& d = m_driver;
  cuda::CUstream stream = nullptr;
  {
    std::lock_guard lock(m_mutex);
    if (!m_idle_streams.empty()) {
      stream = m_idle_streams.back();
      m_idle_streams.pop_back();
    }
  }
  const cuda::CUresult r = cuda::in_context(d, m_ctx, [&] {
    // A blocking stream, as cudaMemcpy's: the copy waits for the work queued
    // before it on the legacy default stream (PyTorch's default), so a
    // tensor a kernel is still writing is read once it is written.
    cuda::CUresult e = stream == nullptr ? d.stream_create(&stream, 0) : cuda::k_success;
    if (e != cuda::k_success) return e;
    // Any kind of buffer (pageable, pinned, device): unified addressing
    // tells the driver which engine copies.
    e = d.memcpy_async(dst, src, length, stream);
    const cuda::CUresult done = d.stream_synchronize(stream);
    return e != cuda::k_success ? e : done;
  });
  if (stream != nullptr) {
    std::lock_guard lock(m_mutex);
    m_idle_streams.push_back(stream);
  }
  return r == cuda::k_success ? Status() : Status(ErrorCode::io_error, std::string(what) + ": " + d.error(r));
}

Status DeviceFrameData::read(uint64_t frame_offset, void* dst, size_t length) {
  TIERMEM_ASSIGN_OR_RETURN(std::byte* src, address(frame_offset, length));
  return copy(reinterpret_cast<cuda::CUdeviceptr>(dst), reinterpret_cast<cuda::CUdeviceptr>(src), length,
              "reading VRAM");
}

Status DeviceFrameData::write(uint64_t frame_offset, const void* src, size_t length) {
  TIERMEM_ASSIGN_OR_RETURN(std::byte* dst, address(frame_offset, length));
  return copy(reinterpret_cast<cuda::CUdeviceptr>(dst), reinterpret_cast<cuda::CUdeviceptr>(src), length,
              "writing VRAM");
}

}  // namespace tiermem::detail
