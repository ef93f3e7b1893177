// One element of the optimizers, shared by the CPU kernels (kernels.cpp) and
// the GPU ones (cuda/kernels.cu, CUDA and HIP), so both do the same
// arithmetic: PyTorch's SGD (momentum, dampening 0) and Adam, weight decay as
// L2 on the gradient. Each reads the committed parameter and state and
// returns the next ones through the out-parameters (which may alias them).
#pragma once

#include <cmath>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define TIERMEM_HOST_DEVICE __host__ __device__
#else
#define TIERMEM_HOST_DEVICE
#endif

namespace tiermem::exec {

TIERMEM_HOST_DEVICE inline void sgd_element(float param, float grad, float velocity, float lr, float momentum,
                                            float weight_decay, float* param_out, float* velocity_out) {
  const float g = grad + weight_decay * param;
  const float v = momentum * velocity + g;
  *velocity_out = v;
  *param_out = param - lr * v;
}

// `step_size`: lr / (1 - beta1^t); `c2_sqrt`: sqrt(1 - beta2^t), for step t.
TIERMEM_HOST_DEVICE inline void adam_element(float param, float grad, float m, float v, float step_size, float c2_sqrt,
                                             float beta1, float beta2, float epsilon, float weight_decay,
                                             float* param_out, float* m_out, float* v_out) {
  const float g = grad + weight_decay * param;
  const float mi = beta1 * m + (1.0f - beta1) * g;
  const float vi = beta2 * v + (1.0f - beta2) * g * g;
  *m_out = mi;
  *v_out = vi;
  // PyTorch: denom = sqrt(v) / sqrt(bias_correction2) + eps
  *param_out = param - step_size * mi / (sqrtf(vi) / c2_sqrt + epsilon);
}

}  // namespace tiermem::exec
