// Random 64-bit numbers for identities that must not repeat across starts
// (incarnations, memory generations, first generations): from the system's
// random device, never 0 (0 means "none" wherever they travel).
#pragma once

#include <cstdint>
#include <random>

namespace tiermem {

inline uint64_t random_nonzero() {
  std::random_device rd;
  uint64_t v = 0;
  while (v == 0) v = (uint64_t{rd()} << 32) | rd();
  return v;
}

}  // namespace tiermem
