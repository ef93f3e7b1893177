// The scheme of the GPU's tiled attention (executor/cuda/flash_attention.cu)
// in plain C++, in fp32, against the CPU's kernels (executor/kernels.cpp):
// the forward pass over tiles of 64 keys with a running maximum and sum per
// row, saving only O and the row's log-sum-exp; the backward pass with
// D = rowsum(dO * O) in place of rowsum(P * dP), dK and dV summed per key
// tile over every query tile at or after it (of every query head of the
// key/value head's group), dQ per query tile over every key tile up to it.
// What it checks here is the arithmetic of the scheme (the CUDA kernels'
// tiles and their bf16 operands are checked on a GPU by
// tests/gpu/attention_gpu_test.cpp); kernels::tiled_attention_fits and
// tiled_attention_state too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <vector>

#include "executor/kernels.hpp"
#include "tests/support/relative_error.hpp"

namespace tiermem::exec {
namespace {

constexpr int64_t k_tile = 64;

struct Shape {
  int64_t seqs, t, d, heads, kv;
  int64_t dh() const { return d / heads; }
  int64_t dkv() const { return dh() * kv; }
  int64_t ld() const { return d + 2 * dkv(); }
  int64_t m() const { return seqs * t; }
};

float at(const std::vector<float>& qkv, const Shape& s, int64_t seq, int64_t row, int64_t col) {
  return qkv[static_cast<size_t>((seq * s.t + row) * s.ld() + col)];
}
float score(const std::vector<float>& qkv, const Shape& s, int64_t seq, int64_t h, int64_t i, int64_t j) {
  const int64_t g = h / (s.heads / s.kv);
  float dot = 0;
  for (int64_t c = 0; c < s.dh(); ++c) dot += at(qkv, s, seq, i, h * s.dh() + c) * at(qkv, s, seq, j, s.d + g * s.dh() + c);
  return dot / std::sqrt(static_cast<float>(s.dh()));
}

// Forward in key tiles: y, and lse[(seq * heads + h) * t + i].
void tiled_forward(const std::vector<float>& qkv, const Shape& s, std::vector<float>* y, std::vector<float>* lse) {
  const int64_t dh = s.dh();
  for (int64_t seq = 0; seq < s.seqs; ++seq) {
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t g = h / (s.heads / s.kv);
      for (int64_t i = 0; i < s.t; ++i) {
        float m = -std::numeric_limits<float>::infinity(), l = 0;
        std::vector<float> o(static_cast<size_t>(dh), 0.0f);
        for (int64_t k0 = 0; k0 <= i; k0 += k_tile) {
          float mx = -std::numeric_limits<float>::infinity();
          for (int64_t j = k0; j < std::min(k0 + k_tile, i + 1); ++j) mx = std::max(mx, score(qkv, s, seq, h, i, j));
          const float m_new = std::max(m, mx), alpha = std::exp(m - m_new);
          for (auto& v : o) v *= alpha;
          l *= alpha;
          for (int64_t j = k0; j < std::min(k0 + k_tile, i + 1); ++j) {
            const float p = std::exp(score(qkv, s, seq, h, i, j) - m_new);
            l += p;
            for (int64_t c = 0; c < dh; ++c) o[c] += p * at(qkv, s, seq, j, s.d + s.dkv() + g * dh + c);
          }
          m = m_new;
        }
        for (int64_t c = 0; c < dh; ++c) (*y)[static_cast<size_t>((seq * s.t + i) * s.d + h * dh + c)] = o[c] / l;
        (*lse)[static_cast<size_t>((seq * s.heads + h) * s.t + i)] = m + std::log(l);
      }
    }
  }
}

// Backward from O (y), lse and dy: dqkv.
void tiled_backward(const std::vector<float>& qkv, const Shape& s, const std::vector<float>& y,
                    const std::vector<float>& lse, const std::vector<float>& dy, std::vector<float>* dqkv) {
  const int64_t dh = s.dh(), group = s.heads / s.kv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  auto idx = [&](int64_t seq, int64_t row, int64_t col) { return static_cast<size_t>((seq * s.t + row) * s.ld() + col); };
  auto yd = [&](const std::vector<float>& v, int64_t seq, int64_t row, int64_t h, int64_t c) {
    return v[static_cast<size_t>((seq * s.t + row) * s.d + h * dh + c)];
  };
  std::vector<float> delta(static_cast<size_t>(s.seqs * s.heads * s.t));
  for (int64_t seq = 0; seq < s.seqs; ++seq) {
    for (int64_t h = 0; h < s.heads; ++h) {
      for (int64_t i = 0; i < s.t; ++i) {
        float sum = 0;
        for (int64_t c = 0; c < dh; ++c) sum += yd(dy, seq, i, h, c) * yd(y, seq, i, h, c);
        delta[static_cast<size_t>((seq * s.heads + h) * s.t + i)] = sum;
      }
    }
  }
  auto ds_of = [&](int64_t seq, int64_t h, int64_t i, int64_t j, float* p_out) {
    const int64_t g = h / group, row = (seq * s.heads + h) * s.t + i;
    const float p = std::exp(score(qkv, s, seq, h, i, j) - lse[static_cast<size_t>(row)]);
    float dp = 0;
    for (int64_t c = 0; c < dh; ++c) dp += yd(dy, seq, i, h, c) * qkv[idx(seq, j, s.d + s.dkv() + g * dh + c)];
    *p_out = p;
    return p * (dp - delta[static_cast<size_t>(row)]);
  };
  for (int64_t seq = 0; seq < s.seqs; ++seq) {
    // dK and dV: per key (its tile), over every query at or after it, of every head of the group.
    for (int64_t g = 0; g < s.kv; ++g) {
      for (int64_t j = 0; j < s.t; ++j) {
        for (int64_t h = g * group; h < (g + 1) * group; ++h) {
          for (int64_t i = j; i < s.t; ++i) {
            float p = 0;
            const float ds = ds_of(seq, h, i, j, &p);
            for (int64_t c = 0; c < dh; ++c) {
              (*dqkv)[idx(seq, j, s.d + s.dkv() + g * dh + c)] += p * yd(dy, seq, i, h, c);
              (*dqkv)[idx(seq, j, s.d + g * dh + c)] += scale * ds * qkv[idx(seq, i, h * dh + c)];
            }
          }
        }
      }
    }
    // dQ: per query, over every key up to it.
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < s.t; ++i) {
        for (int64_t j = 0; j <= i; ++j) {
          float p = 0;
          const float ds = ds_of(seq, h, i, j, &p);
          for (int64_t c = 0; c < dh; ++c) (*dqkv)[idx(seq, i, h * dh + c)] += scale * ds * qkv[idx(seq, j, s.d + g * dh + c)];
        }
      }
    }
  }
}

using tiermem::test::relative_error;

TEST(TiledAttentionTest, TheTilesSchemeGivesTheCpusAttentionAndGradient) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  for (const Shape& s : {Shape{2, 150, 64, 4, 4}, Shape{2, 70, 128, 8, 2}, Shape{1, 40, 64, 2, 1}}) {
    SCOPED_TRACE("t " + std::to_string(s.t) + " heads " + std::to_string(s.heads) + "/" + std::to_string(s.kv));
    std::vector<float> qkv(static_cast<size_t>(s.m() * s.ld())), dy(static_cast<size_t>(s.m() * s.d));
    for (auto& v : qkv) v = 2.0f * uni(rng);
    for (auto& v : dy) v = uni(rng);
    std::vector<float> y(dy.size()), probs(static_cast<size_t>(s.m() * s.heads * s.t)), dqkv(qkv.size());
    kernels::attention(qkv.data(), y.data(), probs.data(), s.m(), s.d, s.heads, s.kv, s.t, 0.0f, 0);
    kernels::attention_grad(qkv.data(), probs.data(), dy.data(), dqkv.data(), s.m(), s.d, s.heads, s.kv, s.t, 0.0f, 0,
                            false);
    std::vector<float> ty(dy.size()), lse(static_cast<size_t>(s.m() * s.heads)), tdqkv(qkv.size(), 0.0f);
    tiled_forward(qkv, s, &ty, &lse);
    tiled_backward(qkv, s, ty, lse, dy, &tdqkv);
    EXPECT_LT(relative_error(ty, y), 1e-5);
    EXPECT_LT(relative_error(tdqkv, dqkv), 1e-5);
  }
}

TEST(TiledAttentionTest, OnlyHeadWidthsWithAKernelAndRoomForTheStateFit) {
  setenv("TIERMEM_FLASH", "0", 1);
  EXPECT_FALSE(kernels::tiled_attention_fits(384, 6, 256)) << "on with TIERMEM_FLASH=0";
  unsetenv("TIERMEM_FLASH");
  EXPECT_TRUE(kernels::tiled_attention_fits(384, 6, 256));   // dh 64
  EXPECT_TRUE(kernels::tiled_attention_fits(64, 4, 32));     // dh 16, t 32 >= 18
  EXPECT_TRUE(kernels::tiled_attention_fits(1024, 8, 130));  // dh 128
  EXPECT_FALSE(kernels::tiled_attention_fits(96, 4, 70));    // dh 24: no kernel
  EXPECT_FALSE(kernels::tiled_attention_fits(512, 4, 129));  // dh 128, t < 130: the state would not fit
  EXPECT_FALSE(kernels::tiled_attention_fits(100, 3, 64));   // heads do not divide d
  EXPECT_EQ(kernels::tiled_attention_state(384, 6), 66);
}

}  // namespace
}  // namespace tiermem::exec
