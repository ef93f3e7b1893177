// How the executor's elementwise GPU kernels are launched (kernels.cu,
// kernels_seq.cu): 256 threads a block, a grid-stride loop over the elements,
// at most 65535 blocks.
#pragma once

#include <cstdint>

namespace tiermem::exec::cuda {

constexpr int k_threads = 256;

inline unsigned blocks_for(int64_t n) {
  const int64_t b = (n + k_threads - 1) / k_threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}

}  // namespace tiermem::exec::cuda

#define TIERMEM_FOR_EACH(i, n) \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
