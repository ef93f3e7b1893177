// Causal attention without the T x T matrix in memory (issue 49): the
// contract of kernels.hpp's attention with --precision bf16, dropout off
// (kernels::tiled_attention_fits),
// on tensor cores (bf16 operands, fp32 sums and softmax statistics), in
// the manner of FlashAttention-2: the forward pass keeps, per query row and
// head, the running maximum and sum of its softmax and writes only O and the
// row's log-sum-exp; the backward pass computes P again from them.
//
// What is saved between the passes lives in the op's probs tensor
// (the plan's room, its last use the gradient): the log-sum-exp [m * heads],
// O [m, d] and the gradient's row sums of dO * O [m * heads];
// kernels::tiled_attention_fits (executor/kernels.hpp) says when it fits
// and the head width has a kernel (16, 32, 64, 128). Each output is written by
// one block, in a fixed order: the same bits every run (no atomics).
//
// CUDA only (mma.sync, ldmatrix, cp.async: sm_80 and later); the HIP build
// check (kernels.cu) does not cover it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tiermem::exec::cuda {

// Sets what the kernels need of the device (their shared memory), before
// any step is captured; the calls below do it too where it was not.
void flash_attention_prepare();

// The bf16 scratch both calls need (flash_attention_scratch values, 256-byte
// aligned): qkv, and the gradient's dY, rounded to bf16 once per call.
inline int64_t flash_attention_scratch(int64_t m, int64_t d, int64_t heads, int64_t kv_heads) {
  return m * (d + 2 * (d / heads * kv_heads)) + m * d;
}
// y = attention(qkv) (kernels.hpp), state <- (log-sum-exp [m * heads], O
// [m, d]); `scale` multiplies Q K^T (1 / sqrt(dh)).
void flash_attention(cudaStream_t s, const float* qkv, float* y, float* state, int64_t m, int64_t d, int64_t heads,
                     int64_t kv_heads, int64_t t, float scale, uint16_t* scratch);
// dqkv (+)= the gradient; `state` as the forward pass left it (its last
// part, the row sums, is written here).
void flash_attention_grad(cudaStream_t s, const float* qkv, float* state, const float* dy, float* dqkv, int64_t m,
                          int64_t d, int64_t heads, int64_t kv_heads, int64_t t, float scale, bool accumulate,
                          uint16_t* scratch);

}  // namespace tiermem::exec::cuda
