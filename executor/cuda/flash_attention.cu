// Causal attention in tiles on tensor cores (flash_attention.cuh): wmma
// 16 x 16 x 16 bf16 products into fp32. A block of 4 warps takes 64 rows
// (queries, or keys for the gradient of K and V), each warp 16 of them, and
// walks the other side 64 rows at a time through shared memory.
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
// dQ += dS K. Every output element is summed by one block in one order.
#include "executor/cuda/flash_attention.cuh"

#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>
#include <cmath>

namespace tiermem::exec::cuda {
namespace {

using namespace nvcuda;
using bf16 = __nv_bfloat16;

constexpr int k_block = 64;               // rows a block takes at a time, each side
constexpr int k_threads = 128;            // 4 warps of 16 rows
constexpr int k_sld = k_block + 4;        // fp32 score rows (floats; 16-row steps stay 32-byte aligned)
constexpr int k_pld = k_block + 8;        // bf16 probability rows

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBt = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;  // B = X^T, X row-major
using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

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

// Rows [r0, r0 + 64) of a sequence (whose first row is seq_row0) of the
// columns [col0, col0 + DH) of a row-major bf16 matrix (rows `ld` apart,
// a multiple of 8, as col0 is) into a tile of rows DH + 8 apart, 16 bytes at
// a time; rows at or past t are zero.
template <int DH>
__device__ void load_tile(bf16* tile, const bf16* src, int64_t ld, int64_t seq_row0, int64_t r0, int64_t t,
                          int64_t col0) {
  constexpr int V = DH / 8;  // 16-byte pieces a row
  for (int i = threadIdx.x; i < k_block * V; i += k_threads) {
    const int r = i / V, c = (i % V) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r0 + r < t) v = *reinterpret_cast<const uint4*>(src + (seq_row0 + r0 + r) * ld + col0 + c);
    *reinterpret_cast<uint4*>(tile + r * (DH + 8) + c) = v;
  }
}

// The same in two halves, so that the next tile's loads are in flight
// while the current one is computed on: fetch_tile into registers (each
// thread its Pieces 16-byte pieces), store_tile into shared memory later.
template <int DH>
struct Pieces {
  static constexpr int n = k_block * (DH / 8) / k_threads;
  uint4 v[n];
};

template <int DH>
__device__ void fetch_tile(Pieces<DH>& p, const bf16* src, int64_t ld, int64_t seq_row0, int64_t r0, int64_t t,
                           int64_t col0) {
  constexpr int V = DH / 8;
#pragma unroll
  for (int k = 0; k < Pieces<DH>::n; ++k) {
    const int i = threadIdx.x + k * k_threads, r = i / V, c = (i % V) * 8;
    p.v[k] = r0 + r < t ? *reinterpret_cast<const uint4*>(src + (seq_row0 + r0 + r) * ld + col0 + c)
                        : make_uint4(0, 0, 0, 0);
  }
}

template <int DH>
__device__ void store_tile(bf16* tile, const Pieces<DH>& p) {
  constexpr int V = DH / 8;
#pragma unroll
  for (int k = 0; k < Pieces<DH>::n; ++k) {
    const int i = threadIdx.x + k * k_threads, r = i / V, c = (i % V) * 8;
    *reinterpret_cast<uint4*>(tile + r * (DH + 8) + c) = p.v[k];
  }
}

// acc = X[rows 16 at x] Y^T[16 columns at y] over DH: both tiles row-major, rows DH + 8 apart.
template <int DH>
__device__ void product_t(Acc& acc, const bf16* x, const bf16* y) {
  wmma::fill_fragment(acc, 0.0f);
  for (int c = 0; c < DH / 16; ++c) {
    FragA a;
    FragBt b;
    wmma::load_matrix_sync(a, x + c * 16, DH + 8);
    wmma::load_matrix_sync(b, y + c * 16, DH + 8);
    wmma::mma_sync(acc, a, b, acc);
  }
}

// Each lane's share of a warp's 16 rows x 64 columns: row lane / 2, half of
// the columns.
struct Lane {
  int row, first;
  __device__ Lane(int warp) : row(warp * 16 + (threadIdx.x % 32) / 2), first((threadIdx.x % 2) * 32) {}
};

template <int DH>
__global__ void __launch_bounds__(k_threads) forward_k(Shape sh, float* y, float* lse, float* ostash) {
  constexpr int L = DH + 8, OL = DH + 4;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* ks = qs + k_block * L;
  bf16* vs = ks + k_block * L;
  bf16* ps = vs + k_block * L;
  float* ss = reinterpret_cast<float*>(ps + k_block * k_pld);
  float* os = ss + k_block * k_sld;

  const int64_t t = sh.t, bh = blockIdx.x, h = bh % sh.heads, g = h / sh.group, seq_row0 = bh / sh.heads * t;
  const int nqb = static_cast<int>((t + k_block - 1) / k_block), qb = nqb - 1 - static_cast<int>(blockIdx.y);
  const int warp = threadIdx.x / 32;
  const int64_t q0 = static_cast<int64_t>(qb) * k_block;
  load_tile<DH>(qs, sh.qkv, sh.ld, seq_row0, q0, t, h * DH);
  for (int i = threadIdx.x; i < k_block * OL; i += k_threads) os[i] = 0.0f;
  const Lane me(warp);
  const int64_t qi = q0 + me.row;
  float m_run = -INFINITY, l_run = 0.0f;
  Pieces<DH> kn, vn;
  fetch_tile<DH>(kn, sh.qkv, sh.ld, seq_row0, 0, t, sh.d + g * DH);
  fetch_tile<DH>(vn, sh.qkv, sh.ld, seq_row0, 0, t, sh.d + sh.dkv + g * DH);
  for (int kb = 0; kb <= qb; ++kb) {
    const int64_t k0 = static_cast<int64_t>(kb) * k_block;
    __syncthreads();
    store_tile<DH>(ks, kn);
    store_tile<DH>(vs, vn);
    __syncthreads();
    if (kb < qb) {
      fetch_tile<DH>(kn, sh.qkv, sh.ld, seq_row0, k0 + k_block, t, sh.d + g * DH);
      fetch_tile<DH>(vn, sh.qkv, sh.ld, seq_row0, k0 + k_block, t, sh.d + sh.dkv + g * DH);
    }
    for (int j = 0; j < 4; ++j) {
      if (kb == qb && j > warp) continue;  // keys all past the warp's queries
      Acc acc;
      product_t<DH>(acc, qs + warp * 16 * L, ks + j * 16 * L);
      wmma::store_matrix_sync(ss + warp * 16 * k_sld + j * 16, acc, k_sld, wmma::mem_row_major);
    }
    __syncwarp();
    const float* srow = ss + me.row * k_sld;
    float mx = -INFINITY;
    for (int c = me.first; c < me.first + 32; ++c) {
      if (k0 + c <= qi && k0 + c < t) mx = fmaxf(mx, srow[c] * sh.scale);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float m_new = fmaxf(m_run, mx);  // finite: key k0 <= q0 <= qi
    const float alpha = __expf(m_run - m_new);
    float sum = 0.0f;
    bf16* prow = ps + me.row * k_pld;
    for (int c = me.first; c < me.first + 32; ++c) {
      const float p = k0 + c <= qi && k0 + c < t ? __expf(srow[c] * sh.scale - m_new) : 0.0f;
      prow[c] = __float2bfloat16(p);
      sum += p;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l_run = l_run * alpha + sum;
    m_run = m_new;
    float* orow = os + me.row * OL;
    for (int c = me.first / 32 * (DH / 2); c < (me.first / 32 + 1) * (DH / 2); ++c) orow[c] *= alpha;
    __syncwarp();
    for (int n = 0; n < DH / 16; ++n) {
      Acc acc;
      wmma::load_matrix_sync(acc, os + warp * 16 * OL + n * 16, OL, wmma::mem_row_major);
      for (int j = 0; j < 4; ++j) {
        if (kb == qb && j > warp) continue;  // P is zero there
        FragA a;
        FragB b;
        wmma::load_matrix_sync(a, ps + warp * 16 * k_pld + j * 16, k_pld);
        wmma::load_matrix_sync(b, vs + j * 16 * L + n * 16, L);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(os + warp * 16 * OL + n * 16, acc, OL, wmma::mem_row_major);
    }
    __syncwarp();
  }
  {
    const float inv = 1.0f / l_run;
    float* orow = os + me.row * OL;
    for (int c = me.first / 32 * (DH / 2); c < (me.first / 32 + 1) * (DH / 2); ++c) orow[c] *= inv;
    if (me.first == 0 && qi < t) lse[bh * t + qi] = m_run + logf(l_run);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < k_block * DH; i += k_threads) {
    const int r = i / DH, c = i % DH;
    if (q0 + r >= t) continue;
    const int64_t at = (seq_row0 + q0 + r) * sh.d + h * DH + c;
    y[at] = os[r * OL + c];
    ostash[at] = os[r * OL + c];
  }
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

__device__ inline void put(float* at, float v, bool accumulate) { *at = accumulate ? *at + v : v; }

// Loads the 64 rows' log-sum-exp and D from r0 (zero past t).
__device__ void load_rows(float* rl, float* rd, const float* lse, const float* delta, int64_t bh, int64_t r0,
                          int64_t t) {
  for (int i = threadIdx.x; i < k_block; i += k_threads) {
    rl[i] = r0 + i < t ? lse[bh * t + r0 + i] : 0.0f;
    rd[i] = r0 + i < t ? delta[bh * t + r0 + i] : 0.0f;
  }
}

// The 4 warps' 16 x DH accumulators, through `out` ([64][DH + 4] floats of
// shared memory), to rows r0.. (before t) of `to` (rows `ld` apart): (+)=
// factor * the sums.
template <int DH>
__device__ void write_rows(Acc (&f)[DH / 16], float* out, float* to, int64_t ld, int64_t seq_row0, int64_t r0,
                           int64_t t, float factor, bool accumulate) {
  constexpr int OL = DH + 4;
  const int warp = threadIdx.x / 32;
  __syncthreads();
  for (int n = 0; n < DH / 16; ++n) wmma::store_matrix_sync(out + warp * 16 * OL + n * 16, f[n], OL, wmma::mem_row_major);
  __syncthreads();
  for (int i = threadIdx.x; i < k_block * DH; i += k_threads) {
    const int r = i / DH, c = i % DH;
    if (r0 + r < t) put(to + (seq_row0 + r0 + r) * ld + c, factor * out[r * OL + c], accumulate);
  }
}

template <int DH>
__global__ void __launch_bounds__(k_threads) dq_k(Shape sh, const bf16* dy, const float* lse, const float* delta,
                                                  float* dqkv, bool accumulate) {
  constexpr int L = DH + 8;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* dos = qs + k_block * L;
  bf16* ks = dos + k_block * L;
  bf16* vs = ks + k_block * L;
  bf16* dss = vs + k_block * L;
  float* ss = reinterpret_cast<float*>(dss + k_block * k_pld);
  float* dps = ss + k_block * k_sld;
  float* rl = dps + k_block * k_sld;
  float* rd = rl + k_block;

  const int64_t t = sh.t, bh = blockIdx.x, h = bh % sh.heads, g = h / sh.group, seq_row0 = bh / sh.heads * t;
  const int nqb = static_cast<int>((t + k_block - 1) / k_block), qb = nqb - 1 - static_cast<int>(blockIdx.y);
  const int warp = threadIdx.x / 32;
  const int64_t q0 = static_cast<int64_t>(qb) * k_block;
  load_tile<DH>(qs, sh.qkv, sh.ld, seq_row0, q0, t, h * DH);
  load_tile<DH>(dos, dy, sh.d, seq_row0, q0, t, h * DH);
  load_rows(rl, rd, lse, delta, bh, q0, t);
  const Lane me(warp);
  const int64_t qi = q0 + me.row;
  Acc dq[DH / 16];
  for (auto& f : dq) wmma::fill_fragment(f, 0.0f);
  Pieces<DH> kn, vn;
  fetch_tile<DH>(kn, sh.qkv, sh.ld, seq_row0, 0, t, sh.d + g * DH);
  fetch_tile<DH>(vn, sh.qkv, sh.ld, seq_row0, 0, t, sh.d + sh.dkv + g * DH);
  for (int kb = 0; kb <= qb; ++kb) {
    const int64_t k0 = static_cast<int64_t>(kb) * k_block;
    __syncthreads();
    store_tile<DH>(ks, kn);
    store_tile<DH>(vs, vn);
    __syncthreads();
    if (kb < qb) {
      fetch_tile<DH>(kn, sh.qkv, sh.ld, seq_row0, k0 + k_block, t, sh.d + g * DH);
      fetch_tile<DH>(vn, sh.qkv, sh.ld, seq_row0, k0 + k_block, t, sh.d + sh.dkv + g * DH);
    }
    for (int j = 0; j < 4; ++j) {
      if (kb == qb && j > warp) continue;
      Acc acc;
      product_t<DH>(acc, qs + warp * 16 * L, ks + j * 16 * L);
      wmma::store_matrix_sync(ss + warp * 16 * k_sld + j * 16, acc, k_sld, wmma::mem_row_major);
      product_t<DH>(acc, dos + warp * 16 * L, vs + j * 16 * L);
      wmma::store_matrix_sync(dps + warp * 16 * k_sld + j * 16, acc, k_sld, wmma::mem_row_major);
    }
    __syncwarp();
    const float row_lse = rl[me.row], row_d = rd[me.row];
    for (int c = me.first; c < me.first + 32; ++c) {
      const int at = me.row * k_sld + c;
      const bool valid = k0 + c <= qi && k0 + c < t;  // else ss and dps hold what an earlier tile left
      dss[me.row * k_pld + c] =
          __float2bfloat16(valid ? __expf(ss[at] * sh.scale - row_lse) * (dps[at] - row_d) : 0.0f);
    }
    __syncwarp();
    for (int n = 0; n < DH / 16; ++n) {
      for (int j = 0; j < 4; ++j) {
        if (kb == qb && j > warp) continue;
        FragA a;
        FragB b;
        wmma::load_matrix_sync(a, dss + warp * 16 * k_pld + j * 16, k_pld);
        wmma::load_matrix_sync(b, ks + j * 16 * L + n * 16, L);
        wmma::mma_sync(dq[n], a, b, dq[n]);
      }
    }
  }
  // ss and dps together hold [64][DH + 4] (2 * 64 * 68 >= 64 * 132).
  write_rows<DH>(dq, ss, dqkv + h * DH, sh.ld, seq_row0, q0, t, sh.scale, accumulate);
}

template <int DH>
__global__ void __launch_bounds__(k_threads) dkv_k(Shape sh, const bf16* dy, const float* lse, const float* delta,
                                                   float* dqkv, bool accumulate) {
  constexpr int L = DH + 8;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* ks = reinterpret_cast<bf16*>(smem);
  bf16* vs = ks + k_block * L;
  bf16* qs = vs + k_block * L;
  bf16* dos = qs + k_block * L;
  bf16* pt = dos + k_block * L;
  bf16* dst = pt + k_block * k_pld;
  float* st = reinterpret_cast<float*>(dst + k_block * k_pld);
  float* dpt = st + k_block * k_sld;
  float* rl = dpt + k_block * k_sld;
  float* rd = rl + k_block;

  const int64_t t = sh.t, kv_heads = sh.heads / sh.group;
  const int64_t s = blockIdx.x / kv_heads, g = blockIdx.x % kv_heads, seq_row0 = s * t;
  const int nqb = static_cast<int>((t + k_block - 1) / k_block), kb = static_cast<int>(blockIdx.y);
  const int warp = threadIdx.x / 32;
  const int64_t k0 = static_cast<int64_t>(kb) * k_block;
  load_tile<DH>(ks, sh.qkv, sh.ld, seq_row0, k0, t, sh.d + g * DH);
  load_tile<DH>(vs, sh.qkv, sh.ld, seq_row0, k0, t, sh.d + sh.dkv + g * DH);
  const Lane me(warp);
  const int64_t kj = k0 + me.row;
  Acc dk[DH / 16], dv[DH / 16];
  for (auto& f : dk) wmma::fill_fragment(f, 0.0f);
  for (auto& f : dv) wmma::fill_fragment(f, 0.0f);
  // Every query block at or after this key block, of every head of the
  // group: (head, query block) pairs in order, the next one's Q and dO in
  // flight while this one is computed on.
  const int per_head = nqb - kb;
  const int64_t pairs = sh.group * per_head;
  Pieces<DH> qn, don;
  fetch_tile<DH>(qn, sh.qkv, sh.ld, seq_row0, k0, t, g * sh.group * DH);
  fetch_tile<DH>(don, dy, sh.d, seq_row0, k0, t, g * sh.group * DH);
  for (int64_t pair = 0; pair < pairs; ++pair) {
    const int64_t h = g * sh.group + pair / per_head, bh = s * sh.heads + h;
    const int qb = kb + static_cast<int>(pair % per_head);
    const int64_t q0 = static_cast<int64_t>(qb) * k_block;
    __syncthreads();
    store_tile<DH>(qs, qn);
    store_tile<DH>(dos, don);
    load_rows(rl, rd, lse, delta, bh, q0, t);
    __syncthreads();
    if (pair + 1 < pairs) {
      const int64_t nh = g * sh.group + (pair + 1) / per_head;
      const int64_t nq0 = static_cast<int64_t>(kb + (pair + 1) % per_head) * k_block;
      fetch_tile<DH>(qn, sh.qkv, sh.ld, seq_row0, nq0, t, nh * DH);
      fetch_tile<DH>(don, dy, sh.d, seq_row0, nq0, t, nh * DH);
    }
    for (int j = 0; j < 4; ++j) {
      if (qb == kb && j < warp) continue;  // queries all before the warp's keys
      Acc acc;
      product_t<DH>(acc, ks + warp * 16 * L, qs + j * 16 * L);
      wmma::store_matrix_sync(st + warp * 16 * k_sld + j * 16, acc, k_sld, wmma::mem_row_major);
      product_t<DH>(acc, vs + warp * 16 * L, dos + j * 16 * L);
      wmma::store_matrix_sync(dpt + warp * 16 * k_sld + j * 16, acc, k_sld, wmma::mem_row_major);
    }
    __syncwarp();
    for (int c = me.first; c < me.first + 32; ++c) {
      const int at = me.row * k_sld + c;
      const bool valid = kj <= q0 + c && q0 + c < t && kj < t;
      const float p = valid ? __expf(st[at] * sh.scale - rl[c]) : 0.0f;
      pt[me.row * k_pld + c] = __float2bfloat16(p);
      dst[me.row * k_pld + c] = __float2bfloat16(valid ? p * (dpt[at] - rd[c]) : 0.0f);
    }
    __syncwarp();
    for (int n = 0; n < DH / 16; ++n) {
      for (int j = 0; j < 4; ++j) {
        if (qb == kb && j < warp) continue;
        FragA a;
        FragB b;
        wmma::load_matrix_sync(b, dos + j * 16 * L + n * 16, L);
        wmma::load_matrix_sync(a, pt + warp * 16 * k_pld + j * 16, k_pld);
        wmma::mma_sync(dv[n], a, b, dv[n]);
        wmma::load_matrix_sync(b, qs + j * 16 * L + n * 16, L);
        wmma::load_matrix_sync(a, dst + warp * 16 * k_pld + j * 16, k_pld);
        wmma::mma_sync(dk[n], a, b, dk[n]);
      }
    }
  }
  // st and dpt together hold [64][DH + 4].
  write_rows<DH>(dk, st, dqkv + sh.d + g * DH, sh.ld, seq_row0, k0, t, sh.scale, accumulate);
  write_rows<DH>(dv, st, dqkv + sh.d + sh.dkv + g * DH, sh.ld, seq_row0, k0, t, 1.0f, accumulate);
}

// Dynamic shared memory of each kernel (bytes).
template <int DH>
constexpr size_t forward_smem() {
  return (3 * k_block * (DH + 8) + k_block * k_pld) * 2 + (k_block * k_sld + k_block * (DH + 4)) * 4;
}
template <int DH>
constexpr size_t dq_smem() {
  return (4 * k_block * (DH + 8) + k_block * k_pld) * 2 + (2 * k_block * k_sld + 2 * k_block) * 4;
}
template <int DH>
constexpr size_t dkv_smem() {
  return (4 * k_block * (DH + 8) + 2 * k_block * k_pld) * 2 + (2 * k_block * k_sld + 2 * k_block) * 4;
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
