// What a stage's ops read and what they send (X5, X6): the batches of the
// dataset (the rows of a micro-batch, or of a test batch, into the input
// and label tensors; on a GPU through pinned staging), the boundary
// activations received from the stage before, the partial gradients
// received from the stages after (summed into the local gradient), and
// the outputs other stages wait for. Owns its staging buffers and the
// shuffled order of each epoch.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include <tiermem/status.h>

#include "executor/compute.hpp"
#include "executor/runtime/state/arenas.hpp"
#include "executor/runtime/plan/job_plan.hpp"
#include "executor/runtime/exchange/mailboxes.hpp"
#include "executor/runtime/options.hpp"
#include "executor/runtime/plan/schedule.hpp"

namespace tiermem::exec {


class Feeder {
 public:
  // `replay`: training steps are captured once and replayed (each parity
  // copies from staging of its own).
  Feeder(const JobPlan& job, const Schedule& schedule, const TrainOptions& options, Arenas& arenas, Mailboxes& mail,
         Compute& compute, bool replay);

  // A new pass (a step, or a test batch): nothing loaded or merged yet.
  void begin_pass();
  // The memory of tensor `t` for micro-batch `mb` in step `step` (the
  // parity of its parameters; `next_params`: the copy the update writes);
  // nullptr for a tensor that arrives in the mailbox (see gather_inputs)
  // and what is not planned here.
  void* memory(int t, int mb, int64_t step, bool next_params = false) const;
  // Everything `op` reads at `at`: batches loaded, activations received
  // (their pointers into the mailbox go to (*pointers)[t]), partial
  // gradients summed. Errors: those of the mailboxes.
  Status gather_inputs(const Op& op, const StepPoint& at, std::vector<void*>* pointers);
  // What other stages wait for of op `op_id`'s outputs. Errors: those of
  // the mailboxes; tier_exhausted without pinned memory to stage a GPU's
  // send to a CPU stage.
  Status send_outputs(int op_id, const StepPoint& at);
  // A replayed step's batches into the staging its capture copies from.
  Status fill_batches(int64_t step);

 private:
  Status merge_partials(int tensor, int mb, int64_t step);
  // Fills the batch into the tensor's memory (on a GPU: into its pinned
  // staging, then a copy queued, unless `queue_copy` is false: a replayed
  // step has the copy in it).
  Status load_batch(int tensor, const StepPoint& at, bool queue_copy = true);
  void fill_rows(const Tensor& tensor, const StepPoint& at, void* out);
  const std::vector<int64_t>& epoch_order(int64_t epoch);

  const JobPlan& m_job;
  const Schedule& m_schedule;
  const TrainOptions& m_options;
  Arenas& m_arenas;
  Mailboxes& m_mail;
  Compute& m_compute;
  bool m_replay;
  void* m_send_staging = nullptr;  // pinned host memory for sends to CPU stages (mixed jobs)
  size_t m_send_staging_bytes = 0;
  std::map<std::pair<int, int>, void*> m_staging;   // (tensor, mb) -> pinned batch (GPU)
  std::vector<std::vector<int64_t>> m_epoch_order;  // shuffled train rows per epoch (cached)
  std::vector<int64_t> m_test_order;
  std::set<std::pair<int, int>> m_merged;  // (tensor, mb) partial gradients merged in this pass
  std::set<std::pair<int, int>> m_loaded;  // (tensor, mb) loaded in this pass
};

}  // namespace tiermem::exec
