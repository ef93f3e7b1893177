// The end of a step (X9, X10): its snapshot when one is due, the commit
// (raising this rank's committed step, from which a restarted rank
// resumes), and the barrier every rank passes before the next step. With
// --replicas the snapshot travels to the copies while the next step
// computes, and the step is committed once it is whole (settle), before that
// step's optimizer writes over the parameters a restart before the commit
// would take. Owns the snapshot on its way and the fault hooks of the
// commit (RuntimeHooks).
#pragma once

#include <cstdint>
#include <optional>

#include <tiermem/batch.h>
#include <tiermem/client.h>

#include "executor/compute.hpp"
#include "executor/runtime/state/arenas.hpp"
#include "executor/runtime/state/job.hpp"
#include "executor/runtime/plan/job_plan.hpp"
#include "executor/runtime/exchange/mailboxes.hpp"
#include "executor/runtime/options.hpp"
#include "executor/trace.hpp"

namespace tiermem::exec {

class Committer {
 public:
  Committer(const JobPlan& job, const TrainOptions& options, Client& client, JobDirectory& dir, Arenas& arenas,
            const RankPeers& peers, Trace& trace, Compute& compute);

  // Step `step` ran and its update is written: its snapshot when due (now,
  // or posted with --replicas), its commit, then the barrier. Errors: those
  // of the snapshot and the barrier (timeouts name the rank awaited).
  Status end_step(int64_t step);
  // The posted snapshot whole on every copy (written again through the
  // job directory if a copy did not take it), and its step committed.
  Status settle();

 private:
  // Raises the committed step (and stops there when a hook asks).
  void commit(int64_t steps);
  void post_snapshot(int64_t steps);
  Status barrier(uint64_t value);

  const JobPlan& m_job;
  const TrainOptions& m_options;
  Client& m_client;
  JobDirectory& m_dir;
  Arenas& m_arenas;
  const RankPeers& m_peers;
  Trace& m_trace;
  Compute& m_compute;
  SnapshotImage m_image;  // the snapshot on its way (--replicas)
  std::optional<Batch> m_pending;
};

}  // namespace tiermem::exec
