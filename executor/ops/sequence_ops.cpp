// Sequences (a GPT): the rows of a tensor are tokens, sequences of `context`
// rows one after the other. EMBEDDING, POSITION_EMBEDDING, CAUSAL_ATTENTION
// (grouped-query too), ROTARY and their gradients.
#include <tiermem/status_macros.h>

#include "executor/ops/op_registry.hpp"

namespace tiermem::exec {
namespace {

double elements(const Graph& g, int t) { return static_cast<double>(g.tensors[static_cast<size_t>(t)].elements()); }

OpSpec embedding() {
  OpSpec s;
  s.kind = proto::EMBEDDING;  // ids [M] (I32), table [V,D] -> [M,D]
  s.name = "embedding";
  s.model_inputs = 2;
  s.i32_inputs = {{0, "token ids"}};
  s.shape = [](const ShapeQuery& q) -> Result<std::vector<int64_t>> {
    if (q.shape(0).size() != 1 || q.shape(1).size() != 2) {
      return q.mismatch("ids " + q.name(0) + " must be a vector and the table " + q.name(1) + " a matrix");
    }
    return std::vector<int64_t>{q.shape(0)[0], q.shape(1)[1]};
  };
  s.flops = [](const Graph& g, const Op& op) { return flops_per_output_element(g, op, 1); };
  s.gradient = [](GradientEmitter& e, const Op& op) {
    if (e.needs(op.in[1])) {
      e.emit(".grad", proto::EMBEDDING_GRAD, {op.in[0], e.dy()}, {op.in[1]}, elements(e.graph(), op.out[0]));
    }
  };
  s.run = [](const OpCall& c) {
    c.k.embedding(c.i32(c.op.in[0]), c.f(c.op.in[1]), c.f(c.op.out[0]), c.shape(c.op.in[0])[0], c.shape(c.op.in[1])[1]);
  };
  return s;
}

OpSpec embedding_grad() {
  OpSpec s;
  s.kind = proto::EMBEDDING_GRAD;  // in: ids, dY; out: dtable
  s.name = "embedding_grad";
  s.phase = Phase::backward;
  s.run = [](const OpCall& c) {
    const auto& table = c.shape(c.op.out[0]);
    c.k.embedding_grad(c.i32(c.op.in[0]), c.f(c.op.in[1]), c.f(c.op.out[0]), c.shape(c.op.in[0])[0], table[1], table[0],
                       c.acc(0));
  };
  return s;
}

OpSpec position_embedding() {
  OpSpec s;
  s.kind = proto::POSITION_EMBEDDING;  // x [M,D], table [T,D] -> x + table[row mod T]
  s.name = "position_embedding";
  s.model_inputs = 2;
  s.shape = [](const ShapeQuery& q) -> Result<std::vector<int64_t>> {
    if (q.shape(0).size() != 2 || q.shape(1).size() != 2 || q.shape(1)[1] != q.shape(0)[1] ||
        q.shape(0)[0] % q.shape(1)[0] != 0) {
      return q.mismatch("the table " + q.name(1) + " must have the columns of " + q.name(0) +
                        " and a number of rows (the context) that divides its rows");
    }
    return q.shape(0);
  };
  s.flops = [](const Graph& g, const Op& op) { return flops_per_output_element(g, op, 1); };
  s.gradient = [](GradientEmitter& e, const Op& op) {
    const double n = elements(e.graph(), op.out[0]);
    if (e.needs(op.in[0])) e.emit(".grad_x", proto::PASS_GRAD, {e.dy()}, {op.in[0]}, n);
    if (e.needs(op.in[1])) e.emit(".grad_table", proto::POSITION_EMBEDDING_GRAD, {e.dy()}, {op.in[1]}, n);
  };
  s.run = [](const OpCall& c) {
    c.k.position_embedding(c.f(c.op.in[0]), c.f(c.op.in[1]), c.f(c.op.out[0]), c.shape(c.op.in[0])[0],
                           c.shape(c.op.in[0])[1], c.shape(c.op.in[1])[0]);
  };
  return s;
}

OpSpec position_embedding_grad() {
  OpSpec s;
  s.kind = proto::POSITION_EMBEDDING_GRAD;  // in: dY; out: dtable
  s.name = "position_embedding_grad";
  s.phase = Phase::backward;
  s.run = [](const OpCall& c) {
    const auto& table = c.shape(c.op.out[0]);
    c.k.position_embedding_grad(c.f(c.op.in[0]), c.f(c.op.out[0]), c.shape(c.op.in[0])[0], table[1], table[0], c.acc(0));
  };
  return s;
}

// The width of a head of an op on qkv [M, (heads + 2 kv_heads) x dh]
// (CAUSAL_ATTENTION, ROTARY), or why its fields do not fit.
Result<int64_t> head_width(const ShapeQuery& q) {
  const int64_t heads = q.def.heads(), kv = q.def.kv_heads() == 0 ? heads : q.def.kv_heads();
  if (heads <= 0 || kv <= 0 || heads % kv != 0) {
    return q.mismatch("heads (" + std::to_string(heads) + ") must be positive and a multiple of kv_heads (" +
                      std::to_string(kv) + ")");
  }
  if (q.shape(0).size() != 2 || q.shape(0)[1] % (heads + 2 * kv) != 0) {
    return q.mismatch(q.name(0) + " must be a matrix of queries, keys and values side by side: " +
                      std::to_string(heads) + " query heads and " + std::to_string(kv) +
                      " key and value heads of one width");
  }
  const int64_t dh = q.shape(0)[1] / (heads + 2 * kv);
  if (q.def.context() <= 0 || q.shape(0)[0] % q.def.context() != 0) {
    return q.mismatch("context (" + std::to_string(q.def.context()) + ") must divide the rows of " + q.name(0));
  }
  return dh;
}

int64_t kv_heads_of(const Op& op) { return op.kv_heads == 0 ? op.heads : op.kv_heads; }

// ROTARY and its gradient: the query and key heads of each row turned.
void run_rotary(const OpCall& c, bool inverse) {
  const auto& x = c.shape(c.op.in[0]);
  const int64_t turned = c.op.heads + kv_heads_of(c.op);
  const int64_t dh = x[1] / (c.op.heads + 2 * kv_heads_of(c.op));
  c.k.rotary(c.f(c.op.in[0]), c.f(c.op.out[0]), x[0], x[1], turned, dh, c.op.context, c.op.theta, inverse,
             inverse && c.acc(0));
}

OpSpec causal_attention() {
  OpSpec s;
  s.kind = proto::CAUSAL_ATTENTION;  // in: QKV [M, D + 2 Dkv]   out: Y [M,D], P [M*heads, context]
  s.name = "attention";
  s.model_inputs = 1;
  s.sequence_fields = true;
  s.takes_probability = true;  // dropout of the probabilities (saved before it: the backward draws it again)
  s.shape = [](const ShapeQuery& q) -> Result<std::vector<int64_t>> {
    TIERMEM_ASSIGN_OR_RETURN(const int64_t dh, head_width(q));
    return std::vector<int64_t>{q.shape(0)[0], dh * q.def.heads()};
  };
  // Saved for the backward pass: every head's softmax, row by row.
  s.saved = [](const Op& op, const std::vector<int64_t>& y) {
    return std::vector<SavedOutput>{{".probs", {y.at(0) * op.heads, op.context}}};
  };
  // q k^T and p v over every sequence and head (the masked half too).
  s.flops = [](const Graph& g, const Op& op) { return 4.0 * elements(g, op.out[0]) * static_cast<double>(op.context); };
  s.gradient = [](GradientEmitter& e, const Op& op) {
    if (!e.needs(op.in[0])) return;
    Op& grad = e.emit(".grad", proto::CAUSAL_ATTENTION_GRAD, {op.in[0], op.out[1], e.dy()}, {op.in[0]}, 2 * op.flops);
    grad.heads = op.heads;
    grad.kv_heads = op.kv_heads;
    grad.context = op.context;
    grad.probability = op.probability;
    grad.salt = op.salt;
  };
  s.run = [](const OpCall& c) {
    c.k.attention(c.f(c.op.in[0]), c.f(c.op.out[0]), c.f(c.op.out[1]), c.shape(c.op.in[0])[0], c.shape(c.op.out[0])[1],
                  c.op.heads, kv_heads_of(c.op), c.op.context, c.op.probability, c.op.salt);
  };
  return s;
}

OpSpec causal_attention_grad() {
  OpSpec s;
  s.kind = proto::CAUSAL_ATTENTION_GRAD;  // in: QKV, P, dY; out: dQKV
  s.name = "attention_grad";
  s.phase = Phase::backward;
  s.run = [](const OpCall& c) {
    c.k.attention_grad(c.f(c.op.in[0]), c.f(c.op.in[1]), c.f(c.op.in[2]), c.f(c.op.out[0]), c.shape(c.op.in[0])[0],
                       c.shape(c.op.in[2])[1], c.op.heads, kv_heads_of(c.op), c.op.context, c.op.probability,
                       c.op.salt, c.acc(0));
  };
  return s;
}

// Rotary positions (Llama's, as Hugging Face's rotate_half writes them) on
// the query and key heads of a qkv tensor; the values pass.
OpSpec rotary() {
  OpSpec s;
  s.kind = proto::ROTARY;  // in: QKV   out: QKV with its q and k heads turned
  s.name = "rotary";
  s.model_inputs = 1;
  s.sequence_fields = true;
  s.takes_theta = true;
  s.shape = [](const ShapeQuery& q) -> Result<std::vector<int64_t>> {
    TIERMEM_ASSIGN_OR_RETURN(const int64_t dh, head_width(q));
    if (dh % 2 != 0) return q.mismatch("heads of " + std::to_string(dh) + " columns: rotary positions turn pairs");
    if (!(q.def.theta() > 1)) return q.mismatch("theta (" + std::to_string(q.def.theta()) + ") must be above 1");
    return q.shape(0);
  };
  s.flops = [](const Graph& g, const Op& op) { return flops_per_output_element(g, op, 3); };
  s.gradient = [](GradientEmitter& e, const Op& op) {
    if (!e.needs(op.in[0])) return;
    Op& grad = e.emit(".grad", proto::ROTARY_GRAD, {e.dy()}, {op.in[0]}, op.flops);
    grad.heads = op.heads;
    grad.kv_heads = op.kv_heads;
    grad.context = op.context;
    grad.theta = op.theta;
  };
  s.run = [](const OpCall& c) { run_rotary(c, false); };
  return s;
}

OpSpec rotary_grad() {
  OpSpec s;
  s.kind = proto::ROTARY_GRAD;  // dX (+)= dY turned back
  s.name = "rotary_grad";
  s.phase = Phase::backward;
  s.run = [](const OpCall& c) { run_rotary(c, true); };
  return s;
}

}  // namespace

const std::vector<OpSpec>& sequence_ops() {
  static const std::vector<OpSpec> ops = {
      embedding(),
      embedding_grad(),
      position_embedding(),
      position_embedding_grad(),
      causal_attention(),
      causal_attention_grad(),
      rotary(),
      rotary_grad(),
  };
  return ops;
}

}  // namespace tiermem::exec
