// Every op's gradient against finite differences of the loss.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <algorithm>
#include <vector>

#include "executor/compute.hpp"
#include "executor/graph.hpp"
#include "executor/interpreter.hpp"

namespace tiermem::exec {
namespace {

struct Buffers {
  std::vector<std::vector<float>> data;
  void* operator()(int t) { return data[t].data(); }
};

Buffers allocate(const Graph& g, uint64_t seed) {
  Buffers b;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  for (const Tensor& t : g.tensors) {
    b.data.emplace_back(static_cast<size_t>(t.elements()), 0.0f);
    auto& v = b.data.back();
    if (t.role == Role::input || t.role == Role::param) {
      for (auto& x : v) x = u(rng);
    }
    if (t.role == Role::label || (t.role == Role::input && t.dtype == DType::i32)) {
      const int64_t classes = 5;
      for (auto& x : v) {
        const int32_t label = static_cast<int32_t>(rng() % classes);
        std::memcpy(&x, &label, 4);
      }
    }
  }
  return b;
}

float forward(const Graph& g, Buffers& b) {
  float loss = 0;
  for (int i : g.ops_of(Phase::forward)) {
    auto r = run_op(g, g.ops[i], std::ref(b));
    if (g.ops[i].kind == proto::SOFTMAX_CROSS_ENTROPY) loss = r.loss;
  }
  return loss;
}

void check_gradients(const std::string& text) {
  auto parsed = parse_model(text, "gradcheck");
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  Graph g = std::move(parsed).value();
  ASSERT_TRUE(add_training(g, 1.0f).ok());
  Buffers b = allocate(g, 7);
  forward(g, b);
  for (int i : g.ops_of(Phase::backward)) run_op(g, g.ops[i], std::ref(b));
  int checked = 0;
  for (int p : g.params()) {
    const int grad = g.tensors[p].grad;
    ASSERT_GE(grad, 0);
    auto& w = b.data[p];
    for (size_t i = 0; i < w.size(); i += std::max<size_t>(1, w.size() / 7)) {
      const float keep = w[i];
      const float eps = 1e-2f;
      w[i] = keep + eps;
      const double up = forward(g, b);
      w[i] = keep - eps;
      const double down = forward(g, b);
      w[i] = keep;
      const double numeric = (up - down) / (2 * eps);
      const double analytic = b.data[grad][i];
      EXPECT_NEAR(analytic, numeric, 2e-3 + 2e-2 * std::abs(numeric))
          << g.tensors[p].name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 10);
}

TEST(AutodiffTest, MatmulBiasReluSoftmaxCrossEntropy) {
  check_gradients(R"(
name: "g" micro_batch: 6
tensor { name: "x" shape: [6, 4] role: INPUT }
tensor { name: "y" shape: [6] role: LABEL dtype: I32 }
tensor { name: "w1" shape: [4, 8] role: PARAM }
tensor { name: "b1" shape: [8] role: PARAM }
tensor { name: "w2" shape: [8, 5] role: PARAM }
op { name: "fc1" type: MATMUL input: ["x", "w1"] output: "h" }
op { name: "b" type: BIAS_ADD input: ["h", "b1"] output: "z" }
op { name: "r" type: RELU input: "z" output: "a" }
op { name: "fc2" type: MATMUL input: ["a", "w2"] output: "logits" }
op { name: "loss" type: SOFTMAX_CROSS_ENTROPY input: ["logits", "y"] output: "l" }
loss: "l" optimizer { type: SGD learning_rate: 0.1 })");
}

TEST(AutodiffTest, Silu) {
  // An op of the element-wise family (elementwise_math.hpp, unary_op_specs).
  check_gradients(R"(
name: "g" micro_batch: 6
tensor { name: "x" shape: [6, 4] role: INPUT }
tensor { name: "y" shape: [6] role: LABEL dtype: I32 }
tensor { name: "w1" shape: [4, 8] role: PARAM }
tensor { name: "w2" shape: [8, 5] role: PARAM }
op { name: "fc1" type: MATMUL input: ["x", "w1"] output: "h" }
op { name: "act" type: SILU input: "h" output: "a" }
op { name: "fc2" type: MATMUL input: ["a", "w2"] output: "logits" }
op { name: "loss" type: SOFTMAX_CROSS_ENTROPY input: ["logits", "y"] output: "l" }
loss: "l" optimizer { type: ADAM learning_rate: 0.01 })");
}

TEST(AutodiffTest, LayerNormGeluResidualAdd) {
  // "e" feeds two ops (layer norm and the residual): its gradient sums both.
  check_gradients(R"(
name: "g" micro_batch: 5
tensor { name: "x" shape: [5, 4] role: INPUT }
tensor { name: "y" shape: [5] role: LABEL dtype: I32 }
tensor { name: "w0" shape: [4, 6] role: PARAM }
tensor { name: "g1" shape: [6] role: PARAM }
tensor { name: "b1" shape: [6] role: PARAM }
tensor { name: "w1" shape: [6, 6] role: PARAM }
tensor { name: "w2" shape: [6, 5] role: PARAM }
op { name: "embed" type: MATMUL input: ["x", "w0"] output: "e" }
op { name: "ln" type: LAYER_NORM input: ["e", "g1", "b1"] output: "n" }
op { name: "fc" type: MATMUL input: ["n", "w1"] output: "u" }
op { name: "gelu" type: GELU input: "u" output: "a" }
op { name: "res" type: ADD input: ["e", "a"] output: "r" }
op { name: "head" type: MATMUL input: ["r", "w2"] output: "logits" }
op { name: "loss" type: SOFTMAX_CROSS_ENTROPY input: ["logits", "y"] output: "l" }
loss: "l" optimizer { type: ADAM learning_rate: 0.01 })");
}

TEST(AutodiffTest, ExactGeluAndALayerNormWithoutBeta) {
  // nanoGPT's MLP activation (nn.GELU(), erf) and its bias=False layer norm:
  // LAYER_NORM with two inputs has no beta, and its gradient op no dbeta.
  check_gradients(R"(
name: "g" micro_batch: 5
tensor { name: "x" shape: [5, 4] role: INPUT }
tensor { name: "y" shape: [5] role: LABEL dtype: I32 }
tensor { name: "w0" shape: [4, 6] role: PARAM }
tensor { name: "g1" shape: [6] role: PARAM }
tensor { name: "w1" shape: [6, 6] role: PARAM }
tensor { name: "w2" shape: [6, 5] role: PARAM }
op { name: "embed" type: MATMUL input: ["x", "w0"] output: "e" }
op { name: "ln" type: LAYER_NORM input: ["e", "g1"] output: "n" }
op { name: "fc" type: MATMUL input: ["n", "w1"] output: "u" }
op { name: "gelu" type: GELU_EXACT input: "u" output: "a" }
op { name: "res" type: ADD input: ["e", "a"] output: "r" }
op { name: "head" type: MATMUL input: ["r", "w2"] output: "logits" }
op { name: "loss" type: SOFTMAX_CROSS_ENTROPY input: ["logits", "y"] output: "l" }
loss: "l" optimizer { type: ADAM learning_rate: 0.01 })");
}

TEST(AutodiffTest, AHeadTiedToTheEmbeddingIsOneParameterWhoseGradientSumsBothUses) {
  // nanoGPT's lm_head.weight = wte.weight: the table [V,D] is read by the
  // embedding and, transposed, by the head (MATMUL_NT); its gradient is the
  // sum of both (checked numerically through the one tensor).
  check_gradients(R"(
name: "g" micro_batch: 2
tensor { name: "ids" shape: [8] role: INPUT dtype: I32 }
tensor { name: "next" shape: [8] role: LABEL dtype: I32 }
tensor { name: "wte" shape: [11, 6] role: PARAM }
tensor { name: "g1" shape: [6] role: PARAM }
op { name: "tok" type: EMBEDDING input: ["ids", "wte"] output: "e" }
op { name: "ln" type: LAYER_NORM input: ["e", "g1"] output: "n" }
op { name: "head" type: MATMUL_NT input: ["n", "wte"] output: "logits" }
op { name: "loss" type: SOFTMAX_CROSS_ENTROPY input: ["logits", "next"] output: "l" }
loss: "l" optimizer { type: ADAM learning_rate: 0.01 })");
}

// A Llama block and its head (the test below, and checkpointing's).
constexpr const char* k_llama_block = R"(
name: "llama" micro_batch: 2
tensor { name: "ids" shape: [8] role: INPUT dtype: I32 }
tensor { name: "y" shape: [8] role: LABEL dtype: I32 }
tensor { name: "tok" shape: [5, 8] role: PARAM }
tensor { name: "w1" shape: [8] role: PARAM }
tensor { name: "wqkv" shape: [8, 16] role: PARAM }
tensor { name: "wo" shape: [8, 8] role: PARAM }
tensor { name: "w2" shape: [8] role: PARAM }
tensor { name: "wg" shape: [8, 6] role: PARAM }
tensor { name: "wu" shape: [8, 6] role: PARAM }
tensor { name: "wd" shape: [6, 8] role: PARAM }
tensor { name: "head" shape: [8, 5] role: PARAM }
op { name: "emb" type: EMBEDDING input: ["ids", "tok"] output: "e" }
op { name: "n1" type: RMS_NORM input: ["e", "w1"] output: "n" epsilon: 1e-6 }
op { name: "qkv" type: MATMUL input: ["n", "wqkv"] output: "q" }
op { name: "rot" type: ROTARY input: ["q"] output: "r" heads: 2 kv_heads: 1 context: 4 theta: 10000 }
op { name: "att" type: CAUSAL_ATTENTION input: ["r"] output: "a" heads: 2 kv_heads: 1 context: 4 }
op { name: "proj" type: MATMUL input: ["a", "wo"] output: "o" }
op { name: "res" type: ADD input: ["e", "o"] output: "h" }
op { name: "n2" type: RMS_NORM input: ["h", "w2"] output: "m" }
op { name: "gate" type: MATMUL input: ["m", "wg"] output: "g" }
op { name: "act" type: SILU input: ["g"] output: "s" }
op { name: "up" type: MATMUL input: ["m", "wu"] output: "u" }
op { name: "prod" type: MUL input: ["s", "u"] output: "p" }
op { name: "down" type: MATMUL input: ["p", "wd"] output: "dn" }
op { name: "res2" type: ADD input: ["h", "dn"] output: "z" }
op { name: "out" type: MATMUL input: ["z", "head"] output: "logits" }
op { name: "loss" type: SOFTMAX_CROSS_ENTROPY input: ["logits", "y"] output: "l" }
loss: "l" optimizer { type: ADAM learning_rate: 0.01 })";

TEST(AutodiffTest, ALlamaBlockRmsNormRotaryGroupedQueryAttentionAndSwiGlu) {
  // Llama's parts: RMS_NORM, rotary positions on the query and key heads,
  // attention with 2 query heads sharing 1 key/value head, and SwiGLU
  // (MUL of silu(gate) and up).
  check_gradients(k_llama_block);
}

TEST(AutodiffTest, ConcatOfColumnBlocks) {
  // Three column blocks of one layer, of uneven widths (as split_for_balance
  // makes them), joined by a CONCAT: each block gets its slice of dY, and the
  // gradient of their shared input "e" sums what flows back from all three
  // (checked through w0).
  check_gradients(R"(
name: "g" micro_batch: 6
tensor { name: "x" shape: [6, 4] role: INPUT }
tensor { name: "y" shape: [6] role: LABEL dtype: I32 }
tensor { name: "w0" shape: [4, 4] role: PARAM }
tensor { name: "wa" shape: [4, 3] role: PARAM }
tensor { name: "wb" shape: [4, 2] role: PARAM }
tensor { name: "wc" shape: [4, 1] role: PARAM }
tensor { name: "b" shape: [6] role: PARAM }
tensor { name: "w2" shape: [6, 5] role: PARAM }
op { name: "in" type: MATMUL input: ["x", "w0"] output: "e" }
op { name: "fa" type: MATMUL input: ["e", "wa"] output: "ha" }
op { name: "fb" type: MATMUL input: ["e", "wb"] output: "hb" }
op { name: "fc" type: MATMUL input: ["e", "wc"] output: "hc" }
op { name: "cat" type: CONCAT input: ["ha", "hb", "hc"] output: "h" }
op { name: "bias" type: BIAS_ADD input: ["h", "b"] output: "z" }
op { name: "act" type: GELU input: "z" output: "a" }
op { name: "head" type: MATMUL input: ["a", "w2"] output: "logits" }
op { name: "loss" type: SOFTMAX_CROSS_ENTROPY input: ["logits", "y"] output: "l" }
loss: "l" optimizer { type: SGD learning_rate: 0.1 })");
}

TEST(AutodiffTest, EmbeddingsAndCausalSelfAttention) {
  // A GPT block on 2 sequences of 4 tokens: token and position embeddings,
  // layer norm, q/k/v in one matmul, 2 heads of causal attention, the
  // projection, the residual, a head over a vocabulary of 5.
  check_gradients(R"(
name: "gpt" micro_batch: 2
tensor { name: "ids" shape: [8] role: INPUT dtype: I32 }
tensor { name: "y" shape: [8] role: LABEL dtype: I32 }
tensor { name: "tok" shape: [5, 6] role: PARAM }
tensor { name: "pos" shape: [4, 6] role: PARAM }
tensor { name: "g1" shape: [6] role: PARAM }
tensor { name: "b1" shape: [6] role: PARAM }
tensor { name: "wqkv" shape: [6, 18] role: PARAM }
tensor { name: "wo" shape: [6, 6] role: PARAM }
tensor { name: "head" shape: [6, 5] role: PARAM }
op { name: "emb" type: EMBEDDING input: ["ids", "tok"] output: "e" }
op { name: "pe" type: POSITION_EMBEDDING input: ["e", "pos"] output: "x" }
op { name: "ln" type: LAYER_NORM input: ["x", "g1", "b1"] output: "n" }
op { name: "qkv" type: MATMUL input: ["n", "wqkv"] output: "q" }
op { name: "att" type: CAUSAL_ATTENTION input: ["q"] output: "a" heads: 2 context: 4 }
op { name: "proj" type: MATMUL input: ["a", "wo"] output: "o" }
op { name: "res" type: ADD input: ["x", "o"] output: "r" }
op { name: "out" type: MATMUL input: ["r", "head"] output: "logits" }
op { name: "loss" type: SOFTMAX_CROSS_ENTROPY input: ["logits", "y"] output: "l" }
loss: "l" optimizer { type: ADAM learning_rate: 0.01 })");
}

TEST(AutodiffTest, SequenceOpsRefuseWhatDoesNotFit) {
  const std::string head = R"(name: "bad" micro_batch: 2
tensor { name: "ids" shape: [8] role: INPUT dtype: I32 }
tensor { name: "y" shape: [8] role: LABEL dtype: I32 }
tensor { name: "tok" shape: [5, 6] role: PARAM }
tensor { name: "pos" shape: [3, 6] role: PARAM }
op { name: "emb" type: EMBEDDING input: ["ids", "tok"] output: "e" }
)";
  const std::string tail = R"(op { name: "loss" type: SOFTMAX_CROSS_ENTROPY input: ["z", "y"] output: "l" }
loss: "l" optimizer { type: SGD learning_rate: 0.1 })";
  const struct {
    std::string ops, message;
  } cases[] = {
      {R"(op { name: "pe" type: POSITION_EMBEDDING input: ["e", "pos"] output: "z" })",
       "a number of rows (the context) that divides its rows"},
      {R"(op { name: "att" type: CAUSAL_ATTENTION input: ["e"] output: "z" heads: 4 context: 4 })",
       "side by side: 4 query heads and 4 key and value heads of one width"},
      {R"(op { name: "att" type: CAUSAL_ATTENTION input: ["e"] output: "z" heads: 3 kv_heads: 2 context: 4 })",
       "heads (3) must be positive and a multiple of kv_heads (2)"},
      {R"(op { name: "rot" type: ROTARY input: ["e"] output: "z" heads: 2 context: 4 theta: 10000 })",
       "heads of 1 columns: rotary positions turn pairs"},
      {R"(op { name: "rot" type: ROTARY input: ["e"] output: "z" heads: 1 context: 4 })",
       "theta (0.000000) must be above 1"},
      {R"(op { name: "act" type: RELU input: ["e"] output: "z" theta: 10000 })", "only ROTARY takes theta"},
      {R"(op { name: "att" type: CAUSAL_ATTENTION input: ["e"] output: "z" heads: 1 context: 3 })",
       "context (3) must divide the rows"},
      {R"(op { name: "att" type: RELU input: ["e"] output: "z" heads: 1 })", "only CAUSAL_ATTENTION and ROTARY take heads"},
      {R"(op { name: "e2" type: EMBEDDING input: ["e", "tok"] output: "z" })", "must be I32 token ids"},
  };
  for (const auto& c : cases) {
    auto g = parse_model(head + c.ops + "\n" + tail, "bad");
    ASSERT_FALSE(g.ok()) << c.ops;
    EXPECT_NE(g.status().message().find(c.message), std::string::npos) << g.status().to_string();
  }
}

TEST(AutodiffTest, OptimizersMatchTheirDefinitions) {
  // One SGD-momentum and one Adam step on known numbers (PyTorch's formulas).
  auto g = parse_model(R"(
name: "o" micro_batch: 1
tensor { name: "x" shape: [1, 1] role: INPUT }
tensor { name: "y" shape: [1] role: LABEL dtype: I32 }
tensor { name: "w" shape: [1, 2] role: PARAM }
op { name: "fc" type: MATMUL input: ["x", "w"] output: "logits" }
op { name: "loss" type: SOFTMAX_CROSS_ENTROPY input: ["logits", "y"] output: "l" }
loss: "l" optimizer { type: SGD learning_rate: 0.5 momentum: 0.9 })", "o");
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE(add_training(*g, 1.0f).ok());
  const Op& update = g->ops[g->ops_of(Phase::update).front()];
  std::vector<float> w{1, 2}, grad{0.1f, -0.2f}, vel{0, 0};
  std::vector<void*> mem(g->tensors.size());
  mem[update.in[0]] = w.data();
  mem[update.in[1]] = grad.data();
  mem[update.in[2]] = vel.data();
  run_op(*g, update, [&](int t) { return mem[t]; });
  EXPECT_FLOAT_EQ(w[0], 1 - 0.5f * 0.1f);
  run_op(*g, update, [&](int t) { return mem[t]; });
  EXPECT_FLOAT_EQ(vel[0], 0.9f * 0.1f + 0.1f);
  EXPECT_FLOAT_EQ(w[0], 1 - 0.5f * 0.1f - 0.5f * (0.9f * 0.1f + 0.1f));
}

TEST(AutodiffTest, AdamWDecaysOnlyItsGroupAtTheScheduledLearningRate) {
  // AdamW (decoupled weight decay, PyTorch's AdamW), a parameter in the
  // no-decay group, and nanoGPT's schedule (warm-up 2 steps, cosine to
  // min_learning_rate at step 6): each update against the formulas by hand.
  auto g = parse_model(R"(
name: "o" micro_batch: 1
tensor { name: "x" shape: [1, 1] role: INPUT }
tensor { name: "y" shape: [1] role: LABEL dtype: I32 }
tensor { name: "w" shape: [1, 2] role: PARAM }
tensor { name: "b" shape: [2] role: PARAM no_weight_decay: true }
op { name: "fc" type: MATMUL input: ["x", "w"] output: "h" }
op { name: "bias" type: BIAS_ADD input: ["h", "b"] output: "logits" }
op { name: "loss" type: SOFTMAX_CROSS_ENTROPY input: ["logits", "y"] output: "l" }
loss: "l" optimizer { type: ADAMW learning_rate: 0.1 beta1: 0.9 beta2: 0.99 epsilon: 1e-8 weight_decay: 0.5
                      warmup_steps: 2 decay_steps: 6 min_learning_rate: 0.01 })", "o");
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  ASSERT_TRUE(add_training(*g, 1.0f).ok());
  const auto lr_at = [](int64_t step) {  // nanoGPT's get_lr(step - 1)
    const int64_t it = step - 1;
    if (it < 2) return 0.1 * (it + 1) / 3.0;
    if (it > 6) return 0.01;
    return 0.01 + 0.5 * (1 + std::cos(M_PI * (it - 2) / 4.0)) * (0.1 - 0.01);
  };
  for (const int u : g->ops_of(Phase::update)) {
    const Op& update = g->ops[u];
    const bool decays = g->tensors[update.origin].name == "w";
    std::vector<float> p{1, 2}, grad{0.1f, -0.2f}, m{0, 0}, v{0, 0};
    std::vector<void*> mem(g->tensors.size());
    mem[update.in[0]] = p.data();
    mem[update.in[1]] = grad.data();
    mem[update.in[2]] = m.data();
    mem[update.in[3]] = v.data();
    double want = 1, mm = 0, vv = 0;
    for (int64_t step = 1; step <= 9; ++step) {
      run_op(*g, update, [&](int t) { return mem[t]; }, false, step);
      const double lr = lr_at(step);
      if (decays) want *= 1 - lr * 0.5;
      mm = 0.9 * mm + 0.1 * 0.1;
      vv = 0.99 * vv + 0.01 * 0.01;
      want -= lr / (1 - std::pow(0.9, step)) * mm / (std::sqrt(vv) / std::sqrt(1 - std::pow(0.99, step)) + 1e-8);
      EXPECT_NEAR(p[0], want, 1e-5) << g->tensors[update.origin].name << " step " << step;
    }
  }
  // What does not fit is refused, naming it.
  for (const auto& [fields, why] : std::vector<std::pair<std::string, std::string>>{
           {"warmup_steps: 5 decay_steps: 3", "decay_steps (3) must be past warmup_steps (5)"},
           {"min_learning_rate: 0.5", "min_learning_rate must be in [0, learning_rate]"},
           {"min_learning_rate: 0.01", "min_learning_rate needs decay_steps"}}) {
    auto bad = parse_model(R"(name: "o" micro_batch: 1
tensor { name: "x" shape: [1, 1] role: INPUT }
tensor { name: "y" shape: [1] role: LABEL dtype: I32 }
tensor { name: "w" shape: [1, 2] role: PARAM }
op { name: "fc" type: MATMUL input: ["x", "w"] output: "logits" }
op { name: "loss" type: SOFTMAX_CROSS_ENTROPY input: ["logits", "y"] output: "l" }
loss: "l" optimizer { type: ADAMW learning_rate: 0.1 )" + fields + " }", "o");
    ASSERT_FALSE(bad.ok()) << fields;
    EXPECT_NE(bad.status().message().find(why), std::string::npos) << bad.status().to_string();
  }
}

TEST(AutodiffTest, AnUpdateOutOfPlaceLeavesTheCommittedCopyAndMatchesInPlace) {
  // The trainer's optimizer reads the committed parameters and state and
  // writes the next copy: the committed copy must stay as it was (a crash
  // mid-update resumes from it), and the result must be the in-place bits.
  for (const char* optimizer : {"type: SGD learning_rate: 0.5 momentum: 0.9 weight_decay: 0.01",
                                "type: ADAM learning_rate: 0.01 weight_decay: 0.01"}) {
    auto g = parse_model(std::string(R"(
name: "o" micro_batch: 1
tensor { name: "x" shape: [1, 1] role: INPUT }
tensor { name: "y" shape: [1] role: LABEL dtype: I32 }
tensor { name: "w" shape: [1, 3] role: PARAM }
op { name: "fc" type: MATMUL input: ["x", "w"] output: "logits" }
op { name: "loss" type: SOFTMAX_CROSS_ENTROPY input: ["logits", "y"] output: "l" }
loss: "l" optimizer { )") + optimizer + " }",
                         "o");
    ASSERT_TRUE(g.ok());
    ASSERT_TRUE(add_training(*g, 1.0f).ok());
    const Op& update = g->ops[g->ops_of(Phase::update).front()];
    const std::vector<float> committed_w{1, -2, 0.5f}, grad{0.1f, -0.2f, 0.3f}, committed_state{0.2f, 0.1f, 0.05f};
    std::vector<std::vector<float>> committed(g->tensors.size()), next(g->tensors.size()), in_place(g->tensors.size());
    for (size_t i = 0; i < update.in.size(); ++i) {
      const int t = update.in[i];
      committed[t] = i == 0 ? committed_w : i == 1 ? grad : committed_state;
      next[t] = i == 1 ? grad : std::vector<float>(3, -99.0f);  // garbage: every element must be written
      in_place[t] = committed[t];
    }
    auto cpu = make_cpu_compute();
    cpu->set_step(3);
    const TensorMemory from = [&](int t) -> void* { return committed[t].data(); };
    run_op(*cpu, *g, update, [&](int t) -> void* { return next[t].data(); }, false, &from);
    run_op(*cpu, *g, update, [&](int t) -> void* { return in_place[t].data(); });
    for (size_t i = 0; i < update.in.size(); ++i) {
      const int t = update.in[i];
      EXPECT_EQ(committed[t], i == 0 ? committed_w : i == 1 ? grad : committed_state) << optimizer << " input " << i;
      EXPECT_EQ(next[t], in_place[t]) << optimizer << " input " << i;
      if (i != 1) {
        EXPECT_NE(next[t], committed[t]) << optimizer << " input " << i;
      }
    }
  }
}

}  // namespace
}  // namespace tiermem::exec

namespace tiermem::exec {
namespace {

// Activation checkpointing (add_training's segments): the backward pass
// recomputes each segment's forward ops as "@recompute" clones, reads their
// outputs instead of the forward pass's, never runs the loss twice, keeps
// fewer forward activations for the backward pass, and gives every parameter
// gradient the bits of the graph without it.
TEST(AutodiffTest, CheckpointedSegmentsRecomputeTheirActivationsToTheSameBits) {
  auto parsed = parse_model(k_llama_block, "checkpointed");
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  Graph plain = *parsed, checkpointed = *parsed;
  ASSERT_TRUE(add_training(plain, 1.0f).ok());
  ASSERT_TRUE(add_training(checkpointed, 1.0f, 3).ok());
  auto kept = [](const Graph& g) {  // forward activations a backward-phase op reads
    std::set<int> out;
    for (int i : g.ops_of(Phase::backward)) {
      for (int t : g.ops[i].in) {
        const Tensor& tensor = g.tensors[t];
        if (tensor.role == Role::activation && tensor.producer >= 0 && g.ops[tensor.producer].phase == Phase::forward) {
          out.insert(t);
        }
      }
    }
    return out;
  };
  int clones = 0;
  for (const Op& op : checkpointed.ops) {
    if (!op.recompute) continue;
    ++clones;
    EXPECT_TRUE(op.name.ends_with("@recompute")) << op.name;
    EXPECT_EQ(op.phase, Phase::backward) << op.name;
    EXPECT_NE(op.kind, proto::SOFTMAX_CROSS_ENTROPY) << "the loss runs once";
    for (int t : op.out) EXPECT_EQ(checkpointed.tensors[t].producer, &op - checkpointed.ops.data()) << op.name;
  }
  EXPECT_GT(clones, 3);
  const std::set<int> plain_kept = kept(plain), checkpointed_kept = kept(checkpointed);
  EXPECT_LT(checkpointed_kept.size(), plain_kept.size());
  EXPECT_TRUE(std::includes(plain_kept.begin(), plain_kept.end(), checkpointed_kept.begin(), checkpointed_kept.end()));
  Buffers a = allocate(plain, 7), b = allocate(checkpointed, 7);
  const float loss_a = forward(plain, a), loss_b = forward(checkpointed, b);
  EXPECT_EQ(loss_a, loss_b);
  for (int i : plain.ops_of(Phase::backward)) run_op(plain, plain.ops[i], std::ref(a));
  for (int i : checkpointed.ops_of(Phase::backward)) run_op(checkpointed, checkpointed.ops[i], std::ref(b));
  const std::vector<int> params = plain.params();
  ASSERT_EQ(params, checkpointed.params());
  for (int p : params) {
    const int ga = plain.tensors[p].grad, gb = checkpointed.tensors[p].grad;
    ASSERT_GE(ga, 0);
    ASSERT_GE(gb, 0);
    EXPECT_EQ(0, std::memcmp(a.data[ga].data(), b.data[gb].data(), a.data[ga].size() * sizeof(float)))
        << "the gradient of " << plain.tensors[p].name;
  }
}

}  // namespace
}  // namespace tiermem::exec
