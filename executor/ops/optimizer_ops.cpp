// The optimizers' update ops (autodiff.cpp adds one per PARAM): each reads
// the parameter and its state from the committed copy and writes the next.
#include "executor/ops/op_registry.hpp"

namespace tiermem::exec {
namespace {

OpSpec sgd_update() {
  OpSpec s;
  s.kind = proto::SGD_UPDATE;  // in: param, grad, velocity
  s.name = "sgd";
  s.phase = Phase::update;
  s.run = [](const OpCall& c) {
    c.k.sgd(c.from(c.op.in[0]), c.f(c.op.in[0]), c.f(c.op.in[1]), c.from(c.op.in[2]), c.f(c.op.in[2]),
            c.count(c.op.in[0]), optimizer_hyper(c.g, c.op.origin));
  };
  return s;
}

OpSpec adam_update() {
  OpSpec s;
  s.kind = proto::ADAM_UPDATE;  // in: param, grad, m, v (Adam and AdamW)
  s.name = "adam";
  s.phase = Phase::update;
  s.run = [](const OpCall& c) {
    c.k.adam(c.from(c.op.in[0]), c.f(c.op.in[0]), c.f(c.op.in[1]), c.from(c.op.in[2]), c.f(c.op.in[2]),
             c.from(c.op.in[3]), c.f(c.op.in[3]), c.count(c.op.in[0]), optimizer_hyper(c.g, c.op.origin));
  };
  return s;
}

}  // namespace

const std::vector<OpSpec>& optimizer_ops() {
  static const std::vector<OpSpec> ops = {sgd_update(), adam_update()};
  return ops;
}

}  // namespace tiermem::exec
