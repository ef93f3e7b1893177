#include "mapping/version_array.hpp"

#include <unistd.h>

#include <string>

namespace tiermem {

Result<VersionArray> VersionArray::create(size_t words) {
  if (words == 0) return Status(ErrorCode::invalid_argument, "a version array needs at least one word");
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t bytes = (words * sizeof(uint64_t) + page - 1) / page * page;
  auto memory = SharedMemory::create("tiermem-versions", bytes);
  if (!memory.ok()) return memory.status().with_context("creating the version array");
  VersionArray array;
  array.m_memory = std::move(memory).value();
  array.m_words = {reinterpret_cast<uint64_t*>(array.m_memory.data()), words};
  return array;
}

}  // namespace tiermem
