// The op registry (executor/ops/): one spec per kind of the graph IR, with
// what each place of the executor asks of it, and model files held to it.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "executor/compute.hpp"
#include "executor/dropout_math.hpp"
#include "executor/elementwise_math.hpp"
#include "executor/graph.hpp"
#include "executor/ops/op_registry.hpp"

namespace tiermem::exec {
namespace {

TEST(OpRegistryTest, EveryKindOfTheIrHasOneSpecWithARuleForEachUse) {
  const auto* kinds = proto::OpType_descriptor();
  std::set<std::string> names;
  size_t kinds_seen = 0;
  for (int i = 0; i < kinds->value_count(); ++i) {
    const auto kind = static_cast<OpKind>(kinds->value(i)->number());
    if (kind == proto::OP_UNSPECIFIED) continue;
    ++kinds_seen;
    const OpSpec& spec = op_spec(kind);
    EXPECT_EQ(spec.kind, kind);
    EXPECT_TRUE(names.insert(std::string(spec.name)).second) << "two kinds are called " << spec.name;
    EXPECT_EQ(op_kind_name(kind), spec.name);
    EXPECT_NE(spec.run, nullptr) << spec.name;
    if (spec.model_inputs != -1) {
      // What a model file may name: a shape rule, FLOPs, a forward op.
      EXPECT_EQ(model_op_spec(kind), &spec);
      EXPECT_NE(spec.shape, nullptr) << spec.name;
      EXPECT_NE(spec.flops, nullptr) << spec.name;
      EXPECT_EQ(spec.phase, Phase::forward) << spec.name;
    } else {
      EXPECT_EQ(model_op_spec(kind), nullptr) << spec.name;
    }
  }
  EXPECT_EQ(all_op_specs().size(), kinds_seen);
}

TEST(OpRegistryTest, AModelFileNamingADerivedKindIsRefusedSayingWhy) {
  auto g = parse_model(R"(
name: "g" micro_batch: 2
tensor { name: "x" shape: [2, 4] role: INPUT }
op { name: "bad" type: MATMUL_GRAD_A input: ["x", "x"] output: "y" }
loss: "y")", "model.pbtxt");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), ErrorCode::config_error);
  EXPECT_NE(g.status().message().find("'bad' is of type MATMUL_GRAD_A, which the executor derives"), std::string::npos)
      << g.status().message();
}

TEST(OpRegistryTest, SiluAndItsDerivativeOnTheCpuAreTheFormula) {
  auto cpu = make_cpu_compute();
  std::vector<float> x(1000), y(1000), dy(1000, 1.0f), dx(1000, 0.5f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = -20.0f + 40.0f * static_cast<float>(i) / 999.0f;
  cpu->unary(elementwise::Unary::silu, x.data(), y.data(), static_cast<int64_t>(x.size()));
  cpu->unary_grad(elementwise::Unary::silu, x.data(), dy.data(), dx.data(), static_cast<int64_t>(x.size()), true);
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    const double s = 1 / (1 + std::exp(-v));
    EXPECT_NEAR(y[i], v * s, 1e-6 + 1e-5 * std::abs(v * s)) << v;
    const double h = 1e-3;
    const double numeric = ((v + h) / (1 + std::exp(-(v + h))) - (v - h) / (1 + std::exp(-(v - h)))) / (2 * h);
    EXPECT_NEAR(dx[i] - 0.5, numeric, 1e-4) << v;  // accumulated onto 0.5
  }
  EXPECT_STREQ(elementwise::unary_name(elementwise::Unary::silu), "silu");
}

TEST(OpRegistryTest, ExactGeluAndItsDerivativeOnTheCpuAreTheFormula) {
  // PyTorch's nn.GELU(): x * Phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2.
  auto cpu = make_cpu_compute();
  std::vector<float> x(1000), y(1000), dy(1000, 1.0f), dx(1000, 0.0f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = -8.0f + 16.0f * static_cast<float>(i) / 999.0f;
  cpu->unary(elementwise::Unary::gelu_exact, x.data(), y.data(), static_cast<int64_t>(x.size()));
  cpu->unary_grad(elementwise::Unary::gelu_exact, x.data(), dy.data(), dx.data(), static_cast<int64_t>(x.size()),
                  false);
  const auto gelu = [](double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); };
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    EXPECT_NEAR(y[i], gelu(v), 1e-6 + 1e-5 * std::abs(gelu(v))) << v;
    const double h = 1e-3;
    EXPECT_NEAR(dx[i], (gelu(v + h) - gelu(v - h)) / (2 * h), 1e-4) << v;
  }
  EXPECT_STREQ(elementwise::unary_name(elementwise::Unary::gelu_exact), "gelu_exact");
}

}  // namespace
TEST(OpRegistryTest, ClippingScalesEveryGradientByTheGlobalNormAsPyTorchDoes) {
  // 200,000 gradients (past one chunk of the sum) of norm 5: with a largest
  // norm of 1 every update reads them at 1 / (5 + 1e-6); with 10 as they
  // are; an optimizer without max_grad_norm ignores the scale.
  auto cpu = make_cpu_compute();
  const int64_t n = 200000;
  std::vector<float> grads(static_cast<size_t>(n), 0.0f);
  grads[0] = 3.0f;
  grads[static_cast<size_t>(n - 1)] = 4.0f;
  auto sgd_step = [&](float max_norm, bool clip) {
    OptimizerHyper h;
    h.lr = 1.0f;
    h.max_grad_norm = max_norm;
    if (clip) cpu->clip_gradients(grads.data(), n, max_norm);
    std::vector<float> p(2, 0.0f), vel(2, 0.0f), g = {grads[0], grads[static_cast<size_t>(n - 1)]};
    cpu->sgd(p.data(), p.data(), g.data(), vel.data(), vel.data(), 2, h);
    return p;
  };
  auto clipped = sgd_step(1.0f, true);
  EXPECT_FLOAT_EQ(clipped[0], -3.0f / (5.0f + 1e-6f));
  EXPECT_FLOAT_EQ(clipped[1], -4.0f / (5.0f + 1e-6f));
  EXPECT_FLOAT_EQ(sgd_step(10.0f, true)[1], -4.0f) << "a norm under the largest is left as it is";
  EXPECT_FLOAT_EQ(sgd_step(0.0f, false)[1], -4.0f) << "without max_grad_norm the scale is not read";
  EXPECT_FLOAT_EQ(clip_scale(1.0f, 25.0), 1.0f / (5.0f + 1e-6f));
}

TEST(OpRegistryTest, DropoutDrawsFromCountersAndItsGradientDrawsTheSameAgain) {
  auto cpu = make_cpu_compute();
  const int64_t n = 100000;
  std::vector<float> x(static_cast<size_t>(n), 1.0f), y(x.size()), again(x.size()), dx(x.size(), 0.5f);
  cpu->set_step(3);
  cpu->set_draw(2);
  cpu->dropout(x.data(), y.data(), n, 0.2f, 77, false);
  EXPECT_EQ(y, x) << "off (the default: evaluation, sample) dropout is the identity";
  cpu->set_dropout(11, true);
  cpu->dropout(x.data(), y.data(), n, 0.2f, 77, false);
  int64_t dropped = 0;
  for (float v : y) {
    if (v == 0) {
      ++dropped;
    } else {
      ASSERT_EQ(v, 1.0f / 0.8f);
    }
  }
  EXPECT_NEAR(static_cast<double>(dropped) / n, 0.2, 0.005);
  cpu->dropout(x.data(), dx.data(), n, 0.2f, 77, true);  // the gradient, added to 0.5
  for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(dx[i] - 0.5f, y[i]) << i;
  // Another step, draw (micro-batch), op or seed: other masks.
  auto differing = [&] {
    cpu->dropout(x.data(), again.data(), n, 0.2f, 77, false);
    int64_t d = 0;
    for (size_t i = 0; i < y.size(); ++i) d += again[i] != y[i];
    return static_cast<double>(d) / n;
  };
  EXPECT_EQ(differing(), 0.0);
  cpu->set_step(4);
  EXPECT_NEAR(differing(), 2 * 0.2 * 0.8, 0.01);
  cpu->set_step(3);
  cpu->set_draw(3);
  EXPECT_NEAR(differing(), 2 * 0.2 * 0.8, 0.01);
  cpu->set_draw(2);
  cpu->set_dropout(12, true);
  EXPECT_NEAR(differing(), 2 * 0.2 * 0.8, 0.01);
}

TEST(OpRegistryTest, AttentionDropsItsProbabilitiesAndItsGradientIsThatFunctions) {
  // Two sequences of 4 tokens, 2 heads of width 2: y = (P * factors) V,
  // P kept as it was; the gradient against central differences of the
  // same draws.
  auto cpu = make_cpu_compute();
  const int64_t t = 4, m = 2 * t, heads = 2, dh = 2, d = heads * dh, ld = 3 * d;
  const float p = 0.5f;
  const uint64_t salt = 5;
  cpu->set_dropout(3, true);
  cpu->set_step(1);
  cpu->set_draw(0);
  std::vector<float> qkv(static_cast<size_t>(m * ld)), w(static_cast<size_t>(m * d));
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = std::sin(0.7f * static_cast<float>(i));
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::cos(1.3f * static_cast<float>(i));
  auto forward = [&](const std::vector<float>& in, std::vector<float>* probs, float prob) {
    std::vector<float> y(static_cast<size_t>(m * d));
    probs->assign(static_cast<size_t>(m * heads * t), 0.0f);
    cpu->attention(in.data(), y.data(), probs->data(), m, d, heads, heads, t, prob, salt);
    return y;
  };
  std::vector<float> probs, plain_probs;
  const auto y = forward(qkv, &probs, p);
  const auto plain = forward(qkv, &plain_probs, 0.0f);
  EXPECT_EQ(probs, plain_probs) << "the saved probabilities are those before the dropout";
  const uint64_t key = dropout_key(3, salt, 1, 0);
  int dropped = 0;
  for (int64_t s = 0; s < 2; ++s) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < t; ++i) {
        for (int64_t c = 0; c < dh; ++c) {
          double want = 0;
          for (int64_t j = 0; j <= i; ++j) {
            const int64_t index = ((s * heads + h) * t + i) * t + j;
            const float f = dropout_factor(key, static_cast<uint64_t>(index), p);
            dropped += f == 0;
            const float v = qkv[static_cast<size_t>((s * t + j) * ld + 2 * d + h * dh + c)];
            want += probs[static_cast<size_t>(index)] * f * v;
          }
          EXPECT_NEAR(y[static_cast<size_t>((s * t + i) * d + h * dh + c)], want, 1e-5);
        }
      }
    }
  }
  EXPECT_GT(dropped, 0);
  auto loss = [&](const std::vector<float>& in) {
    std::vector<float> scratch;
    const auto out = forward(in, &scratch, p);
    double l = 0;
    for (size_t i = 0; i < out.size(); ++i) l += out[i] * w[i];
    return l;
  };
  std::vector<float> dqkv(qkv.size()), saved = probs;
  cpu->attention_grad(qkv.data(), saved.data(), w.data(), dqkv.data(), m, d, heads, heads, t, p, salt, false);
  for (size_t i = 0; i < qkv.size(); i += 5) {
    auto up = qkv, down = qkv;
    up[i] += 1e-2f;
    down[i] -= 1e-2f;
    EXPECT_NEAR(dqkv[i], (loss(up) - loss(down)) / 2e-2, 2e-3) << "qkv element " << i;
  }
}

}  // namespace tiermem::exec
