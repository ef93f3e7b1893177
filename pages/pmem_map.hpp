// PMEM files mapped with libpmem2: the PMEM tier's domain files, in the
// daemon (at fixed places in its reservation) and in a co-located client of
// the domain's tenant (where libpmem2 places them: aligned so that a DAX file
// can be mapped with huge pages). libpmem2 looks at the file and decides how
// stores to it become durable:
//   - DAX with MAP_SYNC (real PMEM): cache flushes from user space, or only
//     a fence where the platform flushes caches on power loss (eADR);
//   - any other file (a disk, tmpfs in tests): msync of the pages written.
// Either way a store is durable once the chosen step returned; nothing else
// (no daemon, no second call) is needed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include <tiermem/status.h>

struct pmem2_map;
struct pmem2_vm_reservation;

namespace tiermem {

// How a writer of mapped PMEM frames makes its stores durable (what
// MappedFrameData is given). Both null: the kernel must write the pages back,
// so the writer msyncs them itself (and can report a failure, where
// libpmem2's persist function would end the process). Set: libpmem2's
// functions for a mapping it flushes from user space; `copy` (libpmem2's
// pmem2_memcpy_fn; flags 0) stores and makes durable in one go, `persist`
// (pmem2_persist_fn) makes durable what was stored otherwise (an atomic).
struct Durability {
  void* (*copy)(void* dst, const void* src, size_t length, unsigned flags) = nullptr;
  void (*persist)(const void* address, size_t length) = nullptr;
};

// One file mapped shared and writable with libpmem2; unmapped when the object
// goes away. Movable, not copyable.
class PmemMap {
 public:
  PmemMap() = default;
  PmemMap(PmemMap&& other) noexcept { *this = std::move(other); }
  PmemMap& operator=(PmemMap&& other) noexcept {
    if (this != &other) {
      unmap();
      m_map = std::exchange(other.m_map, nullptr);
      m_data = std::exchange(other.m_data, nullptr);
      m_size = std::exchange(other.m_size, 0);
      m_user_space = std::exchange(other.m_user_space, false);
      m_copy = std::exchange(other.m_copy, nullptr);
      m_persist = std::exchange(other.m_persist, nullptr);
    }
    return *this;
  }
  PmemMap(const PmemMap&) = delete;
  PmemMap& operator=(const PmemMap&) = delete;
  ~PmemMap() { unmap(); }

  // Maps [0, length) of `fd` (opened read-write), at `offset` of
  // `reservation` when one is given. Page store granularity is accepted, so
  // any file maps. `what` names the file in errors. Errors: io_error with
  // libpmem2's reason (a file shorter than `length`, no address space, ...).
  static Result<PmemMap> map(int fd, uint64_t length, const std::string& what,
                             pmem2_vm_reservation* reservation = nullptr, uint64_t offset = 0);

  std::byte* data() const { return m_data; }
  uint64_t size() const { return m_size; }
  // True when libpmem2 makes stores durable from user space (no msync).
  bool flushes_from_user_space() const { return m_user_space; }
  // For MappedFrameData: libpmem2's functions where it flushes from user
  // space; none (msync by the writer) where it would call msync.
  Durability durability() const;

  // libpmem2's own functions, whatever the granularity (the daemon's tier
  // writes through these; on an msync failure libpmem2 ends the process).
  // Copies `length` bytes to `dst` (inside the mapping), then makes them
  // durable.
  void copy_durable(std::byte* dst, const void* src, size_t length) const { m_copy(dst, src, length, 0); }
  void persist(const std::byte* address, size_t length) const { m_persist(address, length); }

 private:
  // Unmaps what is mapped (libpmem2's mapping, or the mmap of a build
  // without it: pmem_map_mmap.cpp).
  void unmap();

  pmem2_map* m_map = nullptr;
  std::byte* m_data = nullptr;
  uint64_t m_size = 0;
  bool m_user_space = false;
  void* (*m_copy)(void*, const void*, size_t, unsigned) = nullptr;
  void (*m_persist)(const void*, size_t) = nullptr;
};

}  // namespace tiermem
