// Partitioning (X3): the training graph split into pipeline stages. The graph
// is G = (V, E) with a vertex per forward op (its backward and update ops go
// with it), two vertex weights - memory (parameters with their gradient and
// optimizer state, plus activations of every micro-batch in flight) and
// compute (forward and backward FLOPs) - and edge weights in bytes that cross
// between stages per micro-batch (an activation forward, its gradient back).
// METIS finds a k-way minimum cut under a balance bound; random and greedy
// (contiguous FLOP-balanced split in topological order) are the baselines.
//
// Device-aware (partition_by_time): when the stages run on different devices
// (a GPU rank and CPU ranks, or a rank with fewer cores), FLOPs are the wrong
// thing to balance. Each stage then has a StageCost - its device's GEMM rate,
// measured at start, and its link to the next stage - and the partition
// balances predicted *time*: an op's FLOPs at its stage's rate, a boundary
// tensor's bytes over its sender's link.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <tiermem/status.h>

#include "executor/graph.hpp"

namespace tiermem::exec {

// time: partition_by_time's contiguous split (its METIS candidates keep metis).
enum class PartitionMethod { metis, random, greedy, time };

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
  // Device-aware only: each stage's predicted seconds per step (compute at
  // its device's rate and its sends over its link), as predict_stage_seconds.
  bool by_time = false;
  std::vector<double> predicted_seconds;
};

// What one pipeline stage runs on, for the device-aware partition.
struct StageCost {
  std::string device;              // "cpu (2 threads)", "cuda:0 (NVIDIA H200)"
  double flops_per_second = 0;     // GEMM rate of the device (calibrated)
  double link_bytes_per_second = 0;  // to the next stage; 0: no link (the last)
  double link_latency_seconds = 0;
};

// Whether the stages' devices differ enough (rates more than 10 % apart)
// that balancing time gives another split than balancing FLOPs.
bool costs_differ(const std::vector<StageCost>& costs);

// Seconds per step of every stage of `p`: for each micro-batch its forward
// and backward FLOPs at its rate, and each boundary tensor it sends (an
// activation forward, an activation's gradient back) over its link.
std::vector<double> predict_stage_seconds(const Graph& graph, const Partition& p, int micro_batches,
                                          const std::vector<StageCost>& costs);

// The partition into costs.size() stages, in order, whose slowest stage is
// fastest by prediction: the best of (a) an exact dynamic programme over
// contiguous splits of the forward ops in topological order (each prefix and
// stage count: the least bottleneck), (b) METIS with per-part target weights
// (each stage's share of the total rate) made monotone, and (c) the
// FLOP-balanced METIS partition - so it never predicts worse than FLOP
// balance. Errors: invalid_argument (more stages than forward ops, a rate
// not above 0), internal (METIS).
Result<Partition> partition_by_time(const Graph& graph, int micro_batches, const std::vector<StageCost>& costs);

std::string_view method_name(PartitionMethod m);

// The least FLOP imbalance any split at op granularity can reach: the
// heaviest forward op (with its backward) against the mean part. An MLP whose
// first matmul holds most of the work cannot balance two stages better.
double flops_imbalance_floor(const Graph& graph, int parts, int micro_batches);

// The FLOPs of every forward op with its backward ops, per micro-batch
// (index into graph.ops_of(forward)).
std::vector<double> forward_op_flops(const Graph& graph, int micro_batches);

// The partition that puts forward op v on stage of_forward_op[v] (stages
// 0..parts-1, in pipeline order), measured like any other. Errors:
// invalid_argument (a length or stage out of range).
Result<Partition> partition_from(const Graph& graph, int parts, int micro_batches, std::vector<int> of_forward_op);

// Numbers the stages so that the forward pass flows from lower stages to
// higher ones (what 1F1B's warm-up needs; METIS numbers its parts as it
// likes): a topological order of the stages, the lowest number first among
// equals, so an ordered partition stays as it is. False, and nothing
// changed, where the stages feed each other both ways (a residual stream
// cut back and forth).
bool order_stages(const Graph& graph, Partition* p);
// "" where the forward pass flows from lower stages to higher ones only,
// else the first tensor that goes back ("'x' goes from stage 1 back to
// stage 0 in the forward pass").
std::string flows_back(const Graph& graph, const Partition& p);
// A partition 1F1B can run: the stages numbered along the forward pass
// (order_stages), or where they feed each other both ways the contiguous
// FLOP-balanced cut (greedy) instead. Returns what it changed, for a log
// line ("" : nothing).
Result<std::string> order_for_1f1b(const Graph& graph, int micro_batches, Partition* p);

// Errors: invalid_argument (more parts than forward ops), internal (METIS).
Result<Partition> partition(const Graph& graph, int parts, PartitionMethod method, int micro_batches,
                            uint64_t seed = 1);

}  // namespace tiermem::exec
