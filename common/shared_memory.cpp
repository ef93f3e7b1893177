#include "common/shared_memory.hpp"

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include <tiermem/status_macros.h>

namespace tiermem {
namespace {

Status errno_error(const std::string& what) {
  return Status(ErrorCode::io_error, what + ": " + std::strerror(errno));
}

}  // namespace

MappedRegion::MappedRegion(MappedRegion&& other) noexcept
    : m_data(std::exchange(other.m_data, nullptr)), m_size(std::exchange(other.m_size, 0)), m_owned(other.m_owned) {}

MappedRegion& MappedRegion::operator=(MappedRegion&& other) noexcept {
  if (this != &other) {
    if (m_data != nullptr && m_owned) ::munmap(m_data, m_size);
    m_data = std::exchange(other.m_data, nullptr);
    m_size = std::exchange(other.m_size, 0);
    m_owned = other.m_owned;
  }
  return *this;
}

MappedRegion::~MappedRegion() {
  if (m_data != nullptr && m_owned) ::munmap(m_data, m_size);
}

namespace {

Result<MappedRegion> map_shared(int fd, size_t size, uint64_t offset, int protection) {
  void* p = ::mmap(nullptr, size, protection, MAP_SHARED, fd, static_cast<off_t>(offset));
  if (p == MAP_FAILED) return errno_error("mmap of " + std::to_string(size) + " bytes");
  return MappedRegion(static_cast<std::byte*>(p), size);
}

}  // namespace

Result<MappedRegion> MappedRegion::map(int fd, size_t size, uint64_t offset) {
  return map_shared(fd, size, offset, PROT_READ | PROT_WRITE);
}

Result<MappedRegion> MappedRegion::map_read_only(int fd, size_t size, uint64_t offset) {
  return map_shared(fd, size, offset, PROT_READ);
}

Result<SharedMemory> SharedMemory::create(const std::string& name, size_t size) {
  UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return errno_error("memfd_create(" + name + ")");
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
    return errno_error("sizing memfd " + name + " to " + std::to_string(size) + " bytes");
  }
  // Sealed at that size: whoever it is passed to may write it, but not
  // shrink it (which would make this process's accesses fault).
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return errno_error("sealing memfd " + name);
  }
  TIERMEM_ASSIGN_OR_RETURN(auto region, MappedRegion::map(fd.get(), size));
  SharedMemory shm;
  shm.m_fd = std::move(fd);
  shm.m_region = std::move(region);
  return shm;
}

SharedMemory SharedMemory::adopt(std::byte* data, size_t size, UniqueFd fd, std::shared_ptr<void> owner) {
  SharedMemory shm;
  shm.m_owner = std::move(owner);
  shm.m_kind = "transport";
  shm.m_fd = std::move(fd);
  shm.m_region = MappedRegion(data, size, /*owned=*/false);
  return shm;
}

Status SharedMemory::discard(uint64_t offset, uint64_t length) {
  return punch_hole(m_fd.get(), offset, length, m_region.data());
}

Status punch_hole(int fd, uint64_t offset, uint64_t length, std::byte* mapped) {
  if (length == 0) return Status();
  if (::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                  static_cast<off_t>(length)) == 0) {
    return Status();
  }
  if ((errno == EOPNOTSUPP || errno == ENOSYS) && mapped != nullptr) {
    std::memset(mapped + offset, 0, length);
    return Status();
  }
  return errno_error("punching a hole of " + std::to_string(length) + " bytes at " +
                     std::to_string(offset));
}

}  // namespace tiermem
