// Activations: RELU, GELU (tanh approximation) and the element-wise
// functions of elementwise_math.hpp (SILU, GELU_EXACT), and DROPOUT (its
// masks drawn again by its gradient: dropout_math.hpp), with their
// gradients.
#include "executor/ops/op_registry.hpp"

namespace tiermem::exec {
namespace {

double elements(const Graph& g, int t) { return static_cast<double>(g.tensors[static_cast<size_t>(t)].elements()); }

OpSpec relu() {
  OpSpec s;
  s.kind = proto::RELU;
  s.name = "relu";
  s.model_inputs = 1;
  s.shape = same_shape_as_input;
  s.flops = [](const Graph& g, const Op& op) { return flops_per_output_element(g, op, 1); };
  s.gradient = [](GradientEmitter& e, const Op& op) {
    if (e.needs(op.in[0])) e.emit(".grad", proto::RELU_GRAD, {op.in[0], e.dy()}, {op.in[0]}, elements(e.graph(), op.out[0]));
  };
  s.run = [](const OpCall& c) { c.k.relu(c.f(c.op.in[0]), c.f(c.op.out[0]), c.count(c.op.in[0])); };
  return s;
}

OpSpec relu_grad() {
  OpSpec s;
  s.kind = proto::RELU_GRAD;  // dX (+)= dY * (X > 0)
  s.name = "relu_grad";
  s.phase = Phase::backward;
  s.run = [](const OpCall& c) {
    c.k.relu_grad(c.f(c.op.in[0]), c.f(c.op.in[1]), c.f(c.op.out[0]), c.count(c.op.in[0]), c.acc(0));
  };
  return s;
}

OpSpec gelu() {
  OpSpec s;
  s.kind = proto::GELU;
  s.name = "gelu";
  s.model_inputs = 1;
  s.shape = same_shape_as_input;
  s.flops = [](const Graph& g, const Op& op) { return flops_per_output_element(g, op, 20); };
  s.gradient = [](GradientEmitter& e, const Op& op) {
    if (e.needs(op.in[0])) {
      e.emit(".grad", proto::GELU_GRAD, {op.in[0], e.dy()}, {op.in[0]}, 20 * elements(e.graph(), op.out[0]));
    }
  };
  s.run = [](const OpCall& c) { c.k.gelu(c.f(c.op.in[0]), c.f(c.op.out[0]), c.count(c.op.in[0])); };
  return s;
}

OpSpec gelu_grad() {
  OpSpec s;
  s.kind = proto::GELU_GRAD;  // dX (+)= dY * gelu'(X)
  s.name = "gelu_grad";
  s.phase = Phase::backward;
  s.run = [](const OpCall& c) {
    c.k.gelu_grad(c.f(c.op.in[0]), c.f(c.op.in[1]), c.f(c.op.out[0]), c.count(c.op.in[0]), c.acc(0));
  };
  return s;
}

OpSpec dropout() {
  OpSpec s;
  s.kind = proto::DROPOUT;
  s.name = "dropout";
  s.model_inputs = 1;
  s.takes_probability = true;
  s.shape = same_shape_as_input;
  s.flops = [](const Graph& g, const Op& op) { return flops_per_output_element(g, op, 8); };
  s.gradient = [](GradientEmitter& e, const Op& op) {
    if (!e.needs(op.in[0])) return;
    Op& grad = e.emit(".grad", proto::DROPOUT_GRAD, {e.dy()}, {op.in[0]}, 8 * elements(e.graph(), op.out[0]));
    grad.probability = op.probability;
    grad.salt = op.salt;
  };
  s.run = [](const OpCall& c) {
    c.k.dropout(c.f(c.op.in[0]), c.f(c.op.out[0]), c.count(c.op.in[0]), c.op.probability, c.op.salt, false);
  };
  return s;
}

OpSpec dropout_grad() {
  OpSpec s;
  s.kind = proto::DROPOUT_GRAD;  // dX (+)= dY * the forward's factors
  s.name = "dropout_grad";
  s.phase = Phase::backward;
  s.run = [](const OpCall& c) {
    c.k.dropout(c.f(c.op.in[0]), c.f(c.op.out[0]), c.count(c.op.in[0]), c.op.probability, c.op.salt, c.acc(0));
  };
  return s;
}

}  // namespace

const std::vector<OpSpec>& activation_ops() {
  // The element-wise family: one line per function.
  using elementwise::Unary;
  static const std::vector<OpSpec> ops =
      join({relu(), relu_grad(), gelu(), gelu_grad(), dropout(), dropout_grad()},
           join(unary_op_specs<proto::SILU, proto::SILU_GRAD, Unary::silu, 4.0>("silu", "silu_grad"),
                unary_op_specs<proto::GELU_EXACT, proto::GELU_EXACT_GRAD, Unary::gelu_exact, 20.0>(
                    "gelu_exact", "gelu_exact_grad")));
  return ops;
}

}  // namespace tiermem::exec
