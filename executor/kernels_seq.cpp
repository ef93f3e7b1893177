// Kernels of sequence models (a GPT): embeddings and causal self-attention,
// on the CPU. The attention runs per sequence and head with OpenBLAS GEMMs
// on strided views of qkv (no copies of q, k, v).
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "executor/dropout_math.hpp"
#include "executor/kernels.hpp"

namespace tiermem::exec::kernels {
namespace {

int i32(int64_t v) { return static_cast<int>(v); }

}  // namespace

void embedding(const int32_t* ids, const float* table, float* y, int64_t m, int64_t d) {
  for (int64_t i = 0; i < m; ++i) std::memcpy(y + i * d, table + static_cast<int64_t>(ids[i]) * d, sizeof(float) * d);
}

void embedding_grad(const int32_t* ids, const float* dy, float* dtable, int64_t m, int64_t d, int64_t vocab,
                    bool accumulate) {
  if (!accumulate) std::fill(dtable, dtable + vocab * d, 0.0f);
  // Rows in order: the sums are the same bits on every run.
  for (int64_t i = 0; i < m; ++i) {
    float* out = dtable + static_cast<int64_t>(ids[i]) * d;
    const float* in = dy + i * d;
    for (int64_t c = 0; c < d; ++c) out[c] += in[c];
  }
}

void position_embedding(const float* x, const float* table, float* y, int64_t m, int64_t d, int64_t t) {
  for (int64_t i = 0; i < m; ++i) {
    const float* p = table + (i % t) * d;
    for (int64_t c = 0; c < d; ++c) y[i * d + c] = x[i * d + c] + p[c];
  }
}

void position_embedding_grad(const float* dy, float* dtable, int64_t m, int64_t d, int64_t t, bool accumulate) {
  if (!accumulate) std::fill(dtable, dtable + t * d, 0.0f);
  for (int64_t i = 0; i < m; ++i) {
    float* out = dtable + (i % t) * d;
    for (int64_t c = 0; c < d; ++c) out[c] += dy[i * d + c];
  }
}

namespace {

// The probabilities of one sequence and head dropped out into `out` (t x t).
void dropped(const float* p, float* out, int64_t t, float prob, uint64_t key, uint64_t first) {
  for (int64_t i = 0; i < t * t; ++i) out[i] = p[i] * dropout_factor(key, first + static_cast<uint64_t>(i), prob);
}

}  // namespace

void dropout(const float* x, float* y, int64_t count, float p, uint64_t key, bool accumulate) {
  if (p == 0) {
    for (int64_t i = 0; i < count; ++i) y[i] = accumulate ? y[i] + x[i] : x[i];
    return;
  }
#pragma omp parallel for if (count > (int64_t{1} << 16))
  for (int64_t i = 0; i < count; ++i) {
    const float v = x[i] * dropout_factor(key, static_cast<uint64_t>(i), p);
    y[i] = accumulate ? y[i] + v : v;
  }
}

void attention(const float* qkv, float* y, float* probs, int64_t m, int64_t d, int64_t heads, int64_t kv_heads,
               int64_t t, float prob, uint64_t key) {
  const int64_t dh = d / heads, group = heads / kv_heads, dkv = dh * kv_heads, ld = d + 2 * dkv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  std::vector<float> kept(prob > 0 ? static_cast<size_t>(t * t) : 0);
  for (int64_t s = 0; s < m / t; ++s) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* q = qkv + s * t * ld + h * dh;
      const float* k = qkv + s * t * ld + d + (h / group) * dh;
      const float* v = k + dkv;
      float* p = probs + (s * heads + h) * t * t;
      // Scores q k^T (the masked half too: one GEMM), then each row's
      // softmax over keys 0..i.
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, i32(t), i32(t), i32(dh), scale, q, i32(ld), k, i32(ld),
                  0.0f, p, i32(t));
      for (int64_t i = 0; i < t; ++i) {
        float* row = p + i * t;
        float top = row[0];
        for (int64_t j = 1; j <= i; ++j) top = std::max(top, row[j]);
        float sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          row[j] = std::exp(row[j] - top);
          sum += row[j];
        }
        const float inv = 1.0f / sum;
        for (int64_t j = 0; j <= i; ++j) row[j] *= inv;
        std::fill(row + i + 1, row + t, 0.0f);
      }
      const float* weights = p;
      if (prob > 0) {
        dropped(p, kept.data(), t, prob, key, static_cast<uint64_t>((s * heads + h) * t * t));
        weights = kept.data();
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, i32(t), i32(dh), i32(t), 1.0f, weights, i32(t), v,
                  i32(ld), 0.0f, y + s * t * d + h * dh, i32(d));
    }
  }
}

void attention_grad(const float* qkv, float* probs, const float* dy, float* dqkv, int64_t m, int64_t d,
                    int64_t heads, int64_t kv_heads, int64_t t, float prob, uint64_t key, bool accumulate) {
  const int64_t dh = d / heads, group = heads / kv_heads, dkv = dh * kv_heads, ld = d + 2 * dkv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  std::vector<float> dp(static_cast<size_t>(t * t));
  std::vector<float> kept(prob > 0 ? static_cast<size_t>(t * t) : 0);
  for (int64_t s = 0; s < m / t; ++s) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* q = qkv + s * t * ld + h * dh;
      const float* k = qkv + s * t * ld + d + (h / group) * dh;
      const float* v = k + dkv;
      const float* g = dy + s * t * d + h * dh;
      float* dq = dqkv + s * t * ld + h * dh;
      float* dk = dqkv + s * t * ld + d + (h / group) * dh;
      float* dv = dk + dkv;
      // The heads of a group add into their key and value head's gradient.
      const float beta = accumulate ? 1.0f : 0.0f;
      const float beta_kv = accumulate || h % group != 0 ? 1.0f : 0.0f;
      float* p = probs + (s * heads + h) * t * t;
      // dV = P'^T dY, P' the probabilities as dropped out; dP = dY V^T,
      // times the same factors.
      const uint64_t first = static_cast<uint64_t>((s * heads + h) * t * t);
      const float* weights = p;
      if (prob > 0) {
        dropped(p, kept.data(), t, prob, key, first);
        weights = kept.data();
      }
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, i32(t), i32(dh), i32(t), 1.0f, weights, i32(t), g, i32(d),
                  beta_kv, dv, i32(ld));
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, i32(t), i32(t), i32(dh), 1.0f, g, i32(d), v, i32(ld), 0.0f,
                  dp.data(), i32(t));
      if (prob > 0) dropped(dp.data(), dp.data(), t, prob, key, first);
      // dS = P * (dP - rowsum(P * dP)), into P's place (zero past i, as P).
      for (int64_t i = 0; i < t; ++i) {
        float* row = p + i * t;
        const float* drow = dp.data() + i * t;
        float dot = 0;
        for (int64_t j = 0; j <= i; ++j) dot += row[j] * drow[j];
        for (int64_t j = 0; j <= i; ++j) row[j] *= drow[j] - dot;
      }
      // dQ = dS K * scale; dK = dS^T Q * scale
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, i32(t), i32(dh), i32(t), scale, p, i32(t), k, i32(ld),
                  beta, dq, i32(ld));
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, i32(t), i32(dh), i32(t), scale, p, i32(t), q, i32(ld),
                  beta_kv, dk, i32(ld));
    }
  }
}

float rotary_angle(int64_t p, int64_t c, int64_t dh, float theta) {
  const float inv = 1.0f / std::pow(theta, static_cast<float>(2 * c) / static_cast<float>(dh));
  return static_cast<float>(p) * inv;
}

void rotary(const float* x, float* y, int64_t m, int64_t cols, int64_t heads, int64_t dh, int64_t t, float theta,
            bool inverse, bool accumulate) {
  const int64_t half = dh / 2, rotated = heads * dh;
  std::vector<float> cosines(static_cast<size_t>(t * half)), sines(cosines.size());
  for (int64_t p = 0; p < t; ++p) {
    for (int64_t c = 0; c < half; ++c) {
      const float a = rotary_angle(p, c, dh, theta);
      cosines[static_cast<size_t>(p * half + c)] = std::cos(a);
      sines[static_cast<size_t>(p * half + c)] = inverse ? -std::sin(a) : std::sin(a);
    }
  }
#pragma omp parallel for if (m * cols > (int64_t{1} << 15))
  for (int64_t r = 0; r < m; ++r) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    const float* cs = cosines.data() + (r % t) * half;
    const float* sn = sines.data() + (r % t) * half;
    for (int64_t h = 0; h < heads; ++h) {
      const float* a = xr + h * dh;
      float* b = yr + h * dh;
      for (int64_t c = 0; c < half; ++c) {
        const float lo = a[c] * cs[c] - a[c + half] * sn[c];
        const float hi = a[c + half] * cs[c] + a[c] * sn[c];
        b[c] = accumulate ? b[c] + lo : lo;
        b[c + half] = accumulate ? b[c + half] + hi : hi;
      }
    }
    for (int64_t c = rotated; c < cols; ++c) yr[c] = accumulate ? yr[c] + xr[c] : xr[c];
  }
}

}  // namespace tiermem::exec::kernels
