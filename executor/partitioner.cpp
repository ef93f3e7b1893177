#include "executor/partitioner.hpp"

#include <metis.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <tuple>

#include <tiermem/status_macros.h>

#include "executor/partition_detail.hpp"

namespace tiermem::exec {
namespace detail {
namespace {

// An undirected edge's key. (Not std::minmax: it returns references, which
// dangle when an argument is a temporary.)
std::pair<int, int> edge(int a, int b) { return {std::min(a, b), std::max(a, b)}; }

}  // namespace

Weights weigh(const Graph& g, int micro_batches) {
  Weights w;
  w.forward = g.ops_of(Phase::forward);
  std::vector<int> vertex_of(g.ops.size(), -1);
  for (size_t v = 0; v < w.forward.size(); ++v) vertex_of[w.forward[v]] = static_cast<int>(v);
  w.flops.assign(w.forward.size(), 0);
  w.bytes.assign(w.forward.size(), 0);
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const Op& op = g.ops[i];
    int v = vertex_of[i];
    if (op.phase == Phase::backward) v = vertex_of[op.origin];
    if (op.phase == Phase::update) continue;  // counted with the parameter below
    w.flops[v] += op.flops;
    if (op.phase == Phase::forward) {
      for (int t : op.out) w.bytes[v] += g.tensors[t].bytes() * micro_batches;
    }
  }
  // A parameter lives with (the first of) the ops that read it: value, gradient
  // and optimizer state.
  const int states = g.optimizer.type() == proto::OptimizerDef::SGD ? 1 : 2;
  std::map<int, int> owner;
  for (size_t v = 0; v < w.forward.size(); ++v) {
    for (int t : g.ops[w.forward[v]].in) {
      if (g.tensors[t].role != Role::param) continue;
      if (auto it = owner.find(t); it != owner.end()) {
        // Ops sharing a parameter must not be split: tie them together hard.
        w.edges[edge(it->second, static_cast<int>(v))] += int64_t{1} << 40;
      } else {
        owner[t] = static_cast<int>(v);
        w.bytes[v] += g.tensors[t].bytes() * (2 + states);
      }
    }
  }
  for (size_t v = 0; v < w.forward.size(); ++v) {
    for (int t : g.ops[w.forward[v]].in) {
      const int producer = g.tensors[t].producer;
      if (producer < 0 || g.tensors[t].role != Role::activation) continue;
      const int u = vertex_of[producer];
      const int64_t bytes = g.tensors[t].bytes() * (g.tensors[t].grad >= 0 ? 2 : 1);
      w.edges[edge(u, static_cast<int>(v))] += bytes;
    }
  }
  return w;
}

void measure(const Graph& g, const Weights& w, Partition* p) {
  p->part_flops.assign(p->parts, 0);
  p->part_bytes.assign(p->parts, 0);
  for (size_t v = 0; v < w.forward.size(); ++v) {
    p->part_flops[p->of_forward_op[v]] += w.flops[v];
    p->part_bytes[p->of_forward_op[v]] += w.bytes[v];
  }
  // What actually crosses: each activation once per other stage reading it
  // (METIS's edge sum counts a tensor once per reading op), with its gradient.
  std::vector<int> stage_of(g.ops.size(), -1);
  for (size_t v = 0; v < w.forward.size(); ++v) stage_of[w.forward[v]] = p->of_forward_op[v];
  std::set<std::pair<int, int>> crossing;
  for (int op : w.forward) {
    for (int t : g.ops[op].in) {
      const Tensor& tensor = g.tensors[t];
      if (tensor.role == Role::activation && tensor.producer >= 0 && stage_of[tensor.producer] != stage_of[op]) {
        crossing.insert({t, stage_of[op]});
      }
    }
  }
  p->cut_bytes = 0;
  for (const auto& [t, stage] : crossing) {
    p->cut_bytes += g.tensors[t].bytes() * (g.tensors[t].grad >= 0 ? 2 : 1);
  }
  const double total_f = std::accumulate(p->part_flops.begin(), p->part_flops.end(), 0.0);
  const double total_b = static_cast<double>(std::accumulate(p->part_bytes.begin(), p->part_bytes.end(), int64_t{0}));
  p->flops_imbalance = *std::max_element(p->part_flops.begin(), p->part_flops.end()) / (total_f / p->parts) - 1;
  p->memory_imbalance =
      static_cast<double>(*std::max_element(p->part_bytes.begin(), p->part_bytes.end())) / (total_b / p->parts) - 1;
  // Every op follows its forward op (backward) or its parameter's owner (update).
  p->of_op.assign(g.ops.size(), 0);
  std::vector<int> part_of_forward(g.ops.size(), 0);
  for (size_t v = 0; v < w.forward.size(); ++v) part_of_forward[w.forward[v]] = p->of_forward_op[v];
  std::map<int, int> param_part;
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const Op& op = g.ops[i];
    if (op.phase == Phase::forward) {
      p->of_op[i] = part_of_forward[i];
      for (int t : op.in) {
        if (g.tensors[t].role == Role::param && !param_part.count(t)) param_part[t] = p->of_op[i];
      }
    } else if (op.phase == Phase::backward) {
      p->of_op[i] = part_of_forward[op.origin];
    } else {
      p->of_op[i] = param_part[op.origin];
    }
  }
}

// Stages numbered in the order their first op runs: stage 0 reads the input.
void number_stages(Partition* p) {
  std::vector<int> label(p->parts, -1);
  int next = 0;
  for (int& x : p->of_forward_op) {
    if (label[x] < 0) label[x] = next++;
    x = label[x];
  }
}

// Moves ops to later stages until no op runs on an earlier stage than an op
// it reads from: the stages form a chain, as a pipeline needs. METIS balances
// the heavy ops (blocks of a split matmul); the light ops it strands upstream
// of their inputs (the loss next to the first blocks) are what moves.
void make_monotone(const Graph& g, const Weights& w, Partition* p) {
  std::vector<int> vertex_of(g.ops.size(), -1);
  for (size_t v = 0; v < w.forward.size(); ++v) vertex_of[w.forward[v]] = static_cast<int>(v);
  for (size_t v = 0; v < w.forward.size(); ++v) {  // forward ops are in topological order
    for (int t : g.ops[w.forward[v]].in) {
      const int producer = g.tensors[t].producer;
      if (producer < 0 || vertex_of[producer] < 0) continue;
      p->of_forward_op[v] = std::max(p->of_forward_op[v], p->of_forward_op[vertex_of[producer]]);
    }
  }
}

// Whether activations flow between stages without a cycle.
bool stages_acyclic(const Graph& g, const Weights& w, const Partition& p) {
  std::vector<int> stage_of(g.ops.size(), -1);
  for (size_t v = 0; v < w.forward.size(); ++v) stage_of[w.forward[v]] = p.of_forward_op[v];
  std::vector<std::set<int>> feeds(p.parts);
  for (int op : w.forward) {
    for (int t : g.ops[op].in) {
      const int producer = g.tensors[t].producer;
      if (producer >= 0 && stage_of[producer] >= 0 && stage_of[producer] != stage_of[op]) {
        feeds[stage_of[producer]].insert(stage_of[op]);
      }
    }
  }
  // Kahn: every stage leaves when nothing feeds it any more.
  std::vector<int> indegree(p.parts, 0);
  for (const auto& to : feeds) {
    for (int s : to) ++indegree[s];
  }
  std::vector<int> ready;
  for (int s = 0; s < p.parts; ++s) {
    if (indegree[s] == 0) ready.push_back(s);
  }
  int left = p.parts;
  while (!ready.empty()) {
    const int s = ready.back();
    ready.pop_back();
    --left;
    for (int t : feeds[s]) {
      if (--indegree[t] == 0) ready.push_back(t);
    }
  }
  return left == 0;
}

Status metis(const Weights& w, int parts, bool kway, int seed, std::vector<int>* out,
             const std::vector<double>* targets) {
  idx_t n = static_cast<idx_t>(w.forward.size());
  // With targets (device-aware: each part's share of the FLOPs), compute
  // alone: a part's memory follows its device, not an even share.
  idx_t ncon = targets != nullptr ? 1 : 2;
  // Integer weights: compute in kFLOP, memory in KiB (at least 1 each).
  std::vector<idx_t> vwgt;
  for (idx_t v = 0; v < n; ++v) {
    vwgt.push_back(std::max<idx_t>(1, static_cast<idx_t>(w.flops[v] / 1e3)));
    if (ncon == 2) vwgt.push_back(std::max<idx_t>(1, static_cast<idx_t>(w.bytes[v] >> 10)));
  }
  std::vector<real_t> tpwgts;
  if (targets != nullptr) {
    for (double t : *targets) tpwgts.push_back(static_cast<real_t>(t));
  }
  std::vector<std::vector<std::pair<idx_t, idx_t>>> adj(n);
  for (const auto& [e, bytes] : w.edges) {
    const idx_t weight = std::max<idx_t>(1, static_cast<idx_t>(std::min<int64_t>(bytes >> 6, int64_t{1} << 30)));
    adj[e.first].push_back({e.second, weight});
    adj[e.second].push_back({e.first, weight});
  }
  std::vector<idx_t> xadj{0}, adjncy, adjwgt;
  for (idx_t v = 0; v < n; ++v) {
    for (const auto& [u, weight] : adj[v]) {
      adjncy.push_back(u);
      adjwgt.push_back(weight);
    }
    xadj.push_back(static_cast<idx_t>(adjncy.size()));
  }
  idx_t nparts = parts;
  std::vector<real_t> ubvec(ncon, static_cast<real_t>(1 + k_bound));
  idx_t options[METIS_NOPTIONS];
  METIS_SetDefaultOptions(options);
  options[METIS_OPTION_SEED] = seed;  // fixed: deterministic
  options[METIS_OPTION_NUMBERING] = 0;
  idx_t objval = 0;
  std::vector<idx_t> part(n);
  const int rc = !kway ? METIS_PartGraphRecursive(&n, &ncon, xadj.data(), adjncy.data(), vwgt.data(), nullptr,
                                                       adjwgt.data(), &nparts, tpwgts.empty() ? nullptr : tpwgts.data(), ubvec.data(), options,
                                                       &objval, part.data())
                            : METIS_PartGraphKway(&n, &ncon, xadj.data(), adjncy.data(), vwgt.data(), nullptr,
                                                  adjwgt.data(), &nparts, tpwgts.empty() ? nullptr : tpwgts.data(), ubvec.data(), options, &objval,
                                                  part.data());
  if (rc != METIS_OK) return Status(ErrorCode::internal, "METIS failed with code " + std::to_string(rc));
  out->assign(part.begin(), part.end());
  return Status();
}

void greedy(const Weights& w, int parts, std::vector<int>* out) {
  const double total = std::accumulate(w.flops.begin(), w.flops.end(), 0.0);
  out->assign(w.forward.size(), 0);
  double acc = 0;
  const size_t n = w.forward.size();
  for (size_t v = 0; v < n; ++v) {
    // Contiguous in topological order; leave at least one op per later part.
    int p = std::min<int>(parts - 1, static_cast<int>(acc / (total / parts)));
    p = std::max<int>(p, parts - static_cast<int>(n - v));
    // Parts in order, none skipped: at most one past the previous op's.
    if (v > 0) p = std::clamp(p, (*out)[v - 1], (*out)[v - 1] + 1);
    else p = 0;
    (*out)[v] = p;
    acc += w.flops[v];
  }
}

}  // namespace detail

using namespace detail;

std::string_view method_name(PartitionMethod m) {
  switch (m) {
    case PartitionMethod::metis: return "metis";
    case PartitionMethod::random: return "random";
    case PartitionMethod::greedy: return "greedy";
    case PartitionMethod::time: return "time";
  }
  return "?";
}

std::vector<double> forward_op_flops(const Graph& graph, int micro_batches) {
  return weigh(graph, micro_batches).flops;
}

double flops_imbalance_floor(const Graph& graph, int parts, int micro_batches) {
  const std::vector<double> flops = forward_op_flops(graph, micro_batches);
  const double total = std::accumulate(flops.begin(), flops.end(), 0.0);
  if (total <= 0 || parts < 1) return 0;
  return std::max(0.0, *std::max_element(flops.begin(), flops.end()) / (total / parts) - 1);
}

Result<Partition> partition_from(const Graph& graph, int parts, int micro_batches, std::vector<int> of_forward_op) {
  const Weights w = weigh(graph, micro_batches);
  if (of_forward_op.size() != w.forward.size()) {
    return Status(ErrorCode::invalid_argument, "a partition of " + std::to_string(of_forward_op.size()) +
                                                   " forward ops for a graph of " + std::to_string(w.forward.size()));
  }
  for (int x : of_forward_op) {
    if (x < 0 || x >= parts) {
      return Status(ErrorCode::invalid_argument, "stage " + std::to_string(x) + " of a partition into " +
                                                     std::to_string(parts));
    }
  }
  Partition p;
  p.method = PartitionMethod::time;
  p.parts = parts;
  p.of_forward_op = std::move(of_forward_op);
  measure(graph, w, &p);
  return p;
}

bool order_stages(const Graph& graph, Partition* p) {
  const auto n = static_cast<size_t>(p->parts);
  std::vector<std::set<int>> next(n);
  std::vector<int> preds(n, 0);
  for (size_t i = 0; i < graph.ops.size(); ++i) {
    if (graph.ops[i].phase != Phase::forward) continue;
    const int to = p->of_op[i];
    for (int t : graph.ops[i].in) {
      const int producer = graph.tensors[static_cast<size_t>(t)].producer;
      if (producer < 0) continue;
      const int from = p->of_op[static_cast<size_t>(producer)];
      if (from != to && next[static_cast<size_t>(from)].insert(to).second) ++preds[static_cast<size_t>(to)];
    }
  }
  std::vector<int> order;  // order[new] = old
  std::set<int> ready;
  for (size_t s = 0; s < n; ++s) {
    if (preds[s] == 0) ready.insert(static_cast<int>(s));
  }
  while (!ready.empty()) {
    const int s = *ready.begin();
    ready.erase(ready.begin());
    order.push_back(s);
    for (int t : next[static_cast<size_t>(s)]) {
      if (--preds[static_cast<size_t>(t)] == 0) ready.insert(t);
    }
  }
  if (order.size() != n) return false;  // a cycle
  std::vector<int> renamed(n);  // renamed[old] = new
  for (size_t i = 0; i < n; ++i) renamed[static_cast<size_t>(order[i])] = static_cast<int>(i);
  for (int& s : p->of_forward_op) s = renamed[static_cast<size_t>(s)];
  for (int& s : p->of_op) {
    if (s >= 0) s = renamed[static_cast<size_t>(s)];
  }
  auto permute = [&](auto& per_part) {
    if (per_part.size() != n) return;
    auto old = per_part;
    for (size_t i = 0; i < n; ++i) per_part[i] = old[static_cast<size_t>(order[i])];
  };
  permute(p->part_flops);
  permute(p->part_bytes);
  permute(p->predicted_seconds);
  return true;
}

std::string flows_back(const Graph& graph, const Partition& p) {
  for (size_t i = 0; i < graph.ops.size(); ++i) {
    if (graph.ops[i].phase != Phase::forward) continue;
    for (int t : graph.ops[i].in) {
      const int producer = graph.tensors[static_cast<size_t>(t)].producer;
      if (producer < 0) continue;
      const int from = p.of_op[static_cast<size_t>(producer)], to = p.of_op[i];
      if (from > to) {
        return "'" + graph.tensors[static_cast<size_t>(t)].name + "' goes from stage " + std::to_string(from) +
               " back to stage " + std::to_string(to) + " in the forward pass";
      }
    }
  }
  return "";
}

Result<std::string> order_for_1f1b(const Graph& graph, int micro_batches, Partition* p) {
  if (p->parts <= 1 || flows_back(graph, *p).empty()) return std::string();
  Partition before = *p;
  if (order_stages(graph, p)) return std::string("1f1b: stages renumbered along the forward pass");
  const std::string why = flows_back(graph, before);
  TIERMEM_ASSIGN_OR_RETURN(Partition contiguous, partition(graph, p->parts, PartitionMethod::greedy, micro_batches));
  *p = std::move(contiguous);
  char imbalance[64];
  std::snprintf(imbalance, sizeof imbalance, "%.1f%%", 100 * p->flops_imbalance);
  return "1f1b: the " + std::string(method_name(before.method)) + " cut feeds stages both ways (" + why +
         "): cut contiguously along it instead (FLOP imbalance " + imbalance + ")";
}

Result<Partition> partition(const Graph& graph, int parts, PartitionMethod method, int micro_batches,
                            uint64_t seed) {
  const Weights w = weigh(graph, micro_batches);
  if (parts < 1 || static_cast<size_t>(parts) > w.forward.size()) {
    return Status(ErrorCode::invalid_argument, "cannot split " + std::to_string(w.forward.size()) +
                                                   " forward ops into " + std::to_string(parts) + " stages");
  }
  if (method == PartitionMethod::time) {
    return Status(ErrorCode::invalid_argument, "a partition by time needs each stage's costs: partition_by_time");
  }
  Partition p;
  p.method = method;
  p.parts = parts;
  if (parts == 1) {
    p.of_forward_op.assign(w.forward.size(), 0);
  } else if (method == PartitionMethod::metis) {
    // METIS is a heuristic, and on graphs of tens of vertices with two
    // balance constraints one run can miss the bound or cut more than it
    // must: try recursive bisection and k-way with a few fixed seeds, each
    // as METIS gives it and made monotone. Keep, in this order of
    // preference, a partition with FLOPs within the bound; whose stages feed
    // each other without a cycle (a pipeline: no stage waits, within a
    // micro-batch, for a stage it feeds); with memory within the bound; with
    // the smallest cut.
    using Score = std::tuple<double, bool, double, int64_t>;
    auto score = [&](const Partition& x) -> Score {
      return {x.flops_imbalance > k_bound ? x.flops_imbalance : 0.0, !stages_acyclic(graph, w, x),
              x.memory_imbalance > k_bound ? x.memory_imbalance : 0.0, x.cut_bytes};
    };
    Partition best;
    Score best_score;
    bool have = false;
    for (bool kway : {false, true}) {
      for (int seed = 1; seed <= k_metis_seeds; ++seed) {
        Partition trial = p;
        TIERMEM_RETURN_IF_ERROR(metis(w, parts, kway, seed, &trial.of_forward_op, nullptr));
        number_stages(&trial);
        for (bool repaired : {false, true}) {
          if (repaired) make_monotone(graph, w, &trial);
          // METIS (or the repair) may leave a part empty: not a candidate.
          std::vector<int> used(parts, 0);
          for (int x : trial.of_forward_op) used[x] = 1;
          if (std::count(used.begin(), used.end(), 1) != parts) continue;
          measure(graph, w, &trial);
          const Score trial_score = score(trial);
          if (!have || trial_score < best_score) {
            best = trial;
            best_score = trial_score;
            have = true;
          }
        }
      }
    }
    if (have) return best;
    greedy(w, parts, &p.of_forward_op);  // no METIS run used every part
  } else if (method == PartitionMethod::random) {
    std::mt19937_64 rng(seed);
    p.of_forward_op.resize(w.forward.size());
    for (auto& x : p.of_forward_op) x = static_cast<int>(rng() % parts);
    for (int k = 0; k < parts; ++k) p.of_forward_op[k] = k;  // no empty part
    std::shuffle(p.of_forward_op.begin(), p.of_forward_op.end(), rng);
  } else {
    greedy(w, parts, &p.of_forward_op);
  }
  number_stages(&p);
  measure(graph, w, &p);
  return p;
}

}  // namespace tiermem::exec
