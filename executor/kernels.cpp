#include "executor/kernels.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>
#include <bit>

#include "executor/optimizer_math.hpp"
#include "executor/host_adam.hpp"

namespace tiermem::exec::kernels {
namespace {

// Below this many elements a parallel loop costs more than it saves.
constexpr int64_t k_parallel = 1 << 15;

}  // namespace

void matmul(const float* a, const float* b, float* c, int64_t m, int64_t k, int64_t n, bool accumulate) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), 1.0f, a, static_cast<int>(k), b, static_cast<int>(n), accumulate ? 1.0f : 0.0f, c,
              static_cast<int>(n));
}

void matmul_grad_a(const float* dy, const float* b, float* da, int64_t m, int64_t k, int64_t n, bool accumulate) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(k), static_cast<int>(n),
              1.0f, dy, static_cast<int>(n), b, static_cast<int>(n), accumulate ? 1.0f : 0.0f, da, static_cast<int>(k));
}

void matmul_grad_b(const float* a, const float* dy, float* db, int64_t m, int64_t k, int64_t n, bool accumulate) {
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(k), static_cast<int>(n), static_cast<int>(m),
              1.0f, a, static_cast<int>(k), dy, static_cast<int>(n), accumulate ? 1.0f : 0.0f, db, static_cast<int>(n));
}

void bias_add(const float* x, const float* bias, float* y, int64_t m, int64_t n) {
#pragma omp parallel for if (m * n > k_parallel)
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j = 0; j < n; ++j) y[r * n + j] = x[r * n + j] + bias[j];
  }
}

void bias_grad(const float* dy, float* dbias, int64_t m, int64_t n, bool accumulate) {
  // Columns in parallel, rows in order: the sum order never changes.
#pragma omp parallel for if (m * n > k_parallel)
  for (int64_t j = 0; j < n; ++j) {
    float s = 0;
    for (int64_t r = 0; r < m; ++r) s += dy[r * n + j];
    dbias[j] = accumulate ? dbias[j] + s : s;
  }
}

void pass_grad(const float* dy, float* dx, int64_t count, bool accumulate) {
  if (!accumulate) {
    if (dx != dy) std::copy(dy, dy + count, dx);
    return;
  }
#pragma omp parallel for if (count > k_parallel)
  for (int64_t i = 0; i < count; ++i) dx[i] += dy[i];
}

void add(const float* a, const float* b, float* y, int64_t count) {
#pragma omp parallel for if (count > k_parallel)
  for (int64_t i = 0; i < count; ++i) y[i] = a[i] + b[i];
}

void copy_columns(const float* x, float* y, int64_t m, int64_t n, int64_t y_cols, int64_t column) {
#pragma omp parallel for if (m * n > k_parallel)
  for (int64_t r = 0; r < m; ++r) std::copy(x + r * n, x + (r + 1) * n, y + r * y_cols + column);
}

void slice_columns_grad(const float* dy, float* dx, int64_t m, int64_t n, int64_t dy_cols, int64_t column,
                        bool accumulate) {
#pragma omp parallel for if (m * n > k_parallel)
  for (int64_t r = 0; r < m; ++r) {
    const float* src = dy + r * dy_cols + column;
    float* dst = dx + r * n;
    for (int64_t j = 0; j < n; ++j) dst[j] = accumulate ? dst[j] + src[j] : src[j];
  }
}

void relu(const float* x, float* y, int64_t count) {
#pragma omp parallel for if (count > k_parallel)
  for (int64_t i = 0; i < count; ++i) y[i] = x[i] > 0 ? x[i] : 0.0f;
}

void relu_grad(const float* x, const float* dy, float* dx, int64_t count, bool accumulate) {
#pragma omp parallel for if (count > k_parallel)
  for (int64_t i = 0; i < count; ++i) {
    const float g = x[i] > 0 ? dy[i] : 0.0f;
    dx[i] = accumulate ? dx[i] + g : g;
  }
}

namespace {
constexpr float k_sqrt_2_over_pi = 0.7978845608028654f;
constexpr float k_gelu_c = 0.044715f;

// e^x for x <= 0, arithmetic alone (elementwise_math.hpp: shared with the
// element-wise family and the GPU).
using elementwise::exp_nonpositive;

// tanh u = sign(u) (1 - e) / (1 + e), e = e^-2|u|; |u| beyond 9 is 9 (tanh
// 9 is 1 to the float). Absolute error below 1.3e-7 over all floats (near
// 0, where 1 - e cancels, that is a large relative error, but GELU and its
// gradient only ever add tanh to 1); libm's is 2 ulp.
inline float tanh_arith(float u) {
  float a = std::fabs(u);
  a = a > 9.0f ? 9.0f : a;
  const float e = exp_nonpositive(-2.0f * a);
  return std::copysign((1.0f - e) / (1.0f + e), u);
}

}  // namespace

void gelu(const float* x, float* y, int64_t count) {
#pragma omp parallel for simd if (count > k_parallel)
  for (int64_t i = 0; i < count; ++i) {
    const float v = x[i];
    const float inner = k_sqrt_2_over_pi * (v + k_gelu_c * v * v * v);
    y[i] = 0.5f * v * (1.0f + tanh_arith(inner));
  }
}

namespace {
inline float gelu_derivative(float v) {
  const float inner = k_sqrt_2_over_pi * (v + k_gelu_c * v * v * v);
  const float t = tanh_arith(inner);
  return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * k_sqrt_2_over_pi * (1.0f + 3.0f * k_gelu_c * v * v);
}
}  // namespace

namespace {

// One loop per function (the switch stays out of it, so that it vectorises).
template <typename F>
void unary_loop(const float* x, float* y, int64_t count) {
#pragma omp parallel for simd if (count > k_parallel)
  for (int64_t i = 0; i < count; ++i) y[i] = F::value(x[i]);
}

template <typename F>
void unary_grad_loop(const float* x, const float* dy, float* dx, int64_t count, bool accumulate) {
  if (accumulate) {
#pragma omp parallel for simd if (count > k_parallel)
    for (int64_t i = 0; i < count; ++i) dx[i] += dy[i] * F::derivative(x[i]);
  } else {
#pragma omp parallel for simd if (count > k_parallel)
    for (int64_t i = 0; i < count; ++i) dx[i] = dy[i] * F::derivative(x[i]);
  }
}

}  // namespace

void unary(elementwise::Unary fn, const float* x, float* y, int64_t count) {
  switch (fn) {
#define TIERMEM_UNARY_CASE(name, Function)                     \
  case elementwise::Unary::name:                               \
    unary_loop<elementwise::Function>(x, y, count);            \
    return;
    TIERMEM_UNARY_FUNCTIONS(TIERMEM_UNARY_CASE)
#undef TIERMEM_UNARY_CASE
  }
}

void unary_grad(elementwise::Unary fn, const float* x, const float* dy, float* dx, int64_t count, bool accumulate) {
  switch (fn) {
#define TIERMEM_UNARY_GRAD_CASE(name, Function)                          \
  case elementwise::Unary::name:                                         \
    unary_grad_loop<elementwise::Function>(x, dy, dx, count, accumulate); \
    return;
    TIERMEM_UNARY_FUNCTIONS(TIERMEM_UNARY_GRAD_CASE)
#undef TIERMEM_UNARY_GRAD_CASE
  }
}

void gelu_grad(const float* x, const float* dy, float* dx, int64_t count, bool accumulate) {
  // Two loops, so that neither branches on `accumulate` (and both vectorise).
  if (accumulate) {
#pragma omp parallel for simd if (count > k_parallel)
    for (int64_t i = 0; i < count; ++i) dx[i] += dy[i] * gelu_derivative(x[i]);
  } else {
#pragma omp parallel for simd if (count > k_parallel)
    for (int64_t i = 0; i < count; ++i) dx[i] = dy[i] * gelu_derivative(x[i]);
  }
}

void mul(const float* a, const float* b, float* y, int64_t count, bool accumulate) {
  if (accumulate) {
#pragma omp parallel for simd if (count > k_parallel)
    for (int64_t i = 0; i < count; ++i) y[i] += a[i] * b[i];
  } else {
#pragma omp parallel for simd if (count > k_parallel)
    for (int64_t i = 0; i < count; ++i) y[i] = a[i] * b[i];
  }
}

void rms_norm(const float* x, const float* w, float* y, float* rstd, int64_t m, int64_t n, float epsilon) {
#pragma omp parallel for if (m * n > k_parallel)
  for (int64_t r = 0; r < m; ++r) {
    const float* row = x + r * n;
    float ms = 0;
    for (int64_t j = 0; j < n; ++j) ms += row[j] * row[j];
    const float rs = 1.0f / std::sqrt(ms / static_cast<float>(n) + epsilon);
    rstd[r] = rs;
    for (int64_t j = 0; j < n; ++j) y[r * n + j] = row[j] * rs * w[j];
  }
}

void rms_norm_grad(const float* x, const float* w, const float* rstd, const float* dy, float* dx, float* dw, int64_t m,
                   int64_t n, bool accumulate_dx, bool accumulate_w) {
  // xhat = x rstd, y = xhat w: dx = rstd (g - xhat mean(g xhat)), g = dy w.
#pragma omp parallel for if (m * n > k_parallel)
  for (int64_t r = 0; r < m; ++r) {
    const float* xr = x + r * n;
    const float* dyr = dy + r * n;
    float sum_gx = 0;
    for (int64_t j = 0; j < n; ++j) sum_gx += dyr[j] * w[j] * xr[j] * rstd[r];
    const float mean_gx = sum_gx / static_cast<float>(n);
    for (int64_t j = 0; j < n; ++j) {
      const float d = rstd[r] * (dyr[j] * w[j] - xr[j] * rstd[r] * mean_gx);
      dx[r * n + j] = accumulate_dx ? dx[r * n + j] + d : d;
    }
  }
#pragma omp parallel for if (m * n > k_parallel)
  for (int64_t j = 0; j < n; ++j) {
    float s = 0;
    for (int64_t r = 0; r < m; ++r) s += dy[r * n + j] * x[r * n + j] * rstd[r];
    dw[j] = accumulate_w ? dw[j] + s : s;
  }
}

void layer_norm(const float* x, const float* gamma, const float* beta, float* y, float* mean, float* rstd,
                int64_t m, int64_t n) {
#pragma omp parallel for if (m * n > k_parallel)
  for (int64_t r = 0; r < m; ++r) {
    const float* row = x + r * n;
    float mu = 0;
    for (int64_t j = 0; j < n; ++j) mu += row[j];
    mu /= static_cast<float>(n);
    float var = 0;
    for (int64_t j = 0; j < n; ++j) var += (row[j] - mu) * (row[j] - mu);
    var /= static_cast<float>(n);
    const float rs = 1.0f / std::sqrt(var + k_layer_norm_epsilon);
    mean[r] = mu;
    rstd[r] = rs;
    for (int64_t j = 0; j < n; ++j) y[r * n + j] = (row[j] - mu) * rs * gamma[j] + (beta != nullptr ? beta[j] : 0.0f);
  }
}

void layer_norm_grad(const float* x, const float* gamma, const float* mean, const float* rstd, const float* dy,
                     float* dx, float* dgamma, float* dbeta, int64_t m, int64_t n, bool accumulate_dx,
                     bool accumulate_params) {
#pragma omp parallel for if (m * n > k_parallel)
  for (int64_t r = 0; r < m; ++r) {
    const float* xr = x + r * n;
    const float* dyr = dy + r * n;
    float sum_g = 0, sum_gx = 0;  // sums of dxhat and dxhat * xhat over the row
    for (int64_t j = 0; j < n; ++j) {
      const float xhat = (xr[j] - mean[r]) * rstd[r];
      const float g = dyr[j] * gamma[j];
      sum_g += g;
      sum_gx += g * xhat;
    }
    const float inv_n = 1.0f / static_cast<float>(n);
    for (int64_t j = 0; j < n; ++j) {
      const float xhat = (xr[j] - mean[r]) * rstd[r];
      const float g = dyr[j] * gamma[j];
      const float d = rstd[r] * (g - inv_n * sum_g - xhat * inv_n * sum_gx);
      dx[r * n + j] = accumulate_dx ? dx[r * n + j] + d : d;
    }
  }
  // Parameter gradients: columns in parallel, rows in order.
#pragma omp parallel for if (m * n > k_parallel)
  for (int64_t j = 0; j < n; ++j) {
    float sg = 0, sb = 0;
    for (int64_t r = 0; r < m; ++r) {
      const float xhat = (x[r * n + j] - mean[r]) * rstd[r];
      sg += dy[r * n + j] * xhat;
      sb += dy[r * n + j];
    }
    dgamma[j] = accumulate_params ? dgamma[j] + sg : sg;
    if (dbeta != nullptr) dbeta[j] = accumulate_params ? dbeta[j] + sb : sb;
  }
}

namespace {

float row_max(const float* row, int64_t c) {
  float top = row[0];
#pragma omp simd reduction(max : top)
  for (int64_t j = 1; j < c; ++j) top = row[j] > top ? row[j] : top;
  return top;
}

// e^(row - max) into `out` and their sum (in vector lanes, then the lanes:
// a fixed order, so the same bits every run).
float row_exps(const float* row, int64_t c, float max, float* out) {
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < c; ++j) {
    out[j] = exp_nonpositive(row[j] - max);
    sum += out[j];
  }
  return sum;
}

}  // namespace

float softmax_xent(const float* logits, const int32_t* labels, int64_t m, int64_t c, int64_t* correct) {
  double total = 0;
  int64_t right = 0;
  std::vector<float> exps(static_cast<size_t>(c));
  for (int64_t r = 0; r < m; ++r) {
    const float* row = logits + r * c;
    // One pass for the arg-max (the hits) gives the max too.
    const float* top = std::max_element(row, row + c);
    const float sum = row_exps(row, c, *top, exps.data());
    total += static_cast<double>(std::log(sum) + *top - row[labels[r]]);
    right += (top - row) == labels[r];
  }
  if (correct != nullptr) *correct = right;
  return static_cast<float>(total / static_cast<double>(m));
}

void softmax_xent_grad(const float* logits, const int32_t* labels, float* dlogits, int64_t m, int64_t c,
                       float scale, bool accumulate) {
#pragma omp parallel if (m * c > k_parallel)
  {
    std::vector<float> exps(static_cast<size_t>(c));
#pragma omp for
    for (int64_t r = 0; r < m; ++r) {
      const float* row = logits + r * c;
      const float inv = scale / row_exps(row, c, row_max(row, c), exps.data());
      float* out = dlogits + r * c;
      if (accumulate) {
#pragma omp simd
        for (int64_t j = 0; j < c; ++j) out[j] += exps[static_cast<size_t>(j)] * inv;
      } else {
#pragma omp simd
        for (int64_t j = 0; j < c; ++j) out[j] = exps[static_cast<size_t>(j)] * inv;
      }
      out[labels[r]] -= scale;
    }
  }
}

void sgd(const float* param_in, float* param, const float* grad, const float* velocity_in, float* velocity,
         int64_t count, const OptimizerHyper& h, int64_t step, float grad_scale) {
  const float lr = learning_rate_at(h, step);
#pragma omp parallel for if (count > k_parallel)
  for (int64_t i = 0; i < count; ++i) {
    sgd_element(param_in[i], grad[i] * grad_scale, velocity_in[i], lr, h.momentum, h.weight_decay, &param[i],
                &velocity[i]);
  }
}

void adam(const float* param_in, float* param, const float* grad, const float* m_in, float* m, const float* v_in,
          float* v, int64_t count, const OptimizerHyper& h, int64_t step, float grad_scale) {
  // The host's vectorised loop (host_adam.hpp) in chunks of 64 Ki elements.
  const AdamArrays a{param_in, param, grad, m_in, m, v_in, v};
  const AdamStep s = adam_step(h, step, grad_scale);
  constexpr int64_t k_chunk = int64_t{1} << 16;
  const int64_t chunks = (count + k_chunk - 1) / k_chunk;
#pragma omp parallel for if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) adam_range(a, s, c * k_chunk, std::min(count, (c + 1) * k_chunk));
}

double sum_squares(const float* x, int64_t count) {
  // Chunks summed in parallel, then the chunks in order.
  constexpr int64_t k_chunk = int64_t{1} << 16;
  const int64_t chunks = (count + k_chunk - 1) / k_chunk;
  std::vector<double> partial(static_cast<size_t>(chunks));
#pragma omp parallel for if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    double s = 0;
    for (int64_t i = c * k_chunk; i < std::min(count, (c + 1) * k_chunk); ++i) s += static_cast<double>(x[i]) * x[i];
    partial[static_cast<size_t>(c)] = s;
  }
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace tiermem::exec::kernels
