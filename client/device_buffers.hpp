// Buffers a caller hands to write() and read() may be CUDA device memory (a
// PyTorch or CUDA trainer's tensors). The library never dereferences one on
// the host: it asks the CUDA driver the process already loaded what a pointer
// is, and stages device memory through host memory. It never loads CUDA
// itself, so a process without CUDA pays one check of its loaded libraries
// (about 20 ns) per call, and needs no CUDA at build time.
#pragma once

#include <cstddef>

#include <tiermem/status.h>

namespace tiermem::detail {

enum class BufferKind { host, device };

// What `p` is. host: memory the CPU may read (pageable, pinned or managed);
// device: memory of a CUDA device. Errors: invalid_argument when the process
// uses CUDA and `p` is neither CUDA memory nor readable host memory (a freed
// device pointer), or when the driver cannot say.
Result<BufferKind> classify_buffer(const void* p);

// Synchronous copies between device memory and host memory (in the device
// pointer's context). Errors: io_error with the driver's message.
Status copy_from_device(void* host, const void* device, size_t length);
Status copy_to_device(void* device, const void* host, size_t length);

// Host memory to stage `length` bytes of device buffer `device` through:
// this thread's page-locked buffer (kept and reused, at most 256 MiB), so
// the copy runs at the copy engines' speed; null where there is none (too
// large, or the driver would not pin): the caller stages in pageable memory.
std::byte* pinned_staging(const void* device, size_t length);

}  // namespace tiermem::detail
