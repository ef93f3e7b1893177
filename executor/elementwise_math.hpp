// Element-wise functions (X12) whose math the CPU kernels (kernels.cpp) and
// the GPU ones (cuda/kernels.cu) share, as optimizer_math.hpp does for the
// optimizers: one struct per function with its value and its derivative,
// and one line in TIERMEM_UNARY_FUNCTIONS. Compute::unary and unary_grad run
// them; executor/ops/ declares the ops that use them (unary_op_specs).
// Plain C++ with no library headers, so that nvcc and hipcc compile it too.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define TIERMEM_ELEMENTWISE __host__ __device__ inline
#else
#define TIERMEM_ELEMENTWISE inline
#endif

namespace tiermem::exec::elementwise {

// x * sigmoid(x) (PyTorch's F.silu).
struct Silu {
  static TIERMEM_ELEMENTWISE float value(float x) { return x / (1.0f + expf(-x)); }
  static TIERMEM_ELEMENTWISE float derivative(float x) {
    const float s = 1.0f / (1.0f + expf(-x));
    return s * (1.0f + x * (1.0f - s));
  }
};

// x * Phi(x), Phi the standard normal CDF (PyTorch's exact F.gelu).
struct GeluExact {
  static TIERMEM_ELEMENTWISE float value(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }
  static TIERMEM_ELEMENTWISE float derivative(float x) {
    const float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752f));
    const float pdf = 0.39894228040143268f * expf(-0.5f * x * x);
    return cdf + x * pdf;
  }
};

// X(name, Function): every function, in the order of Unary.
#define TIERMEM_UNARY_FUNCTIONS(X) X(silu, Silu) X(gelu_exact, GeluExact)

enum class Unary : int {
#define TIERMEM_UNARY_ENUM(name, Function) name,
  TIERMEM_UNARY_FUNCTIONS(TIERMEM_UNARY_ENUM)
#undef TIERMEM_UNARY_ENUM
};

// "silu" for messages.
inline const char* unary_name(Unary fn) {
  switch (fn) {
#define TIERMEM_UNARY_NAME(name, Function) \
  case Unary::name:                        \
    return #name;
    TIERMEM_UNARY_FUNCTIONS(TIERMEM_UNARY_NAME)
#undef TIERMEM_UNARY_NAME
  }
  return "?";
}

}  // namespace tiermem::exec::elementwise
