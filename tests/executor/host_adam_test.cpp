// The host's Adam (executor/host_adam.hpp): the vectorised loop, the pinned
// pool and kernels::adam give the bits of optimizer_math.hpp's scalar
// adam_element for every element, in place or not, Adam or AdamW, clipped or
// not, at any length and offset, whatever the threads.
#include "executor/host_adam.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "executor/kernels.hpp"

namespace tiermem::exec {
namespace {

struct State {
  std::vector<float> param, grad, m, v;
};

// Values as a training run has them, and the edges: zeros, tiny and huge
// gradients, a second moment of 0.
State make_state(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> exponent(-30.0f, 10.0f);
  State s;
  for (int64_t i = 0; i < n; ++i) {
    s.param.push_back(normal(rng) * 0.02f);
    float g = normal(rng) * std::exp2(exponent(rng));
    if (i % 97 == 0) g = 0;
    s.grad.push_back(g);
    s.m.push_back(i % 89 == 0 ? 0.0f : normal(rng) * 1e-3f);
    s.v.push_back(i % 83 == 0 ? 0.0f : std::fabs(normal(rng)) * 1e-6f);
  }
  return s;
}

// The reference: adam_element, one element at a time.
State reference(const State& in, const AdamStep& s) {
  State out = in;
  for (size_t i = 0; i < in.param.size(); ++i) {
    adam_element(in.param[i], in.grad[i] * s.grad_scale, in.m[i], in.v[i], s.lr, s.step_size, s.c2_sqrt, s.beta1,
                 s.beta2, s.epsilon, s.weight_decay, s.decoupled, &out.param[i], &out.m[i], &out.v[i]);
  }
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b, size_t* first_difference) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      *first_difference = i;
      return false;
    }
  }
  return a.size() == b.size();
}

void expect_same(const State& got, const State& want, const std::string& what) {
  size_t at = 0;
  EXPECT_TRUE(same_bits(got.param, want.param, &at))
      << what << ": parameter " << at << " is " << got.param[at] << ", the scalar update gives " << want.param[at];
  EXPECT_TRUE(same_bits(got.m, want.m, &at)) << what << ": first moment " << at;
  EXPECT_TRUE(same_bits(got.v, want.v, &at)) << what << ": second moment " << at;
}

std::vector<OptimizerHyper> hypers() {
  OptimizerHyper adam;
  adam.lr = 3e-4f;
  adam.weight_decay = 0.01f;  // L2 on the gradient
  OptimizerHyper adamw = adam;
  adamw.decoupled = true;
  adamw.weight_decay = 0.1f;
  adamw.beta2 = 0.95f;
  adamw.warmup = 10;
  adamw.decay = 100;
  adamw.min_lr = 3e-5f;
  return {adam, adamw};
}

TEST(HostAdamTest, TheVectorisedLoopGivesTheScalarBitsInPlaceAndNot) {
  std::printf("host Adam instruction set: %s\n", adam_isa().c_str());
  for (const OptimizerHyper& h : hypers()) {
    for (int64_t step : {1, 7, 50}) {
      for (float scale : {1.0f, 0.37f}) {
        const AdamStep s = adam_step(h, step, scale);
        // Lengths around the vector widths; ranges that start off a vector bound.
        for (int64_t n : {1, 7, 16, 17, 33, 1000, 4099}) {
          const State in = make_state(n, static_cast<uint32_t>(n * 31 + step));
          const State want = reference(in, s);
          State out = in;  // out of place: the inputs stay as they were
          adam_range({in.param.data(), out.param.data(), in.grad.data(), in.m.data(), out.m.data(), in.v.data(),
                      out.v.data()},
                     s, 0, n);
          expect_same(out, want, "out of place, n " + std::to_string(n));
          State place = in;
          const AdamArrays a{place.param.data(), place.param.data(), place.grad.data(), place.m.data(),
                             place.m.data(),     place.v.data(),     place.v.data()};
          const int64_t cut = n / 3;  // two ranges, the second off any vector bound
          adam_range(a, s, 0, cut);
          adam_range(a, s, cut, n);
          expect_same(place, want, "in place, n " + std::to_string(n) + " cut at " + std::to_string(cut));
          State plain = in;
          adam_range_plain({plain.param.data(), plain.param.data(), plain.grad.data(), plain.m.data(),
                            plain.m.data(), plain.v.data(), plain.v.data()},
                           s, 0, n);
          expect_same(plain, want, "the plain loop, n " + std::to_string(n));
        }
      }
    }
  }
}

TEST(HostAdamTest, ThePoolAndTheKernelGiveTheScalarBitsWhateverTheThreads) {
  const int64_t n = 3 * HostAdamPool::k_serial_below + 5;  // split between workers, an odd tail
  for (const OptimizerHyper& h : hypers()) {
    const AdamStep s = adam_step(h, 3, 0.5f);
    const State in = make_state(n, 11);
    const State want = reference(in, s);
    for (int threads : {1, 2, 3, 5}) {
      HostAdamPool pool(threads, true);
      EXPECT_EQ(pool.threads(), threads);
      State out = in;
      pool.adam({out.param.data(), out.param.data(), out.grad.data(), out.m.data(), out.m.data(), out.v.data(),
                 out.v.data()},
                s, n);
      expect_same(out, want, pool.describe());
      // Twice in a row: the workers take the second call too.
      State again = in;
      pool.adam({in.param.data(), again.param.data(), in.grad.data(), in.m.data(), again.m.data(), in.v.data(),
                 again.v.data()},
                s, n);
      expect_same(again, want, pool.describe() + ", second call, out of place");
    }
    State k = in;
    kernels::adam(k.param.data(), k.param.data(), k.grad.data(), k.m.data(), k.m.data(), k.v.data(), k.v.data(), n,
                  h, 3, 0.5f);
    expect_same(k, want, "kernels::adam");
  }
}

TEST(HostAdamTest, APoolPinsOnlyWhereEachWorkerHasACpuOfItsOwn) {
  HostAdamPool fits(1, true);
  EXPECT_TRUE(fits.pinned()) << fits.describe();
  EXPECT_NE(fits.describe().find("pinned to CPUs"), std::string::npos) << fits.describe();
  HostAdamPool crowded(static_cast<int>(std::thread::hardware_concurrency()) + 3, true);
  EXPECT_FALSE(crowded.pinned()) << crowded.describe();
  HostAdamPool asked_not(1, false);
  EXPECT_FALSE(asked_not.pinned());
  HostAdamPool all;
  EXPECT_GE(all.threads(), 1);
}

}  // namespace
}  // namespace tiermem::exec
