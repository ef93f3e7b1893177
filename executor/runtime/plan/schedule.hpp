// The order of one stage's work (X5): what the plan fixes for every step,
// worked out once from the job plan. A training step runs the plan's
// schedule (GPipe: the stage's forward ops for every micro-batch, then the
// backward ops in reverse), with the per-micro-batch gradients zeroed where
// their first contribution runs; the optimizer ops update this stage's
// parameters and state, and what no optimizer op writes is carried over.
// Evaluation runs the forward ops alone. Pure: no memory, no messages (a
// unit test builds one from a plan).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "executor/runtime/plan/job_plan.hpp"

namespace tiermem::exec {

// Where an op runs: at a position of training step `step`, or in an
// evaluation batch (then `step` is the committed step whose parameters it
// uses).
struct StepPoint {
  int64_t step = 0;
  int pos = -1;  // schedule position; -1 in evaluation
  int mb = 0;
  bool eval = false;
  uint64_t eval_sequence = 0;  // evaluation: the test batch's number (from 1)
  int64_t eval_batch = 0;      // evaluation: the test batch
};

class Schedule {
 public:
  explicit Schedule(const JobPlan& job);

  // (op, micro-batch) at each position of a training step.
  const std::vector<std::pair<int, int>>& positions() const { return m_job.plan.schedule; }
  // Work instances (indexes into the plan's work placements) to zero before
  // position `pos` runs: per-micro-batch gradients that contributions add into.
  const std::vector<int>& zero_at(int pos) const { return m_zero_at[static_cast<size_t>(pos)]; }
  // The channel bringing activation `tensor` to this stage, or -1: it is made here.
  int received_by(int tensor) const;
  // Channels bringing partial sums of gradient `tensor` back here (none: nullptr).
  const std::vector<int>* partials_of(int tensor) const;
  // The last op of this stage writing gradient `tensor` (it sends it back
  // once that op ran), or -1.
  int last_writer(int tensor) const;
  // This stage's optimizer ops, and the parameters and state none of them writes.
  const std::vector<int>& update_ops() const { return m_update_ops; }
  const std::vector<int>& carried() const { return m_carried; }
  // This stage's forward ops, in order (evaluation).
  const std::vector<int>& forward_ops() const { return m_forward; }
  // Whether op `op` is a tensor-parallel sum of this stage (PartialSum's).
  bool is_partial_sum(int op) const { return m_partial_sums.count(op) != 0; }
  // Rows the loss op sees per step (0: it is not on this stage).
  int64_t loss_rows() const { return m_loss_rows; }
  // Whether the stage exchanges anything with other ranks during a step
  // (messages, replicas' gradients, tensor-parallel sums).
  bool exchanges() const { return m_exchanges; }

 private:
  const JobPlan& m_job;
  std::vector<std::vector<int>> m_zero_at;
  std::map<int, int> m_received_channel;       // activation -> channel
  std::map<int, std::vector<int>> m_partials;  // gradient -> channels
  std::map<int, int> m_last_writer;            // gradient sent back -> last local op writing it
  std::vector<int> m_update_ops;
  std::vector<int> m_carried;
  std::vector<int> m_forward;
  std::set<int> m_partial_sums;
  int64_t m_loss_rows = 0;
  bool m_exchanges = false;
};

}  // namespace tiermem::exec
