// The contiguous array of page version words (M4).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include <tiermem/status.h>

#include "common/shared_memory.hpp"

namespace tiermem {

// One 64-bit word per virtual page, in one page-aligned memfd so co-located
// clients can map it and the transport can register it for remote atomics.
// Words start at 0 (epoch 0, stable). Thread-safe through the atomic helpers
// in mapping/version.hpp; the array itself never moves or resizes.
class VersionArray {
 public:
  // Errors: io_error from memfd_create/mmap.
  static Result<VersionArray> create(size_t words);

  uint64_t& word(size_t index) { return m_words[index]; }
  size_t size() const { return m_words.size(); }
  std::span<uint64_t> words() { return m_words; }
  int fd() const { return m_memory.fd(); }
  size_t bytes() const { return m_memory.size(); }
  void* base() const { return m_memory.data(); }

 private:
  SharedMemory m_memory;
  std::span<uint64_t> m_words;
};

}  // namespace tiermem
