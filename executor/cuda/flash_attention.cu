// Causal attention in tiles on tensor cores (flash_attention.cuh), as
// FlashAttention-2: mma.sync m16n8k16 bf16 products into fp32 registers,
// their operands from shared memory by ldmatrix. A block of 4 warps takes 64
// rows (queries, or keys for the gradient of K and V), each warp 16 of them,
// and walks the other side 64 rows at a time through shared memory. Scores,
// probabilities and their gradients stay in registers: a product's
// accumulators, rounded to bf16, are the A operand of the next product.
//
// Forward (a block per sequence-head and block of 64 queries): S = Q K^T
// per tile of keys; the online softmax (each row's running maximum m and sum
// l, O rescaled by exp(m_old - m_new)); O += P V. Then O / l and the row's
// log-sum-exp m + log l.
// Backward, as FlashAttention-2 without atomics: D = rowsum(dO * O); a
// block per sequence-kv head and block of 64 keys walks every query block at
// or after it (of every query head of the kv head's group), P = exp(S - lse),
// dV += P^T dO, dS = P (dP - D) with dP = dO V^T, dK += dS^T Q; a block per
// sequence-head and block of 64 queries walks every key block up to it,
// dQ += dS K. Every output element is summed by one thread in one order.
//
// Fragments (PTX ISA, mma.m16n8k16; g = lane / 4, c = 2 (lane % 4)): an
// accumulator of a 16 x 8 tile holds (g, c..c+1) and (g + 8, c..c+1); an A
// operand (16 x 16) (g, c..), (g + 8, c..), (g, c + 8..), (g + 8, c + 8..);
// a B operand (16 x 8, k x n) (k c..c+1, n g) and (k c + 8.., n g).
#include "executor/cuda/flash_attention.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

namespace tiermem::exec::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int k_block = 64;               // rows a block takes at a time, each side
constexpr int k_threads = 128;            // 4 warps of 16 rows

struct Shape {
  const bf16* qkv;  // the fp32 qkv rounded to bf16 (cast_k), in the caller's scratch
  int64_t ld;  // qkv's row: d + 2 dkv
  int64_t d, dkv, heads, group, t;
  float scale;
};

// x rounded to bf16 once per call (as each tile took it before: the same
// bits), so that the tiles load 8 values at a time.
__global__ void cast_k(const float* x, bf16* y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] = __float2bfloat16(x[i]);
  }
}

void cast(cudaStream_t s, const float* x, bf16* y, int64_t n) {
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 65535);
  cast_k<<<static_cast<unsigned>(std::max<int64_t>(blocks, 1)), 256, 0, s>>>(x, y, n);
}

__device__ inline uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Rows [r0, r0 + 64) of a sequence (whose first row is seq_row0) of the
// columns [col0, col0 + DH) of a row-major bf16 matrix (rows `ld` apart,
// a multiple of 8, as col0 is) into a tile of rows DH + 8 apart, 16 bytes at
// a time; rows at or past t are zero. Without waiting (cp.async): the
// copies are there after commit(), wait<n>() with n groups committed after
// theirs, and a __syncthreads().
template <int DH>
__device__ void async_tile(bf16* tile, const bf16* src, int64_t ld, int64_t seq_row0, int64_t r0, int64_t t,
                           int64_t col0) {
  constexpr int V = DH / 8;
  for (int i = threadIdx.x; i < k_block * V; i += k_threads) {
    const int r = i / V, c = (i % V) * 8;
    const bool in = r0 + r < t;
    const bf16* from = in ? src + (seq_row0 + r0 + r) * ld + col0 + c : src;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(tile + r * (DH + 8) + c)),
                 "l"(from), "r"(in ? 16 : 0));
  }
}
__device__ inline void commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int n>
__device__ inline void wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(n));
}

// Four 8 x 8 bf16 matrices from shared memory: lane l names row l % 8 of
// matrix l / 8; register i holds the lane's two values of matrix i (row g,
// columns c..c+1), or of its transpose with `trans`.
template <bool trans>
__device__ inline void ldsm4(uint32_t (&r)[4], const bf16* p) {
  if constexpr (trans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(p)));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(p)));
  }
}

// acc += a b (16 x 8 += 16 x 16 times 16 x 8), fp32 sums.
__device__ inline void mma(float (&acc)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ inline uint32_t pack(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The A operand of rows r0..r0+15, columns c0..c0+15 of a row-major tile
// (rows `ld` values apart).
__device__ inline void load_a(uint32_t (&a)[4], const bf16* tile, int ld, int r0, int c0) {
  const int l = threadIdx.x % 32;
  ldsm4<false>(a, tile + (r0 + l % 8 + l / 8 % 2 * 8) * ld + c0 + l / 16 * 8);
}

// B operands of the 8-column blocks n0 and n0 + 8 (b[0..1] and b[2..3])
// over k0..k0+15, from a tile stored n by k (a row per n: K for Q K^T).
__device__ inline void load_b_nk(uint32_t (&b)[4], const bf16* tile, int ld, int n0, int k0) {
  const int l = threadIdx.x % 32;
  ldsm4<false>(b, tile + (n0 + l % 8 + l / 16 * 8) * ld + k0 + l / 8 % 2 * 8);
}

// The same from a tile stored k by n (a row per k: V for P V).
__device__ inline void load_b_kn(uint32_t (&b)[4], const bf16* tile, int ld, int k0, int n0) {
  const int l = threadIdx.x % 32;
  ldsm4<true>(b, tile + (k0 + l % 8 + l / 8 % 2 * 8) * ld + n0 + l / 16 * 8);
}

// s[j] (columns 8j..8j+7) = rows r0..r0+15 of tile x times rows 0..63 of
// tile y, transposed, over DH (both tiles row-major, rows DH + 8 apart):
// only the 16-column groups [lo, hi) (the others are zero).
template <int DH>
__device__ void scores(float (&s)[8][4], const bf16* x, int r0, const bf16* y, int lo, int hi) {
#pragma unroll
  for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
  for (int c = 0; c < DH; c += 16) {
    uint32_t a[4];
    load_a(a, x, DH + 8, r0, c);
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      if (n < lo || n >= hi) continue;
      uint32_t b[4];
      load_b_nk(b, y, DH + 8, n * 16, c);
      mma(s[2 * n], a, b[0], b[1]);
      mma(s[2 * n + 1], a, b[2], b[3]);
    }
  }
}

// o += p (16 x 64, accumulators, rounded to bf16) times rows 0..63 of the
// row-major tile y (rows DH + 8 apart), over p's 16-column groups [lo, hi).
template <int DH>
__device__ void times(float (&o)[DH / 8][4], const float (&p)[8][4], const bf16* y, int lo, int hi) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    if (kk < lo || kk >= hi) continue;
    const uint32_t a[4] = {pack(p[2 * kk][0], p[2 * kk][1]), pack(p[2 * kk][2], p[2 * kk][3]),
                           pack(p[2 * kk + 1][0], p[2 * kk + 1][1]), pack(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int n = 0; n < DH; n += 16) {
      uint32_t b[4];
      load_b_kn(b, y, DH + 8, kk * 16, n);
      mma(o[n / 8], a, b[0], b[1]);
      mma(o[n / 8 + 1], a, b[2], b[3]);
    }
  }
}

// The lane's place in a warp's 16 rows: rows `row` and row + 8 (of the
// block's 64, from its first), columns c..c+1 of each 8-column block.
struct Lane {
  int row, c;
  __device__ explicit Lane(int warp) : row(warp * 16 + threadIdx.x % 32 / 4), c(threadIdx.x % 4 * 2) {}
};

__device__ inline void put(float* at, float v, bool accumulate) { *at = accumulate ? *at + v : v; }

// A warp's 16 x DH accumulators, times factor, (+)= into rows r0 + me.row
// (and + 8) of `to` (rows `ld` apart, before t).
template <int DH>
__device__ void write_rows(const float (&f)[DH / 8][4], const Lane& me, float* to, int64_t ld, int64_t seq_row0,
                           int64_t r0, int64_t t, float factor, bool accumulate) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t r = r0 + me.row + half * 8;
    if (r >= t) continue;
    float* row = to + (seq_row0 + r) * ld + me.c;
#pragma unroll
    for (int n = 0; n < DH / 8; ++n) {
      put(row + n * 8, factor * f[n][2 * half], accumulate);
      put(row + n * 8 + 1, factor * f[n][2 * half + 1], accumulate);
    }
  }
}

// The K and V tiles of key block kb in kv's double buffer (there on
// return), the next block's copies (up to block `last`) issued into the
// other half, whose readers of the step before are done.
template <int DH>
__device__ const bf16* key_tiles(bf16* kv, const Shape& sh, int64_t seq_row0, int64_t g, int kb, int last) {
  constexpr int L = DH + 8;
  if (kb < last) {
    bf16* next = kv + ((kb + 1) % 2) * 2 * k_block * L;
    const int64_t r0 = static_cast<int64_t>(kb + 1) * k_block;
    async_tile<DH>(next, sh.qkv, sh.ld, seq_row0, r0, sh.t, sh.d + g * DH);
    async_tile<DH>(next + k_block * L, sh.qkv, sh.ld, seq_row0, r0, sh.t, sh.d + sh.dkv + g * DH);
  }
  commit();
  wait<1>();
  __syncthreads();
  return kv + (kb % 2) * 2 * k_block * L;
}

template <int DH>
__global__ void __launch_bounds__(k_threads) forward_k(Shape sh, float* y, float* lse, float* ostash) {
  constexpr int L = DH + 8;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* kv = qs + k_block * L;  // K and V of this tile, then of the next: 4 tiles

  const int64_t t = sh.t, bh = blockIdx.x, h = bh % sh.heads, g = h / sh.group, seq_row0 = bh / sh.heads * t;
  const int nqb = static_cast<int>((t + k_block - 1) / k_block), qb = nqb - 1 - static_cast<int>(blockIdx.y);
  const int warp = threadIdx.x / 32;
  const int64_t q0 = static_cast<int64_t>(qb) * k_block;
  const Lane me(warp);
  const int64_t qi[2] = {q0 + me.row, q0 + me.row + 8};
  float o[DH / 8][4] = {};
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  async_tile<DH>(qs, sh.qkv, sh.ld, seq_row0, q0, t, h * DH);
  async_tile<DH>(kv, sh.qkv, sh.ld, seq_row0, 0, t, sh.d + g * DH);
  async_tile<DH>(kv + k_block * L, sh.qkv, sh.ld, seq_row0, 0, t, sh.d + sh.dkv + g * DH);
  commit();
  for (int kb = 0; kb <= qb; ++kb) {
    const int64_t k0 = static_cast<int64_t>(kb) * k_block;
    const bf16* ks = key_tiles<DH>(kv, sh, seq_row0, g, kb, qb);
    const bf16* vs = ks + k_block * L;
    const int hi = kb == qb ? warp + 1 : 4;  // key groups past the warp's queries: all masked
    float s[8][4];
    scores<DH>(s, qs, warp * 16, ks, 0, hi);
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t key = k0 + j * 8 + me.c + e % 2;
        s[j][e] = key <= qi[e / 2] && key < t ? s[j][e] * sh.scale : -INFINITY;
        mx[e / 2] = fmaxf(mx[e / 2], s[j][e]);
      }
    }
    float alpha[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m_run[r], mx[r]);  // finite: key k0 <= q0 <= the row
      alpha[r] = __expf(m_run[r] - m_new);
      m_run[r] = m_new;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[j][e] = __expf(s[j][e] - m_run[e / 2]);  // 0 where masked
        sum[e / 2] += s[j][e];
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
      sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
      l_run[r] = l_run[r] * alpha[r] + sum[r];
    }
#pragma unroll
    for (int n = 0; n < DH / 8; ++n) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }
    times<DH>(o, s, vs, 0, hi);
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float inv = 1.0f / l_run[r];
#pragma unroll
    for (int n = 0; n < DH / 8; ++n) {
      o[n][2 * r] *= inv;
      o[n][2 * r + 1] *= inv;
    }
    if (me.c == 0 && qi[r] < t) lse[bh * t + qi[r]] = m_run[r] + logf(l_run[r]);
  }
  write_rows<DH>(o, me, y + h * DH, sh.d, seq_row0, q0, t, 1.0f, false);
  write_rows<DH>(o, me, ostash + h * DH, sh.d, seq_row0, q0, t, 1.0f, false);
}

// D[(s * heads + h) * t + i] = dO . O over the head's columns of row i: a warp each.
__global__ void delta_k(const float* dy, const float* o, float* delta, int64_t m, int64_t d, int64_t heads,
                        int64_t t, int dh) {
  const int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (w >= m * heads) return;
  const int64_t row = w / heads, h = w % heads;
  float sum = 0.0f;
  for (int c = threadIdx.x % 32; c < dh; c += 32) sum += dy[row * d + h * dh + c] * o[row * d + h * dh + c];
  for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (threadIdx.x % 32 == 0) delta[(row / t * heads + h) * t + row % t] = sum;
}

// Loads the 64 rows' log-sum-exp and D from r0 (zero past t).
__device__ void load_rows(float* rl, float* rd, const float* lse, const float* delta, int64_t bh, int64_t r0,
                          int64_t t) {
  for (int i = threadIdx.x; i < k_block; i += k_threads) {
    rl[i] = r0 + i < t ? lse[bh * t + r0 + i] : 0.0f;
    rd[i] = r0 + i < t ? delta[bh * t + r0 + i] : 0.0f;
  }
}

template <int DH>
__global__ void __launch_bounds__(k_threads) dq_k(Shape sh, const bf16* dy, const float* lse, const float* delta,
                                                  float* dqkv, bool accumulate) {
  constexpr int L = DH + 8;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* dos = qs + k_block * L;
  bf16* kv = dos + k_block * L;  // K and V of this tile, then of the next: 4 tiles

  const int64_t t = sh.t, bh = blockIdx.x, h = bh % sh.heads, g = h / sh.group, seq_row0 = bh / sh.heads * t;
  const int nqb = static_cast<int>((t + k_block - 1) / k_block), qb = nqb - 1 - static_cast<int>(blockIdx.y);
  const int warp = threadIdx.x / 32;
  const int64_t q0 = static_cast<int64_t>(qb) * k_block;
  async_tile<DH>(qs, sh.qkv, sh.ld, seq_row0, q0, t, h * DH);
  async_tile<DH>(dos, dy, sh.d, seq_row0, q0, t, h * DH);
  async_tile<DH>(kv, sh.qkv, sh.ld, seq_row0, 0, t, sh.d + g * DH);
  async_tile<DH>(kv + k_block * L, sh.qkv, sh.ld, seq_row0, 0, t, sh.d + sh.dkv + g * DH);
  commit();
  const Lane me(warp);
  const int64_t qi[2] = {q0 + me.row, q0 + me.row + 8};
  float row_lse[2], row_d[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row_lse[r] = qi[r] < t ? lse[bh * t + qi[r]] : 0.0f;
    row_d[r] = qi[r] < t ? delta[bh * t + qi[r]] : 0.0f;
  }
  float dq[DH / 8][4] = {};
  for (int kb = 0; kb <= qb; ++kb) {
    const int64_t k0 = static_cast<int64_t>(kb) * k_block;
    const bf16* ks = key_tiles<DH>(kv, sh, seq_row0, g, kb, qb);
    const bf16* vs = ks + k_block * L;
    const int hi = kb == qb ? warp + 1 : 4;
    float s[8][4], dp[8][4];
    scores<DH>(s, qs, warp * 16, ks, 0, hi);
    scores<DH>(dp, dos, warp * 16, vs, 0, hi);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t key = k0 + j * 8 + me.c + e % 2;
        const int r = e / 2;
        s[j][e] = key <= qi[r] && key < t ? __expf(s[j][e] * sh.scale - row_lse[r]) * (dp[j][e] - row_d[r]) : 0.0f;
      }
    }
    times<DH>(dq, s, ks, 0, hi);
    __syncthreads();
  }
  write_rows<DH>(dq, me, dqkv + h * DH, sh.ld, seq_row0, q0, t, sh.scale, accumulate);
}

template <int DH>
__global__ void __launch_bounds__(k_threads) dkv_k(Shape sh, const bf16* dy, const float* lse, const float* delta,
                                                   float* dqkv, bool accumulate) {
  constexpr int L = DH + 8;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* ks = reinterpret_cast<bf16*>(smem);
  bf16* vs = ks + k_block * L;
  bf16* qd = vs + k_block * L;  // Q and dO of this pair, then of the next: 4 tiles
  float* rows = reinterpret_cast<float*>(qd + 4 * k_block * L);  // its log-sum-exp and D, then the next's

  const int64_t t = sh.t, kv_heads = sh.heads / sh.group;
  const int64_t s = blockIdx.x / kv_heads, g = blockIdx.x % kv_heads, seq_row0 = s * t;
  const int nqb = static_cast<int>((t + k_block - 1) / k_block), kb = static_cast<int>(blockIdx.y);
  const int warp = threadIdx.x / 32;
  const int64_t k0 = static_cast<int64_t>(kb) * k_block;
  async_tile<DH>(ks, sh.qkv, sh.ld, seq_row0, k0, t, sh.d + g * DH);
  async_tile<DH>(vs, sh.qkv, sh.ld, seq_row0, k0, t, sh.d + sh.dkv + g * DH);
  const Lane me(warp);
  const int64_t kj[2] = {k0 + me.row, k0 + me.row + 8};
  float dk[DH / 8][4] = {}, dv[DH / 8][4] = {};
  // Every query block at or after this key block, of every head of the
  // group: (head, query block) pairs in order, the next one's Q and dO in
  // flight while this one is computed on.
  const int per_head = nqb - kb;
  const int64_t pairs = sh.group * per_head;
  async_tile<DH>(qd, sh.qkv, sh.ld, seq_row0, k0, t, g * sh.group * DH);
  async_tile<DH>(qd + k_block * L, dy, sh.d, seq_row0, k0, t, g * sh.group * DH);
  commit();
  for (int64_t pair = 0; pair < pairs; ++pair) {
    const int64_t h = g * sh.group + pair / per_head, bh = s * sh.heads + h;
    const int qb = kb + static_cast<int>(pair % per_head);
    const int64_t q0 = static_cast<int64_t>(qb) * k_block;
    bf16* qs = qd + (pair % 2) * 2 * k_block * L;
    bf16* dos = qs + k_block * L;
    float* rl = rows + (pair % 2) * 2 * k_block;
    float* rd = rl + k_block;
    if (pair + 1 < pairs) {
      const int64_t nh = g * sh.group + (pair + 1) / per_head;
      const int64_t nq0 = static_cast<int64_t>(kb + (pair + 1) % per_head) * k_block;
      bf16* nq = qd + ((pair + 1) % 2) * 2 * k_block * L;
      async_tile<DH>(nq, sh.qkv, sh.ld, seq_row0, nq0, t, nh * DH);
      async_tile<DH>(nq + k_block * L, dy, sh.d, seq_row0, nq0, t, nh * DH);
    }
    commit();
    load_rows(rl, rd, lse, delta, bh, q0, t);
    wait<1>();
    __syncthreads();
    const int lo = qb == kb ? warp : 0;  // query groups before the warp's keys: all masked
    float st[8][4], dpt[8][4];
    scores<DH>(st, ks, warp * 16, qs, lo, 4);
    scores<DH>(dpt, vs, warp * 16, dos, lo, 4);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = j * 8 + me.c + e % 2;
        const int64_t query = q0 + col, key = kj[e / 2];
        const bool valid = key <= query && query < t && key < t;
        const float p = valid ? __expf(st[j][e] * sh.scale - rl[col]) : 0.0f;
        st[j][e] = p;
        dpt[j][e] = valid ? p * (dpt[j][e] - rd[col]) : 0.0f;
      }
    }
    times<DH>(dv, st, dos, lo, 4);
    times<DH>(dk, dpt, qs, lo, 4);
    __syncthreads();
  }
  write_rows<DH>(dk, me, dqkv + sh.d + g * DH, sh.ld, seq_row0, k0, t, sh.scale, accumulate);
  write_rows<DH>(dv, me, dqkv + sh.d + sh.dkv + g * DH, sh.ld, seq_row0, k0, t, 1.0f, accumulate);
}

// Dynamic shared memory of each kernel (bytes).
template <int DH>
constexpr size_t forward_smem() {
  return 5 * k_block * (DH + 8) * 2;
}
template <int DH>
constexpr size_t dq_smem() {
  return 6 * k_block * (DH + 8) * 2;
}
template <int DH>
constexpr size_t dkv_smem() {
  return 6 * k_block * (DH + 8) * 2 + 4 * k_block * 4;
}

template <int DH>
void set_smem_limits() {
  static const bool done = [] {
    cudaFuncSetAttribute(forward_k<DH>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(forward_smem<DH>()));
    cudaFuncSetAttribute(dq_k<DH>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(dq_smem<DH>()));
    cudaFuncSetAttribute(dkv_k<DH>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(dkv_smem<DH>()));
    return true;
  }();
  (void)done;
}

// The shape, qkv cast into the scratch's first m (d + 2 dkv) values.
Shape shape_of(cudaStream_t s, const float* qkv, int64_t m, int64_t d, int64_t heads, int64_t kv_heads, int64_t t,
               float scale, bf16* scratch) {
  const int64_t dkv = d / heads * kv_heads, ld = d + 2 * dkv;
  cast(s, qkv, scratch, m * ld);
  return Shape{scratch, ld, d, dkv, heads, heads / kv_heads, t, scale};
}

template <int DH>
void forward(cudaStream_t s, const Shape& sh, float* y, float* state, int64_t m) {
  set_smem_limits<DH>();
  const dim3 grid(static_cast<unsigned>(m / sh.t * sh.heads), static_cast<unsigned>((sh.t + k_block - 1) / k_block));
  forward_k<DH><<<grid, k_threads, forward_smem<DH>(), s>>>(sh, y, state, state + m * sh.heads);
}

template <int DH>
void backward(cudaStream_t s, const Shape& sh, float* state, const float* dy_f, float* dqkv, int64_t m, bool acc) {
  set_smem_limits<DH>();
  bf16* dy = const_cast<bf16*>(sh.qkv) + m * sh.ld;  // the scratch after qkv
  cast(s, dy_f, dy, m * sh.d);
  const float* lse = state;
  const float* o = state + m * sh.heads;
  float* delta = state + m * sh.heads + m * sh.d;
  const int64_t warps = m * sh.heads;
  delta_k<<<static_cast<unsigned>((warps * 32 + 255) / 256), 256, 0, s>>>(dy_f, o, delta, m, sh.d, sh.heads, sh.t, DH);
  const unsigned blocks = static_cast<unsigned>((sh.t + k_block - 1) / k_block);
  const dim3 kv_grid(static_cast<unsigned>(m / sh.t * (sh.heads / sh.group)), blocks);
  dkv_k<DH><<<kv_grid, k_threads, dkv_smem<DH>(), s>>>(sh, dy, lse, delta, dqkv, acc);
  const dim3 q_grid(static_cast<unsigned>(m / sh.t * sh.heads), blocks);
  dq_k<DH><<<q_grid, k_threads, dq_smem<DH>(), s>>>(sh, dy, lse, delta, dqkv, acc);
}

}  // namespace

void flash_attention_prepare() {
  set_smem_limits<16>();
  set_smem_limits<32>();
  set_smem_limits<64>();
  set_smem_limits<128>();
}

void flash_attention(cudaStream_t s, const float* qkv, float* y, float* state, int64_t m, int64_t d, int64_t heads,
                     int64_t kv_heads, int64_t t, float scale, uint16_t* scratch) {
  const Shape sh = shape_of(s, qkv, m, d, heads, kv_heads, t, scale, reinterpret_cast<bf16*>(scratch));
  switch (d / heads) {
    case 16: return forward<16>(s, sh, y, state, m);
    case 32: return forward<32>(s, sh, y, state, m);
    case 64: return forward<64>(s, sh, y, state, m);
    case 128: return forward<128>(s, sh, y, state, m);
    default: return;
  }
}

void flash_attention_grad(cudaStream_t s, const float* qkv, float* state, const float* dy, float* dqkv, int64_t m,
                          int64_t d, int64_t heads, int64_t kv_heads, int64_t t, float scale, bool accumulate,
                          uint16_t* scratch) {
  const Shape sh = shape_of(s, qkv, m, d, heads, kv_heads, t, scale, reinterpret_cast<bf16*>(scratch));
  switch (d / heads) {
    case 16: return backward<16>(s, sh, state, dy, dqkv, m, accumulate);
    case 32: return backward<32>(s, sh, state, dy, dqkv, m, accumulate);
    case 64: return backward<64>(s, sh, state, dy, dqkv, m, accumulate);
    case 128: return backward<128>(s, sh, state, dy, dqkv, m, accumulate);
    default: return;
  }
}

}  // namespace tiermem::exec::cuda
