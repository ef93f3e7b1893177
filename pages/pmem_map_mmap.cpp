// PmemMap without libpmem2 (a build with -Dpmem=disabled, or without PMDK):
// the file is mapped with mmap and every store is made durable with msync of
// the pages written. That is what libpmem2 does itself for any file that is
// not DAX, and on a DAX file msync writes the CPU caches back too (the kernel
// does it), only slower than flushing from user space. Mapping into a
// reservation is the daemon's, which is not built without libpmem2.
#include "pages/pmem_map.hpp"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace tiermem {
namespace {

// msync of the whole pages that hold [address, address + length); a failure
// ends the process, as libpmem2's persist function does.
void msync_pages(const void* address, size_t length) {
  if (length == 0) return;
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t start = reinterpret_cast<uintptr_t>(address) & ~(page - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(address) + length;
  if (::msync(reinterpret_cast<void*>(start), end - start, MS_SYNC) != 0) std::abort();
}

void* copy_then_msync(void* dst, const void* src, size_t length, unsigned /*flags*/) {
  std::memcpy(dst, src, length);
  msync_pages(dst, length);
  return dst;
}

}  // namespace

void PmemMap::unmap() {
  if (m_data != nullptr) ::munmap(m_data, m_size);
  m_data = nullptr;
}

Result<PmemMap> PmemMap::map(int fd, uint64_t length, const std::string& what, pmem2_vm_reservation* reservation,
                             uint64_t /*offset*/) {
  if (reservation != nullptr) {
    return Status(ErrorCode::not_supported, "mapping " + what + " into a reservation needs libpmem2 (built without it)");
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Status(ErrorCode::io_error, "reading " + what + ": " + std::strerror(errno));
  if (static_cast<uint64_t>(st.st_size) < length) {
    return Status(ErrorCode::io_error, "mapping " + what + ": the file has " + std::to_string(st.st_size) +
                                           " bytes, fewer than the " + std::to_string(length) + " to map");
  }
  void* p = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return Status(ErrorCode::io_error, "mapping " + what + ": " + std::strerror(errno));
  PmemMap m;
  m.m_data = static_cast<std::byte*>(p);
  m.m_size = length;
  m.m_user_space = false;
  m.m_copy = copy_then_msync;
  m.m_persist = msync_pages;
  return m;
}

Durability PmemMap::durability() const { return {}; }

}  // namespace tiermem
