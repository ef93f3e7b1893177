#include "executor/graph.hpp"

#include <gtest/gtest.h>

namespace tiermem::exec {
namespace {

const char* k_mlp = R"(
name: "t"
micro_batch: 4
tensor { name: "x" shape: [4, 3] role: INPUT }
tensor { name: "y" shape: [4] role: LABEL dtype: I32 }
tensor { name: "w" shape: [3, 5] role: PARAM init: XAVIER_UNIFORM }
tensor { name: "b" shape: [5] role: PARAM }
op { name: "fc" type: MATMUL input: ["x", "w"] output: "h" }
op { name: "bias" type: BIAS_ADD input: ["h", "b"] output: "logits" }
op { name: "loss" type: SOFTMAX_CROSS_ENTROPY input: ["logits", "y"] output: "l" }
loss: "l"
optimizer { type: SGD learning_rate: 0.1 }
)";

void expect_error(const std::string& text, const std::string& fragment) {
  auto g = parse_model(text, "bad.pbtxt");
  ASSERT_FALSE(g.ok()) << "accepted:\n" << text;
  EXPECT_EQ(g.status().code(), ErrorCode::config_error);
  EXPECT_NE(g.status().message().find(fragment), std::string::npos)
      << "'" << g.status().message() << "' lacks '" << fragment << "'";
  EXPECT_EQ(g.status().message().rfind("bad.pbtxt", 0), 0u);
}

std::string replace(std::string s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  if (at != std::string::npos) s.replace(at, from.size(), to);
  return s;
}

TEST(GraphTest, LoadsInfersShapesAndOrdersOps) {
  // Ops listed out of order still run producers first.
  std::string text = k_mlp;
  auto g = parse_model(text, "t.pbtxt");
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  ASSERT_EQ(g->ops.size(), 3u);
  EXPECT_EQ(g->ops[0].name, "fc");
  EXPECT_EQ(g->tensors[g->find("h")].shape, (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(g->tensors[g->find("l")].shape, (std::vector<int64_t>{1}));
  EXPECT_EQ(g->tensors[g->loss].name, "l");
  auto reordered = parse_model(replace(replace(text, "op { name: \"fc\" type: MATMUL input: [\"x\", \"w\"] output: \"h\" }\n", ""),
                                       "loss: \"l\"", "op { name: \"fc\" type: MATMUL input: [\"x\", \"w\"] output: \"h\" }\nloss: \"l\""),
                               "t");
  ASSERT_TRUE(reordered.ok()) << reordered.status().to_string();
  EXPECT_EQ(reordered->ops[0].name, "fc");
}

TEST(GraphTest, BadModelsGetClearErrors) {
  expect_error(replace(k_mlp, "type: MATMUL", "type: CONV3D"), "CONV3D");
  expect_error(replace(k_mlp, "shape: [3, 5]", "shape: [4, 5]"), "inner dimensions 3 and 4 differ");
  expect_error(replace(k_mlp, "input: [\"h\", \"b\"]", "input: [\"h\", \"q\"]"), "reads 'q', which no op writes");
  expect_error(replace(k_mlp, "input: [\"x\", \"w\"] output: \"h\"", "input: [\"logits\", \"w\"] output: \"h\""),
               "cycle");
  expect_error(replace(k_mlp, "output: \"logits\"", "output: \"h\""), "written by both");
  expect_error(std::string(k_mlp) + "op { name: \"bad\" type: RELU input: \"h\" output: \"b\" }",
               "writes 'b', which is PARAM");
  expect_error(replace(k_mlp, "loss: \"l\"", "loss: \"logits\""), "must be a scalar");
  expect_error(replace(k_mlp, "input: [\"x\", \"w\"]", "input: [\"x\"]"), "takes 2 input(s)");
  expect_error(replace(k_mlp, "dtype: I32", ""), "labels are I32");
  expect_error(replace(k_mlp, "shape: [4, 3] role: INPUT", "shape: [6, 3] role: INPUT"), "a micro-batch has 4 samples");
  expect_error(std::string(k_mlp) + "tensor { name: \"x\" shape: [1] }", "declared twice");
  expect_error("name: \"t\" micro_batch: 1 op { name: \"a\" type: RELU input: \"z\" output: \"q\" }", "reads 'z'");
  expect_error("garbage {", "bad.pbtxt:1:");
  expect_error(std::string(k_mlp) + "op { name: \"cat\" type: CONCAT input: \"h\" output: \"c\" }",
               "(CONCAT) takes two or more input(s) and 1 output, not 1 and 1");
  expect_error(std::string(k_mlp) + "op { name: \"cat\" type: CONCAT input: [\"h\", \"b\"] output: \"c\" }",
               "'b' [5] must be a matrix with the 4 rows of 'h' [4,5]");
  auto missing = load_model("/nonexistent/model.pbtxt");
  EXPECT_NE(missing.status().message().find("cannot read model file"), std::string::npos);
}

TEST(GraphTest, ShippedModelsLoadAndDifferentiate) {
  for (const char* name : {"mlp_digits", "mlp_fashion", "ffn_block_digits", "ffn4_fashion"}) {
    auto g = load_model(std::string(TIERMEM_SOURCE_ROOT) + "/config/models/" + name + ".pbtxt");
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    ASSERT_TRUE(add_training(*g, 1.0f).ok());
    EXPECT_FALSE(g->ops_of(Phase::backward).empty());
    for (int p : g->params()) {
      EXPECT_GE(g->tensors[p].grad, 0) << name << ": " << g->tensors[p].name << " gets no gradient";
    }
    EXPECT_EQ(g->ops_of(Phase::update).size(), g->params().size());
  }
}

}  // namespace
}  // namespace tiermem::exec
