// The executor's own CUDA kernels (everything but the GEMMs, which are
// cuBLAS's): the contract of executor/kernels.hpp on device memory, queued
// on `stream`. Row-major float32; `accumulate` adds into the output.
// Included by nvcc (kernels.cu) and by the host compiler (cuda_compute.cpp),
// and by hipcc for the HIP build check (gpu_platform.cuh).
#pragma once

#include "executor/cuda/gpu_platform.cuh"
#include "executor/dropout_math.hpp"
#include "executor/optimizer_math.hpp"

#include <cstdint>

namespace tiermem::exec::cuda {

void bias_add(cudaStream_t s, const float* x, const float* bias, float* y, int64_t m, int64_t n);
// Column sums (bias_grad, layer_norm_grad's dgamma/dbeta) run in two passes
// through `scratch`: column_sums_scratch(m, n) floats of device memory.
int64_t column_sums_scratch(int64_t m, int64_t n);
void bias_grad(cudaStream_t s, const float* dy, float* dbias, int64_t m, int64_t n, bool accumulate, float* scratch);
void accumulate(cudaStream_t s, const float* dy, float* dx, int64_t count);  // dx += dy
// y = x rounded to bf16 (nearest even), as its 16 bits: the GEMMs' operands
// with --precision bf16.
void to_bf16(cudaStream_t s, const float* x, uint16_t* y, int64_t count);
void add(cudaStream_t s, const float* a, const float* b, float* y, int64_t count);
void copy_columns(cudaStream_t s, const float* x, float* y, int64_t m, int64_t n, int64_t y_cols, int64_t column);
void slice_columns_grad(cudaStream_t s, const float* dy, float* dx, int64_t m, int64_t n, int64_t dy_cols,
                        int64_t column, bool accumulate);
void relu(cudaStream_t s, const float* x, float* y, int64_t count);
void relu_grad(cudaStream_t s, const float* x, const float* dy, float* dx, int64_t count, bool accumulate);
void gelu(cudaStream_t s, const float* x, float* y, int64_t count);
void gelu_grad(cudaStream_t s, const float* x, const float* dy, float* dx, int64_t count, bool accumulate);
// y = fn(x), dx (+)= dy * fn'(x) for fn an elementwise::Unary (its number:
// this header stays free of the executor's).
void unary(cudaStream_t s, int fn, const float* x, float* y, int64_t count);
void unary_grad(cudaStream_t s, int fn, const float* x, const float* dy, float* dx, int64_t count, bool accumulate);
void mul(cudaStream_t s, const float* a, const float* b, float* y, int64_t count, bool accumulate);
void rms_norm(cudaStream_t s, const float* x, const float* w, float* y, float* rstd, int64_t m, int64_t n,
              float epsilon);
// dw through `scratch` (column_sums_scratch(m, n) floats).
void rms_norm_grad(cudaStream_t s, const float* x, const float* w, const float* rstd, const float* dy, float* dx,
                   float* dw, int64_t m, int64_t n, bool accumulate_dx, bool accumulate_w, float* scratch);
// kernels::rotary's contract.
void rotary(cudaStream_t s, const float* x, float* y, int64_t m, int64_t cols, int64_t heads, int64_t dh, int64_t t,
            float theta, bool inverse, bool accumulate);
// beta and dbeta may be null (no bias).
void layer_norm(cudaStream_t s, const float* x, const float* gamma, const float* beta, float* y, float* mean,
                float* rstd, int64_t m, int64_t n, float epsilon);
void layer_norm_grad(cudaStream_t s, const float* x, const float* gamma, const float* mean, const float* rstd,
                     const float* dy, float* dx, float* dgamma, float* dbeta, int64_t m, int64_t n,
                     bool accumulate_dx, bool accumulate_params, float* scratch);
// Per-row losses and hits into row_loss/row_right (m each, scratch), then
// *loss = their mean, stats[0] += the mean, *hits += the hits.
void softmax_xent(cudaStream_t s, const float* logits, const int32_t* labels, float* loss, int64_t m, int64_t c,
                  float* row_loss, int32_t* row_right, double* stats, unsigned long long* hits);
void softmax_xent_grad(cudaStream_t s, const float* logits, const int32_t* labels, float* dlogits, int64_t m,
                       int64_t c, float scale, bool accumulate);
// Out of place (the `*_in` arrays read, the others written) or in place, as
// kernels::sgd/adam; `step` and `grad_scale`: device memory, read when the
// kernel runs (the schedule's learning rate and Adam's bias correction; the
// gradients' scale where h.max_grad_norm > 0).
void sgd(cudaStream_t s, const float* param_in, float* param, const float* grad, const float* velocity_in,
         float* velocity, int64_t count, const OptimizerHyper& h, const int64_t* step, const float* grad_scale);
void adam(cudaStream_t s, const float* param_in, float* param, const float* grad, const float* m_in, float* m,
          const float* v_in, float* v, int64_t count, const OptimizerHyper& h, const int64_t* step,
          const float* grad_scale);
// *grad_scale = clip_scale(max_norm, the sum of the squares of grads[0,
// count)), in two passes through `partial` (clip_partials doubles): a fixed
// order, the same bits every run.
constexpr int clip_partials = 512;
// y (+)= x * dropout_factor(dropout_key(seed, salt, *step, draw), i, p)
// (x may be y); p = 0: y (+)= x.
void dropout(cudaStream_t s, const float* x, float* y, int64_t count, float p, uint64_t seed, uint64_t salt,
             const int64_t* step, uint64_t draw, bool accumulate);
void clip_gradients(cudaStream_t s, const float* grads, int64_t count, float max_norm, double* partial,
                    float* grad_scale);

// Sequences (kernels::embedding ... position_embedding_grad, same contracts;
// the attention is cuda_compute.cpp's, batched GEMMs around the kernels below).
// embedding_grad sums each table row's tokens in row order (no atomics: the
// same bits every run), the tokens sorted by id through `scratch`:
// embedding_grad_scratch(m) int32 words of device memory (256-byte aligned);
// false: the sort failed.
void embedding(cudaStream_t s, const int32_t* ids, const float* table, float* y, int64_t m, int64_t d);
int64_t embedding_grad_scratch(int64_t m);
bool embedding_grad(cudaStream_t s, const int32_t* ids, const float* dy, float* dtable, int64_t m, int64_t d,
                    int64_t vocab, bool accumulate, int32_t* scratch);
void position_embedding(cudaStream_t s, const float* x, const float* table, float* y, int64_t m, int64_t d,
                        int64_t t);
void position_embedding_grad(cudaStream_t s, const float* dy, float* dtable, int64_t m, int64_t d, int64_t t,
                             bool accumulate);
// Attention's pieces around cuBLAS's batched GEMMs (cuda_compute.cpp): heads
// of a [m, ld] tensor (columns col0 + h d/heads ...) to a packed
// [sequences x heads, t, d/heads] one and back (adding when accumulate;
// with `group` > 1, packed head h reads column head h / group, and the
// scatter sums each group of packed heads into their column head:
// grouped-query attention's keys and values);
// a causal softmax of rows of t scores in place (row r is query r % t), and
// its gradient dS = P (dP - rowsum(P dP)) into P's place.
void heads_gather(cudaStream_t s, const float* x, int64_t ld, int64_t col0, float* packed, int64_t m, int64_t d,
                  int64_t heads, int64_t t, int64_t group = 1);
void heads_scatter(cudaStream_t s, const float* packed, float* x, int64_t ld, int64_t col0, int64_t m, int64_t d,
                   int64_t heads, int64_t t, bool accumulate, int64_t group = 1);
void causal_softmax(cudaStream_t s, float* p, int64_t rows, int64_t t);
void causal_softmax_grad(cudaStream_t s, float* p, const float* dp, int64_t rows, int64_t t);

}  // namespace tiermem::exec::cuda
