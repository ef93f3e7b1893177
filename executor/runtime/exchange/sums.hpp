// Every sum a stage makes with other ranks (X7) goes through one of two
// interfaces, one per concern, each implementation chosen once when the
// job is planned (make_stage_sums), so the step never asks which:
//   - GradientSum: the data-parallel sum of parameter gradients over the
//     replicas. One replica: none. Through NCCL (GPU ranks) or the memory
//     service bucket by bucket (bucket_collective.hpp): the gradient
//     buckets (grad_buckets.hpp) start as soon as the last op writing them
//     ran, beside the rest of the backward pass, and the optimizer waits for
//     the last. Through the memory service whole: once the step's compute
//     is done every replica publishes its gradients and sums everyone's in
//     replica order (the replicas stay bit-identical).
//   - PartialSum: a tensor-parallel group's sum of the parts of a tensor
//     (TP_ALL_REDUCE ops): through NCCL on GPUs, else through the memory
//     service (tp_exchange.hpp).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include <tiermem/client.h>

#include "executor/compute.hpp"
#include "executor/grad_buckets.hpp"
#include "executor/runtime/state/arenas.hpp"
#include "executor/runtime/state/job.hpp"
#include "executor/runtime/plan/job_plan.hpp"
#include "executor/runtime/exchange/mailboxes.hpp"
#include "executor/runtime/exchange/rank_parts.hpp"
#include "executor/runtime/plan/schedule.hpp"
#include "executor/runtime/exchange/tp_exchange.hpp"
#include "executor/trace.hpp"

namespace tiermem::exec {

class GradientSum {
 public:
  virtual ~GradientSum() = default;
  // Schedule position `pos` of step `step` ran: the buckets ready after it start.
  virtual void after_position(int pos) = 0;
  // Every position ran (queued): what the optimizer reads waits for every
  // bucket. Errors: the group's (NCCL reports its own at the compute's sync).
  virtual Status all_queued() = 0;
  // The step's compute is done (the host synchronised, not while a step is
  // being captured): sums made on the host. Errors: those of the memory
  // service, timeouts naming the rank awaited.
  virtual Status after_sync(int64_t step) = 0;
};

class PartialSum {
 public:
  virtual ~PartialSum() = default;
  // out (+ out when `accumulate`: a backward sum adds to the gradient) =
  // the group's sum of `part` (`elements` floats), for the op at `at`.
  virtual Status sum(int op, const StepPoint& at, const float* part, float* out, int64_t elements, bool accumulate) = 0;
};

struct StageSums {
  std::unique_ptr<GradientSum> gradients;
  std::unique_ptr<PartialSum> parts;
};

// The stage's sums as the job was planned: over `dp_group` (a collective:
// NCCL, or the memory service's buckets; null: the memory service whole)
// with `buckets`, and `tp_group` (NCCL; null: `tp`, the memory service).
// Errors: tier_exhausted (no device memory for the tensor-parallel sums'
// scratch).
Result<StageSums> make_stage_sums(const RankParts& rank, TpExchange& tp, Collective* dp_group, Collective* tp_group,
                                  std::vector<GradBucket> buckets);

}  // namespace tiermem::exec
