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

// The float whose bits are `bits`.
TIERMEM_ELEMENTWISE float float_of_bits(int32_t bits) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __int_as_float(bits);
#else
  return __builtin_bit_cast(float, bits);
#endif
}

// e^x for x <= 0 (below -87: e^-87, 1.6e-38) with nothing but arithmetic,
// so that a loop of it vectorises on the CPU (libm's expf, tanhf and erff do
// not: libm's tanhf took 19 ns an element, erff 13): x = k ln 2 + r with |r|
// <= ln 2 / 2 (ln 2 split in two, Cody-Waite, so k ln 2 is exact), e^r by its
// Taylor polynomial to degree 6 (relative error below 1.3e-7 there), 2^k
// through the exponent's bits (k >= -126: a normal float).
TIERMEM_ELEMENTWISE float exp_nonpositive(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float t = x * 1.44269504088896341f;
  const int32_t ki = static_cast<int32_t>(t - 0.5f);  // rounded (t <= 0)
  const float k = static_cast<float>(ki);
  const float r = (x - k * 0.693145751953125f) - k * 1.428606765330187e-06f;
  float p = 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  return p * float_of_bits((ki + 127) << 23);
}

// 1 / (1 + e^-x), through exp_nonpositive of -|x|.
TIERMEM_ELEMENTWISE float sigmoid(float x) {
  const float e = exp_nonpositive(x < 0 ? x : -x);
  return x < 0 ? e / (1.0f + e) : 1.0f / (1.0f + e);
}

// erf x with arithmetic alone: Abramowitz and Stegun 7.1.26 (absolute error
// below 1.5e-7, and exp_nonpositive's), odd in x.
TIERMEM_ELEMENTWISE float erf_arith(float x) {
  const float a = x < 0 ? -x : x;
  const float t = 1.0f / (1.0f + 0.3275911f * a);
  float p = 1.061405429f;
  p = p * t - 1.453152027f;
  p = p * t + 1.421413741f;
  p = p * t - 0.284496736f;
  p = p * t + 0.254829592f;
  const float y = 1.0f - p * t * exp_nonpositive(-a * a);
  return x < 0 ? -y : y;
}

// x * sigmoid(x) (PyTorch's F.silu).
struct Silu {
  static TIERMEM_ELEMENTWISE float value(float x) { return x * sigmoid(x); }
  static TIERMEM_ELEMENTWISE float derivative(float x) {
    const float s = sigmoid(x);
    return s * (1.0f + x * (1.0f - s));
  }
};

// x * Phi(x), Phi the standard normal CDF (PyTorch's exact F.gelu).
struct GeluExact {
  static TIERMEM_ELEMENTWISE float value(float x) { return 0.5f * x * (1.0f + erf_arith(x * 0.70710678118654752f)); }
  static TIERMEM_ELEMENTWISE float derivative(float x) {
    const float cdf = 0.5f * (1.0f + erf_arith(x * 0.70710678118654752f));
    const float pdf = 0.39894228040143268f * exp_nonpositive(-0.5f * x * x);
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
