// Evaluation (X5): the stage's forward ops on the test set, one test batch
// after another, with the parameters of a committed step, through the same
// stages with messages of their own; the loss's stage counts the rows whose
// arg-max is the label and sums each batch's mean loss.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <tiermem/status.h>

#include "executor/compute.hpp"
#include "executor/interpreter.hpp"
#include "executor/runtime/step/feeder.hpp"
#include "executor/runtime/plan/job_plan.hpp"
#include "executor/runtime/exchange/mailboxes.hpp"
#include "executor/runtime/plan/schedule.hpp"

namespace tiermem::exec {

// What an evaluation measured (< 0: nothing yet).
struct EvalResult {
  double accuracy = -1;
  double loss = -1;
};

class Evaluator {
 public:
  // `resumed`: this rank restarted; its first evaluation skips the batches
  // its neighbours already got from it.
  Evaluator(const JobPlan& job, const Schedule& schedule, Feeder& feeder, Mailboxes& mail, Compute& compute,
            bool resumed);

  // Runs op `op` at a point of an evaluation (the stage's own op runner).
  using RunOp = std::function<Status(int op, const StepPoint& at)>;
  // Test accuracy and mean test loss over the test batches (the last one
  // wraps around to the split's start) with the parameters committed after
  // `committed` steps (the evaluation of epoch committed / steps_per_epoch);
  // *result is left alone on a stage without the loss.
  Status evaluate(int64_t committed, EvalResult* result, const RunOp& run);
  // The stage's op runner tells each op it ran: the loss op of an
  // evaluation batch has its correct rows counted.
  void ran(const Op& op, const TensorMemory& memory, const StepPoint& at);

 private:
  void count_correct(const float* logits, const int32_t* labels, const std::vector<int64_t>& shape, int64_t eval_batch);

  const JobPlan& m_job;
  const Schedule& m_schedule;
  Feeder& m_feeder;
  Mailboxes& m_mail;
  Compute& m_compute;
  bool m_resume;
  int64_t m_correct = 0, m_rows = 0;
};

}  // namespace tiermem::exec
