#include "executor/runtime/step/evaluator.hpp"

#include <algorithm>

namespace tiermem::exec {

Evaluator::Evaluator(const JobPlan& job, const Schedule& schedule, Feeder& feeder, Mailboxes& mail, Compute& compute,
                     bool resumed)
    : m_job(job), m_schedule(schedule), m_feeder(feeder), m_mail(mail), m_compute(compute), m_resume(resumed) {}

void Evaluator::count_correct(const float* logits, const int32_t* labels, const std::vector<int64_t>& shape,
                              int64_t eval_batch) {
  std::vector<float> host_logits;
  std::vector<int32_t> host_labels;
  if (m_compute.memory_is_device()) {
    host_logits.resize(static_cast<size_t>(shape[0] * shape[1]));
    host_labels.resize(static_cast<size_t>(shape[0]));
    m_compute.copy(host_logits.data(), logits, host_logits.size() * 4);
    m_compute.copy(host_labels.data(), labels, host_labels.size() * 4);
    logits = host_logits.data();
    labels = host_labels.data();
  }
  // Rows past the test split's end (the last batch wraps) are not counted;
  // a sample is one row, or a sequence of rows (tokens).
  const int64_t per_sample = shape[0] / m_job.graph.micro_batch;
  const int64_t valid =
      std::min<int64_t>(shape[0], (m_job.data.test.rows - eval_batch * m_job.graph.micro_batch) * per_sample);
  for (int64_t r = 0; r < valid; ++r) {
    const float* row = logits + r * shape[1];
    m_correct += (std::max_element(row, row + shape[1]) - row) == labels[r];
  }
  m_rows += valid;
}

void Evaluator::ran(const Op& op, const TensorMemory& memory, const StepPoint& at) {
  if (op.kind != proto::SOFTMAX_CROSS_ENTROPY || !at.eval) return;
  count_correct(static_cast<const float*>(memory(op.in[0])), static_cast<const int32_t*>(memory(op.in[1])),
                m_job.graph.tensors[op.in[0]].shape, at.eval_batch);
}

Status Evaluator::evaluate(int64_t committed, EvalResult* result, const RunOp& run) {
  // Forward only, one test batch after the other; the parameters are those
  // committed (the parity of `committed`).
  m_correct = m_rows = 0;
  const uint64_t base = static_cast<uint64_t>((committed / m_job.steps_per_epoch - 1) * m_job.eval_batches);
  // After a restart in the middle of an evaluation: batches this rank's
  // neighbours already got from it, and already took from it, are skipped.
  uint64_t done = 0;
  if (m_resume) {
    auto messages = m_mail.eval_messages_done();
    if (!messages.ok()) return messages.status();
    done = *messages > base ? *messages - base : 0;
    m_resume = false;
  }
  Status status;
  m_compute.reset_stats();  // the loss op adds each batch's mean loss
  int64_t batches = 0;
  for (int64_t b = static_cast<int64_t>(done); b < m_job.eval_batches && status.ok(); ++b, ++batches) {
    m_feeder.begin_pass();
    const StepPoint at{.step = committed, .pos = -1, .mb = 0, .eval = true,
                       .eval_sequence = base + static_cast<uint64_t>(b) + 1, .eval_batch = b};
    for (int op : m_schedule.forward_ops()) {
      status = run(op, at);
      if (!status.ok()) break;
    }
    // The message on its way (its tensor is the next batch's memory), and
    // consumed once the kernels reading the slot in place are done: the
    // slot can take the next batch.
    if (status.ok()) status = m_mail.drain();
    if (status.ok()) status = m_compute.sync();
    if (status.ok()) status = m_mail.consumed_eval(at.eval_sequence);
  }
  double loss_sum = 0;
  int64_t correct = 0;
  m_compute.take_stats(&loss_sum, &correct);
  if (m_rows > 0) {
    result->accuracy = static_cast<double>(m_correct) / static_cast<double>(m_rows);
    result->loss = batches > 0 ? loss_sum / static_cast<double>(batches) : -1;
  }
  return status;
}

}  // namespace tiermem::exec
