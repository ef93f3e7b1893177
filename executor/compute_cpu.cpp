// The CPU compute: kernels.hpp on host memory, statistics on the host.
#include <cstdlib>
#include <cstring>
#include <vector>

#include "executor/compute.hpp"
#include "executor/dropout_math.hpp"
#include "executor/host_adam.hpp"
#include "executor/kernels.hpp"

namespace tiermem::exec {
namespace {

namespace k = kernels;

class CpuCompute final : public Compute {
 public:
  explicit CpuCompute(HostAdamPool* adam_pool) : m_adam_pool(adam_pool) {}
  std::string name() const override { return "cpu"; }
  bool memory_is_device() const override { return false; }
  int device() const override { return -1; }

  void matmul(const float* a, const float* b, float* c, int64_t m, int64_t kk, int64_t n, bool acc) override {
    k::matmul(a, b, c, m, kk, n, acc);
  }
  void matmul_grad_a(const float* dy, const float* b, float* da, int64_t m, int64_t kk, int64_t n, bool acc) override {
    k::matmul_grad_a(dy, b, da, m, kk, n, acc);
  }
  void matmul_grad_b(const float* a, const float* dy, float* db, int64_t m, int64_t kk, int64_t n, bool acc) override {
    k::matmul_grad_b(a, dy, db, m, kk, n, acc);
  }
  void bias_add(const float* x, const float* bias, float* y, int64_t m, int64_t n) override { k::bias_add(x, bias, y, m, n); }
  void bias_grad(const float* dy, float* dbias, int64_t m, int64_t n, bool acc) override { k::bias_grad(dy, dbias, m, n, acc); }
  void pass_grad(const float* dy, float* dx, int64_t count, bool acc) override { k::pass_grad(dy, dx, count, acc); }
  void add(const float* a, const float* b, float* y, int64_t count) override { k::add(a, b, y, count); }
  void copy_columns(const float* x, float* y, int64_t m, int64_t n, int64_t y_cols, int64_t column) override {
    k::copy_columns(x, y, m, n, y_cols, column);
  }
  void slice_columns_grad(const float* dy, float* dx, int64_t m, int64_t n, int64_t dy_cols, int64_t column,
                          bool acc) override {
    k::slice_columns_grad(dy, dx, m, n, dy_cols, column, acc);
  }
  void embedding(const int32_t* ids, const float* table, float* y, int64_t m, int64_t d) override {
    k::embedding(ids, table, y, m, d);
  }
  void embedding_grad(const int32_t* ids, const float* dy, float* dtable, int64_t m, int64_t d, int64_t vocab,
                      bool acc) override {
    k::embedding_grad(ids, dy, dtable, m, d, vocab, acc);
  }
  void position_embedding(const float* x, const float* table, float* y, int64_t m, int64_t d, int64_t t) override {
    k::position_embedding(x, table, y, m, d, t);
  }
  void position_embedding_grad(const float* dy, float* dtable, int64_t m, int64_t d, int64_t t, bool acc) override {
    k::position_embedding_grad(dy, dtable, m, d, t, acc);
  }
  void attention(const float* qkv, float* y, float* probs, int64_t m, int64_t d, int64_t heads, int64_t kv_heads,
                 int64_t t, float p, uint64_t salt) override {
    k::attention(qkv, y, probs, m, d, heads, kv_heads, t, dropout_p(p), key(salt));
  }
  void attention_grad(const float* qkv, float* probs, const float* dy, float* dqkv, int64_t m, int64_t d,
                      int64_t heads, int64_t kv_heads, int64_t t, float p, uint64_t salt, bool acc) override {
    k::attention_grad(qkv, probs, dy, dqkv, m, d, heads, kv_heads, t, dropout_p(p), key(salt), acc);
  }
  void dropout(const float* x, float* y, int64_t count, float p, uint64_t salt, bool acc) override {
    k::dropout(x, y, count, dropout_p(p), key(salt), acc);
  }
  void rotary(const float* x, float* y, int64_t m, int64_t cols, int64_t heads, int64_t dh, int64_t t, float theta,
              bool inverse, bool acc) override {
    k::rotary(x, y, m, cols, heads, dh, t, theta, inverse, acc);
  }
  void mul(const float* a, const float* b, float* y, int64_t count, bool acc) override { k::mul(a, b, y, count, acc); }
  void rms_norm(const float* x, const float* w, float* y, float* rstd, int64_t m, int64_t n, float epsilon) override {
    k::rms_norm(x, w, y, rstd, m, n, epsilon);
  }
  void rms_norm_grad(const float* x, const float* w, const float* rstd, const float* dy, float* dx, float* dw, int64_t m,
                     int64_t n, bool acc_dx, bool acc_w) override {
    k::rms_norm_grad(x, w, rstd, dy, dx, dw, m, n, acc_dx, acc_w);
  }
  void relu(const float* x, float* y, int64_t count) override { k::relu(x, y, count); }
  void relu_grad(const float* x, const float* dy, float* dx, int64_t count, bool acc) override {
    k::relu_grad(x, dy, dx, count, acc);
  }
  void gelu(const float* x, float* y, int64_t count) override { k::gelu(x, y, count); }
  void gelu_grad(const float* x, const float* dy, float* dx, int64_t count, bool acc) override {
    k::gelu_grad(x, dy, dx, count, acc);
  }
  void unary(elementwise::Unary fn, const float* x, float* y, int64_t count) override { k::unary(fn, x, y, count); }
  void unary_grad(elementwise::Unary fn, const float* x, const float* dy, float* dx, int64_t count,
                  bool acc) override {
    k::unary_grad(fn, x, dy, dx, count, acc);
  }
  void layer_norm(const float* x, const float* gamma, const float* beta, float* y, float* mean, float* rstd,
                  int64_t m, int64_t n) override {
    k::layer_norm(x, gamma, beta, y, mean, rstd, m, n);
  }
  void layer_norm_grad(const float* x, const float* gamma, const float* mean, const float* rstd, const float* dy,
                       float* dx, float* dgamma, float* dbeta, int64_t m, int64_t n, bool acc_dx,
                       bool acc_params) override {
    k::layer_norm_grad(x, gamma, mean, rstd, dy, dx, dgamma, dbeta, m, n, acc_dx, acc_params);
  }
  void softmax_xent(const float* logits, const int32_t* labels, float* loss, int64_t m, int64_t c) override {
    int64_t right = 0;
    *loss = k::softmax_xent(logits, labels, m, c, &right);
    m_loss_sum += *loss;
    m_correct += right;
  }
  void softmax_xent_grad(const float* logits, const int32_t* labels, float* dlogits, int64_t m, int64_t c, float scale,
                         bool acc) override {
    k::softmax_xent_grad(logits, labels, dlogits, m, c, scale, acc);
  }
  void sgd(const float* param_in, float* param, const float* grad, const float* velocity_in, float* velocity,
           int64_t count, const OptimizerHyper& h) override {
    k::sgd(param_in, param, grad, velocity_in, velocity, count, h, m_step, h.max_grad_norm > 0 ? m_grad_scale : 1.0f);
  }
  void adam(const float* param_in, float* param, const float* grad, const float* m_in, float* m, const float* v_in,
            float* v, int64_t count, const OptimizerHyper& h) override {
    const float scale = h.max_grad_norm > 0 ? m_grad_scale : 1.0f;
    if (m_adam_pool != nullptr) {
      m_adam_pool->adam({param_in, param, grad, m_in, m, v_in, v}, adam_step(h, m_step, scale), count);
      return;
    }
    k::adam(param_in, param, grad, m_in, m, v_in, v, count, h, m_step, scale);
  }
  void set_step(int64_t step) override { m_step = step; }
  void clip_gradients(const float* grads, int64_t count, float max_norm) override {
    m_grad_scale = clip_scale(max_norm, k::sum_squares(grads, count));
  }

  void reset_stats() override { m_loss_sum = 0, m_correct = 0; }
  void take_stats(double* loss_sum, int64_t* correct) override {
    *loss_sum = m_loss_sum;
    *correct = m_correct;
  }

  void zero(void* p, size_t bytes) override { std::memset(p, 0, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (dst != src) std::memmove(dst, src, bytes);
  }
  void* host_buffer(size_t bytes) override { return buffer(bytes); }
  void* device_buffer(size_t bytes) override { return buffer(bytes); }
  Status sync() override { return Status(); }

  bool can_capture() const override { return false; }
  Status begin_capture() override { return Status(ErrorCode::not_supported, "the CPU replays nothing"); }
  Status end_capture(int) override { return begin_capture(); }
  bool captured(int) const override { return false; }
  Status replay(int) override { return begin_capture(); }

 private:
  void* buffer(size_t bytes) {
    m_buffers.emplace_back(bytes);
    return m_buffers.back().data();
  }

  uint64_t key(uint64_t salt) const { return dropout_key(m_dropout_seed, salt, m_step, m_draw); }

  HostAdamPool* m_adam_pool;
  int64_t m_step = 1;
  float m_grad_scale = 1.0f;
  double m_loss_sum = 0;
  int64_t m_correct = 0;
  std::vector<std::vector<std::byte>> m_buffers;
};

}  // namespace

std::unique_ptr<Compute> make_cpu_compute(HostAdamPool* adam_pool) {
  return std::make_unique<CpuCompute>(adam_pool);
}

}  // namespace tiermem::exec
