// The all-reduce of a tensor-parallel group (X7, tensor_parallel.hpp): every
// tp_all_reduce op sums the group's partial tensors, through tiermem.
//
// Each rank of the group pushes its part into every other rank's mailbox
// (the end of its mbox arena: one slot per exchange of a training step, per
// exchange of an evaluation batch, and per sending rank), then raises the
// receiver's word for the sender in one batch (write, fence,
// compare-and-swap: one request per node). A rank waits on its own words and
// sums the parts where they landed, in rank order: every rank of the group
// gets the same bits. Exchanges are numbered by their place in the schedule
// (training: step x exchanges per step + index; evaluation: test batch x
// exchanges per batch + index), so a restarted rank recomputes the same
// numbers and the same parts. A training slot is written again only in the
// next step, after the barrier every rank passes; an evaluation slot only
// once the receiver said it consumed the one before (a word of its own).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <tiermem/client.h>

#include "executor/runtime/state/arenas.hpp"
#include "executor/runtime/state/job.hpp"
#include "executor/runtime/plan/job_plan.hpp"
#include "executor/runtime/exchange/mailboxes.hpp"
#include "executor/trace.hpp"

namespace tiermem::exec {

class TpExchange {
 public:
  TpExchange(const JobPlan& job, const TrainOptions& options, Client& client, JobDirectory& dir,
             const Arenas& arenas, const RankPeers& peers, Trace& trace);

  // Bytes of the slots at the end of the mbox arena (0 without tensor
  // parallelism), and control words this stage needs past the channels'.
  static int64_t bytes(const JobPlan& job);
  static int64_t ctl_words(const JobPlan& job) { return tp_ctl_words(job); }

  // Whether op `op` is one of this stage's tp_all_reduce ops.
  bool handles(int op) const { return m_ops.count(op) != 0; }

  // The sum over the group of `part` (this rank's, the op's input) into
  // `out` (added to it when `accumulate`). `pos` is the op's schedule
  // position in training; in evaluation, `eval_sequence` numbers the test
  // batch (from 1). Errors: timeout naming the rank awaited; those of the
  // writes.
  Status all_reduce(int op, int pos, int64_t step, bool eval, uint64_t eval_sequence, const float* part, float* out,
                    int64_t elements, bool accumulate);

 private:
  int64_t slot_offset(bool eval, int64_t index, int from) const;
  size_t word(int kind, int u) const { return m_base_word + static_cast<size_t>(kind * m_ways + u); }

  const JobPlan& m_job;
  const TrainOptions& m_options;
  Client& m_client;
  JobDirectory& m_dir;
  const Arenas& m_arenas;
  const RankPeers& m_peers;
  Trace& m_trace;
  int m_ways = 1;
  size_t m_base_word = 0;
  int64_t m_area = 0;                // where the slots start in the mbox arena
  int64_t m_slot_bytes = 0;
  std::map<int, int64_t> m_train_index;  // schedule position -> exchange in the step
  std::map<int, int64_t> m_eval_index;   // op -> exchange in an evaluation batch
  std::set<int> m_ops;                   // this stage's tp_all_reduce ops
  int64_t m_per_step = 0, m_per_eval = 0;
  std::vector<float> m_sum;
};

}  // namespace tiermem::exec
