#include "executor/runtime/step/committer.hpp"

#include <signal.h>

#include <atomic>
#include <cinttypes>
#include <cstdio>

#include <tiermem/status_macros.h>

namespace tiermem::exec {
namespace {

const std::string k_barrier_name = "barrier";
const std::string k_snapshot = "snapshot";
const std::string k_snapshot_wait = "snapshot wait";

}  // namespace

Committer::Committer(const JobPlan& job, const TrainOptions& options, Client& client, JobDirectory& dir,
                     Arenas& arenas, const RankPeers& peers, Trace& trace, Compute& compute)
    : m_job(job), m_options(options), m_client(client), m_dir(dir), m_arenas(arenas), m_peers(peers), m_trace(trace),
      m_compute(compute) {}

Status Committer::end_step(int64_t step) {
  // The step counts as committed once its snapshot (when one is due) is
  // whole: a rank that dies while writing it resumes from the step before
  // on its node too, as a replacement elsewhere does from the snapshot, so
  // no rank is ever committed past what it could be restored to. With
  // --replicas (data parallel) the snapshot travels while the next step
  // computes, and the step is committed before that one's optimizer writes
  // over the copy of the parameters a restart before the commit takes.
  // Meanwhile the others may pass this step's barrier: a replacement that
  // resumes at the step before finds their gradients of it still published
  // (they cannot pass the next barrier without this rank).
  const bool due = m_arenas.snapshot_every() > 0 && (step + 1) % m_arenas.snapshot_every() == 0;
  if (due && m_options.replicas > 0) {
    post_snapshot(step + 1);
  } else {
    if (due) {
      auto span = m_trace.span(SpanKind::comm, k_snapshot);
      TIERMEM_RETURN_IF_ERROR(m_arenas.snapshot(m_dir, step + 1, m_compute));
    }
    commit(step + 1);
  }
  return barrier(static_cast<uint64_t>(step + 1));
}

void Committer::commit(int64_t steps) {
  if (steps == m_options.hooks.stop_before_commit) {
    // Fault injection (RuntimeHooks): the step's gradients all-reduced with
    // the group, its update written, and not committed: this rank resumes a
    // step behind the others.
    std::fprintf(stderr, "rank %d: stopping before committing step %" PRId64 "\n", m_job.topo.rank, steps);
    ::raise(SIGSTOP);
  }
  m_arenas.commit(steps);
  if (steps == m_options.hooks.stop_after_commit) {
    // Fault injection (RuntimeHooks): a real SIGSTOP where a death is
    // hardest to resume from, the step committed and its barrier not raised.
    std::fprintf(stderr, "rank %d: stopping after committing step %" PRId64 "\n", m_job.topo.rank, steps);
    ::raise(SIGSTOP);
  }
}

void Committer::post_snapshot(int64_t steps) {
  auto span = m_trace.span(SpanKind::comm, k_snapshot);
  m_arenas.stage_snapshot(steps, m_compute, &m_image);
  m_pending.emplace(m_client);
  m_pending->write(m_image.at, m_image.bytes.data(), m_image.bytes.size());
  m_pending->submit();
}

Status Committer::settle() {
  if (!m_pending) return Status();
  if (m_image.step == m_options.hooks.stop_in_snapshot) {
    // Fault injection (RuntimeHooks): a real SIGSTOP with the step's
    // barrier raised (the others go on) and the step not committed, its
    // snapshot sent but not known whole.
    std::fprintf(stderr, "rank %d: stopping with the snapshot of step %" PRId64 " unsettled\n", m_job.topo.rank,
                 m_image.step);
    ::raise(SIGSTOP);
  }
  auto span = m_trace.span(SpanKind::sync, k_snapshot_wait);
  Status s = m_pending->wait();
  m_pending.reset();
  // A write a copy did not take (its node died, and is not dropped yet):
  // again, through the directory, which tries until the job's timeout.
  if (!s.ok()) s = m_dir.write(m_image.at, m_image.bytes.data(), m_image.bytes.size());
  if (!s.ok()) return s.with_context("snapshot of step " + std::to_string(m_image.step));
  commit(m_image.step);
  return Status();
}

Status Committer::barrier(uint64_t value) {
  auto span = m_trace.span(SpanKind::sync, k_barrier_name);
  std::atomic_ref<uint64_t> own(m_arenas.ctl()[k_barrier]);
  if (own.load() < value) own.store(value);
  const int world = m_job.topo.world();
  for (int r = 0; r < world; ++r) {
    if (r == m_job.topo.rank) continue;
    TIERMEM_RETURN_IF_ERROR(m_dir.wait_at_least(m_peers.ctl_word(r, k_barrier), value,
                                                "rank " + std::to_string(r) + " to finish step " +
                                                    std::to_string(value - 1)));
  }
  return Status();
}

}  // namespace tiermem::exec
