// Tier backends (M5): the memory behind one tier of one node.
//
// A backend owns one region of `capacity()` bytes; frames are byte offsets in
// it. DRAM is a memfd and PMEM a file mapped with libpmem2, both mapped into
// the daemon (host_base()) and shareable with co-located clients by fd; VRAM
// is a CUDA device arena shared through a CUDA IPC handle. The transport
// registers region_base()/capacity() for one-sided access.
//
// read()/write() copy between host memory and the region; write() returns only
// once the bytes are durable on a persistent tier. Safe to call from several
// threads on disjoint ranges; callers order access to a range with its page's
// version word.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <tiermem/status.h>
#include <tiermem/types.h>

#include "common/shared_memory.hpp"

namespace tiermem {

class TierBackend {
 public:
  virtual ~TierBackend() = default;

  virtual Tier tier() const = 0;
  virtual uint64_t capacity() const = 0;
  virtual bool persistent() const = 0;
  // Human description of what backs it: memfd name, pool path, CUDA device.
  virtual std::string backing() const = 0;

  // CPU pointer to the region, or nullptr when the CPU cannot address it.
  virtual std::byte* host_base() const = 0;
  // Base address for transport registration (device pointer for VRAM).
  virtual void* region_base() const = 0;
  // Descriptor a co-located client can mmap, or -1.
  virtual int share_fd() const { return -1; }
  // Opaque handle for co-located clients of a device tier (cudaIpcMemHandle_t).
  virtual std::string ipc_handle() const { return {}; }

  virtual Status write(uint64_t offset, const void* src, size_t length) = 0;
  virtual Status read(uint64_t offset, void* dst, size_t length) const = 0;
  // Makes [offset, offset+length) durable; no-op on volatile tiers.
  virtual Status persist(uint64_t offset, size_t length) = 0;
  // Zeroes a range and gives its storage back where the tier can (hole punch).
  virtual Status discard(uint64_t offset, size_t length) = 0;
  // Copies within the region or from another backend's region (migration).
  virtual Status copy_from(const TierBackend& source, uint64_t source_offset,
                           uint64_t offset, size_t length);
};

struct PmemTierOptions {
  std::string path;       // pool file; created when missing
  uint64_t capacity = 0;  // the file is grown to this size
};

// Errors: io_error (memfd/mmap), or the factory's when given.
Result<std::unique_ptr<TierBackend>> make_dram_tier(uint64_t capacity, const std::string& name,
                                                    const SharedMemoryFactory& factory = nullptr);
// Errors: io_error (open, size, map), with the path.
Result<std::unique_ptr<TierBackend>> make_pmem_tier(const PmemTierOptions& options);
// Errors: tier_unavailable when built without CUDA or no device is present.
Result<std::unique_ptr<TierBackend>> make_vram_tier(int device, uint64_t capacity);

}  // namespace tiermem
