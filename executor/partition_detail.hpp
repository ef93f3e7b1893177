// The partitioner's graph and its steps, shared by the FLOP-balanced
// partitioner (partitioner.cpp) and the device-aware one (partition_time.cpp).
// Internal to the executor.
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include <tiermem/status.h>

#include "executor/graph.hpp"
#include "executor/partitioner.hpp"

namespace tiermem::exec::detail {

inline constexpr double k_bound = 0.05;  // the balance bound: 5 %
inline constexpr int k_metis_seeds = 4;

// The graph METIS cuts: a vertex per forward op (index into
// graph.ops_of(forward)), its backward ops and parameters with it.
struct Weights {
  std::vector<int> forward;             // forward op ids
  std::vector<double> flops;            // per vertex, per micro-batch
  std::vector<int64_t> bytes;           // per vertex
  std::map<std::pair<int, int>, int64_t> edges;  // (u < v) -> bytes per micro-batch
};

Weights weigh(const Graph& g, int micro_batches);
// Fills the measures of p (cut, imbalances, per part) and of_op from of_forward_op.
void measure(const Graph& g, const Weights& w, Partition* p);
// Stages numbered in the order their first op runs.
void number_stages(Partition* p);
// Moves ops to later stages until none runs before an op it reads from.
void make_monotone(const Graph& g, const Weights& w, Partition* p);
bool stages_acyclic(const Graph& g, const Weights& w, const Partition& p);
// METIS's k-way (or recursive) cut into `parts`; `targets`, when given, the
// share of the FLOPs each part is to take (summing to 1): compute is then the
// only balance constraint. Errors: internal.
Status metis(const Weights& w, int parts, bool kway, int seed, std::vector<int>* out,
             const std::vector<double>* targets);

}  // namespace tiermem::exec::detail
