// Anonymous shared memory (memfd) and mappings of shared descriptors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <tiermem/status.h>

#include "common/unique_fd.hpp"

namespace tiermem {

// A MAP_SHARED mapping; unmaps on destruction. Movable.
class MappedRegion {
 public:
  MappedRegion() = default;
  MappedRegion(std::byte* data, size_t size) : m_data(data), m_size(size) {}
  MappedRegion(MappedRegion&& other) noexcept;
  MappedRegion& operator=(MappedRegion&& other) noexcept;
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;
  ~MappedRegion();

  std::byte* data() const { return m_data; }
  size_t size() const { return m_size; }

  // Maps `size` bytes of `fd` at `offset` read-write and shared.
  static Result<MappedRegion> map(int fd, size_t size, uint64_t offset = 0);

 private:
  std::byte* m_data = nullptr;
  size_t m_size = 0;
};

// A memfd of a fixed size mapped into this process; the descriptor can be
// passed to other processes, which then map the same pages.
class SharedMemory {
 public:
  // Errors: io_error with the errno text (e.g. memfd_create or mmap failing).
  static Result<SharedMemory> create(const std::string& name, size_t size);

  std::byte* data() const { return m_region.data(); }
  size_t size() const { return m_region.size(); }
  int fd() const { return m_fd.get(); }

  // Gives [offset, offset+length) back to the kernel; it reads as zeros after.
  // Both must be multiples of the system page size.
  Status discard(uint64_t offset, uint64_t length);

 private:
  UniqueFd m_fd;
  MappedRegion m_region;
};

// Punches a hole in a file (memfd, tmpfs, ext4, xfs): the range reads as zeros
// afterwards and its storage is released. Falls back to writing zeros through
// `mapped` (may be null) when the file system cannot punch holes.
Status punch_hole(int fd, uint64_t offset, uint64_t length, std::byte* mapped);

}  // namespace tiermem
