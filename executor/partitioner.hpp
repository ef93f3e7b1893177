// Partitioning (X3): the training graph split into pipeline stages. The graph
// is G = (V, E) with a vertex per forward op (its backward and update ops go
// with it), two vertex weights - memory (parameters with their gradient and
// optimizer state, plus activations of every micro-batch in flight) and
// compute (forward and backward FLOPs) - and edge weights in bytes that cross
// between stages per micro-batch (an activation forward, its gradient back).
// METIS finds a k-way minimum cut under a balance bound; random and greedy
// (contiguous FLOP-balanced split in topological order) are the baselines.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <tiermem/status.h>

#include "executor/graph.hpp"

namespace tiermem::exec {

enum class PartitionMethod { metis, random, greedy };

struct Partition {
  PartitionMethod method = PartitionMethod::metis;
  int parts = 1;
  std::vector<int> of_forward_op;  // part of each forward op (index into graph.ops_of(forward))
  std::vector<int> of_op;          // part of every op of the graph
  int64_t cut_bytes = 0;           // per micro-batch
  double flops_imbalance = 0;      // max part / mean part - 1
  double memory_imbalance = 0;
  std::vector<double> part_flops;
  std::vector<int64_t> part_bytes;
};

std::string_view method_name(PartitionMethod m);

// The least FLOP imbalance any split at op granularity can reach: the
// heaviest forward op (with its backward) against the mean part. An MLP whose
// first matmul holds most of the work cannot balance two stages better.
double flops_imbalance_floor(const Graph& graph, int parts, int micro_batches);

// The FLOPs of every forward op with its backward ops, per micro-batch
// (index into graph.ops_of(forward)).
std::vector<double> forward_op_flops(const Graph& graph, int micro_batches);

// Errors: invalid_argument (more parts than forward ops), internal (METIS).
Result<Partition> partition(const Graph& graph, int parts, PartitionMethod method, int micro_batches,
                            uint64_t seed = 1);

}  // namespace tiermem::exec
