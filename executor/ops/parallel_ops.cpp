// Tensor parallelism (tensor_parallel.hpp inserts these; never in a model
// file). On a Compute each is its local part: the runtime adds the group's
// sum for TP_ALL_REDUCE (StageRunner's partial sums).
#include "executor/ops/op_registry.hpp"

namespace tiermem::exec {
namespace {

double elements(const Graph& g, int t) { return static_cast<double>(g.tensors[static_cast<size_t>(t)].elements()); }

void local_part(const OpCall& c) { c.k.pass_grad(c.f(c.op.in[0]), c.f(c.op.out[0]), c.count(c.op.in[0]), c.acc(0)); }

OpSpec tp_identity() {
  OpSpec s;
  s.kind = proto::TP_IDENTITY;  // Y = X; its gradient is the all-reduce of dY over the group
  s.name = "tp_identity";
  s.flops = [](const Graph& g, const Op& op) { return flops_per_output_element(g, op, 1); };
  // The input's gradient is the sum of every rank's part of it.
  s.gradient = [](GradientEmitter& e, const Op& op) {
    if (e.needs(op.in[0])) e.emit(".grad", proto::TP_ALL_REDUCE, {e.dy()}, {op.in[0]}, elements(e.graph(), op.out[0]));
  };
  s.run = local_part;
  return s;
}

OpSpec tp_all_reduce() {
  OpSpec s;
  s.kind = proto::TP_ALL_REDUCE;  // Y = the sum of X over the tensor-parallel group (the runtime's)
  s.name = "tp_all_reduce";
  s.flops = [](const Graph& g, const Op& op) { return flops_per_output_element(g, op, 1); };
  s.gradient = [](GradientEmitter& e, const Op& op) {
    if (e.needs(op.in[0])) e.emit(".grad", proto::PASS_GRAD, {e.dy()}, {op.in[0]}, elements(e.graph(), op.out[0]));
  };
  s.run = local_part;
  return s;
}

}  // namespace

const std::vector<OpSpec>& parallel_ops() {
  static const std::vector<OpSpec> ops = {tp_identity(), tp_all_reduce()};
  return ops;
}

}  // namespace tiermem::exec
