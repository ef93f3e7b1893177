// The files that hold a node's memory (DRAM frames, version words, PMEM
// frames): named files in a directory that exactly one daemon holds locked,
// mapped at fixed places in a range of reserved address space, so that the
// daemon sees each tier as one contiguous region while every domain (one per
// tenant) is a file of its own, which the kernel lets only holders of its
// descriptor map.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <tiermem/status.h>

#include "common/unique_fd.hpp"
#include "tiers/truncation_guard.hpp"

namespace tiermem {

// An exclusive lock (flock) on <dir>/lock: one daemon per directory, so two
// daemons can never share a PMEM pool or a node's shared memory. Released
// when the object goes away or the process dies.
class DirectoryLock {
 public:
  DirectoryLock() = default;
  // Creates `dir` (0700) when missing and locks it. `what` names it in
  // errors ("the PMEM pool"). Errors: already_exists (another tiermemd
  // holds it; says its pid), io_error.
  static Result<DirectoryLock> take(const std::string& dir, const std::string& what);
  const std::string& dir() const { return m_dir; }

 private:
  UniqueFd m_fd;
  std::string m_dir;
};

// A range of address space reserved (PROT_NONE, no memory behind it) in
// which files are mapped at fixed offsets. Unmapped on destruction.
class Reservation {
 public:
  Reservation() = default;
  Reservation(Reservation&& other) noexcept;
  Reservation& operator=(Reservation&& other) noexcept;
  Reservation(const Reservation&) = delete;
  Reservation& operator=(const Reservation&) = delete;
  ~Reservation();

  // Errors: io_error (mmap), naming `what` and the size.
  static Result<Reservation> reserve(size_t bytes, const std::string& what);
  std::byte* base() const { return m_base; }
  size_t size() const { return m_size; }
  // Maps [file_offset, file_offset + length) of `fd`, shared and writable,
  // at `offset` in the reservation. Both offsets page-aligned. The file is
  // watched against truncation (TruncationGuard) while mapped. Errors:
  // invalid_argument (outside the reservation), io_error.
  Status map(uint64_t offset, size_t length, int fd, uint64_t file_offset);

 private:
  std::byte* m_base = nullptr;
  size_t m_size = 0;
  std::vector<TruncationGuard> m_guards;
};

// Opens (creating, mode 0600) the file at `path` and makes it at least
// `size` bytes long; the new bytes are a hole (no storage until written).
// Errors: io_error with the path.
Result<UniqueFd> open_segment(const std::string& path, uint64_t size);

// What trim_segment found of a file and did to it.
struct SegmentTrim {
  uint64_t size_before = 0;     // its length as found
  uint64_t storage_before = 0;  // bytes of storage it held (st_blocks), as found
  uint64_t storage_after = 0;   // and after
  bool trimmed = false;         // it was longer than `size`, or held storage past it, and was cut back
};

// Cuts the file of `fd` back to `size` when it is longer or holds storage
// past `size` (fallocate with FALLOC_FL_KEEP_SIZE): whoever holds its
// descriptor (a tenant) may grow it, and the storage it took is given back
// to the file system. A file shorter than `size` is left as it is (the
// TruncationGuard and recovery judge that). Async-signal-safe apart from the
// Status it returns. Errors: io_error with `path`.
Result<SegmentTrim> trim_segment(int fd, uint64_t size, const std::string& path);
// trim_segment of the regular file at `path` (not following a link); nothing
// when there is none.
Result<SegmentTrim> trim_segment_file(const std::string& path, uint64_t size);

// The trims of a tier's domain files: those a start made (before or as a
// domain opened) are kept and told once, by the first look after it
// (TierBackend::trim_domain_file). Not thread-safe: the tier's lock guards it.
class DomainTrims {
 public:
  // A trim of domain `d`'s file at this start (kept when it cut something).
  void at_start(uint32_t d, const Result<SegmentTrim>& t) {
    if (t.ok() && t->trimmed) m_at_start[d] = *t;
  }
  // The look at `d` now: what it cut, else what the start cut (once).
  Result<SegmentTrim> look(uint32_t d, Result<SegmentTrim> now) {
    if (auto at_start = m_at_start.extract(d); now.ok() && !at_start.empty() && !now->trimmed) return at_start.mapped();
    return now;
  }

 private:
  std::map<uint32_t, SegmentTrim> m_at_start;
};

// `n` rounded up to a multiple of `unit` (a power of two).
inline uint64_t round_up(uint64_t n, uint64_t unit) { return (n + unit - 1) & ~(unit - 1); }

}  // namespace tiermem
