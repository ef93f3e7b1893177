// Trainer: runtime repartitioning (replan.hpp) - the look at every step
// boundary, and the move to a new cut through the memory service.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <thread>

#include <tiermem/status_macros.h>
#include <tiermem/units.h>

#include "executor/runtime/exchange/mesh_check.hpp"
#include "executor/runtime/control/trainer_impl.hpp"

namespace tiermem::exec {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// "11 ops (16.3% of the FLOPs), 1 op (41.9%), 1 op (41.9%)"
std::string cut_text(const Partition& p) {
  const double total = std::accumulate(p.part_flops.begin(), p.part_flops.end(), 0.0);
  std::string out;
  char share[32];
  for (int s = 0; s < p.parts; ++s) {
    const auto ops = std::count(p.of_forward_op.begin(), p.of_forward_op.end(), s);
    std::snprintf(share, sizeof share, "%.1f%%", total > 0 ? 100 * p.part_flops[static_cast<size_t>(s)] / total : 0.0);
    out += (s == 0 ? "" : ", ") + std::to_string(ops) + (ops == 1 ? " op (" : " ops (") + share +
           (s == 0 ? " of the FLOPs)" : ")");
  }
  return out;
}

}  // namespace

Status Trainer::check_replan() const {
  auto no = [](const std::string& why) { return Status(ErrorCode::invalid_argument, "--replan " + why); };
  if (m_job.topo.stages < 2) return no("needs a pipeline (two stages or more): one stage has nothing to move");
  if (m_job.topo.replicas > 1 || m_job.topo.tensor_parallel > 1) {
    return no("moves the stages of one pipeline; data-parallel replicas and tensor-parallel groups are not moved yet");
  }
  if (m_opt.replicas > 0 || m_opt.snapshot_every > 0) {
    return no("cannot go with --replicas or --snapshot-every yet: a snapshot holds one cut's layout");
  }
  if (!record_fits(m_job)) return no("keeps its cuts in a record of 16 stages and 880 forward ops at most");
  return Status();
}

Status Trainer::free_other_generations() {
  TIERMEM_ASSIGN_OR_RETURN(const std::vector<AllocationInfo> all, m_client->list());
  for (const AllocationInfo& a : all) {
    const int64_t g = m_dir->generation_of(m_env.rank, a.name);
    if (g < 0 || static_cast<uint64_t>(g) == m_dir->generation() || a.replica_of.node != 0) continue;
    TIERMEM_RETURN_IF_ERROR(m_client->free(a.gva).with_context("freeing " + a.name + ", left by a move"));
    if (!m_opt.quiet) std::fprintf(stderr, "rank %d: freed %s, left by a move that did not finish\n", m_env.rank, a.name.c_str());
  }
  return Status();
}

Status Trainer::adopt_generation() {
  const OwnRegion* own = m_env.rank == 0 ? &m_profiles.region() : nullptr;
  TIERMEM_ASSIGN_OR_RETURN(PlanRecord record, read_record(*m_dir, own, true));
  if (m_env.rank == 0 && record.pending > record.committed) {
    // A move that did not finish: the committed generation stays.
    std::fprintf(stderr, "rank 0: the move to generation %" PRIu64 " at step %" PRId64
                         " did not finish; the job goes on from generation %" PRIu64 "\n",
                 record.pending, record.switch_step, record.committed);
    record.pending = record.committed;
    record.switch_step = -1;
    write_record(m_profiles.region(), record);
  }
  if (record.committed > 0) {
    TIERMEM_ASSIGN_OR_RETURN(Partition p, partition_from(m_job.graph, m_job.topo.stages, m_job.micro_batches, record.cut));
    for (size_t s = 0; s < m_job.costs.size(); ++s) {
      if (record.rates[s] > 0) m_job.costs[s].flops_per_second = record.rates[s];
    }
    p.predicted_seconds = predict_stage_seconds(m_job.graph, p, m_job.micro_batches, m_job.costs);
    TIERMEM_RETURN_IF_ERROR(apply_partition(m_opt, std::move(p), &m_job));
    m_dir->set_generation(record.committed);
    if (!m_opt.quiet) {
      std::fprintf(stderr, "rank %d: the job was re-planned: generation %" PRIu64 " (%s)\n", m_env.rank,
                   record.committed, cut_text(m_job.partition).c_str());
    }
  }
  return free_other_generations();
}

Status Trainer::at_boundary(int64_t step, int64_t first, double wall, std::unique_ptr<StageRunner>* stage,
                            Progress* progress) {
  if (step > first) {
    const double compute = m_trace.seconds(SpanKind::compute);
    m_samples->step_done(static_cast<uint64_t>(step), wall, compute - m_last_compute);
    m_last_compute = compute;
  }
  // A restarted process looks from its second boundary: at its first, rank
  // 0 may not have cleared a move that did not finish (adopt_generation).
  if (step == first) return Status();
  const OwnRegion* own = m_env.rank == 0 ? &m_profiles.region() : nullptr;
  if (m_policy) {
    TIERMEM_ASSIGN_OR_RETURN(auto decision, m_policy->look(*m_dir, step));
    if (decision) {
      // The move is at the next boundary: every rank reads this record
      // after this rank raises its barrier for the step it now runs.
      TIERMEM_ASSIGN_OR_RETURN(PlanRecord record, read_record(*m_dir, own, true));
      record.pending = record.committed + 1;
      record.switch_step = step + 1;
      record.next_cut = decision->partition.of_forward_op;
      record.next_rates.clear();
      for (const StageCost& c : decision->costs) record.next_rates.push_back(c.flops_per_second);
      if (record.committed == 0) {
        record.cut = m_job.partition.of_forward_op;
        record.rates.clear();
        for (const StageCost& c : m_job.costs) record.rates.push_back(c.flops_per_second);
      }
      write_record(m_profiles.region(), record);
      std::printf("re-plan decided at step %" PRId64 ": %s; moving at step %" PRId64 " to %s (was %s)\n", step,
                  decision->cause.c_str(), step + 1, cut_text(decision->partition).c_str(),
                  cut_text(m_job.partition).c_str());
    }
  }
  TIERMEM_ASSIGN_OR_RETURN(const PlanRecord head, read_record(*m_dir, own, false));
  if (head.pending <= head.committed || head.switch_step != step) return Status();
  TIERMEM_ASSIGN_OR_RETURN(const PlanRecord record, read_record(*m_dir, own, true));
  TIERMEM_RETURN_IF_ERROR(move_to(step, record, stage));
  return progress->cut_changed();
}

Status Trainer::copy_state(const JobPlan& old, const Arenas& old_arenas, int64_t step, int* moved,
                           uint64_t* moved_bytes) {
  // Every stage's plan in the old cut (a pure function of the cut and of
  // the owner's device and budget, which it published), and the arenas
  // each holds the committed copies in.
  const int stages = old.topo.stages;
  std::vector<MemoryPlan> plans;
  std::vector<Gva> params(stages), optimizer(stages);
  for (int s = 0; s < stages; ++s) {
    const RankProfile& owner = m_profiles.ranks()[static_cast<size_t>(old.topo.rank_of(s, 0))];
    TIERMEM_ASSIGN_OR_RETURN(MemoryPlan p, plan_memory(old.graph, old.partition, s, old.micro_batches,
                                                       {.vram = owner.device_memory,
                                                        .budget = owner.budget,
                                                        .schedule = pipeline_schedule(m_opt)}));
    plans.push_back(std::move(p));
    if (s == old.topo.stage()) continue;
    TIERMEM_ASSIGN_OR_RETURN(params[s], m_dir->peer(old.topo.rank_of(s, 0), "params"));
    TIERMEM_ASSIGN_OR_RETURN(optimizer[s], m_dir->peer(old.topo.rank_of(s, 0), "optimizer"));
  }
  const int64_t parity = step % 2;  // the committed copy of `step` steps
  const bool stop = m_opt.hooks.stop_in_move;
  std::vector<std::byte> host;
  int copied = 0;
  for (const auto* list : {&m_job.plan.params, &m_job.plan.optimizer}) {
    const bool is_params = list == &m_job.plan.params;
    for (const Placement& mine : *list) {
      const Tensor& t = m_job.graph.tensors[mine.tensor];
      int from = -1;
      const Placement* theirs = nullptr;
      for (int s = 0; s < stages && from < 0; ++s) {
        for (const Placement& p : is_params ? plans[s].params : plans[s].optimizer) {
          if (p.tensor == mine.tensor) {
            from = s;
            theirs = &p;
            break;
          }
        }
      }
      if (from < 0) return Status(ErrorCode::internal, "no stage of the old cut holds '" + t.name + "'");
      void* to = m_arenas.memory(m_job, mine.tensor, -1, parity);
      const auto bytes = static_cast<size_t>(t.bytes());
      if (from == old.topo.stage()) {
        m_compute->copy(to, old_arenas.memory(old, mine.tensor, -1, parity), bytes);
      } else {
        int64_t arena = 0;
        for (const ArenaPlan& a : plans[from].arenas) {
          if (a.name == (is_params ? "params" : "optimizer")) arena = a.bytes;
        }
        host.resize(bytes);
        const Gva at = (is_params ? params : optimizer)[from].plus(static_cast<uint64_t>(parity * arena + theirs->offset));
        TIERMEM_RETURN_IF_ERROR(m_dir->read(at, host.data(), bytes).with_context("moving '" + t.name + "'"));
        m_compute->copy(to, host.data(), bytes);
        ++*moved;
        *moved_bytes += bytes;
      }
      if (++copied == 1 && stop) {
        // Fault injection for tests: a real SIGSTOP in the middle of a move.
        std::fprintf(stderr, "rank %d: stopping in the move at step %" PRId64 "\n", m_env.rank, step);
        ::raise(SIGSTOP);
      }
    }
  }
  return m_compute->sync();
}

Status Trainer::move_to(int64_t step, const PlanRecord& record, std::unique_ptr<StageRunner>* stage) {
  const auto started = Clock::now();
  TIERMEM_RETURN_IF_ERROR(m_mail->drain());
  stage->reset();
  m_mail.reset();
  m_tp.reset();
  // The old generation stays whole until the new one is committed.
  const JobPlan old = m_job;
  Arenas old_arenas = std::move(m_arenas);
  m_arenas = Arenas();
  TIERMEM_ASSIGN_OR_RETURN(Partition p,
                           partition_from(m_job.graph, m_job.topo.stages, m_job.micro_batches, record.next_cut));
  for (size_t s = 0; s < m_job.costs.size(); ++s) {
    if (record.next_rates[s] > 0) m_job.costs[s].flops_per_second = record.next_rates[s];
  }
  p.predicted_seconds = predict_stage_seconds(m_job.graph, p, m_job.micro_batches, m_job.costs);
  TIERMEM_RETURN_IF_ERROR(apply_partition(m_opt, std::move(p), &m_job));
  m_dir->set_generation(record.pending);
  TIERMEM_RETURN_IF_ERROR(
      m_arenas.allocate(*m_dir, m_job, m_opt, Mailboxes::bytes(m_job) + TpExchange::bytes(m_job), *m_compute));
  m_dir->set_generation(record.committed);  // the old names, to read from
  int moved = 0;
  uint64_t moved_bytes = 0;
  Status s = copy_state(old, old_arenas, step, &moved, &moved_bytes);
  m_dir->set_generation(record.pending);
  TIERMEM_RETURN_IF_ERROR(s);
  // The control words where a run of this cut would have them.
  uint64_t* ctl = m_arenas.ctl();
  for (size_t w : {k_committed, k_barrier}) std::atomic_ref<uint64_t>(ctl[w]).store(static_cast<uint64_t>(step));
  std::atomic_ref<uint64_t>(ctl[k_mesh]).store(2);
  publish_boundary(m_job, m_arenas);
  TIERMEM_ASSIGN_OR_RETURN(m_peers, find_peers(*m_dir, m_job, m_arenas, false));
  m_mail.emplace(m_job, m_opt, *m_client, *m_dir, m_arenas, m_peers, m_trace);
  m_tp.emplace(m_job, m_opt, *m_client, *m_dir, m_arenas, m_peers, m_trace);
  m_mail->start_at(step);
  // Every rank copied before rank 0 commits, and it committed before any
  // rank frees the old generation.
  std::atomic_ref<uint64_t>(ctl[k_moved]).store(static_cast<uint64_t>(step));
  for (int r = 0; r < m_job.topo.world(); ++r) {
    TIERMEM_RETURN_IF_ERROR(m_dir->wait_at_least(m_peers.ctl_word(r, k_moved), static_cast<uint64_t>(step),
                                                 "rank " + std::to_string(r) + " to move to the new cut"));
  }
  if (m_env.rank == 0) {
    PlanRecord done = record;
    done.committed = record.pending;
    done.switch_step = -1;
    done.cut = record.next_cut;
    done.rates = record.next_rates;
    write_record(m_profiles.region(), done);
  } else {
    const auto deadline = Clock::now() + m_opt.timeout;
    for (;;) {
      TIERMEM_ASSIGN_OR_RETURN(const PlanRecord now, read_record(*m_dir, nullptr, false));
      if (now.committed >= record.pending) break;
      if (Clock::now() > deadline) {
        return Status(ErrorCode::timeout, "rank 0 did not commit the move to generation " +
                                              std::to_string(record.pending));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  for (const Gva g : old_arenas.release()) TIERMEM_RETURN_IF_ERROR(m_client->free(g).with_context("freeing the old cut"));
  TIERMEM_ASSIGN_OR_RETURN(*stage, make_stage(false));
  if (m_policy) m_policy->moved(step);
  const int stage_now = m_job.topo.stage();
  std::fprintf(stderr,
               "rank %d: moved to generation %" PRIu64 " at step %" PRId64 " in %.1f ms: the stages now hold %s; "
               "stage %d took %d tensor(s), %s, from other stages through tiermem\n",
               m_env.rank, record.pending, step, 1e3 * seconds_since(started), cut_text(m_job.partition).c_str(),
               stage_now, moved, format_size(moved_bytes).c_str());
  return Status();
}

}  // namespace tiermem::exec
