// The CUDA compute (compute.hpp), the plugin libtiermem-exec-cuda.so: GEMMs
// on cuBLAS (fp32, no TF32), the other ops as the kernels of kernels.cu, all
// on one stream of its own; capture and replay as CUDA graphs. The step Adam
// reads is a device word that set_step fills before the step (a replay too),
// so one captured update serves every step; the loss statistics are device
// words read back by take_stats.
#include <cublas_v2.h>

#include <cmath>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <algorithm>
#include <vector>

#include "executor/compute.hpp"
#include "executor/cuda/flash_attention.cuh"
#include "executor/cuda/kernels.cuh"
#include "executor/cuda/nccl_collective.hpp"
#include "executor/kernels.hpp"

namespace tiermem::exec {
namespace {

namespace kc = tiermem::exec::cuda;

class CudaCompute final : public Compute {
 public:
  ~CudaCompute() override {
    if (m_stream != nullptr) cudaStreamSynchronize(m_stream);
    if (m_side != nullptr) {
      cudaStreamSynchronize(m_side);
      for (cudaEvent_t e : m_side_events) cudaEventDestroy(e);
      cudaStreamDestroy(m_side);
    }
    for (auto& [slot, exec] : m_graphs) cudaGraphExecDestroy(exec);
    if (m_blas != nullptr) cublasDestroy(m_blas);
    for (void* p : m_device) cudaFree(p);
    for (void* p : m_host) cudaFreeHost(p);
    for (void* p : m_registered) cudaHostUnregister(p);
    if (m_stream != nullptr) cudaStreamDestroy(m_stream);
  }

  // Empty on success, else what failed.
  std::string open(int ordinal) {
    int count = 0;
    if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
      return std::string("no CUDA device usable: ") + cudaGetErrorString(e);
    }
    if (ordinal >= count) return "no CUDA device " + std::to_string(ordinal) + " (" + std::to_string(count) + " visible)";
    m_ordinal = ordinal;
    cudaDeviceProp prop{};
    if (cudaSetDevice(ordinal) != cudaSuccess || cudaGetDeviceProperties(&prop, ordinal) != cudaSuccess) {
      return "cannot use CUDA device " + std::to_string(ordinal) + ": " + cudaGetErrorString(cudaGetLastError());
    }
    m_name = "cuda:" + std::to_string(ordinal) + " (" + prop.name + ")";
    m_uuid = "GPU-";
    for (int i = 0; i < 16; ++i) {
      char hex[3];
      std::snprintf(hex, sizeof hex, "%02x", static_cast<unsigned char>(prop.uuid.bytes[i]));
      m_uuid += hex;
    }
    if (cudaError_t e = cudaStreamCreateWithFlags(&m_stream, cudaStreamNonBlocking); e != cudaSuccess) {
      return std::string("cudaStreamCreate: ") + cudaGetErrorString(e);
    }
    if (cublasStatus_t b = cublasCreate(&m_blas); b != CUBLAS_STATUS_SUCCESS) {
      m_blas = nullptr;
      return std::string("cublasCreate: ") + cublasGetStatusString(b);
    }
    // A workspace of our own: cuBLAS then allocates nothing while a step is
    // captured. Default math: fp32 GEMMs without TF32.
    void* workspace = device_buffer(k_workspace);
    if (workspace == nullptr || cublasSetStream(m_blas, m_stream) != CUBLAS_STATUS_SUCCESS ||
        cublasSetWorkspace(m_blas, workspace, k_workspace) != CUBLAS_STATUS_SUCCESS ||
        cublasSetMathMode(m_blas, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS) {
      return "cannot set up cuBLAS on " + m_name;
    }
    m_stats = static_cast<double*>(device_buffer(64));
    m_step_host = static_cast<int64_t*>(host_buffer(sizeof(int64_t)));
    m_step_device = static_cast<int64_t*>(device_buffer(sizeof(int64_t)));
    m_stats_host = static_cast<double*>(host_buffer(64));
    m_clip_partials = static_cast<double*>(device_buffer(sizeof(double) * kc::clip_partials));
    m_grad_scale = static_cast<float*>(device_buffer(sizeof(float)));
    if (m_stats == nullptr || m_step_host == nullptr || m_step_device == nullptr || m_stats_host == nullptr ||
        m_clip_partials == nullptr || m_grad_scale == nullptr) {
      return "out of memory on " + m_name;
    }
    set_step(1);
    reset_stats();
    if (Status s = sync(); !s.ok()) return s.to_string();
    return std::string();
  }

  std::string name() const override { return m_name; }
  bool memory_is_device() const override { return true; }
  int device() const override { return m_ordinal; }
  std::string device_uuid() const override { return m_uuid; }

  // Row-major C = A.B is column-major C^T = B^T.A^T: the operands swap.
  void matmul(const float* a, const float* b, float* c, int64_t m, int64_t k, int64_t n, bool acc) override {
    gemm(CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, b, n, a, k, c, n, acc);
  }
  void matmul_grad_a(const float* dy, const float* b, float* da, int64_t m, int64_t k, int64_t n, bool acc) override {
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, k, m, n, b, n, dy, n, da, k, acc);
  }
  void matmul_grad_b(const float* a, const float* dy, float* db, int64_t m, int64_t k, int64_t n, bool acc) override {
    gemm(CUBLAS_OP_N, CUBLAS_OP_T, n, k, m, dy, n, a, k, db, n, acc);
  }
  void bias_add(const float* x, const float* bias, float* y, int64_t m, int64_t n) override {
    kc::bias_add(m_stream, x, bias, y, m, n);
  }
  void bias_grad(const float* dy, float* dbias, int64_t m, int64_t n, bool acc) override {
    float* scratch = grown(&m_sums, &m_sums_room, kc::column_sums_scratch(m, n), "column sums");
    if (scratch != nullptr) kc::bias_grad(m_stream, dy, dbias, m, n, acc, scratch);
  }
  void pass_grad(const float* dy, float* dx, int64_t count, bool acc) override {
    if (acc) {
      kc::accumulate(m_stream, dy, dx, count);
    } else if (dx != dy) {
      check(cudaMemcpyAsync(dx, dy, static_cast<size_t>(count) * 4, cudaMemcpyDeviceToDevice, m_stream), "copy");
    }
  }
  void add(const float* a, const float* b, float* y, int64_t count) override { kc::add(m_stream, a, b, y, count); }
  void copy_columns(const float* x, float* y, int64_t m, int64_t n, int64_t y_cols, int64_t column) override {
    kc::copy_columns(m_stream, x, y, m, n, y_cols, column);
  }
  void slice_columns_grad(const float* dy, float* dx, int64_t m, int64_t n, int64_t dy_cols, int64_t column,
                          bool acc) override {
    kc::slice_columns_grad(m_stream, dy, dx, m, n, dy_cols, column, acc);
  }
  void embedding(const int32_t* ids, const float* table, float* y, int64_t m, int64_t d) override {
    kc::embedding(m_stream, ids, table, y, m, d);
  }
  void embedding_grad(const int32_t* ids, const float* dy, float* dtable, int64_t m, int64_t d, int64_t vocab,
                      bool acc) override {
    float* scratch = grown(&m_embedding_sort, &m_embedding_sort_room, kc::embedding_grad_scratch(m), "the ids' sort");
    if (scratch != nullptr &&
        !kc::embedding_grad(m_stream, ids, dy, dtable, m, d, vocab, acc, reinterpret_cast<int32_t*>(scratch))) {
      fail("the embedding gradient's sort of the ids failed");
    }
  }
  void position_embedding(const float* x, const float* table, float* y, int64_t m, int64_t d, int64_t t) override {
    kc::position_embedding(m_stream, x, table, y, m, d, t);
  }
  void position_embedding_grad(const float* dy, float* dtable, int64_t m, int64_t d, int64_t t, bool acc) override {
    kc::position_embedding_grad(m_stream, dy, dtable, m, d, t, acc);
  }
  // With --precision bf16 and no dropout (kernels::tiled_attention_fits),
  // attention in tiles on tensor cores
  // (flash_attention.cuh: probs holds its saved state, not the softmax);
  // the forward pass and its gradient decide alike, and the plan sized
  // probs for it (job_plan.cpp).
  bool flash(float p, int64_t d, int64_t heads, int64_t t) const {
    return m_precision == Precision::bf16 && p == 0 && kernels::tiled_attention_fits(d, heads, t);
  }
  // Attention as GEMMs batched over (sequence, head) on q, k and v packed
  // per head ([b, t, dh]): S = scale Q K^T into probs (the masked half
  // too), the causal softmax in place, O = P V, O to y.
  // With dropout, P' (P dropped out) in the dP scratch weighs V; P stays.
  void attention(const float* qkv, float* y, float* probs, int64_t m, int64_t d, int64_t heads, int64_t kv_heads,
                 int64_t t, float p, uint64_t salt) override {
    p = dropout_p(p);
    if (flash(p, d, heads, t)) {
      uint16_t* scratch = flash_scratch(m, d, heads, kv_heads);
      if (scratch == nullptr) return;
      kc::flash_attention(m_stream, qkv, y, probs, m, d, heads, kv_heads, t,
                          1.0f / std::sqrt(static_cast<float>(d / heads)), scratch);
      return;
    }
    const int64_t batch = m / t * heads, dh = d / heads;
    float* q = attention_scratch(m * d, 5);
    float* kept = q == nullptr || p == 0 ? probs : attention_probs_scratch(batch * t * t);
    if (q == nullptr || kept == nullptr) return;
    float *k = q + m * d, *v = k + m * d, *o = v + m * d;
    pack_qkv(qkv, q, k, v, m, d, heads, kv_heads, t);
    const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
    batched(false, true, t, t, dh, scale, q, dh, t * dh, k, dh, t * dh, probs, t, t * t, batch, false);
    kc::causal_softmax(m_stream, probs, batch * t, t);
    if (p > 0) drop(probs, kept, batch * t * t, p, salt);
    batched(false, false, t, dh, t, 1.0f, kept, t, t * t, v, dh, t * dh, o, dh, t * dh, batch, false);
    kc::heads_scatter(m_stream, o, y, d, 0, m, d, heads, t, false);
  }
  // dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(P dP)) into probs' place,
  // dQ = scale dS K, dK = scale dS^T Q; each to its columns of dqkv.
  // With dropout: dV = P'^T dO (P' drawn again into the dP scratch), and dP
  // times the same factors before the softmax's gradient.
  void attention_grad(const float* qkv, float* probs, const float* dy, float* dqkv, int64_t m, int64_t d,
                      int64_t heads, int64_t kv_heads, int64_t t, float p, uint64_t salt, bool acc) override {
    p = dropout_p(p);
    if (flash(p, d, heads, t)) {
      uint16_t* scratch = flash_scratch(m, d, heads, kv_heads);
      if (scratch == nullptr) return;
      kc::flash_attention_grad(m_stream, qkv, probs, dy, dqkv, m, d, heads, kv_heads, t,
                               1.0f / std::sqrt(static_cast<float>(d / heads)), acc, scratch);
      return;
    }
    const int64_t batch = m / t * heads, dh = d / heads, n = m * d;
    const int64_t group = heads / kv_heads, dkv = dh * kv_heads, ld = d + 2 * dkv;
    float* q = attention_scratch(n, 5);
    float* dp = q == nullptr ? nullptr : attention_probs_scratch(batch * t * t);
    if (q == nullptr || dp == nullptr) return;
    float *k = q + n, *v = k + n, *dout = v + n, *grad = dout + n;
    pack_qkv(qkv, q, k, v, m, d, heads, kv_heads, t);
    kc::heads_gather(m_stream, dy, d, 0, dout, m, d, heads, t);
    const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
    if (p > 0) drop(probs, dp, batch * t * t, p, salt);
    const float* weights = p > 0 ? dp : probs;
    batched(true, false, t, dh, t, 1.0f, weights, t, t * t, dout, dh, t * dh, grad, dh, t * dh, batch, false);
    kc::heads_scatter(m_stream, grad, dqkv, ld, d + dkv, m, d, heads, t, acc, group);
    batched(false, true, t, t, dh, 1.0f, dout, dh, t * dh, v, dh, t * dh, dp, t, t * t, batch, false);
    if (p > 0) drop(dp, dp, batch * t * t, p, salt);
    kc::causal_softmax_grad(m_stream, probs, dp, batch * t, t);
    batched(false, false, t, dh, t, scale, probs, t, t * t, k, dh, t * dh, grad, dh, t * dh, batch, false);
    kc::heads_scatter(m_stream, grad, dqkv, ld, 0, m, d, heads, t, acc);
    batched(true, false, t, dh, t, scale, probs, t, t * t, q, dh, t * dh, grad, dh, t * dh, batch, false);
    kc::heads_scatter(m_stream, grad, dqkv, ld, d, m, d, heads, t, acc, group);
  }
  void dropout(const float* x, float* y, int64_t count, float p, uint64_t salt, bool acc) override {
    drop(x, y, count, dropout_p(p), salt, acc);
  }
  void rotary(const float* x, float* y, int64_t m, int64_t cols, int64_t heads, int64_t dh, int64_t t, float theta,
              bool inverse, bool acc) override {
    kc::rotary(m_stream, x, y, m, cols, heads, dh, t, theta, inverse, acc);
  }
  void mul(const float* a, const float* b, float* y, int64_t count, bool acc) override {
    kc::mul(m_stream, a, b, y, count, acc);
  }
  void rms_norm(const float* x, const float* w, float* y, float* rstd, int64_t m, int64_t n, float epsilon) override {
    kc::rms_norm(m_stream, x, w, y, rstd, m, n, epsilon);
  }
  void rms_norm_grad(const float* x, const float* w, const float* rstd, const float* dy, float* dx, float* dw, int64_t m,
                     int64_t n, bool acc_dx, bool acc_w) override {
    float* scratch = grown(&m_sums, &m_sums_room, kc::column_sums_scratch(m, n), "column sums");
    if (scratch != nullptr) kc::rms_norm_grad(m_stream, x, w, rstd, dy, dx, dw, m, n, acc_dx, acc_w, scratch);
  }
  void relu(const float* x, float* y, int64_t count) override { kc::relu(m_stream, x, y, count); }
  void relu_grad(const float* x, const float* dy, float* dx, int64_t count, bool acc) override {
    kc::relu_grad(m_stream, x, dy, dx, count, acc);
  }
  void gelu(const float* x, float* y, int64_t count) override { kc::gelu(m_stream, x, y, count); }
  void gelu_grad(const float* x, const float* dy, float* dx, int64_t count, bool acc) override {
    kc::gelu_grad(m_stream, x, dy, dx, count, acc);
  }
  void unary(elementwise::Unary fn, const float* x, float* y, int64_t count) override {
    kc::unary(m_stream, static_cast<int>(fn), x, y, count);
  }
  void unary_grad(elementwise::Unary fn, const float* x, const float* dy, float* dx, int64_t count,
                  bool acc) override {
    kc::unary_grad(m_stream, static_cast<int>(fn), x, dy, dx, count, acc);
  }
  void layer_norm(const float* x, const float* gamma, const float* beta, float* y, float* mean, float* rstd,
                  int64_t m, int64_t n) override {
    kc::layer_norm(m_stream, x, gamma, beta, y, mean, rstd, m, n, kernels::k_layer_norm_epsilon);
  }
  void layer_norm_grad(const float* x, const float* gamma, const float* mean, const float* rstd, const float* dy,
                       float* dx, float* dgamma, float* dbeta, int64_t m, int64_t n, bool acc_dx,
                       bool acc_params) override {
    float* scratch = grown(&m_sums, &m_sums_room, kc::column_sums_scratch(m, n), "column sums");
    if (scratch != nullptr) {
      kc::layer_norm_grad(m_stream, x, gamma, mean, rstd, dy, dx, dgamma, dbeta, m, n, acc_dx, acc_params, scratch);
    }
  }
  void softmax_xent(const float* logits, const int32_t* labels, float* loss, int64_t m, int64_t c) override {
    // One scratch serves every call (they run in stream order); a larger
    // one replaces it, the old one stays for the steps captured with it.
    if (m > m_rows_capacity) {
      m_rows = static_cast<float*>(device_buffer(static_cast<size_t>(m) * 8));
      m_rows_capacity = m_rows == nullptr ? 0 : m;
      if (m_rows == nullptr) return fail("out of device memory for the loss");
    }
    float* rows = m_rows;
    kc::softmax_xent(m_stream, logits, labels, loss, m, c, rows, reinterpret_cast<int32_t*>(rows + m), m_stats,
                     reinterpret_cast<unsigned long long*>(m_stats + 1));
  }
  void softmax_xent_grad(const float* logits, const int32_t* labels, float* dlogits, int64_t m, int64_t c, float scale,
                         bool acc) override {
    kc::softmax_xent_grad(m_stream, logits, labels, dlogits, m, c, scale, acc);
  }
  void sgd(const float* param_in, float* param, const float* grad, const float* velocity_in, float* velocity,
           int64_t count, const OptimizerHyper& h) override {
    kc::sgd(m_stream, param_in, param, grad, velocity_in, velocity, count, h, m_step_device, m_grad_scale);
  }
  void adam(const float* param_in, float* param, const float* grad, const float* m_in, float* m, const float* v_in,
            float* v, int64_t count, const OptimizerHyper& h) override {
    kc::adam(m_stream, param_in, param, grad, m_in, m, v_in, v, count, h, m_step_device, m_grad_scale);
  }
  void clip_gradients(const float* grads, int64_t count, float max_norm) override {
    kc::clip_gradients(m_stream, grads, count, max_norm, m_clip_partials, m_grad_scale);
  }
  // The step into device memory, queued before what follows (a replay
  // included): every Adam thread reads it there, not over PCIe.
  void set_step(int64_t step) override {
    *m_step_host = step;
    check(cudaMemcpyAsync(m_step_device, m_step_host, sizeof(int64_t), cudaMemcpyHostToDevice, m_stream), "copy");
  }

  void reset_stats() override { check(cudaMemsetAsync(m_stats, 0, 16, m_stream), "memset"); }
  void take_stats(double* loss_sum, int64_t* correct) override {
    check(cudaMemcpyAsync(m_stats_host, m_stats, 16, cudaMemcpyDeviceToHost, m_stream), "copy");
    (void)sync();
    *loss_sum = m_stats_host[0];
    uint64_t hits = 0;
    std::memcpy(&hits, m_stats_host + 1, 8);
    *correct = static_cast<int64_t>(hits);
  }

  void zero(void* p, size_t bytes) override { check(cudaMemsetAsync(p, 0, bytes, m_stream), "memset"); }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0 || dst == src) return;
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, m_stream), "copy");
    if (pageable(dst) || pageable(src)) {
      if (m_capturing) return fail("a copy from or to pageable host memory cannot be captured");
      (void)sync();
    }
  }
  void* host_buffer(size_t bytes) override {
    void* p = nullptr;
    if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) return nullptr;
    m_host.push_back(p);
    return p;
  }
  void* device_buffer(size_t bytes) override {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes == 0 ? 1 : bytes) != cudaSuccess) return nullptr;
    m_device.push_back(p);
    return p;
  }
  Status sync() override {
    if (!m_capturing && !m_groups.empty()) {
      // Collectives on the streams: a member that died must not hang us.
      if (Status s = m_groups.wait_idle(m_stream, m_side); !s.ok()) fail(s.message());
    }
    if (!m_capturing) {
      if (cudaError_t e = cudaStreamSynchronize(m_stream); e != cudaSuccess) fail(std::string("stream: ") + cudaGetErrorString(e));
      if (m_side != nullptr) {
        if (cudaError_t e = cudaStreamSynchronize(m_side); e != cudaSuccess) {
          fail(std::string("side copies: ") + cudaGetErrorString(e));
        }
      }
    }
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) fail(std::string("kernel launch: ") + cudaGetErrorString(e));
    if (m_error.empty()) return Status();
    return Status(ErrorCode::io_error, m_name + ": " + m_error);
  }

  Status set_precision(Precision precision, int64_t max_operand) override {
    m_precision = precision;
    // A measurement switch (issue 49; docs/benchmarks.md): TIERMEM_BF16_GEMM=bf16
    // has cuBLAS round the fp32 operands inside its kernels instead of our
    // casts (nanoGPT's char GPT 8 % faster on an H100, the 4096-wide MLP
    // 33 % slower: not the default).
    m_gemm_compute = compute_type(std::getenv("TIERMEM_BF16_GEMM"), CUBLAS_COMPUTE_32F);
    if (precision == Precision::bf16) kc::flash_attention_prepare();
    if (precision == Precision::fp32 || max_operand <= m_bf16_room) return Status();
    m_bf16_a = static_cast<uint16_t*>(device_buffer(static_cast<size_t>(max_operand) * 2));
    m_bf16_b = static_cast<uint16_t*>(device_buffer(static_cast<size_t>(max_operand) * 2));
    if (m_bf16_a == nullptr || m_bf16_b == nullptr) {
      m_bf16_room = 0;
      return Status(ErrorCode::tier_exhausted, m_name + ": no device memory for the bf16 copies of GEMM operands (2 x " +
                                                   std::to_string(max_operand * 2) + " bytes)");
    }
    m_bf16_room = max_operand;
    return Status();
  }

  static cublasComputeType_t compute_type(const char* name, cublasComputeType_t fallback) {
    if (name == nullptr) return fallback;
    const std::string n(name);
    if (n == "bf16") return CUBLAS_COMPUTE_32F_FAST_16BF;
    return CUBLAS_COMPUTE_32F;
  }

  // A second stream for copies beside the kernels: each waits for what the
  // main stream had queued (an event recorded there), and the main stream
  // waits for a ticket's event. Events come from a ring: a ticket whose
  // event was recorded again by a later copy is waited for with that one,
  // later in the same stream: a longer wait, never a shorter one.
  uint64_t side_copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return m_tickets;
    if (m_side == nullptr) {
      if (cudaError_t e = cudaStreamCreateWithFlags(&m_side, cudaStreamNonBlocking); e != cudaSuccess) {
        fail(std::string("cudaStreamCreate (side copies): ") + cudaGetErrorString(e));
        m_side = nullptr;
        copy(dst, src, bytes);
        return m_tickets;
      }
      m_side_events.resize(2 * k_side_ring);
      for (cudaEvent_t& e : m_side_events) check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "event");
    }
    const uint64_t ticket = ++m_tickets;
    cudaEvent_t after = m_side_events[2 * (ticket % k_side_ring)];
    cudaEvent_t done = m_side_events[2 * (ticket % k_side_ring) + 1];
    check(cudaEventRecord(after, m_stream), "event");
    check(cudaStreamWaitEvent(m_side, after, 0), "wait");
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, m_side), "side copy");
    check(cudaEventRecord(done, m_side), "event");
    return ticket;
  }
  void wait_side(uint64_t ticket) override {
    if (ticket == 0 || m_side == nullptr || ticket <= m_side_waited) return;
    check(cudaStreamWaitEvent(m_stream, m_side_events[2 * (ticket % k_side_ring) + 1], 0), "wait");
    m_side_waited = ticket;
  }
  // From another thread (the host's optimizer): the ticket's event, or a
  // later copy's that took its slot (a longer wait, never a shorter one).
  // Errors surface at the compute's next sync.
  void host_wait_side(uint64_t ticket) override {
    if (ticket == 0 || m_side == nullptr) return;
    (void)cudaEventSynchronize(m_side_events[2 * (ticket % k_side_ring) + 1]);
  }

  bool pin_host(void* p, size_t bytes) override {
    if (cudaHostRegister(p, bytes, cudaHostRegisterPortable) != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky: the copies go on, pageable
      return false;
    }
    m_registered.push_back(p);
    return true;
  }
  void unpin_host(void* p) override {
    auto it = std::find(m_registered.begin(), m_registered.end(), p);
    if (it == m_registered.end()) return;
    cudaHostUnregister(p);
    m_registered.erase(it);
  }

  Status collectives_available() const override { return nccl::available(); }
  Result<std::string> collective_id() override { return nccl::unique_id(); }
  Result<std::unique_ptr<Collective>> join_collective(const std::string& id, int size, int rank,
                                                      std::chrono::milliseconds timeout) override {
    return nccl::join(m_groups, m_stream, id, size, rank, timeout);
  }

  bool can_capture() const override { return true; }
  Status begin_capture() override {
    if (cudaError_t e = cudaStreamBeginCapture(m_stream, cudaStreamCaptureModeRelaxed); e != cudaSuccess) {
      return Status(ErrorCode::io_error, m_name + ": cudaStreamBeginCapture: " + cudaGetErrorString(e));
    }
    m_capturing = true;
    return Status();
  }
  Status end_capture(int slot) override {
    cudaGraph_t graph = nullptr;
    cudaError_t e = cudaStreamEndCapture(m_stream, &graph);
    m_capturing = false;
    cudaGraphExec_t exec = nullptr;
    if (e == cudaSuccess) e = cudaGraphInstantiate(&exec, graph, 0);
    if (graph != nullptr) cudaGraphDestroy(graph);
    if (e != cudaSuccess) return Status(ErrorCode::io_error, m_name + ": capturing the step: " + cudaGetErrorString(e));
    if (!m_error.empty()) {
      cudaGraphExecDestroy(exec);
      return sync();
    }
    if (auto it = m_graphs.find(slot); it != m_graphs.end()) cudaGraphExecDestroy(it->second);
    m_graphs[slot] = exec;
    return Status();
  }
  bool captured(int slot) const override { return m_graphs.count(slot) != 0; }
  Status replay(int slot) override {
    auto it = m_graphs.find(slot);
    if (it == m_graphs.end()) return Status(ErrorCode::internal, "no captured step " + std::to_string(slot));
    if (cudaError_t e = cudaGraphLaunch(it->second, m_stream); e != cudaSuccess) {
      return Status(ErrorCode::io_error, m_name + ": cudaGraphLaunch: " + cudaGetErrorString(e));
    }
    return Status();
  }

 private:
  static constexpr size_t k_workspace = 32 << 20;

  void gemm(cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
            const float* b, int64_t ldb, float* c, int64_t ldc, bool acc) {
    const float one = 1.0f, beta = acc ? 1.0f : 0.0f;
    if (m_precision == Precision::bf16 && m_gemm_compute != CUBLAS_COMPUTE_32F) {
      // cuBLAS rounds the fp32 operands itself, inside the GEMM's kernel.
      const cublasStatus_t s = cublasGemmEx(m_blas, ta, tb, static_cast<int>(m), static_cast<int>(n),
                                            static_cast<int>(k), &one, a, CUDA_R_32F, static_cast<int>(lda), b,
                                            CUDA_R_32F, static_cast<int>(ldb), &beta, c, CUDA_R_32F,
                                            static_cast<int>(ldc), m_gemm_compute, CUBLAS_GEMM_DEFAULT);
      if (s != CUBLAS_STATUS_SUCCESS) fail(std::string("cublasGemmEx (fp32, fast): ") + cublasGetStatusString(s));
      return;
    }
    if (m_precision == Precision::bf16) {
      // Both operands rounded to bf16 (into the copies' room), the product
      // accumulated in fp32 into the fp32 result.
      const int64_t a_count = lda * (ta == CUBLAS_OP_N ? k : m), b_count = ldb * (tb == CUBLAS_OP_N ? n : k);
      if (a_count > m_bf16_room || b_count > m_bf16_room) return fail("a GEMM operand larger than set_precision said");
      kc::to_bf16(m_stream, a, m_bf16_a, a_count);
      kc::to_bf16(m_stream, b, m_bf16_b, b_count);
      const cublasStatus_t s = cublasGemmEx(m_blas, ta, tb, static_cast<int>(m), static_cast<int>(n),
                                            static_cast<int>(k), &one, m_bf16_a, CUDA_R_16BF, static_cast<int>(lda),
                                            m_bf16_b, CUDA_R_16BF, static_cast<int>(ldb), &beta, c, CUDA_R_32F,
                                            static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      if (s != CUBLAS_STATUS_SUCCESS) fail(std::string("cublasGemmEx (bf16): ") + cublasGetStatusString(s));
      return;
    }
    const cublasStatus_t s = cublasSgemm(m_blas, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                                         &one, a, static_cast<int>(lda), b, static_cast<int>(ldb), &beta, c,
                                         static_cast<int>(ldc));
    if (s != CUBLAS_STATUS_SUCCESS) fail(std::string("cublasSgemm: ") + cublasGetStatusString(s));
  }
  // Row-major C = alpha op(A) op(B) (+ C), op(A) [m, k], for `batch`
  // matrices `stride_*` floats apart: column-major C^T = op(B)^T op(A)^T.
  void batched(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
               int64_t stride_a, const float* b, int64_t ldb, int64_t stride_b, float* c, int64_t ldc,
               int64_t stride_c, int64_t batch, bool acc) {
    const float beta = acc ? 1.0f : 0.0f;
    const cublasStatus_t s = cublasSgemmStridedBatched(
        m_blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n),
        static_cast<int>(m), static_cast<int>(k), &alpha, b, static_cast<int>(ldb), stride_b, a, static_cast<int>(lda),
        stride_a, &beta, c, static_cast<int>(ldc), stride_c, static_cast<int>(batch));
    if (s != CUBLAS_STATUS_SUCCESS) fail(std::string("cublasSgemmStridedBatched: ") + cublasGetStatusString(s));
  }
  // q, k and v packed per query head (a key/value head repeated for each
  // query head of its group).
  void pack_qkv(const float* qkv, float* q, float* k, float* v, int64_t m, int64_t d, int64_t heads, int64_t kv_heads,
                int64_t t) {
    const int64_t group = heads / kv_heads, dkv = d / heads * kv_heads, ld = d + 2 * dkv;
    kc::heads_gather(m_stream, qkv, ld, 0, q, m, d, heads, t);
    kc::heads_gather(m_stream, qkv, ld, d, k, m, d, heads, t, group);
    kc::heads_gather(m_stream, qkv, ld, d + dkv, v, m, d, heads, t, group);
  }
  // Scratch for `count` packed tensors of `elements` floats (one room, grown
  // as needed; an old one stays for the steps captured with it).
  // The step's draws read the step where the kernel runs (a replay too);
  // the draw (micro-batch) is the launch's.
  void drop(const float* x, float* y, int64_t count, float p, uint64_t salt, bool acc = false) {
    kc::dropout(m_stream, x, y, count, p, m_dropout_seed, salt, m_step_device, m_draw, acc);
  }
  // The tiles' bf16 copies of qkv and dY (in the batched GEMMs' room).
  uint16_t* flash_scratch(int64_t m, int64_t d, int64_t heads, int64_t kv_heads) {
    const int64_t halves = kc::flash_attention_scratch(m, d, heads, kv_heads);
    return reinterpret_cast<uint16_t*>(attention_scratch((halves + 1) / 2, 1));
  }
  float* attention_scratch(int64_t elements, int count) {
    return grown(&m_attention, &m_attention_room, elements * count, "attention");
  }
  float* attention_probs_scratch(int64_t elements) {
    return grown(&m_attention_dp, &m_attention_dp_room, elements, "attention's dP");
  }
  float* grown(float** room, int64_t* capacity, int64_t elements, const char* what) {
    if (elements > *capacity) {
      *room = static_cast<float*>(device_buffer(static_cast<size_t>(elements) * 4));
      *capacity = *room == nullptr ? 0 : elements;
      if (*room == nullptr) fail(std::string("out of device memory for ") + what);
    }
    return *room;
  }
  static bool pageable(const void* p) {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();
      return true;
    }
    return a.type == cudaMemoryTypeUnregistered;
  }
  void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) fail(std::string(what) + ": " + cudaGetErrorString(e));
  }
  // The first failure is kept and reported by sync().
  void fail(const std::string& what) {
    if (m_error.empty()) m_error = what;
  }

  int m_ordinal = -1;
  std::string m_name;
  std::string m_uuid;
  cudaStream_t m_stream = nullptr;
  static constexpr uint64_t k_side_ring = 64;
  cudaStream_t m_side = nullptr;              // side copies (offload)
  std::vector<cudaEvent_t> m_side_events;     // ring: (after, done) per ticket
  uint64_t m_tickets = 0, m_side_waited = 0;
  std::vector<void*> m_registered;            // pin_host
  cublasHandle_t m_blas = nullptr;
  double* m_stats = nullptr;       // device: loss sum, hits (u64)
  double* m_stats_host = nullptr;  // pinned: where take_stats reads them to
  int64_t* m_step_host = nullptr;  // pinned: Adam's step, set_step's copy source
  int64_t* m_step_device = nullptr;
  double* m_clip_partials = nullptr;  // clip_gradients' first pass
  float* m_grad_scale = nullptr;      // clip_gradients' result, read by sgd and adam
  Precision m_precision = Precision::fp32;
  cublasComputeType_t m_gemm_compute = CUBLAS_COMPUTE_32F;       // bf16: 32F = cast, then bf16 GEMM
  uint16_t* m_bf16_a = nullptr;  // bf16 copies of a GEMM's operands (--precision bf16)
  uint16_t* m_bf16_b = nullptr;
  int64_t m_bf16_room = 0;       // elements each holds
  float* m_sums = nullptr;  // column sums' partials per chunk of rows
  int64_t m_sums_room = 0;
  float* m_embedding_sort = nullptr;  // embedding_grad's sort of the ids (int32 words)
  int64_t m_embedding_sort_room = 0;
  float* m_attention = nullptr;  // attention's packed q, k, v and outputs
  int64_t m_attention_room = 0;
  float* m_attention_dp = nullptr;  // attention_grad's dP
  int64_t m_attention_dp_room = 0;
  float* m_rows = nullptr;  // softmax_xent's per-row scratch
  int64_t m_rows_capacity = 0;
  bool m_capturing = false;
  nccl::Registry m_groups;  // live collectives (they go before this compute)
  std::string m_error;
  std::map<int, cudaGraphExec_t> m_graphs;
  std::vector<void*> m_device, m_host;
};

}  // namespace
}  // namespace tiermem::exec

// The plugin's entry point (compute.cpp loads it).
extern "C" __attribute__((visibility("default"))) tiermem::exec::Compute* tiermem_exec_cuda_create(
    int ordinal, char* error, size_t error_bytes) {
  auto compute = std::make_unique<tiermem::exec::CudaCompute>();
  const std::string failed = compute->open(ordinal);
  if (failed.empty()) return compute.release();
  std::snprintf(error, error_bytes, "%s", failed.c_str());
  return nullptr;
}
