// Dropout's masks from counters, shared by the CPU kernels and the GPU ones:
// nothing is stored between the forward pass and the backward, which draws
// the same masks again. An element is kept when a 24-bit uniform hashed
// from (the job's seed, the op's salt, the step, the draw: which
// micro-batch of which replica) and its index is at least p * 2^24, and is
// then scaled by 1 / (1 - p). The same seed gives the same bits on every
// run, after a restart (the step is the same), on the CPU and the GPU, in
// one pipeline stage or several.
#pragma once

#include <cstdint>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define TIERMEM_DROPOUT_FN __host__ __device__
#else
#define TIERMEM_DROPOUT_FN
#endif

namespace tiermem::exec {

// splitmix64's finaliser.
TIERMEM_DROPOUT_FN inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// The key of one op's draws in one step for one micro-batch.
TIERMEM_DROPOUT_FN inline uint64_t dropout_key(uint64_t seed, uint64_t salt, int64_t step, uint64_t draw) {
  return mix64(mix64(mix64(seed ^ mix64(salt)) ^ static_cast<uint64_t>(step)) ^ draw);
}

// The factor of element `index`: 0 (dropped) or 1 / (1 - p).
TIERMEM_DROPOUT_FN inline float dropout_factor(uint64_t key, uint64_t index, float p) {
  const uint32_t u = static_cast<uint32_t>(mix64(key + index * 0x9e3779b97f4a7c15ULL) >> 40);
  return static_cast<float>(u) >= p * 16777216.0f ? 1.0f / (1.0f - p) : 0.0f;
}

// An op's salt: FNV-1a of its name (the same on every rank and stage).
inline uint64_t dropout_salt(const char* name, uint64_t length) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (uint64_t i = 0; i < length; ++i) {
    h ^= static_cast<unsigned char>(name[i]);
    h *= 0x100000001b3ULL;
  }
  return h;
}

}  // namespace tiermem::exec
