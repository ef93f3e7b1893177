// Arrays of 64-bit words in shared memory: the page version words (M4) and the
// L3 sub-block bits of the page table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include <tiermem/status.h>

#include "common/shared_memory.hpp"

namespace tiermem {

// A plain, page-aligned array of 64-bit words in a memfd, so co-located
// clients can map it and the transport can register it for remote atomics.
// Words start at 0. Access them with std::atomic_ref (mapping/version.hpp);
// the array itself never moves or resizes.
class WordArray {
 public:
  // Errors: invalid_argument (0 words), io_error from memfd_create/mmap, or
  // the factory's (which provides the memory when given).
  static Result<WordArray> create(size_t words, const char* name, const SharedMemoryFactory& factory = nullptr);

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

// One version word per virtual page (see mapping/version.hpp).
using VersionArray = WordArray;

}  // namespace tiermem
