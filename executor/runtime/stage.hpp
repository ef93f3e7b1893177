// The schedule of one pipeline stage (X5, X7): a training step is the GPipe
// schedule of the stage's ops (forward of every micro-batch, then backward in
// reverse), with the boundary messages each op receives before and sends
// after (on the CPU a message travels while the next ops compute:
// Mailboxes::send); then the all-reduce of parameter gradients across replicas, the
// optimizer writing the next copy of parameters and state, the commit, and a
// barrier. Evaluation runs the forward ops on the test set through the same
// stages with messages of its own.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include <tiermem/batch.h>
#include <tiermem/client.h>

#include "executor/compute.hpp"
#include "executor/grad_buckets.hpp"
#include "executor/interpreter.hpp"
#include "executor/runtime/arenas.hpp"
#include "executor/runtime/job_plan.hpp"
#include "executor/runtime/mailboxes.hpp"
#include "executor/runtime/param_stream.hpp"
#include "executor/runtime/slowdown.hpp"
#include "executor/runtime/tp_exchange.hpp"
#include "executor/trace.hpp"

namespace tiermem::exec {

// What the loss op saw in one step (on the stage that holds it).
struct StepStats {
  double loss_sum = 0;  // over the micro-batches
  int64_t correct = 0;
  int64_t rows = 0;
};

// What an evaluation measured (< 0: nothing yet).
struct EvalResult {
  double accuracy = -1;
  double loss = -1;
};

class StageRunner {
 public:
  StageRunner(const JobPlan& job, const TrainOptions& options, Client& client, JobDirectory& dir, Arenas& arenas,
              Mailboxes& mailboxes, TpExchange& tp, const RankPeers& peers, Trace& trace, bool resumed, Compute& compute);

  // Groups that reduce through NCCL (collectives.hpp; null: through
  // tiermem): the data-parallel one all-reduces `buckets` beside the
  // backward pass, the tensor-parallel one sums the parts. Errors:
  // tier_exhausted (no device memory for the sums' scratch).
  Status use_collectives(Collective* dp, Collective* tp, std::vector<GradBucket> buckets);

  // Whether steps are captured once and replayed (a GPU, --graphs, a stage
  // that exchanges no messages and has no replicas).
  bool replays() const { return m_replay; }

  // Runs training step `step` and commits it: at once, or (--replicas) once
  // its snapshot, written while the next step computes, is whole on every
  // copy (finish() for the last). Errors: those of the messages, the
  // all-reduce, the snapshot and the barrier (timeouts name the rank awaited).
  Status run_step(int64_t step, StepStats* stats);
  // Commits the last step run once its snapshot is whole.
  Status finish() { return settle_snapshot(); }
  // Offload's copies (param_stream.hpp).
  const ParamStream& stream() const { return m_stream; }
  // Test accuracy and mean test loss (over the test batches; the last one
  // wraps around to the split's start) with the parameters committed after
  // `committed` steps (the evaluation of epoch committed / steps_per_epoch);
  // *result is left alone on a stage without the loss.
  Status evaluate(int64_t committed, EvalResult* result);

 private:
  // Runs one (op, micro-batch) of the schedule at position `pos` (-1 in
  // evaluation), with what it receives before and sends after.
  Status run_scheduled(int op, int mb, int pos, bool eval, uint64_t eval_sequence, int64_t eval_batch);
  Status gather_inputs(const Op& op, int mb, bool eval, uint64_t eval_sequence, int64_t eval_batch,
                       std::vector<void*>* pointers);
  // The compute part of a step through a captured replay: captured at the
  // first step of each parity (the parameter copies alternate), after that
  // only the batches are loaded and the capture replayed.
  Status replay_step();
  Status fill_batches();
  Status send_outputs(int op_id, int mb, bool eval, uint64_t eval_sequence);
  void record_eval(const Op& op, const TensorMemory& memory, bool eval, int64_t eval_batch);
  Status merge_partials(int tensor, int mb);
  // Fills the batch into the tensor's memory (on a GPU: into its pinned
  // staging, then a copy queued, unless `queue_copy` is false: a replayed
  // step has the copy in it).
  Status load_batch(int tensor, int mb, bool eval, int64_t eval_batch, bool queue_copy = true);
  void fill_rows(const Tensor& tensor, int mb, bool eval, int64_t eval_batch, void* out);
  const std::vector<int64_t>& epoch_order(int64_t epoch);
  void count_correct(const float* logits, const int32_t* labels, const std::vector<int64_t>& shape, int64_t eval_batch);
  Status compute_step(int64_t step);
  Status all_reduce(int64_t step);
  // NCCL: the buckets ready after position `pos` on the group's stream.
  void reduce_buckets_after(int pos);
  // NCCL: the tensor-parallel group's sum of `part` into `out`.
  void tp_sum(const float* part, float* out, int64_t elements, bool accumulate);
  Status update();
  Status barrier(uint64_t value);
  // Raises the committed step (and stops there when a test asked).
  void commit(int64_t steps);
  // --replicas: the snapshot of `steps` staged and on its way, on the
  // library's thread; settle_snapshot() waits for it (writing it again
  // through the job directory if a copy did not take it) and commits.
  void post_snapshot(int64_t steps);
  Status settle_snapshot();
  // The memory of a tensor for the op being run; nullptr for tensors that
  // arrive in the mailbox (see gather_inputs) and what is not planned here.
  void* memory(int tensor, int mb, bool next_params) const;

  const JobPlan& m_job;
  const TrainOptions& m_options;
  Client& m_client;
  JobDirectory& m_dir;
  Arenas& m_arenas;
  Mailboxes& m_mail;
  TpExchange& m_tp;
  const RankPeers& m_peers;
  Trace& m_trace;
  Slowdown m_slowdown;  // --slowdown: an emulated slower device
  void* m_send_staging = nullptr;  // pinned host memory for sends to CPU stages (mixed jobs)
  size_t m_send_staging_bytes = 0;
  Compute& m_compute;
  Collective* m_dp = nullptr;   // NCCL data-parallel group
  Collective* m_tpc = nullptr;  // NCCL tensor-parallel group
  std::vector<GradBucket> m_buckets;
  std::map<int, std::vector<size_t>> m_buckets_at;  // schedule position -> buckets ready after it
  uint64_t m_dp_ticket = 0;
  float* m_tp_scratch = nullptr;  // a backward sum before it is added
  // Offload: parameters and gradients through the window, and the
  // optimizer on the host (the CPU's Adam over the home tier, ZeRO-Offload's
  // way) when the kernels run on a GPU.
  ParamStream m_stream;
  std::unique_ptr<Compute> m_host_compute;
  Compute* m_update_compute;
  bool m_eval_resume;  // the first evaluation after a restart skips what is done
  int64_t m_stop_after_commit = -1;  // TIERMEM_EXEC_STOP_AFTER_COMMIT (tests)
  int64_t m_stop_in_snapshot = -1;   // TIERMEM_EXEC_STOP_IN_SNAPSHOT (tests)
  int64_t m_stop_before_commit = -1;  // TIERMEM_EXEC_STOP_BEFORE_COMMIT (tests)
  SnapshotImage m_image;             // the snapshot on its way (--replicas)
  std::optional<Batch> m_pending;
  bool m_replay = false;
  bool m_capturing = false;
  int64_t m_prefilled = -1;  // the step whose batches are in their staging already
  int64_t m_loss_rows = 0;  // rows the loss op sees per step (0: not on this stage)
  std::map<std::pair<int, int>, void*> m_staging;  // (tensor, mb) -> pinned batch (GPU)

  // Fixed by the plan: which work instances start life at each schedule
  // position (the per-micro-batch gradients, which every contribution adds
  // into), where each activation comes from, who sends partial gradients.
  std::vector<std::vector<int>> m_zero_at;
  std::map<int, int> m_received_channel;       // activation -> channel bringing it here
  std::map<int, std::vector<int>> m_partials;  // gradient -> channels bringing partial sums
  std::map<int, int> m_last_writer;            // gradient sent back -> last local op writing it
  std::vector<int> m_update_ops;               // this stage's optimizer ops
  std::vector<int> m_carried;                  // parameters and state no optimizer op writes
  std::vector<std::vector<int64_t>> m_epoch_order;  // shuffled train rows per epoch (cached)
  std::vector<int64_t> m_test_order;

  // The step being run (also the parity of the committed copy) and what it
  // has done so far.
  int64_t m_step = 0;
  std::set<std::pair<int, int>> m_merged;  // (tensor, mb) partial gradients merged
  std::set<std::pair<int, int>> m_loaded;  // (tensor, mb) loaded in this pass
  StepStats m_stats;
  int64_t m_eval_correct = 0, m_eval_rows = 0;
};

}  // namespace tiermem::exec
