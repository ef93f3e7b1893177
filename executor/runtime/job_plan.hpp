// What a rank knows about its job before it touches memory (X3-X5): the
// training graph (split for balance, with its backward and update ops), the
// pipeline topology, the partition, the channels between stages, this stage's
// memory plan, the dataset and the step counts. Every rank computes the same
// plan from the same model and options: it is a pure function of them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <tiermem/status.h>

#include "executor/data.hpp"
#include "executor/graph.hpp"
#include "executor/memory_plan.hpp"
#include "executor/partitioner.hpp"
#include "executor/runtime/channels.hpp"
#include "executor/runtime/env.hpp"
#include "executor/runtime/trainer.hpp"

namespace tiermem::exec {

struct JobPlan {
  Graph graph;
  Topology topo;
  Partition partition;
  std::vector<std::string> split_report;  // ops split into column blocks for balance
  std::vector<std::string> tp_report;     // blocks split over the tensor-parallel group
  std::vector<Channel> channels;
  MemoryPlan plan;  // of this rank's stage
  Split data;
  int micro_batches = 1;
  int loss_stage = 0;
  int64_t steps_per_epoch = 1;
  int64_t total_steps = 0;
  int64_t eval_batches = 0;

  // The rank that prints progress: the loss's stage, first replica.
  bool reporter() const { return topo.stage() == loss_stage && topo.replica() == 0 && topo.tp() == 0; }
  // Rows one step trains on, over all replicas.
  int64_t rows_per_step() const { return graph.micro_batch * micro_batches * topo.replicas; }
  // Bytes of the arena `name` in the plan (0 when it has none).
  int64_t arena_bytes(const std::string& name) const;
};

// The plan in two parts, so that a rank loads its dataset while it does
// other things: all but the dataset (data and step counts left out)...
// Errors: those of loading the model; invalid_argument for a world that the
// stages do not divide, a bad --micro-batches.
Result<JobPlan> plan_model(const TrainOptions& options, const RankEnv& env);
// ... then the dataset (load_dataset's result) and the step counts. Errors:
// those of loading it; invalid_argument for a model whose inputs do not
// match it.
Status attach_data(Result<Split> data, const TrainOptions& options, JobPlan* job);
// Elements of an INPUT per sample: the tokens of a sequence, for a text
// dataset (load_dataset's `sequence`).
int64_t sample_rows(const Graph& graph);
// The most elements an operand of the graph's GEMMs has (Compute::set_precision).
int64_t gemm_operand_elements(const Graph& graph);

}  // namespace tiermem::exec
