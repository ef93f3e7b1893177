// Autodiff (X2): the backward pass from the forward graph, then the optimizer.
#include <cmath>

#include "executor/graph.hpp"

namespace tiermem::exec {
namespace {

class Differentiator {
 public:
  Differentiator(Graph& g, float scale) : m_g(g), m_scale(scale) {}

  Status run() {
    const std::vector<int> forward = m_g.ops_of(Phase::forward);
    m_needs.assign(m_g.tensors.size(), false);
    for (int p : m_g.params()) m_needs[p] = true;
    for (int i : forward) {
      const Op& op = m_g.ops[i];
      bool any = false;
      for (int t : op.in) any = any || m_needs[t];
      for (int t : op.out) m_needs[t] = any;
    }
    if (!m_needs[m_g.loss]) return Status(ErrorCode::config_error, "the loss does not depend on any PARAM");
    for (auto it = forward.rbegin(); it != forward.rend(); ++it) backward(*it);
    return optimizer();
  }

 private:
  // The gradient tensor of `t`, created on first use.
  int grad(int t) {
    if (m_g.tensors[t].grad >= 0) return m_g.tensors[t].grad;
    Tensor g;
    g.name = "grad/" + m_g.tensors[t].name;
    g.shape = m_g.tensors[t].shape;
    g.role = Role::grad;
    g.of_param = m_g.tensors[t].role == Role::param;
    m_g.tensors.push_back(std::move(g));
    const int id = static_cast<int>(m_g.tensors.size()) - 1;
    m_g.tensors[t].grad = id;
    return id;
  }

  void emit(const std::string& name, OpKind kind, std::vector<int> in, std::vector<int> targets, int origin,
            double flops) {
    Op op;
    op.name = name;
    op.kind = kind;
    op.phase = Phase::backward;
    op.in = std::move(in);
    op.origin = origin;
    op.flops = flops;
    const int id = static_cast<int>(m_g.ops.size());
    for (int target : targets) {
      const int g = grad(target);
      // Parameter gradients sum over micro-batches (zeroed at each step);
      // any gradient with several contributors sums them.
      const bool accumulate = m_g.tensors[target].role == Role::param || m_g.tensors[g].producer >= 0;
      if (m_g.tensors[g].producer < 0) m_g.tensors[g].producer = id;
      op.out.push_back(g);
      op.accumulate.push_back(accumulate);
    }
    m_g.ops.push_back(std::move(op));
  }

  void backward(int index) {
    const Op op = m_g.ops[index];  // copy: emit() grows the vector
    const int y = op.out[0];
    if (!m_needs[y]) return;
    if (op.kind != OpKind::softmax_xent && m_g.tensors[y].grad < 0) return;  // nothing flows back here
    const double n = static_cast<double>(m_g.tensors[y].elements());
    auto needs = [&](size_t i) { return m_needs[op.in[i]]; };
    switch (op.kind) {
      case OpKind::matmul: {
        const int dy = m_g.tensors[y].grad;
        const auto& a = m_g.tensors[op.in[0]].shape;
        const auto& b = m_g.tensors[op.in[1]].shape;
        const double flops = 2.0 * a[0] * a[1] * b[1];
        if (needs(0)) emit(op.name + ".grad_a", OpKind::matmul_grad_a, {dy, op.in[1]}, {op.in[0]}, index, flops);
        if (needs(1)) emit(op.name + ".grad_b", OpKind::matmul_grad_b, {op.in[0], dy}, {op.in[1]}, index, flops);
        break;
      }
      case OpKind::bias_add: {
        const int dy = m_g.tensors[y].grad;
        if (needs(0)) emit(op.name + ".grad_x", OpKind::pass_grad, {dy}, {op.in[0]}, index, n);
        if (needs(1)) emit(op.name + ".grad_b", OpKind::bias_grad, {dy}, {op.in[1]}, index, n);
        break;
      }
      case OpKind::add: {
        const int dy = m_g.tensors[y].grad;
        if (needs(0)) emit(op.name + ".grad_a", OpKind::pass_grad, {dy}, {op.in[0]}, index, n);
        if (needs(1)) emit(op.name + ".grad_b", OpKind::pass_grad, {dy}, {op.in[1]}, index, n);
        break;
      }
      case OpKind::relu:
        if (needs(0)) emit(op.name + ".grad", OpKind::relu_grad, {op.in[0], m_g.tensors[y].grad}, {op.in[0]}, index, n);
        break;
      case OpKind::gelu:
        if (needs(0)) emit(op.name + ".grad", OpKind::gelu_grad, {op.in[0], m_g.tensors[y].grad}, {op.in[0]}, index, 20 * n);
        break;
      case OpKind::layer_norm: {
        // dX, dgamma, dbeta in one op (they share the per-row sums).
        std::vector<int> targets;
        for (size_t i = 0; i < 3; ++i) {
          if (needs(i)) targets.push_back(op.in[i]);
        }
        if (targets.size() != 3) {
          // Every input of a layer norm needs its gradient when any does in
          // the models we build; keep the kernel simple and say so otherwise.
          for (size_t i = 0; i < 3; ++i) m_needs[op.in[i]] = true;
          targets = {op.in[0], op.in[1], op.in[2]};
        }
        emit(op.name + ".grad", OpKind::layer_norm_grad, {op.in[0], op.in[1], op.out[1], op.out[2], m_g.tensors[y].grad},
             targets, index, 10 * n);
        break;
      }
      case OpKind::softmax_xent:
        if (y == m_g.loss && needs(0)) {
          emit(op.name + ".grad", OpKind::softmax_xent_grad, {op.in[0], op.in[1]}, {op.in[0]}, index,
               5.0 * static_cast<double>(m_g.tensors[op.in[0]].elements()));
        }
        break;
      case OpKind::concat: {
        int64_t column = 0;
        for (size_t i = 0; i < op.in.size(); ++i) {
          const int64_t cols = m_g.tensors[op.in[i]].shape[1];
          if (needs(i)) {
            emit(op.name + ".grad" + std::to_string(i), OpKind::slice_grad, {m_g.tensors[y].grad}, {op.in[i]}, index,
                 static_cast<double>(m_g.tensors[op.in[i]].elements()));
            m_g.ops.back().column = column;
          }
          column += cols;
        }
        break;
      }
      case OpKind::embedding:
        if (needs(1)) {
          emit(op.name + ".grad", OpKind::embedding_grad, {op.in[0], m_g.tensors[y].grad}, {op.in[1]}, index, n);
        }
        break;
      case OpKind::position_embedding: {
        const int dy = m_g.tensors[y].grad;
        if (needs(0)) emit(op.name + ".grad_x", OpKind::pass_grad, {dy}, {op.in[0]}, index, n);
        if (needs(1)) emit(op.name + ".grad_table", OpKind::position_embedding_grad, {dy}, {op.in[1]}, index, n);
        break;
      }
      case OpKind::attention:
        if (needs(0)) {
          emit(op.name + ".grad", OpKind::attention_grad, {op.in[0], op.out[1], m_g.tensors[y].grad}, {op.in[0]},
               index, 2 * op.flops);
          m_g.ops.back().heads = op.heads;
          m_g.ops.back().context = op.context;
        }
        break;
      case OpKind::tp_identity:
        // The input's gradient is the sum of every rank's part of it.
        if (needs(0)) emit(op.name + ".grad", OpKind::tp_all_reduce, {m_g.tensors[y].grad}, {op.in[0]}, index, n);
        break;
      case OpKind::tp_all_reduce:
        if (needs(0)) emit(op.name + ".grad", OpKind::pass_grad, {m_g.tensors[y].grad}, {op.in[0]}, index, n);
        break;
      default:
        break;
    }
  }

  Status optimizer() {
    const auto& opt = m_g.optimizer;
    if (opt.learning_rate() <= 0) {
      return Status(ErrorCode::config_error, "optimizer.learning_rate must be positive");
    }
    for (int p : m_g.params()) {
      if (m_g.tensors[p].grad < 0) continue;  // does not influence the loss
      Op op;
      op.name = "update/" + m_g.tensors[p].name;
      op.phase = Phase::update;
      op.origin = p;
      op.in = {p, m_g.tensors[p].grad};
      const bool adam = opt.type() == proto::OptimizerDef::ADAM;
      op.kind = adam ? OpKind::adam : OpKind::sgd;
      for (const char* state : adam ? std::vector<const char*>{"m", "v"} : std::vector<const char*>{"velocity"}) {
        Tensor s;
        s.name = "opt/" + m_g.tensors[p].name + "/" + state;
        s.shape = m_g.tensors[p].shape;
        s.role = Role::optimizer_state;
        m_g.tensors.push_back(std::move(s));
        op.in.push_back(static_cast<int>(m_g.tensors.size()) - 1);
      }
      op.flops = (adam ? 12.0 : 4.0) * static_cast<double>(m_g.tensors[p].elements());
      m_g.ops.push_back(std::move(op));
    }
    return Status();
  }

  Graph& m_g;
  float m_scale;
  std::vector<bool> m_needs;
};

}  // namespace

Status add_training(Graph& graph, float grad_scale) {
  if (!graph.ops_of(Phase::backward).empty()) return Status(ErrorCode::failed_precondition, "already a training graph");
  // FLOPs of the forward ops, for the partitioner.
  for (Op& op : graph.ops) {
    const double n = static_cast<double>(graph.tensors[op.out[0]].elements());
    if (op.kind == OpKind::matmul) {
      const auto& a = graph.tensors[op.in[0]].shape;
      op.flops = 2.0 * a[0] * a[1] * graph.tensors[op.in[1]].shape[1];
    } else if (op.kind == OpKind::concat) {
      op.flops = n;  // a copy
    } else if (op.kind == OpKind::softmax_xent) {
      op.flops = 5.0 * static_cast<double>(graph.tensors[op.in[0]].elements());
    } else if (op.kind == OpKind::attention) {
      // q k^T and p v over every sequence and head (the masked half too).
      op.flops = 4.0 * n * static_cast<double>(op.context);
    } else {
      op.flops = (op.kind == OpKind::gelu ? 20.0 : op.kind == OpKind::layer_norm ? 8.0 : 1.0) * n;
    }
  }
  graph.grad_scale = grad_scale;
  return Differentiator(graph, grad_scale).run();
}

}  // namespace tiermem::exec
