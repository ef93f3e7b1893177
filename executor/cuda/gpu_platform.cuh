// The GPU runtime the executor's kernels are compiled against: CUDA (nvcc,
// and the host compiler for cuda_compute.cpp) or HIP (hipcc, the build check
// of the kernels for AMD GPUs: executor/meson.build). kernels.cu is written
// once for both; what differs is named here.
#pragma once

#if defined(__HIPCC__)
#include <hip/hip_runtime.h>
using cudaStream_t = hipStream_t;
// Lanes work in groups of 32 on both (CUDA's warp; half of an AMD wave64):
// the shuffle stays within the group of 32.
#define TIERMEM_SHFL_XOR(v, lane_mask) __shfl_xor((v), (lane_mask), 32)
#else
#include <cuda_runtime_api.h>
#define TIERMEM_SHFL_XOR(v, lane_mask) __shfl_xor_sync(0xffffffffu, (v), (lane_mask))
#endif
