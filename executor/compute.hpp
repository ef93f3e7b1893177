// Where the executor computes (X12): the kernels of kernels.hpp, memory
// operations on tensors and the loss statistics, on the CPU or on a GPU.
//
// Pointers a kernel gets are in this compute's memory (memory_is_device():
// device pointers, never read on the host). On a GPU every call is queued on
// one stream in order, and returns before it ran, except where said; copy()
// takes any mix of host and device pointers. A run of calls without host
// work in between can be captured once and replayed (begin_capture,
// end_capture, replay): the training step of a stage that exchanges no
// messages is one such run, replayed every step.
//
// The CUDA compute lives in a plugin (executor/cuda/, libtiermem-exec-cuda.so)
// loaded on first use, so that tiermem-exec runs where no CUDA library is.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <tiermem/status.h>

#include "executor/elementwise_math.hpp"
#include "executor/optimizer_math.hpp"

namespace tiermem::exec {

// What the GEMMs compute in: fp32 throughout, or (GPUs) bf16 operands with
// fp32 accumulation into fp32 results (mixed precision; parameters,
// optimizer state, activations and gradients stay fp32 in the tiers).
enum class Precision { fp32, bf16 };

// A group of ranks that sum tensors of their computes' memory together: NCCL
// on GPUs (executor/cuda/nccl_collective.cpp), made by Compute::join_collective.
// Calls are queued on the compute's stream in order with its kernels, or
// (all_reduce_beside) on a stream of the group's own; every member must make
// the same calls in the same order. A member that dies or stops leaves the
// others' calls waiting: Compute::sync() then gives up after the group's
// timeout, aborts the group and reports it (the job restarts as a whole).
class Collective {
 public:
  virtual ~Collective() = default;
  // Members, and this one's place among them.
  virtual int size() const = 0;
  virtual int rank() const = 0;
  // While the group is being made (join_collective returns at once): true
  // once made; an error when it failed. abort() gives a join up (a newer
  // id was published) or the made group (no call on it may follow).
  virtual Result<bool> joined() = 0;
  virtual void abort() = 0;
  // out = the group's sum of `in` (fp32; out may be in), queued on the
  // compute's stream.
  virtual void all_reduce(const float* in, float* out, int64_t count) = 0;
  // The same in place, on the group's stream: it starts once everything
  // queued on the compute before the call is done and runs beside what is
  // queued after (a gradient bucket while the backward pass goes on).
  // Returns its ticket; wait_beside makes what the compute queues from then
  // on wait for it (and those before it).
  virtual uint64_t all_reduce_beside(float* data, int64_t count) = 0;
  virtual void wait_beside(uint64_t ticket) = 0;
  // The group's sum of host words (blocking; the mesh check). Errors: the
  // group's, timeout.
  virtual Result<std::vector<uint64_t>> sum_words(const std::vector<uint64_t>& mine) = 0;
  // What the beside calls took so far: bytes reduced and seconds on the
  // group's stream (its events), for the bus bandwidth report.
  virtual void beside_time(uint64_t* bytes, double* seconds) = 0;
  // "NCCL 2.27.3".
  virtual std::string library() const = 0;
  // The first failure of a call that returns nothing (NCCL's also reach
  // the compute's sync()).
  virtual Status failure() const { return Status(); }
};

class Compute {
 public:
  virtual ~Compute() = default;

  // "cpu", or "cuda:0 (NVIDIA H200)".
  virtual std::string name() const = 0;
  // Tensors are in device memory: the host copies them in and out.
  virtual bool memory_is_device() const = 0;
  // The CUDA ordinal of that memory in this process; -1 for the CPU.
  virtual int device() const = 0;
  // The device's UUID ("GPU-..."), the same in every process that sees it;
  // empty for the CPU. Two ranks on one GPU cannot be members of one NCCL
  // group (collectives.hpp).
  virtual std::string device_uuid() const { return std::string(); }

  // ---- kernels: the contract of kernels.hpp ----
  virtual void matmul(const float* a, const float* b, float* c, int64_t m, int64_t k, int64_t n, bool accumulate) = 0;
  virtual void matmul_grad_a(const float* dy, const float* b, float* da, int64_t m, int64_t k, int64_t n,
                             bool accumulate) = 0;
  virtual void matmul_grad_b(const float* a, const float* dy, float* db, int64_t m, int64_t k, int64_t n,
                             bool accumulate) = 0;
  virtual void bias_add(const float* x, const float* bias, float* y, int64_t m, int64_t n) = 0;
  virtual void bias_grad(const float* dy, float* dbias, int64_t m, int64_t n, bool accumulate) = 0;
  virtual void pass_grad(const float* dy, float* dx, int64_t count, bool accumulate) = 0;
  virtual void add(const float* a, const float* b, float* y, int64_t count) = 0;
  virtual void copy_columns(const float* x, float* y, int64_t m, int64_t n, int64_t y_cols, int64_t column) = 0;
  virtual void slice_columns_grad(const float* dy, float* dx, int64_t m, int64_t n, int64_t dy_cols, int64_t column,
                                  bool accumulate) = 0;
  virtual void relu(const float* x, float* y, int64_t count) = 0;
  virtual void relu_grad(const float* x, const float* dy, float* dx, int64_t count, bool accumulate) = 0;
  virtual void gelu(const float* x, float* y, int64_t count) = 0;
  virtual void gelu_grad(const float* x, const float* dy, float* dx, int64_t count, bool accumulate) = 0;
  // y = fn(x) and dx (+)= dy * fn'(x), element-wise: the functions of
  // elementwise_math.hpp, whose math the CPU and the GPU share.
  virtual void unary(elementwise::Unary fn, const float* x, float* y, int64_t count) = 0;
  virtual void unary_grad(elementwise::Unary fn, const float* x, const float* dy, float* dx, int64_t count,
                          bool accumulate) = 0;
  // y (+)= a * b, element-wise.
  virtual void mul(const float* a, const float* b, float* y, int64_t count, bool accumulate) = 0;
  virtual void rms_norm(const float* x, const float* w, float* y, float* rstd, int64_t m, int64_t n,
                        float epsilon) = 0;
  virtual void rms_norm_grad(const float* x, const float* w, const float* rstd, const float* dy, float* dx, float* dw,
                             int64_t m, int64_t n, bool accumulate_dx, bool accumulate_w) = 0;
  // Layer norm over rows of n; beta and dbeta may be null (no bias).
  virtual void layer_norm(const float* x, const float* gamma, const float* beta, float* y, float* mean, float* rstd,
                          int64_t m, int64_t n) = 0;
  virtual void layer_norm_grad(const float* x, const float* gamma, const float* mean, const float* rstd,
                               const float* dy, float* dx, float* dgamma, float* dbeta, int64_t m, int64_t n,
                               bool accumulate_dx, bool accumulate_params) = 0;
  // Writes the mean cross-entropy to *loss (one float of this memory) and
  // adds it, and the rows whose arg-max is the label, to the statistics.
  virtual void softmax_xent(const float* logits, const int32_t* labels, float* loss, int64_t m, int64_t c) = 0;
  virtual void softmax_xent_grad(const float* logits, const int32_t* labels, float* dlogits, int64_t m, int64_t c,
                                 float scale, bool accumulate) = 0;
  // Sequences (kernels.hpp: rows are tokens; attention_grad overwrites probs).
  virtual void embedding(const int32_t* ids, const float* table, float* y, int64_t m, int64_t d) = 0;
  virtual void embedding_grad(const int32_t* ids, const float* dy, float* dtable, int64_t m, int64_t d, int64_t vocab,
                              bool accumulate) = 0;
  virtual void position_embedding(const float* x, const float* table, float* y, int64_t m, int64_t d, int64_t t) = 0;
  virtual void position_embedding_grad(const float* dy, float* dtable, int64_t m, int64_t d, int64_t t,
                                       bool accumulate) = 0;
  // With `p` > 0 (and dropout on), the probabilities are dropped out (the
  // draws of `salt`, index (s * heads + h) * t * t + i * t + j) before they
  // weigh the values; `probs` keeps them as they were, and the gradient
  // draws the same again. A GPU with --precision bf16 and no dropout
  // (kernels::tiled_attention_fits) keeps
  // in `probs` what its tiled kernels save instead (cuda/flash_attention.cuh):
  // only attention_grad reads it.
  virtual void attention(const float* qkv, float* y, float* probs, int64_t m, int64_t d, int64_t heads,
                         int64_t kv_heads, int64_t t, float p, uint64_t salt) = 0;
  virtual void attention_grad(const float* qkv, float* probs, const float* dy, float* dqkv, int64_t m, int64_t d,
                              int64_t heads, int64_t kv_heads, int64_t t, float p, uint64_t salt,
                              bool accumulate) = 0;
  // Dropout (dropout_math.hpp): y (+)= x * the factor of each element, drawn
  // from the seed of set_dropout, `salt` (the op's), the step of set_step
  // and the draw of set_draw; the forward op and its gradient call it alike.
  // Off (set_dropout's `training` false: evaluation, sample, the default)
  // every dropout is the identity.
  virtual void dropout(const float* x, float* y, int64_t count, float p, uint64_t salt, bool accumulate) = 0;
  void set_dropout(uint64_t seed, bool training) {
    m_dropout_seed = seed;
    m_dropout_on = training;
  }
  // Which micro-batch of which replica the ops from here on run on.
  void set_draw(uint64_t draw) { m_draw = draw; }
  virtual void rotary(const float* x, float* y, int64_t m, int64_t cols, int64_t heads, int64_t dh, int64_t t,
                      float theta, bool inverse, bool accumulate) = 0;
  // The optimizers read parameter and state from the `*_in` arrays and write
  // the updated values to the others (kernels::sgd/adam): the trainer's next
  // copy from its committed one in one pass, or in place. The schedule's
  // learning rate and Adam's bias correction take the step of set_step()
  // (from 1), read when the kernel runs: a replayed step takes the step set
  // before the replay.
  virtual void sgd(const float* param_in, float* param, const float* grad, const float* velocity_in, float* velocity,
                   int64_t count, const OptimizerHyper& h) = 0;
  virtual void adam(const float* param_in, float* param, const float* grad, const float* m_in, float* m,
                    const float* v_in, float* v, int64_t count, const OptimizerHyper& h) = 0;
  virtual void set_step(int64_t step) = 0;
  // Clipping by the global norm: the norm of grads[0, count) (every
  // parameter gradient of the step: the grads arena) sets the scale, read
  // when the kernels run, that sgd and adam apply to the gradients they read
  // while the optimizer has a max_grad_norm (clip_scale in
  // optimizer_math.hpp). Queued on a GPU, and captured with the step.
  virtual void clip_gradients(const float* grads, int64_t count, float max_norm) = 0;
  // The GEMMs from here on; `max_operand` is the most elements a GEMM
  // operand has (its bf16 copy's room, taken now: none may be allocated
  // while a step is captured). Errors: not_supported (bf16 on the CPU),
  // tier_exhausted (no room for the copies).
  virtual Status set_precision(Precision precision, int64_t max_operand) {
    (void)max_operand;
    if (precision == Precision::fp32) return Status();
    return Status(ErrorCode::not_supported, "--precision bf16 runs on a GPU (cuBLAS bf16 GEMMs); the CPU computes in fp32");
  }

  // ---- statistics of softmax_xent since the last reset ----
  virtual void reset_stats() = 0;
  // Waits for what is queued. loss_sum: the sum of the mean losses; correct:
  // rows right.
  virtual void take_stats(double* loss_sum, int64_t* correct) = 0;

  // ---- memory ----
  virtual void zero(void* p, size_t bytes) = 0;
  // Host or this compute's memory on either side. Host memory from
  // host_buffer() is read when the copy runs; other host memory is read or
  // written before copy() returns.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // Host memory the device copies from at full speed (pinned), kept until
  // the compute goes; plain memory on the CPU. nullptr when out of memory.
  virtual void* host_buffer(size_t bytes) = 0;
  // Device memory for tensors that are not in tiermem (messages received
  // from other stages), kept until the compute goes; plain memory on the
  // CPU. nullptr when out of memory.
  virtual void* device_buffer(size_t bytes) = 0;
  // Waits for everything queued (side copies too). Errors: a kernel or copy
  // that failed.
  virtual Status sync() = 0;

  // ---- copies beside the kernels (offload: param_stream.hpp) ----
  // Queues a copy on a second queue: it starts once everything queued
  // before the call is done and runs while what is queued after it does
  // (the copy engines beside the SMs). Returns its ticket; side copies run
  // in the order they were queued. The CPU copies at once.
  virtual uint64_t side_copy(void* dst, const void* src, size_t bytes) {
    copy(dst, src, bytes);
    return 0;
  }
  // What is queued from here on waits for side copy `ticket` and those
  // before it.
  virtual void wait_side(uint64_t ticket) { (void)ticket; }
  // The calling host thread waits until side copy `ticket` (and those
  // before it) is done; any thread may call it.
  virtual void host_wait_side(uint64_t ticket) { (void)ticket; }
  // Host memory the side copies use often (an offloaded rank's home arenas,
  // mapped from the daemon's DRAM tier): page-locked for the device so that
  // copies run on the copy engines at their speed, beside the kernels.
  // False when it could not be (the copies still work, slower and in step
  // with the host); the CPU has nothing to do. unpin_host undoes it.
  virtual bool pin_host(void* p, size_t bytes) {
    (void)p;
    (void)bytes;
    return true;
  }
  virtual void unpin_host(void* p) { (void)p; }

  // ---- collectives (several GPUs: NCCL) ----
  // Whether this compute can join groups (the library loads). Errors:
  // not_supported, saying why.
  virtual Status collectives_available() const {
    return Status(ErrorCode::not_supported, "collectives through NCCL need a GPU (" + name() + " reduces through tiermem)");
  }
  // The id a group is made with (ncclUniqueId's bytes), made by one member
  // and handed to the others (runtime/collectives.hpp: through tiermem).
  // Errors: not_supported (the CPU, a build without NCCL).
  virtual Result<std::string> collective_id() {
    return Status(ErrorCode::not_supported, "collectives through NCCL need a GPU (" + name() + " reduces through tiermem)");
  }
  // Starts joining group `id` as member `rank` of `size` (poll joined()).
  // `timeout` bounds every wait on the group. Errors: not_supported, those
  // of the library.
  virtual Result<std::unique_ptr<Collective>> join_collective(const std::string& id, int size, int rank,
                                                              std::chrono::milliseconds timeout) {
    (void)id;
    (void)size;
    (void)rank;
    (void)timeout;
    return Status(ErrorCode::not_supported, "collectives through NCCL need a GPU (" + name() + " reduces through tiermem)");
  }

  // ---- capture and replay ----
  // Whether begin_capture can work here (the CPU: no).
  virtual bool can_capture() const = 0;
  // Calls from here to end_capture are recorded as replay `slot`, not run.
  // Errors: what the device says.
  virtual Status begin_capture() = 0;
  virtual Status end_capture(int slot) = 0;
  virtual bool captured(int slot) const = 0;
  // Runs what slot recorded (queued, like any call).
  virtual Status replay(int slot) = 0;

 protected:
  // The probability a dropout runs at now: 0 when dropout is off.
  float dropout_p(float p) const { return m_dropout_on ? p : 0.0f; }
  uint64_t m_dropout_seed = 0;
  uint64_t m_draw = 0;
  bool m_dropout_on = false;
};

class HostAdamPool;
// The CPU (kernels.hpp; statistics on the host). With `adam_pool`, Adam
// runs on its pinned threads (host_adam.hpp) instead of OpenMP's.
std::unique_ptr<Compute> make_cpu_compute(HostAdamPool* adam_pool = nullptr);

// "cpu", "cuda" (device 0) or "cuda:N". Errors: invalid_argument (another
// name), not_supported (a build without CUDA kernels, no CUDA driver or no
// such device, with the reason).
Result<std::unique_ptr<Compute>> make_compute(const std::string& device);

}  // namespace tiermem::exec
