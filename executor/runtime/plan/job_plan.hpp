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
#include "executor/runtime/plan/channels.hpp"
#include "executor/runtime/env.hpp"
#include "executor/runtime/options.hpp"

namespace tiermem::exec {

// The shape of a GEMM (a device is calibrated on the model's heaviest).
struct GemmShape {
  int64_t m = 512, k = 512, n = 512;
};

struct JobPlan {
  Graph graph;
  Topology topo;
  Partition partition;
  std::vector<std::string> split_report;  // ops split into column blocks for balance
  std::vector<std::string> tp_report;     // blocks split over the tensor-parallel group
  std::vector<Channel> channels;
  MemoryPlan plan;  // of this rank's stage
  int checkpoint = 0;          // the segments the graph was checkpointed over (autodiff.cpp; 0: none)
  std::string checkpoint_note;  // why, when the planner chose it
  Split data;
  int micro_batches = 1;
  int loss_stage = 0;
  int64_t steps_per_epoch = 1;
  int64_t total_steps = 0;
  int64_t eval_batches = 0;
  // Each stage's device and link as measured at start (profile.hpp); empty
  // when the job did not measure (one stage, --balance flops).
  std::vector<StageCost> costs;
  // Partitioned by time: what the FLOP-balanced cut was predicted to take.
  std::vector<double> flops_predicted_seconds;

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
// --schedule as the memory plan takes it (options.cpp checked the name).
PipelineSchedule pipeline_schedule(const TrainOptions& options);
// ... then the dataset (load_dataset's result) and the step counts. Errors:
// those of loading it; invalid_argument for a model whose inputs do not
// match it.
Status attach_data(Result<Split> data, const TrainOptions& options, JobPlan* job);
// Whether the job measures its ranks' devices for the partition: a pipeline
// (more than one stage) unless --balance flops, or one that re-plans.
bool wants_costs(const TrainOptions& options, const JobPlan& job);
// The partition again from the measured costs (--balance time; auto when
// the stages' devices differ, else the FLOP-balanced cut is kept and only
// its prediction added), with its channels and memory plan. Every rank gets
// the same costs, so every rank the same partition. Errors: those of
// partition_by_time and plan_memory.
Status balance_by_time(const TrainOptions& options, std::vector<StageCost> costs, JobPlan* job);
// Takes `partition` for the job: its channels, this stage's memory plan and
// the loss's stage follow. Errors: those of plan_memory.
Status apply_partition(const TrainOptions& options, Partition partition, JobPlan* job);
// For people: how the stages were cut, each stage's device, share of the
// FLOPs and predicted time; "" when the job did not measure its devices.
std::string describe_stages(const JobPlan& job);
// Elements of an INPUT per sample: the tokens of a sequence, for a text
// dataset (load_dataset's `sequence`).
int64_t sample_rows(const Graph& graph);
// The shape of the graph's GEMM with the most FLOPs (512^3 when it has none):
// what a rank calibrates its device at (profile.hpp).
GemmShape heaviest_gemm(const Graph& graph);
// The most elements an operand of the graph's GEMMs has (Compute::set_precision).
int64_t gemm_operand_elements(const Graph& graph);

}  // namespace tiermem::exec
