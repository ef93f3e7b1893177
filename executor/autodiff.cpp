// Autodiff (X2): the backward pass from the forward graph, then the
// optimizer. Each forward op's gradient rule is its spec's (executor/ops/).
#include <cmath>

#include "executor/graph.hpp"
#include "executor/ops/op_registry.hpp"

namespace tiermem::exec {
namespace {

class Differentiator final : public GradientEmitter {
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

  // GradientEmitter, for the op being differentiated (m_op).
  const Graph& graph() const override { return m_g; }
  bool needs(int t) const override { return m_needs[static_cast<size_t>(t)]; }
  void need(int t) override { m_needs[static_cast<size_t>(t)] = true; }
  int dy(size_t i) const override { return m_g.tensors[static_cast<size_t>(m_op->out[i])].grad; }
  Op& emit(const std::string& suffix, OpKind kind, std::vector<int> in, std::vector<int> targets,
           double flops) override {
    Op op;
    op.name = m_op->name + suffix;
    op.kind = kind;
    op.phase = Phase::backward;
    op.in = std::move(in);
    op.origin = m_index;
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
    return m_g.ops.back();
  }

  void backward(int index) {
    const Op op = m_g.ops[index];  // copy: emit() grows the vector
    const int y = op.out[0];
    if (!m_needs[y]) return;
    const OpSpec& spec = op_spec(op.kind);
    // Nothing flows back here, unless this op starts the backward pass.
    if (m_g.tensors[y].grad < 0 && !(spec.starts_backward && y == m_g.loss)) return;
    if (spec.gradient == nullptr) return;
    m_op = &op;
    m_index = index;
    spec.gradient(*this, op);
    m_op = nullptr;
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
      const bool adam = opt.type() == proto::OptimizerDef::ADAM || opt.type() == proto::OptimizerDef::ADAMW;
      op.kind = adam ? proto::ADAM_UPDATE : proto::SGD_UPDATE;
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
  const Op* m_op = nullptr;  // the forward op whose gradient rule runs
  int m_index = -1;          // and its index
};

}  // namespace

Status add_training(Graph& graph, float grad_scale) {
  if (!graph.ops_of(Phase::backward).empty()) return Status(ErrorCode::failed_precondition, "already a training graph");
  // FLOPs of the forward ops, for the partitioner.
  for (Op& op : graph.ops) {
    const OpSpec& spec = op_spec(op.kind);
    op.flops = spec.flops != nullptr ? spec.flops(graph, op) : static_cast<double>(graph.tensors[op.out[0]].elements());
  }
  graph.grad_scale = grad_scale;
  return Differentiator(graph, grad_scale).run();
}

}  // namespace tiermem::exec
