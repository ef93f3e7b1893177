// Tier backends (M5): the memory behind one tier of one node.
//
// A backend owns a region of frames; frames are byte offsets in it. DRAM and
// PMEM keep each domain (one per tenant) in a file of its own, mapped at
// frame offsets [k * domain_span(), k * domain_span() + domain_bytes(k)), so
// the daemon sees one contiguous region (host_base()) while a co-located
// client is given the descriptors of its own tenant's domains only. DRAM is
// shared memory in the node's directory under /dev/shm, PMEM a file per
// domain mapped with libpmem2; VRAM is one range of device addresses laid out
// the same way, backed by chunks of device memory, each exported as a file
// descriptor that a co-located client of the domain's tenant imports
// (vram_tier.cpp).
//
// read()/write() copy between host memory and the region; write() returns only
// once the bytes are durable on a persistent tier. Safe to call from several
// threads on disjoint ranges; callers order access to a range with its page's
// version word.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <tiermem/status.h>
#include <tiermem/types.h>

#include "tiers/segment_file.hpp"

namespace tiermem {

// One range of a batched copy between tiers: `length` bytes from
// `source_offset` of the source tier to `offset` of this one.
struct FrameCopy {
  uint64_t source_offset = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// One range of a batched read into host memory.
struct FrameRead {
  uint64_t offset = 0;
  void* dst = nullptr;
  uint64_t length = 0;
};

class TierBackend {
 public:
  virtual ~TierBackend() = default;

  virtual Tier tier() const = 0;
  // Bytes of frames the tier has: what all its domains together may use.
  virtual uint64_t capacity() const = 0;
  virtual bool persistent() const = 0;
  // Human description of what backs it: directory, pool, CUDA device.
  virtual std::string backing() const = 0;

  // Domains. A tier without them (VRAM) has one that spans its capacity.
  virtual uint32_t domains() const { return 1; }
  // Whether its frames are files of each domain (DRAM, PMEM: a tenant's
  // files, opened by open_domain, also when there is one domain), or one
  // region all share (VRAM).
  virtual bool per_domain() const { return false; }
  virtual uint64_t domain_span() const { return capacity(); }
  // Bytes of frames domain `d` has (0 while it is not open).
  virtual uint64_t domain_bytes(uint32_t d) const { return d == 0 ? capacity() : 0; }
  // Gives domain `d` `bytes` of frames: its file is created (or found) and
  // mapped; once, a domain is never resized while in use. Errors:
  // invalid_argument (no such domain, already open with another size),
  // io_error.
  virtual Status open_domain(uint32_t /*d*/, uint64_t /*bytes*/) { return Status(); }
  // The length of domain `d`'s file as an earlier daemon (or the domain's
  // tenant, who may truncate it) left it, before open_domain: frames below
  // it kept their bytes. 0: no file. A tier without files (VRAM) never
  // keeps its memory.
  virtual uint64_t domain_file_bytes(uint32_t /*d*/) const { return 0; }
  // Domain `d`'s file cut back to the size open_domain gave it, where the
  // tenant holding its descriptor grew it or gave it storage past its end
  // (trim_segment); `*path` names the file. Nothing on a tier without files
  // or a domain not open. Errors: io_error.
  virtual Result<SegmentTrim> trim_domain_file(uint32_t /*d*/, std::string* /*path*/) { return SegmentTrim{}; }
  // The same for a domain not opened yet, whose file an earlier daemon gave
  // `bytes`: at a start, before anything needs storage of a file system its
  // tenant may have filled. What it cut is told by the first
  // trim_domain_file after open_domain. Nothing without a file.
  virtual Result<SegmentTrim> trim_unopened(uint32_t /*d*/, uint64_t /*bytes*/) { return SegmentTrim{}; }
  // Removes domain `d`'s file before open_domain makes a new one: what it
  // held is gone, and a client still mapping it keeps an unlinked file that
  // nobody else is given.
  virtual void remove_domain_file(uint32_t /*d*/) {}
  // True when [offset, offset+length) lies inside one open domain.
  bool contains(uint64_t offset, uint64_t length) const;
  uint32_t domain_of(uint64_t offset) const { return static_cast<uint32_t>(offset / domain_span()); }

  // CPU pointer to frame offset 0, or nullptr when the CPU cannot address it.
  virtual std::byte* host_base() const = 0;
  // Base address for transport registration (device pointer for VRAM).
  virtual void* region_base() const = 0;
  // Descriptor of domain `d`'s file, which a co-located client may mmap; -1
  // when there is none.
  virtual int share_fd(uint32_t /*d*/) const { return -1; }
  // Whether the frames outlive the daemon (files another daemon adopts);
  // device memory dies with its process.
  virtual bool keeps_memory() const { return per_domain(); }

  // A device tier's chunks (VRAM): the 16-byte UUID of its device, the size
  // of a chunk, and the chunks holding any of [offset, offset+length) that
  // exist: their frame offsets and descriptors (owned by the backend), at
  // most `limit`. Empty on host tiers.
  struct DeviceChunk {
    uint64_t frame_offset = 0;
    int fd = -1;
  };
  // Page-locks host memory for the device's copy engines (VRAM: cudaHostRegister),
  // so copies between the tiers run at their speed; null on host tiers.
  using HostPinner = std::function<Status(std::byte* p, size_t length)>;
  virtual HostPinner host_pinner() const { return {}; }
  // Host tiers: from now on, memory given frames (commit) is pinned with
  // `pin`, a chunk at a time, and never unpinned (a pinned range is zeroed
  // rather than given back to the OS: the device holds its pages).
  virtual void pin_with(HostPinner /*pin*/) {}
  virtual std::string device_uuid() const { return {}; }
  virtual uint64_t chunk_bytes() const { return 0; }
  virtual std::vector<DeviceChunk> device_chunks(uint64_t /*offset*/, uint64_t /*length*/, size_t /*limit*/) const {
    return {};
  }

  virtual Status write(uint64_t offset, const void* src, size_t length) = 0;
  virtual Status read(uint64_t offset, void* dst, size_t length) const = 0;
  // Makes [offset, offset+length) durable; no-op on volatile tiers.
  virtual Status persist(uint64_t offset, size_t length) = 0;
  // Zeroes a range and gives its storage back where the tier can (hole punch).
  virtual Status discard(uint64_t offset, size_t length) = 0;
  // A range no allocation holds any more: its storage back where the tier
  // can give it, else nothing (frames are cleared when next handed out).
  virtual Status release(uint64_t offset, size_t length) { return discard(offset, length); }
  // Gives a range storage now (fallocate), so that frames handed out never
  // fault for want of space later (a full /dev/shm would raise SIGBUS on the
  // first write). Errors: tier_exhausted (no space), io_error.
  virtual Status commit(uint64_t /*offset*/, size_t /*length*/) { return Status(); }
  // Copies within the region or from another backend's region (migration).
  virtual Status copy_from(const TierBackend& source, uint64_t source_offset,
                           uint64_t offset, size_t length);
  // Copies every range of `copies` from `source` into this tier and returns
  // once all of them are in place (durable on a persistent tier). Migration
  // moves runs of pages this way, so a device tier queues them all on its
  // copy engines and waits once. Default: copy_from() each, or, from a
  // device into this tier's host memory, the source's read_many().
  virtual Status copy_from_many(const TierBackend& source, std::span<const FrameCopy> copies);
  // Reads every range into host memory and returns once all are there.
  // Default: read() each.
  virtual Status read_many(std::span<const FrameRead> reads) const;
};

// The checks of open_domain for a tier ("DRAM") of `domains` domains of at
// most `span` bytes, whose domain `d` has `current` bytes now (0: not open):
// invalid_argument when it cannot be opened with `bytes`; *done is true when
// it already is.
Status check_open_domain(const char* tier, uint32_t d, uint64_t bytes, size_t domains, uint64_t span,
                         uint64_t current, bool* done);

// fallocate of [offset, offset+length) of a domain file, with the error a
// caller can show ("the DRAM tier's files in DIR ...").
Status commit_file_range(int fd, uint64_t offset, uint64_t length, const std::string& what);

// DRAM and PMEM: files <dir>/dram.<k> or <dir>/pmem.<k>, one per domain
// (created by open_domain). The caller holds the directory's lock
// (DirectoryLock) and decides what an existing file means: open_domain
// keeps its contents.
struct SegmentedTierOptions {
  std::string dir;
  uint64_t capacity = 0;
  uint32_t domains = 1;
};

// Errors: invalid_argument (capacity 0), io_error (reserving address space).
Result<std::unique_ptr<TierBackend>> make_dram_tier(const SegmentedTierOptions& options);
Result<std::unique_ptr<TierBackend>> make_pmem_tier(const SegmentedTierOptions& options);
// VRAM of CUDA device `device`: `capacity` bytes (0: half of what is free)
// for `domains` domains. Errors: tier_unavailable when built without CUDA or
// no device is present, not_supported when the device or driver lacks
// virtual memory management with file-descriptor export, io_error.
Result<std::unique_ptr<TierBackend>> make_vram_tier(int device, uint64_t capacity, uint32_t domains = 1);

// The length of the regular file at `path` (0: none, or not a regular file).
uint64_t segment_file_bytes(const std::string& path);

// The frame-offset span of one domain for a tier of `capacity`: whole 2 MiB
// (the largest mapping alignment PMEM on DAX asks for).
uint64_t domain_span_for(uint64_t capacity);

}  // namespace tiermem
