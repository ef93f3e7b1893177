// LAYER_NORM, RMS_NORM and the loss, SOFTMAX_CROSS_ENTROPY, with their
// gradients.
#include "executor/kernels.hpp"
#include "executor/ops/op_registry.hpp"

namespace tiermem::exec {
namespace {

double elements(const Graph& g, int t) { return static_cast<double>(g.tensors[static_cast<size_t>(t)].elements()); }

OpSpec layer_norm() {
  OpSpec s;
  s.kind = proto::LAYER_NORM;  // over the last dimension; in: x, gamma and (optional) beta
  s.name = "layer_norm";
  s.model_inputs = 3;
  s.optional_inputs = 1;  // no beta: nanoGPT's bias=False
  s.shape = [](const ShapeQuery& q) -> Result<std::vector<int64_t>> {
    const bool beta = q.in.size() == 3;
    if (q.shape(0).size() != 2 || q.shape(1) != std::vector<int64_t>{q.shape(0)[1]} || (beta && q.shape(2) != q.shape(1))) {
      return q.mismatch("gamma " + q.name(1) + (beta ? " and beta " + q.name(2) : std::string()) +
                        " must match the last dimension of " + q.name(0));
    }
    return q.shape(0);
  };
  // Saved for the backward pass: per-row mean and 1/stddev.
  s.saved = [](const Op&, const std::vector<int64_t>& y) {
    return std::vector<SavedOutput>{{".mean", {y.at(0)}}, {".rstd", {y.at(0)}}};
  };
  s.flops = [](const Graph& g, const Op& op) { return flops_per_output_element(g, op, 8); };
  s.gradient = [](GradientEmitter& e, const Op& op) {
    // dX, dgamma, dbeta in one op (they share the per-row sums). Every input
    // of a layer norm needs its gradient when any does in the models we
    // build: the kernel stays simple.
    // Without beta, the op has two outputs (dX, dgamma) and the kernel
    // leaves dbeta out.
    std::vector<int> targets(op.in.begin(), op.in.end());
    for (int t : targets) e.need(t);
    e.emit(".grad", proto::LAYER_NORM_GRAD, {op.in[0], op.in[1], op.out[1], op.out[2], e.dy()}, targets,
           10 * elements(e.graph(), op.out[0]));
  };
  s.run = [](const OpCall& c) {
    c.k.layer_norm(c.f(c.op.in[0]), c.f(c.op.in[1]), c.op.in.size() > 2 ? c.f(c.op.in[2]) : nullptr, c.f(c.op.out[0]),
                   c.f(c.op.out[1]), c.f(c.op.out[2]), c.shape(c.op.in[0])[0], c.shape(c.op.in[0])[1]);
  };
  return s;
}

OpSpec layer_norm_grad() {
  OpSpec s;
  s.kind = proto::LAYER_NORM_GRAD;  // in: X, gamma, mean, rstd, dY   out: dX, dgamma, (dbeta)
  s.name = "layer_norm_grad";
  s.phase = Phase::backward;
  s.run = [](const OpCall& c) {
    c.k.layer_norm_grad(c.f(c.op.in[0]), c.f(c.op.in[1]), c.f(c.op.in[2]), c.f(c.op.in[3]), c.f(c.op.in[4]),
                        c.f(c.op.out[0]), c.f(c.op.out[1]), c.op.out.size() > 2 ? c.f(c.op.out[2]) : nullptr,
                        c.shape(c.op.in[0])[0], c.shape(c.op.in[0])[1], c.acc(0), c.acc(1));
  };
  return s;
}

OpSpec rms_norm() {
  OpSpec s;
  s.kind = proto::RMS_NORM;  // over the last dimension; in: x, w   out: y, rstd
  s.name = "rms_norm";
  s.model_inputs = 2;
  s.takes_epsilon = true;
  s.shape = [](const ShapeQuery& q) -> Result<std::vector<int64_t>> {
    if (q.shape(0).size() != 2 || q.shape(1) != std::vector<int64_t>{q.shape(0)[1]}) {
      return q.mismatch("w " + q.name(1) + " must match the last dimension of " + q.name(0));
    }
    return q.shape(0);
  };
  s.saved = [](const Op&, const std::vector<int64_t>& y) { return std::vector<SavedOutput>{{".rstd", {y.at(0)}}}; };
  s.flops = [](const Graph& g, const Op& op) { return flops_per_output_element(g, op, 4); };
  s.gradient = [](GradientEmitter& e, const Op& op) {
    for (int t : op.in) e.need(t);  // dX and dw in one op, as LAYER_NORM's
    e.emit(".grad", proto::RMS_NORM_GRAD, {op.in[0], op.in[1], op.out[1], e.dy()}, {op.in[0], op.in[1]},
           7 * elements(e.graph(), op.out[0]));
  };
  s.run = [](const OpCall& c) {
    c.k.rms_norm(c.f(c.op.in[0]), c.f(c.op.in[1]), c.f(c.op.out[0]), c.f(c.op.out[1]), c.shape(c.op.in[0])[0],
                 c.shape(c.op.in[0])[1], c.op.epsilon > 0 ? c.op.epsilon : kernels::k_layer_norm_epsilon);
  };
  return s;
}

OpSpec rms_norm_grad() {
  OpSpec s;
  s.kind = proto::RMS_NORM_GRAD;  // in: X, w, rstd, dY   out: dX, dw
  s.name = "rms_norm_grad";
  s.phase = Phase::backward;
  s.run = [](const OpCall& c) {
    c.k.rms_norm_grad(c.f(c.op.in[0]), c.f(c.op.in[1]), c.f(c.op.in[2]), c.f(c.op.in[3]), c.f(c.op.out[0]),
                      c.f(c.op.out[1]), c.shape(c.op.in[0])[0], c.shape(c.op.in[0])[1], c.acc(0), c.acc(1));
  };
  return s;
}

OpSpec softmax_cross_entropy() {
  OpSpec s;
  s.kind = proto::SOFTMAX_CROSS_ENTROPY;  // logits [M,C], labels [M] -> mean loss [1]
  s.name = "softmax_xent";
  s.model_inputs = 2;
  s.i32_inputs = {{1, "labels"}};
  s.starts_backward = true;
  s.shape = [](const ShapeQuery& q) -> Result<std::vector<int64_t>> {
    if (q.shape(0).size() != 2 || q.shape(1) != std::vector<int64_t>{q.shape(0)[0]}) {
      return q.mismatch("labels " + q.name(1) + " must have one entry per row of logits " + q.name(0));
    }
    return std::vector<int64_t>{1};
  };
  s.flops = [](const Graph& g, const Op& op) { return 5.0 * elements(g, op.in[0]); };
  s.gradient = [](GradientEmitter& e, const Op& op) {
    if (op.out[0] == e.graph().loss && e.needs(op.in[0])) {
      e.emit(".grad", proto::SOFTMAX_CROSS_ENTROPY_GRAD, {op.in[0], op.in[1]}, {op.in[0]},
             5.0 * elements(e.graph(), op.in[0]));
    }
  };
  s.run = [](const OpCall& c) {
    c.k.softmax_xent(c.f(c.op.in[0]), c.i32(c.op.in[1]), c.f(c.op.out[0]), c.shape(c.op.in[0])[0],
                     c.shape(c.op.in[0])[1]);
  };
  return s;
}

OpSpec softmax_cross_entropy_grad() {
  OpSpec s;
  s.kind = proto::SOFTMAX_CROSS_ENTROPY_GRAD;  // dL = (softmax(L) - onehot(y)) * scale
  s.name = "softmax_xent_grad";
  s.phase = Phase::backward;
  s.run = [](const OpCall& c) {
    const auto& l = c.shape(c.op.in[0]);
    c.k.softmax_xent_grad(c.f(c.op.in[0]), c.i32(c.op.in[1]), c.f(c.op.out[0]), l[0], l[1],
                          c.g.grad_scale / static_cast<float>(l[0]), c.acc(0));
  };
  return s;
}

}  // namespace

const std::vector<OpSpec>& normalisation_ops() {
  static const std::vector<OpSpec> ops = {
      layer_norm(),
      layer_norm_grad(),
      rms_norm(),
      rms_norm_grad(),
      softmax_cross_entropy(),
      softmax_cross_entropy_grad(),
  };
  return ops;
}

}  // namespace tiermem::exec
