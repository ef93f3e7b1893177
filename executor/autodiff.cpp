// Autodiff (X2): the backward pass from the forward graph, then the
// optimizer. Each forward op's gradient rule is its spec's (executor/ops/).
//
// Activation checkpointing (checkpoint_segments > 0): the forward ops are cut
// into that many contiguous segments, each cut where the fewest activation
// bytes cross it. Before the first backward op of a segment, its forward ops
// run again as backward-phase clones ("<op>@recompute", writing "<t>@r"), and
// the segment's backward ops read those clones' outputs instead of the
// forward pass's; so the forward pass's activations inside a segment die as
// soon as the next forward op has read them, and only the tensors that cross
// segments live until the backward pass. The clones run the same kernels on
// the same inputs (dropout: the same salt, step and micro-batch, so the same
// mask): the same bits. The loss and tensor-parallel sums are never run
// twice; a clone nothing reads is dropped.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "executor/graph.hpp"
#include "executor/ops/op_registry.hpp"

namespace tiermem::exec {
namespace {

class Differentiator final : public GradientEmitter {
 public:
  Differentiator(Graph& g, float scale, int segments) : m_g(g), m_scale(scale), m_segments(segments) {}

  Status run() {
    const std::vector<int> forward = m_g.ops_of(Phase::forward);
    if (m_segments > 1) cut_segments(forward);
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
    if (m_segments > 1) drop_unread_clones();
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
    // Checkpointed: the segment's forward ops again, first; the values read
    // are theirs.
    if (!m_segment_of.empty()) {
      const int s = m_segment_of[static_cast<size_t>(m_index)];
      if (s >= 0 && m_recomputed_segments.insert(s).second) recompute(s);
      for (int& t : in) {
        if (auto it = m_recomputed.find(t); it != m_recomputed.end()) t = it->second;
      }
    }
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

  // --- activation checkpointing -------------------------------------------------

  static bool runs_once(const Op& op) {
    return op_spec(op.kind).starts_backward || op.kind == proto::TP_ALL_REDUCE;
  }

  // Segment of every forward op (m_segment_of, -1 for other ops): m_segments
  // contiguous runs of about equal length, each cut moved within half a
  // segment to where the fewest activation bytes cross it.
  void cut_segments(const std::vector<int>& forward) {
    const int n = static_cast<int>(forward.size());
    const int k = std::min(m_segments, n);
    if (k <= 1) return;
    std::vector<int> position(m_g.ops.size(), -1);
    for (int i = 0; i < n; ++i) position[static_cast<size_t>(forward[static_cast<size_t>(i)])] = i;
    // crossing[p]: bytes of activations made before position p and read at or after it.
    std::vector<int64_t> crossing(static_cast<size_t>(n) + 1, 0);
    for (size_t t = 0; t < m_g.tensors.size(); ++t) {
      const Tensor& tensor = m_g.tensors[t];
      if (tensor.role != Role::activation || tensor.producer < 0) continue;
      const int made = position[static_cast<size_t>(tensor.producer)];
      if (made < 0) continue;
      int last = made;
      for (int i = made + 1; i < n; ++i) {
        const Op& op = m_g.ops[static_cast<size_t>(forward[static_cast<size_t>(i)])];
        if (std::find(op.in.begin(), op.in.end(), static_cast<int>(t)) != op.in.end()) last = i;
      }
      for (int p = made + 1; p <= last; ++p) crossing[static_cast<size_t>(p)] += tensor.bytes();
    }
    std::vector<int> cuts{0};
    for (int c = 1; c < k; ++c) {
      const int target = c * n / k, half = std::max(1, n / k / 2);
      int best = std::max(cuts.back() + 1, target - half);
      for (int p = best; p <= std::min(n - (k - c), target + half); ++p) {
        if (crossing[static_cast<size_t>(p)] < crossing[static_cast<size_t>(best)]) best = p;
      }
      cuts.push_back(best);
    }
    cuts.push_back(n);
    m_segment_of.assign(m_g.ops.size(), -1);
    m_segment_ops.assign(static_cast<size_t>(k), {});
    for (int s = 0; s < k; ++s) {
      for (int i = cuts[static_cast<size_t>(s)]; i < cuts[static_cast<size_t>(s) + 1]; ++i) {
        const int op = forward[static_cast<size_t>(i)];
        m_segment_of[static_cast<size_t>(op)] = s;
        m_segment_ops[static_cast<size_t>(s)].push_back(op);
      }
    }
  }

  // Segment `s`'s forward ops again, as backward-phase clones writing new
  // tensors; m_recomputed maps each original output to its clone's.
  void recompute(int s) {
    for (int index : m_segment_ops[static_cast<size_t>(s)]) {
      Op clone = m_g.ops[static_cast<size_t>(index)];
      if (runs_once(clone)) continue;
      clone.name += "@recompute";
      clone.phase = Phase::backward;
      clone.recompute = true;
      clone.origin = index;
      for (int& t : clone.in) {
        if (auto it = m_recomputed.find(t); it != m_recomputed.end()) t = it->second;
      }
      const int id = static_cast<int>(m_g.ops.size());
      for (int& t : clone.out) {
        Tensor copy = m_g.tensors[static_cast<size_t>(t)];
        copy.name += "@r";
        copy.producer = id;
        copy.grad = -1;
        m_g.tensors.push_back(std::move(copy));
        const int fresh = static_cast<int>(m_g.tensors.size()) - 1;
        m_recomputed[t] = fresh;
        t = fresh;
      }
      m_g.ops.push_back(std::move(clone));
    }
  }

  // Clones whose outputs no op reads, removed (last first, so a clone read
  // only by a removed one goes too); the tensors they wrote stay, unused.
  void drop_unread_clones() {
    std::vector<int> readers(m_g.tensors.size(), 0);
    for (const Op& op : m_g.ops) {
      for (int t : op.in) ++readers[static_cast<size_t>(t)];
    }
    std::vector<bool> drop(m_g.ops.size(), false);
    for (size_t i = m_g.ops.size(); i-- > 0;) {
      const Op& op = m_g.ops[i];
      if (!op.recompute) continue;
      bool read = false;
      for (int t : op.out) read = read || readers[static_cast<size_t>(t)] > 0;
      if (read) continue;
      drop[i] = true;
      for (int t : op.in) --readers[static_cast<size_t>(t)];
    }
    std::vector<int> renumbered(m_g.ops.size(), -1);
    std::vector<Op> kept;
    for (size_t i = 0; i < m_g.ops.size(); ++i) {
      if (drop[i]) continue;
      renumbered[i] = static_cast<int>(kept.size());
      kept.push_back(std::move(m_g.ops[i]));
    }
    m_g.ops = std::move(kept);
    for (Tensor& t : m_g.tensors) {
      if (t.producer >= 0) t.producer = renumbered[static_cast<size_t>(t.producer)];
    }
  }

  Graph& m_g;
  float m_scale;
  int m_segments;
  std::vector<int> m_segment_of;               // forward op -> segment (-1: none)
  std::vector<std::vector<int>> m_segment_ops;  // segment -> its forward ops, in order
  std::set<int> m_recomputed_segments;
  std::map<int, int> m_recomputed;  // forward activation -> its clone's
  std::vector<bool> m_needs;
  const Op* m_op = nullptr;  // the forward op whose gradient rule runs
  int m_index = -1;          // and its index
};

}  // namespace

Status add_training(Graph& graph, float grad_scale, int checkpoint_segments) {
  if (!graph.ops_of(Phase::backward).empty()) return Status(ErrorCode::failed_precondition, "already a training graph");
  // FLOPs of the forward ops, for the partitioner.
  for (Op& op : graph.ops) {
    const OpSpec& spec = op_spec(op.kind);
    op.flops = spec.flops != nullptr ? spec.flops(graph, op) : static_cast<double>(graph.tensors[op.out[0]].elements());
  }
  graph.grad_scale = grad_scale;
  return Differentiator(graph, grad_scale, checkpoint_segments).run();
}

}  // namespace tiermem::exec
