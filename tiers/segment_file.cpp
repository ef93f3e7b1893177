#include "tiers/segment_file.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include <tiermem/status_macros.h>
#include <tiermem/units.h>

namespace tiermem {
namespace {

Status errno_error(const std::string& what) { return Status(ErrorCode::io_error, what + ": " + std::strerror(errno)); }

// The pid the holder of a lock file wrote into it, or "" when unreadable.
std::string holder_of(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return {};
  std::string pid(buf, static_cast<size_t>(n));
  while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
  return pid;
}

}  // namespace

Result<DirectoryLock> DirectoryLock::take(const std::string& dir, const std::string& what) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status(ErrorCode::io_error, "creating " + what + " directory " + dir + ": " + ec.message());
  ::chmod(dir.c_str(), 0700);
  const std::string path = dir + "/lock";
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!fd.valid()) return errno_error("opening the lock of " + what + " " + path);
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) return errno_error("locking " + path);
    const std::string pid = holder_of(fd.get());
    return Status(ErrorCode::already_exists,
                  what + " " + dir + " is in use by another tiermemd" + (pid.empty() ? "" : " (pid " + pid + ")") +
                      "; two daemons must never share it: give each its own directory");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd.get(), 0) != 0 || ::pwrite(fd.get(), pid.data(), pid.size(), 0) < 0) {
    return errno_error("writing " + path);
  }
  DirectoryLock lock;
  lock.m_fd = std::move(fd);
  lock.m_dir = dir;
  return lock;
}

Reservation::Reservation(Reservation&& other) noexcept
    : m_base(std::exchange(other.m_base, nullptr)), m_size(std::exchange(other.m_size, 0)),
      m_guards(std::move(other.m_guards)) {}

Reservation& Reservation::operator=(Reservation&& other) noexcept {
  if (this != &other) {
    m_guards.clear();
    if (m_base != nullptr) ::munmap(m_base, m_size);
    m_base = std::exchange(other.m_base, nullptr);
    m_size = std::exchange(other.m_size, 0);
    m_guards = std::move(other.m_guards);
  }
  return *this;
}

Reservation::~Reservation() {
  m_guards.clear();
  if (m_base != nullptr) ::munmap(m_base, m_size);
}

Result<Reservation> Reservation::reserve(size_t bytes, const std::string& what) {
  void* p = ::mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return errno_error("reserving " + format_size(bytes) + " of address space for " + what);
  Reservation r;
  r.m_base = static_cast<std::byte*>(p);
  r.m_size = bytes;
  return r;
}

Status Reservation::map(uint64_t offset, size_t length, int fd, uint64_t file_offset) {
  if (offset > m_size || length > m_size - offset) {
    return Status(ErrorCode::invalid_argument, "mapping of " + std::to_string(length) + " bytes at " +
                                                   std::to_string(offset) + " lies outside the reservation");
  }
  if (length == 0) return Status();
  void* p = ::mmap(m_base + offset, length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd,
                   static_cast<off_t>(file_offset));
  if (p == MAP_FAILED) return errno_error("mapping " + format_size(length) + " of a segment");
  TIERMEM_ASSIGN_OR_RETURN(auto guard, TruncationGuard::watch(m_base + offset, length, fd, file_offset));
  m_guards.push_back(std::move(guard));
  return Status();
}

Result<UniqueFd> open_segment(const std::string& path, uint64_t size) {
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!fd.valid()) return errno_error("opening " + path + " (does its directory exist and is it writable?)");
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return errno_error("stat of " + path);
  if (static_cast<uint64_t>(st.st_size) < size && ::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
    return errno_error("sizing " + path + " to " + format_size(size));
  }
  return fd;
}

}  // namespace tiermem

namespace tiermem {

Result<SegmentTrim> trim_segment(int fd, uint64_t size, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return errno_error("stat of " + path);
  SegmentTrim t;
  t.size_before = static_cast<uint64_t>(st.st_size);
  t.storage_before = static_cast<uint64_t>(st.st_blocks) * 512;
  t.storage_after = t.storage_before;
  // Storage past the end shows as more blocks than the length holds; a
  // file system's own blocks (extent trees) stay well under the slack.
  const uint64_t slack = (1 << 20) + size / 64;
  if (t.size_before <= size && t.storage_before <= round_up(size, 4096) + slack) return t;
  if (t.size_before < size) return t;  // short and holding more than its size? not a growth to cut
  // Cutting to the same length gives back storage past it as well.
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) return errno_error("cutting " + path + " back to its size");
  if (::fstat(fd, &st) == 0) t.storage_after = static_cast<uint64_t>(st.st_blocks) * 512;
  t.trimmed = true;
  return t;
}

Result<SegmentTrim> trim_segment_file(const std::string& path, uint64_t size) {
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
  if (!fd.valid()) {
    if (errno == ENOENT) return SegmentTrim{};
    return errno_error("opening " + path);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return SegmentTrim{};
  return trim_segment(fd.get(), size, path);
}

}  // namespace tiermem
