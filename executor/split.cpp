#include "executor/split.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <numeric>

#include <tiermem/status_macros.h>

#include "executor/partitioner.hpp"

namespace tiermem::exec {
namespace {

constexpr double k_balance = 0.05;
constexpr int64_t k_min_block_columns = 8;

// Column blocks for an op of `flops` against a block budget: the fewest that
// divide the N columns evenly with every block within the budget, without
// blocks narrower than k_min_block_columns (then as many as allowed).
int64_t blocks_for(double flops, double budget, int64_t columns) {
  int64_t best = 1;
  for (int64_t k = 2; k <= columns / k_min_block_columns; ++k) {
    if (columns % k != 0) continue;
    best = k;
    if (flops / static_cast<double>(k) <= budget) break;
  }
  return best;
}

// Builds the rewritten graph: tensors other than the split weights keep their
// order; a split op becomes its blocks and a CONCAT writing the old output.
class Rewriter {
 public:
  // widths[i]: the column widths of op i's blocks; empty: op i stays whole.
  Rewriter(const Graph& g, const std::vector<std::vector<int64_t>>& widths) : m_old(g), m_widths(widths) {}

  Graph run() {
    m_new.name = m_old.name;
    m_new.dataset = m_old.dataset;
    m_new.micro_batch = m_old.micro_batch;
    m_new.optimizer = m_old.optimizer;
    m_new.grad_scale = m_old.grad_scale;
    std::vector<bool> dropped(m_old.tensors.size(), false);
    for (size_t i = 0; i < m_old.ops.size(); ++i) {
      if (!m_widths[i].empty()) dropped[m_old.ops[i].in[1]] = true;
    }
    m_remap.assign(m_old.tensors.size(), -1);
    for (size_t t = 0; t < m_old.tensors.size(); ++t) {
      if (dropped[t]) continue;
      Tensor copy = m_old.tensors[t];
      copy.producer = -1;
      m_remap[t] = add_tensor(std::move(copy));
    }
    for (size_t i = 0; i < m_old.ops.size(); ++i) {
      if (!m_widths[i].empty()) {
        split(m_old.ops[i], m_widths[i]);
      } else {
        Op op = m_old.ops[i];
        for (int& t : op.in) t = m_remap[t];
        for (int& t : op.out) t = m_remap[t];
        add_op(std::move(op));
      }
    }
    m_new.loss = m_remap[m_old.loss];
    return std::move(m_new);
  }

 private:
  int add_tensor(Tensor t) {
    m_new.tensors.push_back(std::move(t));
    return static_cast<int>(m_new.tensors.size()) - 1;
  }

  void add_op(Op op) {
    const int id = static_cast<int>(m_new.ops.size());
    for (int t : op.out) {
      if (m_new.tensors[t].producer < 0) m_new.tensors[t].producer = id;
    }
    m_new.ops.push_back(std::move(op));
  }

  void split(const Op& op, const std::vector<int64_t>& widths) {
    const Tensor& w = m_old.tensors[op.in[1]];
    const Tensor& y = m_old.tensors[op.out[0]];
    int64_t column = 0;
    Op concat;
    concat.name = op.name + ".concat";
    concat.kind = proto::CONCAT;
    concat.phase = Phase::forward;
    for (size_t j = 0; j < widths.size(); ++j) {
      const int64_t cols = widths[j];
      const std::string suffix = ".c" + std::to_string(j);
      Tensor wj = w;
      wj.name = w.name + suffix;
      wj.shape = {w.shape[0], cols};
      init_as_part_of(w, 0, {{column, cols}}, &wj);
      column += cols;
      Tensor yj = y;
      yj.name = y.name + suffix;
      yj.shape = {y.shape[0], cols};
      yj.producer = -1;
      Op block = op;
      block.name = op.name + suffix;
      block.in = {m_remap[op.in[0]], add_tensor(std::move(wj))};
      block.out = {add_tensor(std::move(yj))};
      concat.in.push_back(block.out[0]);
      add_op(std::move(block));
    }
    concat.out = {m_remap[op.out[0]]};
    concat.accumulate = {false};
    add_op(std::move(concat));
  }

  const Graph& m_old;
  const std::vector<std::vector<int64_t>>& m_widths;
  std::vector<int> m_remap;
  Graph m_new;
};

// A forward graph with its training ops, and how METIS places them.
struct Placed {
  Graph training;
  Partition partition;
};

Result<Placed> place(const Graph& forward, int parts, int micro_batches) {
  Placed out{forward, {}};
  TIERMEM_RETURN_IF_ERROR(add_training(out.training, 1.0f));
  TIERMEM_ASSIGN_OR_RETURN(auto p, partition(out.training, parts, PartitionMethod::metis, micro_batches));
  out.partition = std::move(p);
  return out;
}

}  // namespace

Result<std::vector<std::string>> split_for_balance(Graph& forward, int parts, int micro_batches) {
  std::vector<std::string> report;
  if (parts <= 1) return report;
  if (!forward.ops_of(Phase::backward).empty()) {
    return Status(ErrorCode::failed_precondition, "split_for_balance takes a graph without its training ops");
  }
  TIERMEM_ASSIGN_OR_RETURN(auto whole, place(forward, parts, micro_batches));
  const double before = whole.partition.flops_imbalance;
  if (before <= k_balance) return report;
  const std::vector<double> flops = forward_op_flops(whole.training, micro_batches);
  const double mean = std::accumulate(flops.begin(), flops.end(), 0.0) / parts;
  const double budget = k_split_block_share * mean;
  // Fine: every heavy matmul in equal blocks small enough to balance.
  std::vector<std::vector<int64_t>> fine(forward.ops.size());
  bool any = false;
  for (size_t i = 0; i < forward.ops.size(); ++i) {
    const Op& op = forward.ops[i];
    if (op.kind != proto::MATMUL || flops[i] <= budget) continue;
    const Tensor& w = forward.tensors[op.in[1]];
    if (w.role != Role::param || w.shape.size() != 2) continue;
    // Blocks are named <tensor>.c<j>: leave an op whole whose names are taken.
    const std::string& y = forward.tensors[op.out[0]].name;
    if (forward.find(w.name + ".c0") >= 0 || forward.find(y + ".c0") >= 0) continue;
    const int64_t k = blocks_for(flops[i], budget, w.shape[1]);
    if (k == 1) continue;
    fine[i].assign(static_cast<size_t>(k), w.shape[1] / k);
    any = true;
  }
  if (!any) return report;
  Graph split = Rewriter(forward, fine).run();
  TIERMEM_ASSIGN_OR_RETURN(auto placed, place(split, parts, micro_batches));
  if (placed.partition.flops_imbalance >= before) return report;  // no better: leave the ops whole

  // Coarse: the blocks METIS put on one stage are one block, so that a stage
  // sends each other stage one tensor per split op, not one per block.
  std::map<std::string, int> stage_of;
  const std::vector<int> placed_ops = placed.training.ops_of(Phase::forward);
  for (size_t v = 0; v < placed_ops.size(); ++v) {
    stage_of[placed.training.ops[placed_ops[v]].name] = placed.partition.of_forward_op[v];
  }
  std::vector<std::vector<int64_t>> coarse(forward.ops.size());
  for (size_t i = 0; i < forward.ops.size(); ++i) {
    if (fine[i].empty()) continue;
    std::vector<int64_t> per_stage(parts, 0);
    for (size_t j = 0; j < fine[i].size(); ++j) {
      per_stage[stage_of.at(forward.ops[i].name + ".c" + std::to_string(j))] += fine[i][j];
    }
    for (int64_t width : per_stage) {
      if (width > 0) coarse[i].push_back(width);
    }
    if (coarse[i].size() == 1) coarse[i].clear();  // all on one stage: whole
  }
  double after = placed.partition.flops_imbalance;
  const std::vector<std::vector<int64_t>>* widths = &fine;
  Graph merged = Rewriter(forward, coarse).run();
  auto merged_placed = place(merged, parts, micro_batches);
  if (merged_placed.ok() && merged_placed->partition.flops_imbalance <= std::max(k_balance, after)) {
    split = std::move(merged);
    widths = &coarse;
    after = merged_placed->partition.flops_imbalance;
  }
  for (size_t i = 0; i < forward.ops.size(); ++i) {
    if ((*widths)[i].empty()) continue;
    const Op& op = forward.ops[i];
    std::string blocks;
    for (int64_t width : (*widths)[i]) blocks += (blocks.empty() ? "" : ", ") + std::to_string(width);
    char line[256];
    std::snprintf(line, sizeof line, "split %s (%s x %s, %.0f%% of the FLOPs) into %zu column blocks (%s)",
                  op.name.c_str(), shape_text(forward.tensors[op.in[0]].shape).c_str(),
                  shape_text(forward.tensors[op.in[1]].shape).c_str(), 100 * flops[i] / (mean * parts),
                  (*widths)[i].size(), blocks.c_str());
    report.emplace_back(line);
  }
  char line[128];
  std::snprintf(line, sizeof line, "FLOP imbalance over %d stages: %.1f%% whole, %.1f%% split", parts, 100 * before,
                100 * after);
  report.emplace_back(line);
  forward = std::move(split);
  return report;
}

}  // namespace tiermem::exec
