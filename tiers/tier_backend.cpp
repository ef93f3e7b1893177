#include "tiers/tier_backend.hpp"

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include <tiermem/status_macros.h>
#include <tiermem/units.h>

namespace tiermem {

Status check_open_domain(const char* tier, uint32_t d, uint64_t bytes, size_t domains, uint64_t span,
                         uint64_t current, bool* done) {
  *done = false;
  if (d >= domains || bytes == 0 || bytes > span) {
    return Status(ErrorCode::invalid_argument, std::string(tier) + " domain " + std::to_string(d) + " of " +
                                                   format_size(bytes) + " does not fit (" + std::to_string(domains) +
                                                   " domains of at most " + format_size(span) + ")");
  }
  if (current == 0) return Status();
  if (current != bytes) {
    return Status(ErrorCode::invalid_argument,
                  std::string(tier) + " domain " + std::to_string(d) + " is already open with another size");
  }
  *done = true;
  return Status();
}

Status commit_file_range(int fd, uint64_t offset, uint64_t length, const std::string& what) {
  int rc = 0;
  do {
    rc = ::fallocate(fd, 0, static_cast<off_t>(offset), static_cast<off_t>(length));
  } while (rc != 0 && errno == EINTR);
  if (rc == 0) return Status();
  if (errno == EOPNOTSUPP) return Status();  // the file system cannot: frames fault in on first use
  const ErrorCode code = errno == ENOSPC ? ErrorCode::tier_exhausted : ErrorCode::io_error;
  return Status(code, what + " cannot get " + format_size(length) + " of storage (" + std::strerror(errno) +
                          "): its file system holds less than the tier's capacity says");
}

uint64_t segment_file_bytes(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return 0;
  return static_cast<uint64_t>(st.st_size);
}

uint64_t domain_span_for(uint64_t capacity) {
  constexpr uint64_t k_unit = 2 << 20;
  return (capacity + k_unit - 1) / k_unit * k_unit;
}

bool TierBackend::contains(uint64_t offset, uint64_t length) const {
  const uint64_t span = domain_span();
  if (span == 0) return false;
  const uint64_t d = offset / span;
  if (d >= domains()) return false;
  const uint64_t in_domain = offset % span;
  const uint64_t bytes = domain_bytes(static_cast<uint32_t>(d));
  // A domain not opened has no mapping (nor persist or copy functions) at
  // all, not even for an empty range.
  if (bytes == 0) return false;
  return in_domain <= bytes && length <= bytes - in_domain;
}

Status TierBackend::copy_from_many(const TierBackend& source, std::span<const FrameCopy> copies) {
  std::byte* dst = host_base();
  if (source.host_base() == nullptr && dst != nullptr) {
    // From a device straight into this tier's memory, every range queued
    // before the one wait, then made durable.
    std::vector<FrameRead> reads;
    reads.reserve(copies.size());
    for (const FrameCopy& c : copies) reads.push_back({c.source_offset, dst + c.offset, c.length});
    TIERMEM_RETURN_IF_ERROR(source.read_many(reads));
    for (const FrameCopy& c : copies) TIERMEM_RETURN_IF_ERROR(persist(c.offset, c.length));
    return Status();
  }
  for (const FrameCopy& c : copies) TIERMEM_RETURN_IF_ERROR(copy_from(source, c.source_offset, c.offset, c.length));
  return Status();
}

Status TierBackend::read_many(std::span<const FrameRead> reads) const {
  for (const FrameRead& r : reads) TIERMEM_RETURN_IF_ERROR(read(r.offset, r.dst, r.length));
  return Status();
}

Status TierBackend::copy_from(const TierBackend& source, uint64_t source_offset, uint64_t offset,
                              size_t length) {
  if (std::byte* src = source.host_base()) return write(offset, src + source_offset, length);
  if (std::byte* dst = host_base()) {
    // From a device: straight into this tier's memory, then made durable.
    TIERMEM_RETURN_IF_ERROR(source.read(source_offset, dst + offset, length));
    return persist(offset, length);
  }
  // Neither side addressable by the CPU as a whole: bounce through host memory.
  constexpr size_t k_chunk = 4 << 20;
  std::vector<std::byte> bounce(length < k_chunk ? length : k_chunk);
  for (size_t done = 0; done < length;) {
    const size_t n = length - done < bounce.size() ? length - done : bounce.size();
    Status s = source.read(source_offset + done, bounce.data(), n);
    if (!s.ok()) return s;
    s = write(offset + done, bounce.data(), n);
    if (!s.ok()) return s;
    done += n;
  }
  return Status();
}

}  // namespace tiermem
