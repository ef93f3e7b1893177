// Kernels of sequence models (a GPT): embeddings and causal self-attention,
// on the CPU. The attention runs per sequence and head with OpenBLAS GEMMs
// on strided views of qkv (no copies of q, k, v).
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

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

void attention(const float* qkv, float* y, float* probs, int64_t m, int64_t d, int64_t heads, int64_t t) {
  const int64_t dh = d / heads, ld = 3 * d;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  for (int64_t s = 0; s < m / t; ++s) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* q = qkv + s * t * ld + h * dh;
      const float* k = q + d;
      const float* v = q + 2 * d;
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
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, i32(t), i32(dh), i32(t), 1.0f, p, i32(t), v, i32(ld),
                  0.0f, y + s * t * d + h * dh, i32(d));
    }
  }
}

void attention_grad(const float* qkv, float* probs, const float* dy, float* dqkv, int64_t m, int64_t d,
                    int64_t heads, int64_t t, bool accumulate) {
  const int64_t dh = d / heads, ld = 3 * d;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  const float beta = accumulate ? 1.0f : 0.0f;
  std::vector<float> dp(static_cast<size_t>(t * t));
  for (int64_t s = 0; s < m / t; ++s) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* q = qkv + s * t * ld + h * dh;
      const float* k = q + d;
      const float* v = q + 2 * d;
      const float* g = dy + s * t * d + h * dh;
      float* dq = dqkv + s * t * ld + h * dh;
      float* dk = dq + d;
      float* dv = dq + 2 * d;
      float* p = probs + (s * heads + h) * t * t;
      // dV = P^T dY; dP = dY V^T
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, i32(t), i32(dh), i32(t), 1.0f, p, i32(t), g, i32(d), beta,
                  dv, i32(ld));
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, i32(t), i32(t), i32(dh), 1.0f, g, i32(d), v, i32(ld), 0.0f,
                  dp.data(), i32(t));
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
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, i32(t), i32(dh), i32(t), scale, p, i32(t), q, i32(ld), beta,
                  dk, i32(ld));
    }
  }
}

}  // namespace tiermem::exec::kernels
