// CPU kernels (X12): GEMM through BLAS, element-wise loops vectorised by the
// compiler and spread over the cores with OpenMP. Row-major float32. Every
// kernel with an `accumulate` flag adds into its output instead of
// overwriting it. Deterministic: same inputs, same threads, same bits.
#pragma once

#include <cstdint>
#include <cstdlib>

#include "executor/elementwise_math.hpp"
#include "executor/optimizer_math.hpp"

namespace tiermem::exec::kernels {

// C[M,N] (+)= A[M,K] . B[K,N]
void matmul(const float* a, const float* b, float* c, int64_t m, int64_t k, int64_t n, bool accumulate);
// dA[M,K] (+)= dY[M,N] . B[K,N]^T
void matmul_grad_a(const float* dy, const float* b, float* da, int64_t m, int64_t k, int64_t n, bool accumulate);
// dB[K,N] (+)= A[M,K]^T . dY[M,N]
void matmul_grad_b(const float* a, const float* dy, float* db, int64_t m, int64_t k, int64_t n, bool accumulate);

void bias_add(const float* x, const float* bias, float* y, int64_t m, int64_t n);
void bias_grad(const float* dy, float* dbias, int64_t m, int64_t n, bool accumulate);
void pass_grad(const float* dy, float* dx, int64_t count, bool accumulate);
void add(const float* a, const float* b, float* y, int64_t count);
// y (+)= a * b, element-wise (MUL, and each of its gradients).
void mul(const float* a, const float* b, float* y, int64_t count, bool accumulate);
// Y[:, column : column + n] = X[M,n] for Y with `y_cols` columns (one input of a concat).
void copy_columns(const float* x, float* y, int64_t m, int64_t n, int64_t y_cols, int64_t column);
// dX[M,n] (+)= dY[:, column : column + n] for dY with `dy_cols` columns.
void slice_columns_grad(const float* dy, float* dx, int64_t m, int64_t n, int64_t dy_cols, int64_t column,
                        bool accumulate);
void relu(const float* x, float* y, int64_t count);
void relu_grad(const float* x, const float* dy, float* dx, int64_t count, bool accumulate);
// GELU, tanh approximation (PyTorch's approximate="tanh").
void gelu(const float* x, float* y, int64_t count);
void gelu_grad(const float* x, const float* dy, float* dx, int64_t count, bool accumulate);
// y = fn(x), dx (+)= dy * fn'(x): the functions of elementwise_math.hpp.
void unary(elementwise::Unary fn, const float* x, float* y, int64_t count);
void unary_grad(elementwise::Unary fn, const float* x, const float* dy, float* dx, int64_t count, bool accumulate);

inline constexpr float k_layer_norm_epsilon = 1e-5f;
void layer_norm(const float* x, const float* gamma, const float* beta, float* y, float* mean, float* rstd,
                int64_t m, int64_t n);
void layer_norm_grad(const float* x, const float* gamma, const float* mean, const float* rstd, const float* dy,
                     float* dx, float* dgamma, float* dbeta, int64_t m, int64_t n, bool accumulate_dx,
                     bool accumulate_params);

// RMS norm over rows of n: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + epsilon).
void rms_norm(const float* x, const float* w, float* y, float* rstd, int64_t m, int64_t n, float epsilon);
void rms_norm_grad(const float* x, const float* w, const float* rstd, const float* dy, float* dx, float* dw, int64_t m,
                   int64_t n, bool accumulate_dx, bool accumulate_w);

// Mean cross-entropy of softmax(logits) against labels; *correct gets the
// number of rows whose arg-max is the label.
float softmax_xent(const float* logits, const int32_t* labels, int64_t m, int64_t c, int64_t* correct);
// dL (+)= (softmax(L) - onehot(y)) * scale
void softmax_xent_grad(const float* logits, const int32_t* labels, float* dlogits, int64_t m, int64_t c,
                       float scale, bool accumulate);

// ---- sequences (kernels_seq.cpp): rows are tokens, `context` rows a sequence ----
// y[i] = table[ids[i]] (every id in [0, vocab): the caller checks).
void embedding(const int32_t* ids, const float* table, float* y, int64_t m, int64_t d);
// dtable (+)= sum over rows i with ids[i] = v of dy[i], for each row v of
// the table (`vocab` rows).
void embedding_grad(const int32_t* ids, const float* dy, float* dtable, int64_t m, int64_t d, int64_t vocab,
                    bool accumulate);
// y[i] = x[i] + table[i mod t]
void position_embedding(const float* x, const float* table, float* y, int64_t m, int64_t d, int64_t t);
// dtable[r] (+)= sum over rows i with i mod t = r of dy[i]
void position_embedding_grad(const float* dy, float* dtable, int64_t m, int64_t d, int64_t t, bool accumulate);
// Causal multi-head self-attention: qkv [m, d + 2 dkv] (queries, keys,
// values; dkv = d / heads x kv_heads), y [m, d], probs [m * heads, t] (row
// (s * heads + h) * t + i: the softmax of query i of sequence s, head h,
// over keys 0..i; zero past i). Query head h reads key/value head
// h / (heads / kv_heads).
// With p > 0 the probabilities weigh the values dropped out (the factors of
// `key`, dropout_math.hpp; index (s * heads + h) * t * t + i * t + j);
// `probs` keeps them as they were.
void attention(const float* qkv, float* y, float* probs, int64_t m, int64_t d, int64_t heads, int64_t kv_heads,
               int64_t t, float p, uint64_t key);
// dqkv (+)= the gradient of the above; `probs` is overwritten (its last use).
void attention_grad(const float* qkv, float* probs, const float* dy, float* dqkv, int64_t m, int64_t d,
                    int64_t heads, int64_t kv_heads, int64_t t, float p, uint64_t key, bool accumulate);
// Attention in tiles (a GPU with --precision bf16, no dropout:
// cuda/flash_attention.cuh): whether a head width has a kernel and its
// state fits in probs' room, and what it keeps per query row and head in
// place of the softmax (its log-sum-exp, O's dh floats, the gradient's
// row sum): a job that will run it saves [m * heads, dh + 2] there.
// TIERMEM_FLASH=0 turns it off (the batched GEMMs instead: a comparison),
// for the plan and the compute alike.
inline bool tiled_attention_fits(int64_t d, int64_t heads, int64_t t) {
  const char* off = std::getenv("TIERMEM_FLASH");
  if (off != nullptr && off[0] == '0' && off[1] == '\0') return false;
  if (heads <= 0 || d % heads != 0) return false;
  const int64_t dh = d / heads;
  return (dh == 16 || dh == 32 || dh == 64 || dh == 128) && t >= dh + 2;
}
inline int64_t tiled_attention_state(int64_t d, int64_t heads) { return d / heads + 2; }
// y (+)= x * dropout_factor(key, i, p) (p = 0: y (+)= x).
void dropout(const float* x, float* y, int64_t count, float p, uint64_t key, bool accumulate);
// The angle of pair c (of a head of width dh) at position p: p * theta^(-2c/dh),
// computed as PyTorch's rotary embeddings compute it (float32).
float rotary_angle(int64_t p, int64_t c, int64_t dh, float theta);
// Rotary positions: x and y [m, cols]; the first `heads` heads of width dh
// of each row have each pair (c, c + dh/2) turned by rotary_angle(row mod
// t, c) (back, for the gradient: `inverse`); the other columns are copied.
void rotary(const float* x, float* y, int64_t m, int64_t cols, int64_t heads, int64_t dh, int64_t t, float theta,
            bool inverse, bool accumulate);

// PyTorch's SGD (dampening 0), Adam and AdamW (optimizer_math.hpp), at step
// `step` (from 1: the schedule's learning rate, Adam's bias correction).
// Each reads the parameter and its state from the `*_in` arrays and writes
// the updated ones to `param`/`velocity`/`m`/`v`: the same arrays update in
// place, others leave the inputs as they were (the trainer's committed copy).
// Every gradient is read times `grad_scale` (clipping: clip_scale).
void sgd(const float* param_in, float* param, const float* grad, const float* velocity_in, float* velocity,
         int64_t count, const OptimizerHyper& h, int64_t step, float grad_scale);
void adam(const float* param_in, float* param, const float* grad, const float* m_in, float* m, const float* v_in,
          float* v, int64_t count, const OptimizerHyper& h, int64_t step, float grad_scale);
// The sum of the squares of x[0, count), in double, in a fixed order (the
// same bits whatever the threads).
double sum_squares(const float* x, int64_t count);

}  // namespace tiermem::exec::kernels
