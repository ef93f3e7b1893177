// Anonymous shared memory (memfd) and mappings of shared descriptors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <tiermem/status.h>

#include "common/unique_fd.hpp"

namespace tiermem {

// A MAP_SHARED mapping; unmaps on destruction. Movable.
class MappedRegion {
 public:
  MappedRegion() = default;
  // `owned`: unmap on destruction (false for memory someone else maps).
  MappedRegion(std::byte* data, size_t size, bool owned = true) : m_data(data), m_size(size), m_owned(owned) {}
  MappedRegion(MappedRegion&& other) noexcept;
  MappedRegion& operator=(MappedRegion&& other) noexcept;
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;
  ~MappedRegion();

  std::byte* data() const { return m_data; }
  size_t size() const { return m_size; }

  // Maps `size` bytes of `fd` at `offset` read-write and shared.
  static Result<MappedRegion> map(int fd, size_t size, uint64_t offset = 0);
  // The same, read-only (a descriptor opened for reading only).
  static Result<MappedRegion> map_read_only(int fd, size_t size, uint64_t offset = 0);

 private:
  std::byte* m_data = nullptr;
  size_t m_size = 0;
  bool m_owned = true;
};

// A memfd of a fixed size mapped into this process; the descriptor can be
// passed to other processes, which then map the same pages.
class SharedMemory {
 public:
  // Sealed at `size` (F_SEAL_SHRINK, F_SEAL_GROW): a process it is passed to
  // may write it but not truncate it under this one.
  // Errors: io_error with the errno text (e.g. memfd_create or mmap failing).
  static Result<SharedMemory> create(const std::string& name, size_t size);
  // Memory mapped by someone else (e.g. allocated by the transport) from a
  // descriptor: `owner` keeps it mapped and is released last.
  static SharedMemory adopt(std::byte* data, size_t size, UniqueFd fd, std::shared_ptr<void> owner);

  std::byte* data() const { return m_region.data(); }
  size_t size() const { return m_region.size(); }
  int fd() const { return m_fd.get(); }
  // "memfd", or who else provided it ("transport").
  const std::string& kind() const { return m_kind; }

  // Gives [offset, offset+length) back to the kernel; it reads as zeros after.
  // Both must be multiples of the system page size.
  Status discard(uint64_t offset, uint64_t length);

 private:
  // Declaration order is destruction order reversed: the owner goes last.
  std::shared_ptr<void> m_owner;
  std::string m_kind = "memfd";
  UniqueFd m_fd;
  MappedRegion m_region;
};

// Makes shared memory: how the daemon lets the transport provide it.
using SharedMemoryFactory = std::function<Result<SharedMemory>(const std::string& name, size_t size)>;

// Punches a hole in a file (memfd, tmpfs, ext4, xfs): the range reads as zeros
// afterwards and its storage is released. Falls back to writing zeros through
// `mapped` (may be null) when the file system cannot punch holes.
Status punch_hole(int fd, uint64_t offset, uint64_t length, std::byte* mapped);

}  // namespace tiermem
