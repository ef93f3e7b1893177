// The executor's GPU kernels over sequences (kernels.cuh): token and position
// embeddings and their gradients (the token gradient sorted by id, summed in
// token order), attention heads packed and unpacked, the causal softmax.
// CUDA, and HIP from the same source (gpu_platform.cuh); the bits are the CPU
// kernels' (executor/kernels.cpp).
#include "executor/cuda/kernels.cuh"
#include "executor/cuda/launch.cuh"

#include <algorithm>

#if defined(__HIPCC__)
#include <rocprim/device/device_radix_sort.hpp>
#else
#include <cub/device/device_radix_sort.cuh>
#endif

namespace tiermem::exec::cuda {
namespace {

constexpr int k_seq_threads = 128;

// The sum (max) of `v` over the block (k_seq_threads threads), to every
// thread.
__device__ float seq_block_sum(float v, float* scratch) {
  for (int o = 16; o > 0; o /= 2) v += TIERMEM_SHFL_XOR(v, o);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0;
  for (int w = 0; w < k_seq_threads / 32; ++w) total += scratch[w];
  __syncthreads();
  return total;
}

__device__ float seq_block_max(float v, float* scratch) {
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, TIERMEM_SHFL_XOR(v, o));
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  float top = scratch[0];
  for (int w = 1; w < k_seq_threads / 32; ++w) top = fmaxf(top, scratch[w]);
  __syncthreads();
  return top;
}

__global__ void embedding_k(const int32_t* ids, const float* table, float* y, int64_t m, int64_t d) {
  TIERMEM_FOR_EACH(i, m * d) y[i] = table[static_cast<int64_t>(ids[i / d]) * d + i % d];
}

// The tokens sorted by id (a stable radix sort keeps token order within an
// id: `keys` the ids, `rows` their token indices); a block per table row v
// (grid-stride; blockIdx.y picks a span of k_threads columns) finds v's
// tokens by binary search and each thread adds dy of its column over them
// in token order: the same bits every run (and as the CPU's kernel sums
// them), in time linear in the tokens rather than tokens x vocabulary.
__device__ int64_t first_not_below(const int32_t* keys, int64_t m, int64_t v) {
  int64_t lo = 0, hi = m;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (keys[mid] < v) lo = mid + 1; else hi = mid;
  }
  return lo;
}

__global__ void iota_k(int32_t* v, int64_t m) { TIERMEM_FOR_EACH(i, m) v[i] = static_cast<int32_t>(i); }

__global__ void embedding_grad_k(const int32_t* __restrict__ keys, const int32_t* __restrict__ rows,
                                 const float* __restrict__ dy, float* dtable, int64_t m, int64_t d, int64_t vocab,
                                 bool accumulate) {
  __shared__ int64_t range[2];
  const int64_t c = blockIdx.y * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  for (int64_t v = blockIdx.x; v < vocab; v += gridDim.x) {
    __syncthreads();  // range may still be read for the row before
    if (threadIdx.x < 2) range[threadIdx.x] = first_not_below(keys, m, v + threadIdx.x);
    __syncthreads();
    if (c >= d) continue;
    float sum = 0;
#pragma unroll 8
    for (int64_t k = range[0]; k < range[1]; ++k) sum += dy[static_cast<int64_t>(rows[k]) * d + c];
    dtable[v * d + c] = accumulate ? dtable[v * d + c] + sum : sum;
  }
}

// The sort's room in `scratch` (int32 words): keys, token indices in and
// out, each rounded to 256 bytes, then CUB's own.
int64_t rounded_words(int64_t m) { return (m + 63) / 64 * 64; }

// A stable sort of (id, token) pairs by id (CUB; rocPRIM for HIP); with
// room == nullptr it sets *bytes to the room it needs. False: it failed.
bool sort_pairs(void* room, size_t* bytes, const int32_t* keys_in, int32_t* keys, const int32_t* rows_in,
                int32_t* rows, int64_t m, cudaStream_t s) {
#if defined(__HIPCC__)
  return rocprim::radix_sort_pairs(room, *bytes, keys_in, keys, rows_in, rows, static_cast<size_t>(m), 0, 32, s) ==
         hipSuccess;
#else
  return cub::DeviceRadixSort::SortPairs(room, *bytes, keys_in, keys, rows_in, rows, static_cast<int>(m), 0, 32, s) ==
         cudaSuccess;
#endif
}

size_t sort_bytes(int64_t m) {
  size_t bytes = 0;
  sort_pairs(nullptr, &bytes, nullptr, nullptr, nullptr, nullptr, m, nullptr);
  return bytes;
}

__global__ void position_embedding_k(const float* x, const float* table, float* y, int64_t m, int64_t d, int64_t t) {
  TIERMEM_FOR_EACH(i, m * d) y[i] = x[i] + table[((i / d) % t) * d + i % d];
}

__global__ void position_embedding_grad_k(const float* dy, float* dtable, int64_t m, int64_t d, int64_t t,
                                          bool accumulate) {
  TIERMEM_FOR_EACH(e, t * d) {
    const int64_t r = e / d, c = e % d;
    float sum = 0;
    for (int64_t i = r; i < m; i += t) sum += dy[i * d + c];
    dtable[e] = accumulate ? dtable[e] + sum : sum;
  }
}

// Attention's heads as a batch (cuda_compute.cpp runs its GEMMs batched
// over b = sequence x heads + head): gather copies head h of sequence s of a
// [m, ld] tensor (columns col0 + h dh ...) to rows [b][i][c] of a packed
// [b, t, dh] one; scatter writes them back (adding when accumulate).
__global__ void heads_gather_k(const float* x, int64_t ld, int64_t col0, float* packed, int64_t m, int64_t d,
                               int64_t heads, int64_t t, int64_t group) {
  const int64_t dh = d / heads, rows = m * heads;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {  // row = b t + i, b = s heads + h
    const int64_t b = row / t, i = row % t, s = b / heads, h = b % heads;
    const float* from = x + (s * t + i) * ld + col0 + (h / group) * dh;
    for (int64_t c = threadIdx.x; c < dh; c += blockDim.x) packed[row * dh + c] = from[c];
  }
}

// Into heads / group heads of x: each the sum, in order, of the `group`
// packed heads that read it (grouped-query attention's dK, dV; group 1: a copy).
__global__ void heads_scatter_k(const float* packed, float* x, int64_t ld, int64_t col0, int64_t m, int64_t d,
                                int64_t heads, int64_t t, bool accumulate, int64_t group) {
  const int64_t dh = d / heads, kv = heads / group, rows = m * kv;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {  // row = b t + i, b = s kv + g
    const int64_t b = row / t, i = row % t, s = b / kv, g = b % kv;
    float* to = x + (s * t + i) * ld + col0 + g * dh;
    for (int64_t c = threadIdx.x; c < dh; c += blockDim.x) {
      float sum = 0;
      for (int64_t j = 0; j < group; ++j) sum += packed[((s * heads + g * group + j) * t + i) * dh + c];
      to[c] = accumulate ? to[c] + sum : sum;
    }
  }
}

// One block per score row (row i of a [t, t] block): softmax over keys
// 0..i, zeros beyond (the causal mask), in place.
__global__ void causal_softmax_k(float* p, int64_t t) {
  __shared__ float scratch[k_seq_threads / 32];
  const int64_t i = blockIdx.x % t;
  float* row = p + static_cast<int64_t>(blockIdx.x) * t;
  float top = -3.4e38f;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) top = fmaxf(top, row[j]);
  top = seq_block_max(top, scratch);
  float sum = 0;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) sum += expf(row[j] - top);
  const float inv = 1.0f / seq_block_sum(sum, scratch);
  for (int64_t j = threadIdx.x; j < t; j += blockDim.x) row[j] = j <= i ? expf(row[j] - top) * inv : 0.0f;
}

// dS = P (dP - sum over the row of P dP), into P's place (dP: the same
// layout, read only).
__global__ void causal_softmax_grad_k(float* p, const float* dp, int64_t t) {
  __shared__ float scratch[k_seq_threads / 32];
  const int64_t i = blockIdx.x % t, base = static_cast<int64_t>(blockIdx.x) * t;
  float partial = 0;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) partial += p[base + j] * dp[base + j];
  const float total = seq_block_sum(partial, scratch);
  for (int64_t j = threadIdx.x; j < t; j += blockDim.x) {
    p[base + j] = j <= i ? p[base + j] * (dp[base + j] - total) : 0.0f;
  }
}

}  // namespace

void embedding(cudaStream_t s, const int32_t* ids, const float* table, float* y, int64_t m, int64_t d) {
  embedding_k<<<blocks_for(m * d), k_threads, 0, s>>>(ids, table, y, m, d);
}

int64_t embedding_grad_scratch(int64_t m) {
  return 3 * rounded_words(m) + static_cast<int64_t>((sort_bytes(m) + 3) / 4);
}

bool embedding_grad(cudaStream_t s, const int32_t* ids, const float* dy, float* dtable, int64_t m, int64_t d,
                    int64_t vocab, bool accumulate, int32_t* scratch) {
  int32_t* keys = scratch;
  int32_t* rows_in = keys + rounded_words(m);
  int32_t* rows = rows_in + rounded_words(m);
  void* room = rows + rounded_words(m);
  size_t bytes = sort_bytes(m);
  if (m > 0) {
    iota_k<<<blocks_for(m), k_threads, 0, s>>>(rows_in, m);
    if (!sort_pairs(room, &bytes, ids, keys, rows_in, rows, m, s)) return false;
  }
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(vocab, 65535)),
                  static_cast<unsigned>((d + k_threads - 1) / k_threads));
  embedding_grad_k<<<grid, k_threads, 0, s>>>(keys, rows, dy, dtable, m, d, vocab, accumulate);
  return true;
}

void position_embedding(cudaStream_t s, const float* x, const float* table, float* y, int64_t m, int64_t d,
                        int64_t t) {
  position_embedding_k<<<blocks_for(m * d), k_threads, 0, s>>>(x, table, y, m, d, t);
}

void position_embedding_grad(cudaStream_t s, const float* dy, float* dtable, int64_t m, int64_t d, int64_t t,
                             bool accumulate) {
  position_embedding_grad_k<<<blocks_for(t * d), k_threads, 0, s>>>(dy, dtable, m, d, t, accumulate);
}

void heads_gather(cudaStream_t s, const float* x, int64_t ld, int64_t col0, float* packed, int64_t m, int64_t d,
                  int64_t heads, int64_t t, int64_t group) {
  heads_gather_k<<<static_cast<unsigned>(std::min<int64_t>(m * heads, 65535)), 64, 0, s>>>(x, ld, col0, packed, m, d,
                                                                                          heads, t, group);
}

void heads_scatter(cudaStream_t s, const float* packed, float* x, int64_t ld, int64_t col0, int64_t m, int64_t d,
                   int64_t heads, int64_t t, bool accumulate, int64_t group) {
  heads_scatter_k<<<static_cast<unsigned>(std::min<int64_t>(m * (heads / group), 65535)), 64, 0, s>>>(
      packed, x, ld, col0, m, d, heads, t, accumulate, group);
}

void causal_softmax(cudaStream_t s, float* p, int64_t rows, int64_t t) {
  causal_softmax_k<<<static_cast<unsigned>(rows), k_seq_threads, 0, s>>>(p, t);
}

void causal_softmax_grad(cudaStream_t s, float* p, const float* dp, int64_t rows, int64_t t) {
  causal_softmax_grad_k<<<static_cast<unsigned>(rows), k_seq_threads, 0, s>>>(p, dp, t);
}

}  // namespace tiermem::exec::cuda

