// One element of the optimizers, shared by the CPU kernels (kernels.cpp) and
// the GPU ones (cuda/kernels.cu, CUDA and HIP), so both do the same
// arithmetic: PyTorch's SGD (momentum, dampening 0), Adam (weight decay as L2
// on the gradient) and AdamW (decoupled), at the learning rate of the step's
// schedule. Each reads the committed parameter and state and returns the
// next ones through the out-parameters (which may alias them).
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define TIERMEM_HOST_DEVICE __host__ __device__
#else
#define TIERMEM_HOST_DEVICE
#endif

namespace tiermem::exec {

// What an update reads besides its arrays: the optimizer's fields
// (graph.proto's OptimizerDef) and the parameter's group (weight decay or
// none). Plain values: a kernel takes it by value.
struct OptimizerHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f, beta2 = 0.999f, epsilon = 1e-8f;
  float momentum = 0;
  float weight_decay = 0;
  bool decoupled = false;  // AdamW: p -= lr wd p, the gradient as it is
  // The schedule (nanoGPT's get_lr): warm-up over `warmup` steps, then a
  // cosine to min_lr at step `decay`, min_lr after; both 0: constant.
  int64_t warmup = 0, decay = 0;
  float min_lr = 0;
  // Clipping by the global gradient norm (0: none): the optimizer reads
  // every gradient scaled by clip_scale of the step's norm.
  float max_grad_norm = 0;
};

// PyTorch's clip_grad_norm_: min(1, max_norm / (norm + 1e-6)) for the
// norm whose square is `sum_squares`.
TIERMEM_HOST_DEVICE inline float clip_scale(float max_norm, double sum_squares) {
  const float c = max_norm / (static_cast<float>(sqrt(sum_squares)) + 1e-6f);
  return c < 1.0f ? c : 1.0f;
}

// The learning rate of step `step` (from 1), as nanoGPT's get_lr(it) for
// it = step - 1: lr (it + 1) / (warmup + 1) while it < warmup; then, with a
// decay, min_lr + (lr - min_lr) (1 + cos(pi (it - warmup) / (decay -
// warmup))) / 2 until it reaches decay, min_lr past it.
TIERMEM_HOST_DEVICE inline float learning_rate_at(const OptimizerHyper& h, int64_t step) {
  const int64_t it = step - 1;
  if (it < h.warmup) return h.lr * static_cast<float>(it + 1) / static_cast<float>(h.warmup + 1);
  if (h.decay <= 0) return h.lr;
  if (it > h.decay) return h.min_lr;
  const float ratio = static_cast<float>(it - h.warmup) / static_cast<float>(h.decay - h.warmup);
  return h.min_lr + 0.5f * (1.0f + cosf(3.14159265358979f * ratio)) * (h.lr - h.min_lr);
}

TIERMEM_HOST_DEVICE inline void sgd_element(float param, float grad, float velocity, float lr, float momentum,
                                            float weight_decay, float* param_out, float* velocity_out) {
  const float g = grad + weight_decay * param;
  const float v = momentum * velocity + g;
  *velocity_out = v;
  *param_out = param - lr * v;
}

// `grad`: as clipped. `lr`: this step's; `step_size`: lr / (1 - beta1^t); `c2_sqrt`: sqrt(1 -
// beta2^t), for step t. Adam's weight decay is L2 on the gradient; AdamW's
// (`decoupled`) shrinks the parameter first, as PyTorch's AdamW does.
TIERMEM_HOST_DEVICE inline void adam_element(float param, float grad, float m, float v, float lr, float step_size,
                                             float c2_sqrt, float beta1, float beta2, float epsilon,
                                             float weight_decay, bool decoupled, float* param_out, float* m_out,
                                             float* v_out) {
  const float p = decoupled ? param * (1.0f - lr * weight_decay) : param;
  const float g = decoupled ? grad : grad + weight_decay * param;
  const float mi = beta1 * m + (1.0f - beta1) * g;
  const float vi = beta2 * v + (1.0f - beta2) * g * g;
  *m_out = mi;
  *v_out = vi;
  // PyTorch: denom = sqrt(v) / sqrt(bias_correction2) + eps
  *param_out = p - step_size * mi / (sqrtf(vi) / c2_sqrt + epsilon);
}

}  // namespace tiermem::exec
