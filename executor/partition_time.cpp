// Device-aware partitioning (X3): balance predicted time, not FLOPs
// (partitioner.hpp). The cost model is the simplest that tells a GPU stage
// from a CPU one: an op costs its forward and backward FLOPs at its stage's
// measured GEMM rate (the GEMMs are most of every model here, and the rate
// of the element-wise kernels follows the device the same way), a boundary
// tensor costs its sender the link's latency plus its bytes at the link's
// bandwidth, once per micro-batch.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <set>

#include <tiermem/status_macros.h>

#include "executor/partition_detail.hpp"

namespace tiermem::exec {
namespace {

using namespace detail;

// An activation that may cross stages: produced by forward op (vertex) p,
// read by the forward ops in `readers` (sorted vertices after p).
struct Crossing {
  int producer = 0;
  std::vector<int> readers;
  int64_t bytes = 0;
  bool has_grad = false;
};

std::vector<Crossing> crossings(const Graph& g, const Weights& w) {
  std::vector<int> vertex_of(g.ops.size(), -1);
  for (size_t v = 0; v < w.forward.size(); ++v) vertex_of[w.forward[v]] = static_cast<int>(v);
  std::map<int, Crossing> by_tensor;
  for (size_t v = 0; v < w.forward.size(); ++v) {
    for (int t : g.ops[w.forward[v]].in) {
      const Tensor& tensor = g.tensors[t];
      if (tensor.role != Role::activation || tensor.producer < 0 || vertex_of[tensor.producer] < 0) continue;
      Crossing& c = by_tensor[t];
      c.producer = vertex_of[tensor.producer];
      c.bytes = tensor.bytes();
      c.has_grad = tensor.grad >= 0;
      if (c.readers.empty() || c.readers.back() != static_cast<int>(v)) c.readers.push_back(static_cast<int>(v));
    }
  }
  std::vector<Crossing> out;
  for (auto& [t, c] : by_tensor) out.push_back(std::move(c));
  return out;
}

// The link stage s sends over: its own (to the next stage), or for the last
// stage the one before it (links are taken as symmetric).
const StageCost& link_of(const std::vector<StageCost>& costs, size_t s) {
  if (costs[s].link_bytes_per_second > 0 || s == 0) return costs[s];
  return costs[s - 1];
}

double send_seconds(const std::vector<StageCost>& costs, size_t s, int64_t bytes) {
  const StageCost& link = link_of(costs, s);
  if (link.link_bytes_per_second <= 0) return 0;
  return link.link_latency_seconds + static_cast<double>(bytes) / link.link_bytes_per_second;
}

// The contiguous split: stage s takes forward ops [cut[s], cut[s + 1]).
class Chain {
 public:
  Chain(const Graph& g, const Weights& w, int micro_batches, const std::vector<StageCost>& costs)
      : m_w(w), m_crossings(crossings(g, w)), m_costs(costs), m_micro_batches(micro_batches) {
    m_prefix.assign(w.forward.size() + 1, 0);
    for (size_t v = 0; v < w.forward.size(); ++v) m_prefix[v + 1] = m_prefix[v] + w.flops[v];
    // A parameter read by several ops (tied weights) keeps them in one stage:
    // no cut between its first and last reader.
    m_allowed.assign(w.forward.size() + 1, true);
    std::map<int, std::pair<int, int>> readers;  // param -> (first, last vertex)
    for (size_t v = 0; v < w.forward.size(); ++v) {
      for (int t : g.ops[w.forward[v]].in) {
        if (g.tensors[t].role != Role::param) continue;
        auto [it, fresh] = readers.try_emplace(t, static_cast<int>(v), static_cast<int>(v));
        if (!fresh) it->second.second = static_cast<int>(v);
      }
    }
    for (const auto& [t, range] : readers) {
      for (int j = range.first + 1; j <= range.second; ++j) m_allowed[j] = false;
    }
  }

  // Seconds per step of stage s holding forward ops [i, j).
  double seconds(size_t s, int i, int j) const {
    double send = 0;
    for (const Crossing& c : m_crossings) {
      if (c.producer >= i && c.producer < j && c.readers.back() >= j) {
        send += send_seconds(m_costs, s, c.bytes);  // the activation forward
      } else if (c.producer < i && c.has_grad) {
        auto r = std::lower_bound(c.readers.begin(), c.readers.end(), i);
        if (r != c.readers.end() && *r < j) send += send_seconds(m_costs, s, c.bytes);  // its gradient back
      }
    }
    return m_micro_batches * ((m_prefix[j] - m_prefix[i]) / m_costs[s].flops_per_second + send);
  }

  // The least bottleneck over contiguous splits (dynamic programme);
  // empty when no split into costs.size() non-empty stages is allowed.
  std::vector<int> best_split() const {
    const int n = static_cast<int>(m_w.forward.size());
    const int parts = static_cast<int>(m_costs.size());
    constexpr double k_none = std::numeric_limits<double>::infinity();
    // best[s][j]: the least bottleneck of stages 0..s over ops [0, j).
    std::vector<std::vector<double>> best(parts, std::vector<double>(n + 1, k_none));
    std::vector<std::vector<int>> from(parts, std::vector<int>(n + 1, -1));
    for (int j = 1; j <= n; ++j) best[0][j] = m_allowed[j] || j == n ? seconds(0, 0, j) : k_none;
    for (int s = 1; s < parts; ++s) {
      for (int j = s + 1; j <= n; ++j) {
        if (!m_allowed[j] && j != n) continue;
        for (int i = s; i < j; ++i) {
          if (best[s - 1][i] == k_none) continue;
          const double b = std::max(best[s - 1][i], seconds(static_cast<size_t>(s), i, j));
          if (b < best[s][j]) {
            best[s][j] = b;
            from[s][j] = i;
          }
        }
      }
    }
    if (best[parts - 1][n] == k_none) return {};
    std::vector<int> of(n, 0);
    for (int s = parts - 1, j = n; s >= 0; --s) {
      const int i = s == 0 ? 0 : from[s][j];
      for (int v = i; v < j; ++v) of[v] = s;
      j = i;
    }
    return of;
  }

 private:
  const Weights& m_w;
  std::vector<Crossing> m_crossings;
  const std::vector<StageCost>& m_costs;
  int m_micro_batches;
  std::vector<double> m_prefix;
  std::vector<bool> m_allowed;  // a cut before vertex j (j = n: the end)
};

}  // namespace

bool costs_differ(const std::vector<StageCost>& costs) {
  if (costs.empty()) return false;
  const auto [lo, hi] = std::minmax_element(costs.begin(), costs.end(), [](const StageCost& a, const StageCost& b) {
    return a.flops_per_second < b.flops_per_second;
  });
  return lo->flops_per_second > 0 && hi->flops_per_second / lo->flops_per_second > 1.1;
}

std::vector<double> predict_stage_seconds(const Graph& graph, const Partition& p, int micro_batches,
                                          const std::vector<StageCost>& costs) {
  const Weights w = weigh(graph, micro_batches);
  std::vector<double> out(costs.size(), 0);
  if (p.of_forward_op.size() != w.forward.size() || static_cast<size_t>(p.parts) != costs.size()) return out;
  for (size_t v = 0; v < w.forward.size(); ++v) {
    const size_t s = static_cast<size_t>(p.of_forward_op[v]);
    out[s] += micro_batches * w.flops[v] / costs[s].flops_per_second;
  }
  // Each crossing activation once per stage reading it, its gradient back
  // once from each (as channels_of makes them).
  for (const Crossing& c : crossings(graph, w)) {
    const int from = p.of_forward_op[c.producer];
    std::set<int> to;
    for (int r : c.readers) {
      if (p.of_forward_op[r] != from) to.insert(p.of_forward_op[r]);
    }
    for (int s : to) {
      out[from] += micro_batches * send_seconds(costs, static_cast<size_t>(from), c.bytes);
      if (c.has_grad) out[s] += micro_batches * send_seconds(costs, static_cast<size_t>(s), c.bytes);
    }
  }
  return out;
}

Result<Partition> partition_by_time(const Graph& graph, int micro_batches, const std::vector<StageCost>& costs) {
  const int parts = static_cast<int>(costs.size());
  for (size_t s = 0; s < costs.size(); ++s) {
    if (!(costs[s].flops_per_second > 0) || !std::isfinite(costs[s].flops_per_second)) {
      return Status(ErrorCode::invalid_argument,
                    "stage " + std::to_string(s) + " (" + costs[s].device + ") has no GEMM rate above 0");
    }
  }
  TIERMEM_ASSIGN_OR_RETURN(Partition by_flops, partition(graph, parts, PartitionMethod::metis, micro_batches));
  const Weights w = weigh(graph, micro_batches);
  std::vector<Partition> candidates;
  by_flops.predicted_seconds = predict_stage_seconds(graph, by_flops, micro_batches, costs);
  candidates.push_back(by_flops);
  if (parts > 1) {
    Chain chain(graph, w, micro_batches, costs);
    if (std::vector<int> of = chain.best_split(); !of.empty()) {
      Partition p;
      p.method = PartitionMethod::time;
      p.parts = parts;
      p.of_forward_op = std::move(of);
      measure(graph, w, &p);
      candidates.push_back(std::move(p));
    }
    const double total = std::accumulate(costs.begin(), costs.end(), 0.0,
                                         [](double a, const StageCost& c) { return a + c.flops_per_second; });
    std::vector<double> targets;
    for (const StageCost& c : costs) targets.push_back(c.flops_per_second / total);
    // A share below one op's worth cannot be met (METIS then leaves the part
    // empty, or gives up): the programme above covers such meshes. K-way
    // only: recursive bisection with uneven targets empties parts too.
    const double least = *std::min_element(targets.begin(), targets.end());
    for (int seed = 1; least * static_cast<double>(w.forward.size()) >= 1 && seed <= k_metis_seeds; ++seed) {
      Partition p;
      p.parts = parts;
      if (!metis(w, parts, true, seed, &p.of_forward_op, &targets).ok()) continue;  // a candidate less
      number_stages(&p);
      make_monotone(graph, w, &p);
      std::vector<int> used(parts, 0);
      for (int x : p.of_forward_op) used[x] = 1;
      if (std::count(used.begin(), used.end(), 1) != parts || !stages_acyclic(graph, w, p)) continue;
      measure(graph, w, &p);
      candidates.push_back(std::move(p));
    }
  }
  auto bottleneck = [](const Partition& p) {
    return *std::max_element(p.predicted_seconds.begin(), p.predicted_seconds.end());
  };
  for (Partition& p : candidates) p.predicted_seconds = predict_stage_seconds(graph, p, micro_batches, costs);
  Partition best = candidates.front();
  for (const Partition& p : candidates) {
    // Ahead by more than rounding, or as fast with a smaller cut.
    const double a = bottleneck(p), b = bottleneck(best);
    if (a < b * (1 - 1e-9) || (a <= b * (1 + 1e-9) && p.cut_bytes < best.cut_bytes)) best = p;
  }
  best.by_time = true;
  return best;
}

}  // namespace tiermem::exec
