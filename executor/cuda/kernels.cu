// The executor's GPU kernels (kernels.cuh): CUDA, and HIP from the same
// source (gpu_platform.cuh). Same arithmetic as the CPU kernels
// (executor/kernels.cpp) in float; sums over rows run per column in a fixed
// order, so a step gives the same bits every time.
#include "executor/cuda/kernels.cuh"
#include "executor/elementwise_math.hpp"
#include "executor/optimizer_math.hpp"

#include <algorithm>

#if defined(__HIPCC__)
#include <rocprim/device/device_radix_sort.hpp>
#else
#include <cub/device/device_radix_sort.cuh>
#endif

namespace tiermem::exec::cuda {
namespace {

constexpr int k_threads = 256;
constexpr float k_sqrt_2_over_pi = 0.7978845608028654f;
constexpr float k_gelu_c = 0.044715f;

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + k_threads - 1) / k_threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}

#define TIERMEM_FOR_EACH(i, n) \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

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
__global__ void column_partials_k(const float* dy, const float* x, const float* mean, const float* rstd,
                                  float* partial, float* partial_x, int64_t m, int64_t n) {
  __shared__ float part[8][33];
  __shared__ float part_x[8][33];
  const int64_t j = blockIdx.x * 32 + threadIdx.x;
  const int64_t first = blockIdx.y * k_sum_chunk, last = min(m, first + k_sum_chunk);
  float s = 0, sx = 0;
  if (j < n) {
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

template <bool k_layer_norm>
__global__ void column_totals_k(const float* partial, const float* partial_x, float* sum_dy, float* sum_dyx,
                                int64_t chunks, int64_t n, bool accumulate) {
  TIERMEM_FOR_EACH(j, n) {
    float total = 0, total_x = 0;
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
// (the same bits): lane l sums, in turn for w = 0 .. k_threads / 32 - 1, the
// columns l + 32 w, + k_threads, ... in order (thread l + 32 w's share),
// the butterfly over the lanes gives warp w's sum, and the warps' sums are
// added in order.
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
    for (int w = 0; w < k_threads / 32; ++w) {
      float s = 0;
      for (int64_t j = lane + 32 * w; j < n; j += k_threads) s += row[j];
      total += warp_total(s);
    }
    const float mu = total / static_cast<float>(n);
    total = 0;
    for (int w = 0; w < k_threads / 32; ++w) {
      float q = 0;
      for (int64_t j = lane + 32 * w; j < n; j += k_threads) q += (row[j] - mu) * (row[j] - mu);
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
    for (int k = 0; k < k_threads / 32; ++k) {
      float q = 0;
      for (int64_t j = lane + 32 * k; j < n; j += k_threads) q += row[j] * row[j];
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
    for (int k = 0; k < k_threads / 32; ++k) {
      float sgx = 0;
      for (int64_t j = lane + 32 * k; j < n; j += k_threads) sgx += dyr[j] * w[j] * xr[j] * rstd[r];
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
    for (int k = 0; k < k_threads / 32; ++k) {
      float sg = 0, sgx = 0;
      for (int64_t j = lane + 32 * k; j < n; j += k_threads) {
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

// One warp per row: max (first arg-max), sum of exponentials.
struct RowSoftmax {
  float max;
  int arg;
  float sum;
};

__device__ RowSoftmax row_softmax(const float* row, int64_t c) {
  const int lane = threadIdx.x % 32;
  float max = -INFINITY;
  int arg = 0x7fffffff;
  for (int64_t j = lane; j < c; j += 32) {
    if (row[j] > max) max = row[j], arg = static_cast<int>(j);
  }
  for (int o = 16; o > 0; o /= 2) {
    const float om = TIERMEM_SHFL_XOR(max, o);
    const int oa = TIERMEM_SHFL_XOR(arg, o);
    if (om > max || (om == max && oa < arg)) max = om, arg = oa;
  }
  float sum = 0;
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

__global__ void softmax_xent_grad_k(const float* logits, const int32_t* labels, float* dlogits, int64_t m, int64_t c,
                                    float scale, bool accumulate) {
  const int64_t r = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  if (r >= m) return;
  const float* row = logits + r * c;
  const RowSoftmax s = row_softmax(row, c);
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

// ---- sequences --------------------------------------------------------------
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
