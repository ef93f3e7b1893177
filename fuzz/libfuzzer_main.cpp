// The request target under libFuzzer (clang -fsanitize=fuzzer): coverage-
// guided byte mutation, seeded with a corpus the structured fuzzer writes
// (bench/fuzz.sh does both).
#include <cstddef>
#include <cstdint>

#include "fuzz/request_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static auto target = tiermem::fuzz::RequestTarget::create();
  static uint64_t runs = 0;
  if (!target) __builtin_trap();
  target->run(data, size);
  if (++runs % 20000 == 0) target->reset();  // a full space stops allocating
  return 0;
}
