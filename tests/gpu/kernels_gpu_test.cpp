// The GPU's kernels against the CPU's (suite gpu; exits 77 where no CUDA
// device is).
//
// The embedding gradient (executor/cuda/kernels.cu: the ids sorted, a block
// per table row) gives the CPU's bits: each row's tokens summed in token
// order; a few ids holding most tokens, as text has.
//
// Causal attention with --precision bf16: the tiled kernels (executor/cuda/
// flash_attention.cu) against the CPU's (executor/kernels.cpp, fp32) on
// random q, k, v and dY, forward and gradient, for every head width with a
// kernel (16 to 128), lengths that are and are not a multiple of the 64-row
// tile, grouped-query heads and an accumulated gradient; the batched GEMMs
// of the same compute (TIERMEM_FLASH=0, fp32) printed beside them. Two
// runs give the same bits (no atomics).
#include <cuda_runtime_api.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "executor/compute.hpp"
#include "executor/kernels.hpp"
#include "tests/support/relative_error.hpp"

namespace tiermem::exec {
namespace {

struct Case {
  int64_t seqs, t, d, heads, kv_heads;
};

using tiermem::test::relative_error;

struct Outputs {
  std::vector<float> y, dqkv;
};

// One forward and gradient on `compute` (bf16), dqkv starting at `start`
// (accumulated into when `accumulate`).
Outputs run(Compute& c, bool tiles, const Case& k, const std::vector<float>& qkv, const std::vector<float>& dy,
            const std::vector<float>& start, bool accumulate) {
  setenv("TIERMEM_FLASH", tiles ? "1" : "0", 1);  // read as the calls are made (kernels::tiled_attention_fits)
  const int64_t m = k.seqs * k.t;
  auto put = [&](const std::vector<float>& v) {
    void* p = c.device_buffer(v.size() * 4);
    c.copy(p, v.data(), v.size() * 4);
    return static_cast<float*>(p);
  };
  float* dqkv_in = put(qkv);
  float* ddy = put(dy);
  float* ddqkv = put(start);
  auto* y = static_cast<float*>(c.device_buffer(static_cast<size_t>(m * k.d) * 4));
  auto* probs = static_cast<float*>(c.device_buffer(static_cast<size_t>(m * k.heads * k.t) * 4));
  c.attention(dqkv_in, y, probs, m, k.d, k.heads, k.kv_heads, k.t, 0.0f, 0);
  c.attention_grad(dqkv_in, probs, ddy, ddqkv, m, k.d, k.heads, k.kv_heads, k.t, 0.0f, 0, accumulate);
  Outputs out{std::vector<float>(static_cast<size_t>(m * k.d)), std::vector<float>(start.size())};
  c.copy(out.y.data(), y, out.y.size() * 4);
  c.copy(out.dqkv.data(), ddqkv, out.dqkv.size() * 4);
  EXPECT_TRUE(c.sync().ok()) << c.sync().message();
  return out;
}

std::unique_ptr<Compute> bf16_compute(int64_t max_operand) {
  auto c = make_compute("cuda");
  EXPECT_TRUE(c.ok()) << c.status().message();
  if (!c.ok()) return nullptr;
  EXPECT_TRUE((*c)->set_precision(Precision::bf16, max_operand).ok());
  return std::move(*c);
}

TEST(FlashAttentionTest, ForwardAndGradientFollowTheCpuWithinBf16Rounding) {
  const std::vector<Case> cases = {
      {8, 32, 64, 4, 4},      // dh 16: gpt_tiny's shape
      {3, 100, 128, 4, 4},    // dh 32, a length past one tile and not a multiple of it
      {4, 256, 384, 6, 6},    // dh 64: nanoGPT's character-level recipe, fewer sequences
      {2, 200, 256, 2, 2},    // dh 128
      {2, 130, 256, 8, 2},    // grouped-query: 4 query heads a key/value head
      {2, 70, 96, 4, 4},      // dh 24: no kernel, the batched GEMMs
  };
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  for (const Case& k : cases) {
    SCOPED_TRACE("seqs " + std::to_string(k.seqs) + " t " + std::to_string(k.t) + " d " + std::to_string(k.d) +
                 " heads " + std::to_string(k.heads) + "/" + std::to_string(k.kv_heads));
    const int64_t m = k.seqs * k.t, dkv = k.d / k.heads * k.kv_heads, ld = k.d + 2 * dkv;
    std::vector<float> qkv(static_cast<size_t>(m * ld)), dy(static_cast<size_t>(m * k.d));
    for (auto& v : qkv) v = 2.0f * uni(rng);  // logits up to several units: a peaked softmax too
    for (auto& v : dy) v = uni(rng);
    std::vector<float> start(qkv.size());
    for (auto& v : start) v = uni(rng);

    // The CPU (fp32): the reference, and the accumulated one.
    std::vector<float> y(static_cast<size_t>(m * k.d)), probs(static_cast<size_t>(m * k.heads * k.t));
    std::vector<float> dqkv(qkv.size()), dqkv_acc = start;
    kernels::attention(qkv.data(), y.data(), probs.data(), m, k.d, k.heads, k.kv_heads, k.t, 0.0f, 0);
    std::vector<float> probs2 = probs;
    kernels::attention_grad(qkv.data(), probs.data(), dy.data(), dqkv.data(), m, k.d, k.heads, k.kv_heads, k.t, 0.0f,
                            0, false);
    kernels::attention_grad(qkv.data(), probs2.data(), dy.data(), dqkv_acc.data(), m, k.d, k.heads, k.kv_heads, k.t,
                            0.0f, 0, true);

    auto c = bf16_compute(m * ld);
    ASSERT_TRUE(c);
    const Outputs g = run(*c, false, k, qkv, dy, start, false);
    const Outputs f = run(*c, true, k, qkv, dy, start, false);
    const double gy = relative_error(g.y, y), gd = relative_error(g.dqkv, dqkv);
    const double fy = relative_error(f.y, y), fd = relative_error(f.dqkv, dqkv);
    std::printf("t %ld dh %ld heads %ld/%ld: y %.2e (GEMMs %.2e), dqkv %.2e (GEMMs %.2e)\n",
                static_cast<long>(k.t), static_cast<long>(k.d / k.heads), static_cast<long>(k.heads),
                static_cast<long>(k.kv_heads), fy, gy, fd, gd);
    // bf16 operands (q, k, v, P, dO, dS: 2^-9 relative each) with fp32
    // sums: 2.5e-3 to 2.9e-3 (y) and 3.6e-3 to 3.8e-3 (dqkv) on an H100,
    // against 1e-7 for the batched fp32 GEMMs; with room.
    setenv("TIERMEM_FLASH", "1", 1);
    if (kernels::tiled_attention_fits(k.d, k.heads, k.t)) {
      EXPECT_NE(f.y, g.y) << "the tiles did not run";
    }
    EXPECT_LT(fy, 6e-3);
    EXPECT_LT(fd, 8e-3);
    const Outputs again = run(*c, true, k, qkv, dy, start, false);
    EXPECT_EQ(again.y, f.y) << "a second run gave other bits";
    EXPECT_EQ(again.dqkv, f.dqkv) << "a second run gave other bits";
    const Outputs acc = run(*c, true, k, qkv, dy, start, true);
    EXPECT_LT(relative_error(acc.dqkv, dqkv_acc), 8e-3) << "accumulated into dqkv";
  }
}

TEST(SequenceKernelsTest, EmbeddingGradientIsTheCpusBitsWithTheTokensSortedById) {
  struct Shape {
    int64_t m, d, vocab;
  };
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  for (const Shape& k : {Shape{8192, 768, 50304}, Shape{16384, 384, 256}, Shape{1000, 300, 5000}, Shape{7, 33, 3}}) {
    SCOPED_TRACE("m " + std::to_string(k.m) + " d " + std::to_string(k.d) + " vocab " + std::to_string(k.vocab));
    // Ids as text has them: a third of the tokens one id, a third a few
    // dozen, the rest anywhere (most rows of a large vocabulary get none).
    std::vector<int32_t> ids(static_cast<size_t>(k.m));
    for (auto& id : ids) {
      const uint32_t r = rng();
      id = static_cast<int32_t>(r % 3 == 0 ? k.vocab / 2 : (r % 3 == 1 ? (r >> 2) % std::min<int64_t>(40, k.vocab)
                                                                        : (r >> 2) % k.vocab));
    }
    std::vector<float> dy(static_cast<size_t>(k.m * k.d)), start(static_cast<size_t>(k.vocab * k.d));
    for (auto& v : dy) v = uni(rng);
    for (auto& v : start) v = uni(rng);
    std::vector<float> want(start.size()), want_acc = start;
    kernels::embedding_grad(ids.data(), dy.data(), want.data(), k.m, k.d, k.vocab, false);
    kernels::embedding_grad(ids.data(), dy.data(), want_acc.data(), k.m, k.d, k.vocab, true);

    auto made = make_compute("cuda");
    ASSERT_TRUE(made.ok()) << made.status().message();
    Compute& c = **made;
    auto* dids = static_cast<int32_t*>(c.device_buffer(ids.size() * 4));
    auto* ddy = static_cast<float*>(c.device_buffer(dy.size() * 4));
    auto* table = static_cast<float*>(c.device_buffer(start.size() * 4));
    c.copy(dids, ids.data(), ids.size() * 4);
    c.copy(ddy, dy.data(), dy.size() * 4);
    std::vector<float> got(start.size());
    c.embedding_grad(dids, ddy, table, k.m, k.d, k.vocab, false);  // the first call makes the sort's room
    ASSERT_TRUE(c.sync().ok());
    const auto t0 = std::chrono::steady_clock::now();
    c.embedding_grad(dids, ddy, table, k.m, k.d, k.vocab, false);
    ASSERT_TRUE(c.sync().ok()) << c.sync().message();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    c.copy(got.data(), table, got.size() * 4);
    EXPECT_EQ(got, want) << "not the CPU's bits";
    c.copy(table, start.data(), start.size() * 4);
    c.embedding_grad(dids, ddy, table, k.m, k.d, k.vocab, true);
    c.copy(got.data(), table, got.size() * 4);
    ASSERT_TRUE(c.sync().ok());
    // Accumulated: the start plus the row's sum (the CPU adds each token to
    // the start in turn): within fp32 rounding.
    EXPECT_LT(relative_error(got, want_acc), 1e-6);
    std::printf("embedding gradient m %ld d %ld vocab %ld: %.3f ms\n", static_cast<long>(k.m), static_cast<long>(k.d),
                static_cast<long>(k.vocab), ms);
  }
}

}  // namespace
}  // namespace tiermem::exec

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "no CUDA device: skipped\n");
    return 77;
  }
  // The plugin beside tiermem-exec ($TIERMEM_EXEC on the device machine), or the build tree's.
  if (std::getenv("TIERMEM_EXEC_CUDA") == nullptr) {
    const char* exec = std::getenv("TIERMEM_EXEC");
    const char* root = std::getenv("TIERMEM_BUILD_ROOT");
    const std::string dir = exec != nullptr ? std::filesystem::path(exec).parent_path().string()
                                            : std::string(root != nullptr ? root : ".") + "/executor";
    setenv("TIERMEM_EXEC_CUDA", (dir + "/libtiermem-exec-cuda.so").c_str(), 1);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
