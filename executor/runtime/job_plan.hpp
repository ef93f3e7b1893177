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
  std::vector<Channel> channels;
  MemoryPlan plan;  // of this rank's stage
  Split data;
  int micro_batches = 1;
  int loss_stage = 0;
  int64_t steps_per_epoch = 1;
  int64_t total_steps = 0;
  int64_t eval_batches = 0;

  // The rank that prints progress: the loss's stage, first replica.
  bool reporter() const { return topo.stage() == loss_stage && topo.replica() == 0; }
  // Rows one step trains on, over all replicas.
  int64_t rows_per_step() const { return graph.micro_batch * micro_batches * topo.replicas; }
  // Bytes of the arena `name` in the plan (0 when it has none).
  int64_t arena_bytes(const std::string& name) const;
};

// Errors: those of loading the model and the dataset; invalid_argument for
// a world that the stages do not divide, a bad --micro-batches, a model whose
// inputs do not match the dataset.
Result<JobPlan> plan_job(const TrainOptions& options, const RankEnv& env);

}  // namespace tiermem::exec
