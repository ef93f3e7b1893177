#include "mapping/word_array.hpp"

#include <unistd.h>

#include <string>

namespace tiermem {

Result<WordArray> WordArray::create(size_t words, const char* name, const SharedMemoryFactory& factory) {
  if (words == 0) return Status(ErrorCode::invalid_argument, std::string(name) + " needs at least one word");
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t bytes = (words * sizeof(uint64_t) + page - 1) / page * page;
  auto memory = factory ? factory(name, bytes) : SharedMemory::create(name, bytes);
  if (!memory.ok()) return memory.status().with_context(std::string("creating ") + name);
  WordArray array;
  array.m_memory = std::move(memory).value();
  array.m_words = {reinterpret_cast<uint64_t*>(array.m_memory.data()), words};
  return array;
}

}  // namespace tiermem
