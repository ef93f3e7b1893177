// The executor's GPU kernels (kernels.cuh): CUDA, and HIP from the same
// source (gpu_platform.cuh). Same arithmetic as the CPU kernels
// (executor/kernels.cpp) in float; sums over rows run per column in a fixed
// order, so a step gives the same bits every time.
#include "executor/cuda/kernels.cuh"
#include "executor/cuda/launch.cuh"
#include "executor/elementwise_math.hpp"
#include "executor/optimizer_math.hpp"

#include <algorithm>

namespace tiermem::exec::cuda {
namespace {

constexpr float k_sqrt_2_over_pi = 0.7978845608028654f;
constexpr float k_gelu_c = 0.044715f;

// A row per block (grid-stride), its columns over the threads: no 64-bit
// division per element.
__global__ void bias_add_k(const float* x, const float* b, float* y, int64_t m, int64_t n) {
  for (int64_t r = blockIdx.x; r < m; r += gridDim.x) {
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) y[r * n + j] = x[r * n + j] + b[j];
  }
}

// Column sums of dy [m, n] (and of dy * xhat for layer norm's gamma), in two
// passes so that every SM has work: blocks of 32 columns x 8 row groups over
// a chunk of k_sum_chunk rows each (each group summing every 8th row of the
// chunk, then the groups in order) write a partial sum per chunk; then each
// column adds its chunks in order. A fixed order: the same bits every run.
constexpr int64_t k_sum_chunk = 128;

template <bool k_layer_norm>
__global__ void column_partials_k(const float* __restrict__ dy, const float* __restrict__ x,
                                  const float* __restrict__ mean, const float* __restrict__ rstd, float* partial,
                                  float* partial_x, int64_t m, int64_t n) {
  __shared__ float part[8][33];
  __shared__ float part_x[8][33];
  const int64_t j = blockIdx.x * 32 + threadIdx.x;
  const int64_t first = blockIdx.y * k_sum_chunk, last = min(m, first + k_sum_chunk);
  float s = 0, sx = 0;
  if (j < n) {
#pragma unroll 4
    for (int64_t r = first + threadIdx.y; r < last; r += 8) {
      const float g = dy[r * n + j];
      s += g;
      if (k_layer_norm) sx += g * ((x[r * n + j] - (mean != nullptr ? mean[r] : 0.0f)) * rstd[r]);  // null: RMS
    }
  }
  part[threadIdx.y][threadIdx.x] = s;
  part_x[threadIdx.y][threadIdx.x] = sx;
  __syncthreads();
  if (threadIdx.y != 0 || j >= n) return;
  float total = 0, total_x = 0;
  for (int g = 0; g < 8; ++g) {
    total += part[g][threadIdx.x];
    total_x += part_x[g][threadIdx.x];
  }
  partial[blockIdx.y * n + j] = total;
  if (k_layer_norm) partial_x[blockIdx.y * n + j] = total_x;
}

// A thread a column: few threads, each a long chain of loads; unrolled so
// that several are in flight (added in the same order: the same bits).
template <bool k_layer_norm>
__global__ void column_totals_k(const float* __restrict__ partial, const float* __restrict__ partial_x,
                                float* sum_dy, float* sum_dyx, int64_t chunks, int64_t n, bool accumulate) {
  TIERMEM_FOR_EACH(j, n) {
    float total = 0, total_x = 0;
#pragma unroll 16
    for (int64_t c = 0; c < chunks; ++c) {
      total += partial[c * n + j];
      if (k_layer_norm) total_x += partial_x[c * n + j];
    }
    if (sum_dy != nullptr) sum_dy[j] = accumulate ? sum_dy[j] + total : total;  // null: a layer norm without beta
    if (k_layer_norm) sum_dyx[j] = accumulate ? sum_dyx[j] + total_x : total_x;
  }
}

template <bool k_layer_norm>
void column_sums(cudaStream_t s, const float* dy, const float* x, const float* mean, const float* rstd, float* sum_dy,
                 float* sum_dyx, int64_t m, int64_t n, bool accumulate, float* scratch) {
  const int64_t chunks = (m + k_sum_chunk - 1) / k_sum_chunk;
  const dim3 grid(static_cast<unsigned>((n + 31) / 32), static_cast<unsigned>(chunks));
  column_partials_k<k_layer_norm><<<grid, dim3(32, 8), 0, s>>>(dy, x, mean, rstd, scratch, scratch + chunks * n, m, n);
  column_totals_k<k_layer_norm><<<blocks_for(n), k_threads, 0, s>>>(scratch, scratch + chunks * n, sum_dy, sum_dyx,
                                                                     chunks, n, accumulate);
}

__global__ void accumulate_k(const float* dy, float* dx, int64_t count) { TIERMEM_FOR_EACH(i, count) dx[i] += dy[i]; }

__global__ void mul_k(const float* a, const float* b, float* y, int64_t count, bool accumulate) {
  TIERMEM_FOR_EACH(i, count) y[i] = accumulate ? y[i] + a[i] * b[i] : a[i] * b[i];
}

// Rotary positions: one thread per pair (c, c + dh/2) of a turned head of a
// row; the columns past the turned heads are copied by the same threads.
__global__ void rotary_k(const float* x, float* y, int64_t m, int64_t cols, int64_t heads, int64_t dh, int64_t t,
                         float theta, bool inverse, bool accumulate) {
  const int64_t half = dh / 2, pairs = heads * half, rest = cols - heads * dh;
  const int64_t per_row = pairs + rest;
  TIERMEM_FOR_EACH(i, m * per_row) {
    const int64_t r = i / per_row, k = i % per_row;
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    if (k >= pairs) {
      const int64_t c = heads * dh + (k - pairs);
      yr[c] = accumulate ? yr[c] + xr[c] : xr[c];
      continue;
    }
    const int64_t h = k / half, c = k % half;
    const float inv = 1.0f / powf(theta, static_cast<float>(2 * c) / static_cast<float>(dh));
    const float angle = static_cast<float>(r % t) * inv;
    const float cs = cosf(angle), sn = inverse ? -sinf(angle) : sinf(angle);
    const float a = xr[h * dh + c], b = xr[h * dh + c + half];
    const float lo = a * cs - b * sn, hi = b * cs + a * sn;
    yr[h * dh + c] = accumulate ? yr[h * dh + c] + lo : lo;
    yr[h * dh + c + half] = accumulate ? yr[h * dh + c + half] + hi : hi;
  }
}

// bf16 by its bits (the upper half of a float), rounded to nearest even; a
// NaN stays a (quiet) NaN. Plain bits: the same source builds for HIP.
__global__ void to_bf16_k(const float* x, uint16_t* y, int64_t count) {
  TIERMEM_FOR_EACH(i, count) {
    uint32_t u = __float_as_uint(x[i]);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      y[i] = static_cast<uint16_t>((u >> 16) | 0x40u);
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);
      y[i] = static_cast<uint16_t>(u >> 16);
    }
  }
}

__global__ void add_k(const float* a, const float* b, float* y, int64_t count) {
  TIERMEM_FOR_EACH(i, count) y[i] = a[i] + b[i];
}

__global__ void copy_columns_k(const float* x, float* y, int64_t m, int64_t n, int64_t y_cols, int64_t column) {
  TIERMEM_FOR_EACH(i, m * n) y[(i / n) * y_cols + column + i % n] = x[i];
}

__global__ void slice_grad_k(const float* dy, float* dx, int64_t m, int64_t n, int64_t dy_cols, int64_t column,
                             bool accumulate) {
  TIERMEM_FOR_EACH(i, m * n) {
    const float g = dy[(i / n) * dy_cols + column + i % n];
    dx[i] = accumulate ? dx[i] + g : g;
  }
}

__global__ void relu_k(const float* x, float* y, int64_t count) { TIERMEM_FOR_EACH(i, count) y[i] = x[i] > 0 ? x[i] : 0.0f; }

__global__ void relu_grad_k(const float* x, const float* dy, float* dx, int64_t count, bool accumulate) {
  TIERMEM_FOR_EACH(i, count) {
    const float g = x[i] > 0 ? dy[i] : 0.0f;
    dx[i] = accumulate ? dx[i] + g : g;
  }
}

__global__ void gelu_k(const float* x, float* y, int64_t count) {
  TIERMEM_FOR_EACH(i, count) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.0f + tanhf(k_sqrt_2_over_pi * (v + k_gelu_c * v * v * v)));
  }
}

// One kernel per element-wise function of elementwise_math.hpp.
template <typename F>
__global__ void unary_k(const float* x, float* y, int64_t count) {
  TIERMEM_FOR_EACH(i, count) y[i] = F::value(x[i]);
}

template <typename F>
__global__ void unary_grad_k(const float* x, const float* dy, float* dx, int64_t count, bool accumulate) {
  TIERMEM_FOR_EACH(i, count) {
    const float g = dy[i] * F::derivative(x[i]);
    dx[i] = accumulate ? dx[i] + g : g;
  }
}

__global__ void gelu_grad_k(const float* x, const float* dy, float* dx, int64_t count, bool accumulate) {
  TIERMEM_FOR_EACH(i, count) {
    const float v = x[i];
    const float t = tanhf(k_sqrt_2_over_pi * (v + k_gelu_c * v * v * v));
    const float d = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * k_sqrt_2_over_pi * (1.0f + 3.0f * k_gelu_c * v * v);
    const float g = dy[i] * d;
    dx[i] = accumulate ? dx[i] + g : g;
  }
}

// A row per warp (8 rows a block of k_threads). Each row's sums keep the
// arithmetic of block_sum over a block per row, which these kernels were
// (the same bits): lane l sums, in turn for each of the block's former warps
// vw = 0 .. k_threads / 32 - 1, the columns l + 32 vw, + k_threads, ... in
// order (thread l + 32 vw's share), the butterfly over the lanes gives former
// warp vw's sum, and those sums are added in order.
__device__ float warp_total(float v) {
  for (int o = 16; o > 0; o /= 2) v += TIERMEM_SHFL_XOR(v, o);
  return v;
}

__device__ int64_t warp_row() { return (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32; }
__device__ int64_t warps_in_grid() { return static_cast<int64_t>(gridDim.x) * blockDim.x / 32; }

__global__ void layer_norm_k(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                             float* rstd, int64_t m, int64_t n, float epsilon) {
  for (int64_t r = warp_row(); r < m; r += warps_in_grid()) {
    const int lane = threadIdx.x % 32;
    const float* row = x + r * n;
    float total = 0;
    for (int vw = 0; vw < k_threads / 32; ++vw) {
      float s = 0;
      for (int64_t j = lane + 32 * vw; j < n; j += k_threads) s += row[j];
      total += warp_total(s);
    }
    const float mu = total / static_cast<float>(n);
    total = 0;
    for (int vw = 0; vw < k_threads / 32; ++vw) {
      float q = 0;
      for (int64_t j = lane + 32 * vw; j < n; j += k_threads) q += (row[j] - mu) * (row[j] - mu);
      total += warp_total(q);
    }
    const float rs = 1.0f / sqrtf(total / static_cast<float>(n) + epsilon);
    if (lane == 0) {
      mean[r] = mu;
      rstd[r] = rs;
    }
    for (int64_t j = lane; j < n; j += 32) {
      y[r * n + j] = (row[j] - mu) * rs * gamma[j] + (beta != nullptr ? beta[j] : 0.0f);
    }
  }
}

// RMS norm.
__global__ void rms_norm_k(const float* x, const float* w, float* y, float* rstd, int64_t m, int64_t n,
                           float epsilon) {
  for (int64_t r = warp_row(); r < m; r += warps_in_grid()) {
    const int lane = threadIdx.x % 32;
    const float* row = x + r * n;
    float total = 0;
    for (int vw = 0; vw < k_threads / 32; ++vw) {
      float q = 0;
      for (int64_t j = lane + 32 * vw; j < n; j += k_threads) q += row[j] * row[j];
      total += warp_total(q);
    }
    const float rs = 1.0f / sqrtf(total / static_cast<float>(n) + epsilon);
    if (lane == 0) rstd[r] = rs;
    for (int64_t j = lane; j < n; j += 32) y[r * n + j] = row[j] * rs * w[j];
  }
}

__global__ void rms_norm_dx_k(const float* x, const float* w, const float* rstd, const float* dy, float* dx,
                              int64_t m, int64_t n, bool accumulate) {
  for (int64_t r = warp_row(); r < m; r += warps_in_grid()) {
    const int lane = threadIdx.x % 32;
    const float* xr = x + r * n;
    const float* dyr = dy + r * n;
    float total = 0;
    for (int vw = 0; vw < k_threads / 32; ++vw) {
      float sgx = 0;
      for (int64_t j = lane + 32 * vw; j < n; j += k_threads) sgx += dyr[j] * w[j] * xr[j] * rstd[r];
      total += warp_total(sgx);
    }
    const float mean_gx = total / static_cast<float>(n);
    for (int64_t j = lane; j < n; j += 32) {
      const float d = rstd[r] * (dyr[j] * w[j] - xr[j] * rstd[r] * mean_gx);
      dx[r * n + j] = accumulate ? dx[r * n + j] + d : d;
    }
  }
}

__global__ void layer_norm_dx_k(const float* x, const float* gamma, const float* mean, const float* rstd,
                                const float* dy, float* dx, int64_t m, int64_t n, bool accumulate) {
  for (int64_t r = warp_row(); r < m; r += warps_in_grid()) {
    const int lane = threadIdx.x % 32;
    const float* xr = x + r * n;
    const float* dyr = dy + r * n;
    float sum_g = 0, sum_gx = 0;
    for (int vw = 0; vw < k_threads / 32; ++vw) {
      float sg = 0, sgx = 0;
      for (int64_t j = lane + 32 * vw; j < n; j += k_threads) {
        const float g = dyr[j] * gamma[j];
        sg += g;
        sgx += g * ((xr[j] - mean[r]) * rstd[r]);
      }
      sum_g += warp_total(sg);
      sum_gx += warp_total(sgx);
    }
    const float inv_n = 1.0f / static_cast<float>(n);
    for (int64_t j = lane; j < n; j += 32) {
      const float xhat = (xr[j] - mean[r]) * rstd[r];
      const float d = rstd[r] * (dyr[j] * gamma[j] - inv_n * sum_g - xhat * inv_n * sum_gx);
      dx[r * n + j] = accumulate ? dx[r * n + j] + d : d;
    }
  }
}

// One warp per row: max (first arg-max), sum of exponentials. Each lane
// takes every 32nd value in order; the loops are unrolled so that a lane has
// several loads in flight (the same order of use: the same bits).
struct RowSoftmax {
  float max;
  int arg;
  float sum;
};

__device__ RowSoftmax row_softmax(const float* __restrict__ row, int64_t c) {
  const int lane = threadIdx.x % 32;
  float max = -INFINITY;
  int arg = 0x7fffffff;
#pragma unroll 8
  for (int64_t j = lane; j < c; j += 32) {
    const float v = row[j];
    if (v > max) max = v, arg = static_cast<int>(j);
  }
  for (int o = 16; o > 0; o /= 2) {
    const float om = TIERMEM_SHFL_XOR(max, o);
    const int oa = TIERMEM_SHFL_XOR(arg, o);
    if (om > max || (om == max && oa < arg)) max = om, arg = oa;
  }
  float sum = 0;
#pragma unroll 8
  for (int64_t j = lane; j < c; j += 32) sum += expf(row[j] - max);
  for (int o = 16; o > 0; o /= 2) sum += TIERMEM_SHFL_XOR(sum, o);
  return {max, arg, sum};
}

__global__ void softmax_xent_rows_k(const float* logits, const int32_t* labels, int64_t m, int64_t c,
                                    float* row_loss, int32_t* row_right) {
  const int64_t r = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  if (r >= m) return;
  const float* row = logits + r * c;
  const RowSoftmax s = row_softmax(row, c);
  if (threadIdx.x % 32 == 0) {
    row_loss[r] = logf(s.sum) + s.max - row[labels[r]];
    row_right[r] = s.arg == labels[r];
  }
}

// One block: the rows in order per thread, then the threads in order.
__global__ void softmax_xent_total_k(const float* row_loss, const int32_t* row_right, int64_t m, float* loss,
                                     double* stats, unsigned long long* hits) {
  __shared__ double part[k_threads];
  __shared__ long long part_right[k_threads];
  double s = 0;
  long long right = 0;
  for (int64_t r = threadIdx.x; r < m; r += k_threads) s += row_loss[r], right += row_right[r];
  part[threadIdx.x] = s;
  part_right[threadIdx.x] = right;
  __syncthreads();
  if (threadIdx.x != 0) return;
  double total = 0;
  long long total_right = 0;
  for (int t = 0; t < k_threads; ++t) total += part[t], total_right += part_right[t];
  const float mean = static_cast<float>(total / static_cast<double>(m));
  *loss = mean;
  stats[0] += mean;
  *hits += static_cast<unsigned long long>(total_right);
}

__global__ void softmax_xent_grad_k(const float* __restrict__ logits, const int32_t* labels,
                                    float* __restrict__ dlogits, int64_t m, int64_t c, float scale, bool accumulate) {
  const int64_t r = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  if (r >= m) return;
  const float* row = logits + r * c;
  const RowSoftmax s = row_softmax(row, c);
#pragma unroll 4
  for (int64_t j = threadIdx.x % 32; j < c; j += 32) {
    const float p = expf(row[j] - s.max) / s.sum;
    const float g = (p - (j == labels[r] ? 1.0f : 0.0f)) * scale;
    dlogits[r * c + j] = accumulate ? dlogits[r * c + j] + g : g;
  }
}

// Sums of squares for clipping: each of clip_partials blocks sums a
// grid-stride share per thread in double, then its threads in a fixed tree;
// then one block adds the partials the same way.
__device__ double block_sum(double v) {
  __shared__ double part[k_threads];
  part[threadIdx.x] = v;
  __syncthreads();
  for (int w = k_threads / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  return part[0];
}

__global__ void sum_squares_k(const float* x, int64_t n, double* partial) {
  double s = 0;
  TIERMEM_FOR_EACH(i, n) {
    const double v = x[i];
    s += v * v;
  }
  const double total = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

__global__ void clip_scale_k(const double* partial, float max_norm, float* grad_scale) {
  double s = 0;
  for (int i = threadIdx.x; i < clip_partials; i += k_threads) s += partial[i];
  const double total = block_sum(s);
  if (threadIdx.x == 0) *grad_scale = clip_scale(max_norm, total);
}

__global__ void dropout_k(const float* x, float* y, int64_t count, float p, uint64_t seed, uint64_t salt,
                          const int64_t* step, uint64_t draw, bool accumulate) {
  const uint64_t key = dropout_key(seed, salt, *step, draw);
  TIERMEM_FOR_EACH(i, count) {
    const float v = p > 0 ? x[i] * dropout_factor(key, static_cast<uint64_t>(i), p) : x[i];
    y[i] = accumulate ? y[i] + v : v;
  }
}

__global__ void sgd_k(const float* param_in, float* param, const float* grad, const float* velocity_in,
                      float* velocity, int64_t count, OptimizerHyper h, const int64_t* step,
                      const float* grad_scale) {
  const float lr = learning_rate_at(h, *step);
  const float gs = h.max_grad_norm > 0 ? *grad_scale : 1.0f;
  TIERMEM_FOR_EACH(i, count) {
    sgd_element(param_in[i], grad[i] * gs, velocity_in[i], lr, h.momentum, h.weight_decay, &param[i], &velocity[i]);
  }
}

__global__ void adam_k(const float* param_in, float* param, const float* grad, const float* m_in, float* m,
                       const float* v_in, float* v, int64_t count, OptimizerHyper h, const int64_t* step,
                       const float* grad_scale) {
  const float t = static_cast<float>(*step);
  const float gs = h.max_grad_norm > 0 ? *grad_scale : 1.0f;
  const float lr = learning_rate_at(h, *step);
  const float step_size = lr / (1.0f - powf(h.beta1, t));
  const float c2_sqrt = sqrtf(1.0f - powf(h.beta2, t));
  TIERMEM_FOR_EACH(i, count) {
    adam_element(param_in[i], grad[i] * gs, m_in[i], v_in[i], lr, step_size, c2_sqrt, h.beta1, h.beta2, h.epsilon,
                 h.weight_decay, h.decoupled, &param[i], &m[i], &v[i]);
  }
}

unsigned warp_blocks(int64_t rows) { return blocks_for(rows * 32); }

}  // namespace

void bias_add(cudaStream_t s, const float* x, const float* bias, float* y, int64_t m, int64_t n) {
  bias_add_k<<<static_cast<unsigned>(std::min<int64_t>(m, 65535)), k_threads, 0, s>>>(x, bias, y, m, n);
}

int64_t column_sums_scratch(int64_t m, int64_t n) { return 2 * ((m + k_sum_chunk - 1) / k_sum_chunk) * n; }

void bias_grad(cudaStream_t s, const float* dy, float* dbias, int64_t m, int64_t n, bool accumulate, float* scratch) {
  column_sums<false>(s, dy, nullptr, nullptr, nullptr, dbias, nullptr, m, n, accumulate, scratch);
}

void to_bf16(cudaStream_t s, const float* x, uint16_t* y, int64_t count) {
  to_bf16_k<<<blocks_for(count), k_threads, 0, s>>>(x, y, count);
}

void accumulate(cudaStream_t s, const float* dy, float* dx, int64_t count) {
  accumulate_k<<<blocks_for(count), k_threads, 0, s>>>(dy, dx, count);
}

void add(cudaStream_t s, const float* a, const float* b, float* y, int64_t count) {
  add_k<<<blocks_for(count), k_threads, 0, s>>>(a, b, y, count);
}

void copy_columns(cudaStream_t s, const float* x, float* y, int64_t m, int64_t n, int64_t y_cols, int64_t column) {
  copy_columns_k<<<blocks_for(m * n), k_threads, 0, s>>>(x, y, m, n, y_cols, column);
}

void slice_columns_grad(cudaStream_t s, const float* dy, float* dx, int64_t m, int64_t n, int64_t dy_cols,
                        int64_t column, bool accumulate) {
  slice_grad_k<<<blocks_for(m * n), k_threads, 0, s>>>(dy, dx, m, n, dy_cols, column, accumulate);
}

void relu(cudaStream_t s, const float* x, float* y, int64_t count) {
  relu_k<<<blocks_for(count), k_threads, 0, s>>>(x, y, count);
}

void relu_grad(cudaStream_t s, const float* x, const float* dy, float* dx, int64_t count, bool accumulate) {
  relu_grad_k<<<blocks_for(count), k_threads, 0, s>>>(x, dy, dx, count, accumulate);
}

void gelu(cudaStream_t s, const float* x, float* y, int64_t count) {
  gelu_k<<<blocks_for(count), k_threads, 0, s>>>(x, y, count);
}

void gelu_grad(cudaStream_t s, const float* x, const float* dy, float* dx, int64_t count, bool accumulate) {
  gelu_grad_k<<<blocks_for(count), k_threads, 0, s>>>(x, dy, dx, count, accumulate);
}

void unary(cudaStream_t s, int fn, const float* x, float* y, int64_t count) {
  switch (static_cast<elementwise::Unary>(fn)) {
#define TIERMEM_UNARY_LAUNCH(name, Function)                                                 \
  case elementwise::Unary::name:                                                             \
    unary_k<elementwise::Function><<<blocks_for(count), k_threads, 0, s>>>(x, y, count);     \
    return;
    TIERMEM_UNARY_FUNCTIONS(TIERMEM_UNARY_LAUNCH)
#undef TIERMEM_UNARY_LAUNCH
  }
}

void unary_grad(cudaStream_t s, int fn, const float* x, const float* dy, float* dx, int64_t count, bool accumulate) {
  switch (static_cast<elementwise::Unary>(fn)) {
#define TIERMEM_UNARY_GRAD_LAUNCH(name, Function)                                                                  \
  case elementwise::Unary::name:                                                                                   \
    unary_grad_k<elementwise::Function><<<blocks_for(count), k_threads, 0, s>>>(x, dy, dx, count, accumulate);     \
    return;
    TIERMEM_UNARY_FUNCTIONS(TIERMEM_UNARY_GRAD_LAUNCH)
#undef TIERMEM_UNARY_GRAD_LAUNCH
  }
}

void layer_norm(cudaStream_t s, const float* x, const float* gamma, const float* beta, float* y, float* mean,
                float* rstd, int64_t m, int64_t n, float epsilon) {
  layer_norm_k<<<warp_blocks(m), k_threads, 0, s>>>(x, gamma, beta, y, mean, rstd, m, n, epsilon);
}

void layer_norm_grad(cudaStream_t s, const float* x, const float* gamma, const float* mean, const float* rstd,
                     const float* dy, float* dx, float* dgamma, float* dbeta, int64_t m, int64_t n,
                     bool accumulate_dx, bool accumulate_params, float* scratch) {
  layer_norm_dx_k<<<warp_blocks(m), k_threads, 0, s>>>(x, gamma, mean, rstd, dy, dx, m, n, accumulate_dx);
  column_sums<true>(s, dy, x, mean, rstd, dbeta, dgamma, m, n, accumulate_params, scratch);
}

void mul(cudaStream_t s, const float* a, const float* b, float* y, int64_t count, bool accumulate) {
  mul_k<<<blocks_for(count), k_threads, 0, s>>>(a, b, y, count, accumulate);
}

void rms_norm(cudaStream_t s, const float* x, const float* w, float* y, float* rstd, int64_t m, int64_t n,
              float epsilon) {
  rms_norm_k<<<warp_blocks(m), k_threads, 0, s>>>(x, w, y, rstd, m, n, epsilon);
}

void rms_norm_grad(cudaStream_t s, const float* x, const float* w, const float* rstd, const float* dy, float* dx,
                   float* dw, int64_t m, int64_t n, bool accumulate_dx, bool accumulate_w, float* scratch) {
  rms_norm_dx_k<<<warp_blocks(m), k_threads, 0, s>>>(x, w, rstd, dy, dx, m, n, accumulate_dx);
  column_sums<true>(s, dy, x, nullptr, rstd, nullptr, dw, m, n, accumulate_w, scratch);
}

void rotary(cudaStream_t s, const float* x, float* y, int64_t m, int64_t cols, int64_t heads, int64_t dh, int64_t t,
            float theta, bool inverse, bool accumulate) {
  const int64_t per_row = heads * (dh / 2) + (cols - heads * dh);
  rotary_k<<<blocks_for(m * per_row), k_threads, 0, s>>>(x, y, m, cols, heads, dh, t, theta, inverse, accumulate);
}

void softmax_xent(cudaStream_t s, const float* logits, const int32_t* labels, float* loss, int64_t m, int64_t c,
                  float* row_loss, int32_t* row_right, double* stats, unsigned long long* hits) {
  softmax_xent_rows_k<<<warp_blocks(m), k_threads, 0, s>>>(logits, labels, m, c, row_loss, row_right);
  softmax_xent_total_k<<<1, k_threads, 0, s>>>(row_loss, row_right, m, loss, stats, hits);
}

void softmax_xent_grad(cudaStream_t s, const float* logits, const int32_t* labels, float* dlogits, int64_t m,
                       int64_t c, float scale, bool accumulate) {
  softmax_xent_grad_k<<<warp_blocks(m), k_threads, 0, s>>>(logits, labels, dlogits, m, c, scale, accumulate);
}

void sgd(cudaStream_t s, const float* param_in, float* param, const float* grad, const float* velocity_in,
         float* velocity, int64_t count, const OptimizerHyper& h, const int64_t* step, const float* grad_scale) {
  sgd_k<<<blocks_for(count), k_threads, 0, s>>>(param_in, param, grad, velocity_in, velocity, count, h, step,
                                                grad_scale);
}

void adam(cudaStream_t s, const float* param_in, float* param, const float* grad, const float* m_in, float* m,
          const float* v_in, float* v, int64_t count, const OptimizerHyper& h, const int64_t* step,
          const float* grad_scale) {
  adam_k<<<blocks_for(count), k_threads, 0, s>>>(param_in, param, grad, m_in, m, v_in, v, count, h, step,
                                                 grad_scale);
}

void dropout(cudaStream_t s, const float* x, float* y, int64_t count, float p, uint64_t seed, uint64_t salt,
             const int64_t* step, uint64_t draw, bool accumulate) {
  dropout_k<<<blocks_for(count), k_threads, 0, s>>>(x, y, count, p, seed, salt, step, draw, accumulate);
}

void clip_gradients(cudaStream_t s, const float* grads, int64_t count, float max_norm, double* partial,
                    float* grad_scale) {
  sum_squares_k<<<clip_partials, k_threads, 0, s>>>(grads, count, partial);
  clip_scale_k<<<1, k_threads, 0, s>>>(partial, max_norm, grad_scale);
}

}  // namespace tiermem::exec::cuda
