#include "executor/runtime/plan/job_plan.hpp"

#include <algorithm>
#include <cstdio>
#include <numeric>

#include <tiermem/status_macros.h>

#include "executor/kernels.hpp"
#include "executor/ops/op_registry.hpp"
#include "executor/split.hpp"
#include "executor/tensor_parallel.hpp"

namespace tiermem::exec {

PipelineSchedule pipeline_schedule(const TrainOptions& options) {
  return options.schedule == "1f1b" ? PipelineSchedule::one_f_one_b : PipelineSchedule::gpipe;
}

namespace {

Status check_dataset(const Graph& graph, const Split& data) {
  const bool tokens = !data.train.ids.empty();
  for (const Tensor& tensor : graph.tensors) {
    const int64_t per_sample = tensor.elements() / graph.micro_batch;
    if (tensor.role == Role::input) {
      if ((tensor.dtype == DType::i32) != tokens) {
        return Status(ErrorCode::invalid_argument, "input '" + tensor.name + "' is " +
                                                       (tokens ? "F32 features, but dataset " + data.name + " has token ids"
                                                               : "I32 token ids, but dataset " + data.name +
                                                                     " has features (a text:... dataset has tokens)"));
      }
      if (per_sample != data.train.cols) {
        return Status(ErrorCode::invalid_argument, "input '" + tensor.name + "' has " + std::to_string(per_sample) +
                                                       (tokens ? " tokens" : " features") + " per sample, dataset " +
                                                       data.name + " has " + std::to_string(data.train.cols));
      }
    }
    if (tensor.role == Role::label && per_sample != data.train.label_cols) {
      return Status(ErrorCode::invalid_argument, "label '" + tensor.name + "' has " + std::to_string(per_sample) +
                                                     " per sample, dataset " + data.name + " has " +
                                                     std::to_string(data.train.label_cols));
    }
  }
  // Every token id a table is indexed by must be one of its rows.
  for (const Op& op : graph.ops) {
    if (op.kind != proto::EMBEDDING || graph.tensors[op.in[0]].role != Role::input) continue;
    const int64_t rows = graph.tensors[op.in[1]].shape[0];
    if (rows < data.train.classes) {
      return Status(ErrorCode::invalid_argument, "op '" + op.name + "': the table has " + std::to_string(rows) +
                                                     " rows, but dataset " + data.name + "'s tokens go up to " +
                                                     std::to_string(data.train.classes - 1));
    }
  }
  return Status();
}

// A GPU with --precision bf16 runs attention without dropout in tiles where
// kernels.hpp's tiled_attention_fits says: its saved tensor holds the tiles'
// state, [m * heads, dh + 2], not every head's softmax, [m * heads, t].
void compact_attention_state(Graph& g) {
  for (const Op& op : g.ops) {
    if (op.kind != proto::CAUSAL_ATTENTION || op.probability > 0 || op.out.size() < 2) continue;
    const std::vector<int64_t>& y = g.tensors[op.out[0]].shape;
    if (!kernels::tiled_attention_fits(y[1], op.heads, op.context)) continue;
    g.tensors[op.out[1]].shape = {y[0] * op.heads, kernels::tiled_attention_state(y[1], op.heads)};
  }
}

// What follows from the partition: the channels, this stage's memory, the
// loss's stage.
Status place(const TrainOptions& options, JobPlan* job) {
  if (options.precision == "bf16" && options.device != "cpu") compact_attention_state(job->graph);
  // 1F1B: the forward pass from lower stages to higher ones (renumbered,
  // else cut contiguously).
  std::string reordered;
  if (pipeline_schedule(options) == PipelineSchedule::one_f_one_b) {
    TIERMEM_ASSIGN_OR_RETURN(reordered, order_for_1f1b(job->graph, job->micro_batches, &job->partition));
  }
  job->channels = channels_of(job->graph, job->partition);
  TIERMEM_ASSIGN_OR_RETURN(job->plan, plan_memory(job->graph, job->partition, job->topo.stage(), job->micro_batches,
                                                  {.vram = options.device != "cpu",
                                                   .budget = options.budget,
                                                   .schedule = pipeline_schedule(options)}));
  if (!reordered.empty()) job->plan.schedule_note = reordered;
  job->loss_stage = job->partition.of_op[job->graph.tensors[job->graph.loss].producer];
  return Status();
}

Status plan_graph(const TrainOptions& options, JobPlan* job) {
  // Every rank of a tensor-parallel group cuts its own part; the graphs of
  // the group have one shape, so they partition alike.
  TIERMEM_ASSIGN_OR_RETURN(job->tp_report,
                           shard_for_tensor_parallel(job->graph, job->topo.tensor_parallel, job->topo.tp()));
  if (options.split) {
    // Every rank rewrites the same graph the same way: the split is a pure
    // function of the model, the stages and the micro-batches.
    TIERMEM_ASSIGN_OR_RETURN(job->split_report, split_for_balance(job->graph, job->topo.stages, job->micro_batches));
  }
  if (options.checkpoint > 1 && job->topo.stages > 1) {
    return Status(ErrorCode::invalid_argument,
                  "--checkpoint " + std::to_string(options.checkpoint) + " with " + std::to_string(job->topo.stages) +
                      " pipeline stages: activation checkpointing runs on one stage for now (a recomputed segment "
                      "would send its activations between stages again); use --stages 1 or leave it out");
  }
  const Graph forward = job->graph;
  auto train_with = [&](int segments) -> Status {
    job->graph = forward;
    job->checkpoint = segments;
    TIERMEM_RETURN_IF_ERROR(
        add_training(job->graph, 1.0f / static_cast<float>(job->micro_batches * job->topo.replicas), segments));
    TIERMEM_ASSIGN_OR_RETURN(job->partition,
                             partition(job->graph, job->topo.stages, PartitionMethod::metis, job->micro_batches));
    return place(options, job);
  };
  Status planned = train_with(options.checkpoint);
  // A budget the activations do not fit even offloaded, on one stage and
  // with no --checkpoint given: checkpointed over 2, 4, 8, ... segments,
  // the fewest that fit (the same choice on every rank of the same budget).
  if (planned.code() != ErrorCode::tier_exhausted || options.checkpoint != 0 || job->topo.stages != 1 ||
      options.budget <= 0) {
    return planned;
  }
  const auto forward_ops = static_cast<int>(forward.ops_of(Phase::forward).size());
  for (int segments = 2; segments <= forward_ops; segments *= 2) {
    if (train_with(segments).ok()) {
      job->checkpoint_note = "activations do not fit the budget: checkpointed over " + std::to_string(segments) +
                             " segments (--checkpoint " + std::to_string(segments) + ")";
      return Status();
    }
  }
  return planned.with_context("checkpointed over up to " + std::to_string(forward_ops) + " segments it does not fit either");
}

}  // namespace

Status apply_partition(const TrainOptions& options, Partition partition, JobPlan* job) {
  job->partition = std::move(partition);
  return place(options, job);
}

bool wants_costs(const TrainOptions& options, const JobPlan& job) {
  return job.topo.stages > 1 && (options.balance != "flops" || options.replan.enabled);
}

Status balance_by_time(const TrainOptions& options, std::vector<StageCost> costs, JobPlan* job) {
  if (options.balance == "flops" || (options.balance == "auto" && !costs_differ(costs))) {
    // One kind of device: time follows FLOPs; the FLOP-balanced METIS cut
    // stays, with the prediction beside it (so with --balance flops).
    job->partition.predicted_seconds = predict_stage_seconds(job->graph, job->partition, job->micro_batches, costs);
    job->costs = std::move(costs);
    return Status();
  }
  job->flops_predicted_seconds = predict_stage_seconds(job->graph, job->partition, job->micro_batches, costs);
  TIERMEM_ASSIGN_OR_RETURN(job->partition, partition_by_time(job->graph, job->micro_batches, costs));
  job->costs = std::move(costs);
  return place(options, job);
}

std::string describe_stages(const JobPlan& job) {
  if (job.costs.empty()) return "";
  const Partition& p = job.partition;
  auto slowest = [](const std::vector<double>& v) { return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end()); };
  char line[512];
  std::string out;
  if (p.by_time) {
    std::snprintf(line, sizeof line,
                  "partition by time (each stage's measured device and link): slowest stage predicted %.2f ms per "
                  "step, against %.2f ms balancing FLOPs\n",
                  1e3 * slowest(p.predicted_seconds), 1e3 * slowest(job.flops_predicted_seconds));
  } else {
    std::snprintf(line, sizeof line,
                  "partition by FLOPs (%s): slowest stage predicted %.2f ms per step\n",
                  costs_differ(job.costs) ? "--balance flops" : "the stages run on one kind of device",
                  1e3 * slowest(p.predicted_seconds));
  }
  out += line;
  const std::vector<int> forward = job.graph.ops_of(Phase::forward);
  const double total = std::accumulate(p.part_flops.begin(), p.part_flops.end(), 0.0);
  for (int s = 0; s < p.parts; ++s) {
    const int ops = static_cast<int>(std::count(p.of_forward_op.begin(), p.of_forward_op.end(), s));
    const StageCost& c = job.costs[static_cast<size_t>(s)];
    std::snprintf(line, sizeof line, "  stage %d on %s (%.3g GFLOP/s", s, c.device.c_str(), c.flops_per_second / 1e9);
    out += line;
    if (c.link_bytes_per_second > 0) {
      std::snprintf(line, sizeof line, "; link %.3g GB/s, %.0f us", c.link_bytes_per_second / 1e9,
                    1e6 * c.link_latency_seconds);
      out += line;
    }
    std::snprintf(line, sizeof line, "): %d forward op(s), %.1f%% of the FLOPs, predicted %.2f ms per step\n", ops,
                  total > 0 ? 100 * p.part_flops[static_cast<size_t>(s)] / total : 0.0,
                  1e3 * p.predicted_seconds[static_cast<size_t>(s)]);
    out += line;
  }
  return out;
}

int64_t JobPlan::arena_bytes(const std::string& name) const {
  for (const ArenaPlan& a : plan.arenas) {
    if (a.name == name) return a.bytes;
  }
  return 0;
}

Result<JobPlan> plan_model(const TrainOptions& options, const RankEnv& env) {
  JobPlan job;
  TIERMEM_ASSIGN_OR_RETURN(job.graph, load_model(options.model));
  if (options.tensor_parallel < 1) return Status(ErrorCode::invalid_argument, "--tensor-parallel must be at least 1");
  if (options.tensor_parallel > 1 && options.device != "cpu" && options.collectives == "tiermem") {
    // tp_exchange.cpp sums the parts on the host: a group on GPUs sums them
    // device to device through NCCL (collectives.hpp).
    return Status(ErrorCode::invalid_argument, "--tensor-parallel " + std::to_string(options.tensor_parallel) +
                                                   " on GPU ranks sums the parts through NCCL: --collectives auto "
                                                   "or nccl, not tiermem");
  }
  if (options.tensor_parallel > 1 && options.replicas > 0) {
    return Status(ErrorCode::invalid_argument, "--replicas cannot go with --tensor-parallel yet: a rank that moved would "
                                               "need its group's partial sums again");
  }
  job.topo.tensor_parallel = options.tensor_parallel;
  if (env.world % options.tensor_parallel != 0) {
    return Status(ErrorCode::invalid_argument, "a world of " + std::to_string(env.world) +
                                                   " ranks cannot be split into tensor-parallel groups of " +
                                                   std::to_string(options.tensor_parallel));
  }
  const int groups = env.world / options.tensor_parallel;
  job.topo.stages = options.stages > 0 ? options.stages : groups;
  if (groups % job.topo.stages != 0) {
    return Status(ErrorCode::invalid_argument,
                  "a world of " + std::to_string(env.world) + " ranks cannot be split into " +
                      std::to_string(job.topo.stages) + " pipeline stages" +
                      (options.tensor_parallel > 1 ? " of " + std::to_string(options.tensor_parallel) + " ranks each"
                                                   : std::string()));
  }
  job.topo.replicas = groups / job.topo.stages;
  job.topo.rank = env.rank;
  if (options.micro_batches < 1) return Status(ErrorCode::invalid_argument, "--micro-batches must be at least 1");
  if (options.balance != "auto" && options.balance != "flops" && options.balance != "time") {
    return Status(ErrorCode::invalid_argument, "--balance '" + options.balance + "' is not auto, flops or time");
  }
  if (!(options.slowdown >= 1 && options.slowdown <= 1000)) {
    return Status(ErrorCode::invalid_argument, "--slowdown " + std::to_string(options.slowdown) +
                                                   " is not a factor from 1 to 1000");
  }
  if (options.slowdown_from < 0) {
    return Status(ErrorCode::invalid_argument, "--slowdown-from " + std::to_string(options.slowdown_from) +
                                                   " is not a step (0 or more)");
  }
  if (options.slowdown > 1 && options.device != "cpu") {
    // A GPU's kernels are queued, not run, when the call returns: there is
    // nothing to time and stretch on the host.
    return Status(ErrorCode::invalid_argument, "--slowdown emulates a slower device on CPU ranks (--device cpu) only");
  }
  if (options.replicas > 0 && job.topo.stages > 1) {
    // A pipeline rank that moved would need the boundary messages its
    // neighbours sent to its old mailbox again: not built.
    return Status(ErrorCode::invalid_argument,
                  "--replicas needs a data-parallel job (--stages 1): a pipeline stage cannot move to another node yet");
  }
  if (options.replicas > 0 && options.snapshot_every > 1) {
    // The other ranks keep only the last step's gradients for a rank that
    // resumes: it must resume at the step they are in.
    return Status(ErrorCode::invalid_argument, "--replicas snapshots every step; --snapshot-every " +
                                                   std::to_string(options.snapshot_every) + " cannot go with it");
  }
  job.micro_batches = options.micro_batches;
  if (options.tensor_parallel > 1) {
    for (const Op& op : job.graph.ops) {
      // A rank's share of a split tensor would draw another rank's masks.
      if (op.probability > 0) {
        return Status(ErrorCode::invalid_argument, "op '" + op.name +
                                                       "' drops out: dropout does not run tensor-parallel yet "
                                                       "(--tensor-parallel 1, or dropout 0)");
      }
    }
  }
  TIERMEM_RETURN_IF_ERROR(plan_graph(options, &job));
  if (job.graph.optimizer.max_grad_norm() > 0 &&
      (job.topo.stages > 1 || job.topo.tensor_parallel > 1 || job.plan.offload)) {
    // The norm is every gradient's: stages and tensor-parallel ranks would
    // sum their parts' squares first, and an offloaded stage streams its
    // gradients through the update; neither is built.
    char norm[32];
    std::snprintf(norm, sizeof norm, "%g", static_cast<double>(job.graph.optimizer.max_grad_norm()));
    return Status(ErrorCode::invalid_argument,
                  "the model clips gradients by their global norm (optimizer max_grad_norm " + std::string(norm) +
                      "): that runs on one rank's whole model (data-parallel replicas too), not yet " +
                      (job.topo.stages > 1             ? "over " + std::to_string(job.topo.stages) + " pipeline stages"
                       : job.topo.tensor_parallel > 1 ? "over " + std::to_string(job.topo.tensor_parallel) +
                                                            " tensor-parallel ranks"
                                                      : std::string("offloaded (beyond the memory budget)")));
  }
  return job;
}

int64_t gemm_operand_elements(const Graph& graph) {
  int64_t most = 0;
  for (const Op& op : graph.ops) {
    if (!op_spec(op.kind).gemm) continue;
    for (int t : op.in) most = std::max(most, graph.tensors[t].elements());
  }
  return most;
}

GemmShape heaviest_gemm(const Graph& graph) {
  GemmShape best;
  double most = 0;
  for (const Op& op : graph.ops) {
    if (op.kind != proto::MATMUL) continue;
    const Tensor& a = graph.tensors[op.in[0]];
    const Tensor& b = graph.tensors[op.in[1]];
    const double flops = static_cast<double>(a.shape[0]) * static_cast<double>(a.shape[1]) * static_cast<double>(b.shape[1]);
    if (flops > most) {
      most = flops;
      best = {a.shape[0], a.shape[1], b.shape[1]};
    }
  }
  return best;
}

int64_t sample_rows(const Graph& graph) {
  for (const Tensor& t : graph.tensors) {
    if (t.role == Role::input) return t.elements() / graph.micro_batch;
  }
  return 1;
}

Status attach_data(Result<Split> data, const TrainOptions& options, JobPlan* job) {
  // Every rank runs the same schedule of batches, so every rank knows how
  // many steps an epoch has.
  if (!data.ok()) return data.status();
  job->data = std::move(*data);
  TIERMEM_RETURN_IF_ERROR(check_dataset(job->graph, job->data));
  job->steps_per_epoch = std::max<int64_t>(1, job->data.train.rows / job->rows_per_step());
  job->total_steps = options.steps > 0 ? options.steps : options.epochs * job->steps_per_epoch;
  job->eval_batches = (job->data.test.rows + job->graph.micro_batch - 1) / job->graph.micro_batch;
  return Status();
}


}  // namespace tiermem::exec
