// Trainer: puts a rank together and runs it (see trainer_impl.hpp).
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <future>

#include <tiermem/status_macros.h>
#include <tiermem/units.h>

#include "executor/runtime/exchange/mesh_check.hpp"
#include "executor/runtime/control/progress.hpp"
#include "executor/runtime/step/stage.hpp"
#include "executor/runtime/control/trainer_impl.hpp"
#include "executor/step_report.hpp"

namespace tiermem::exec {

Status Trainer::set_up() {
  TIERMEM_ASSIGN_OR_RETURN(m_job, plan_model(m_opt, m_env));
  // The dataset loads while this rank connects and finds (or restores) its
  // memory: a replacement rank's RTO.
  auto data = std::async(std::launch::async, [name = m_job.graph.dataset, path = m_opt.data, seed = m_opt.seed,
                                               sequence = sample_rows(m_job.graph)] {
    return load_dataset(name, path, seed, sequence);
  });
  TIERMEM_ASSIGN_OR_RETURN(m_compute, make_compute(m_opt.device));
  TIERMEM_RETURN_IF_ERROR(m_compute->set_precision(m_opt.precision == "bf16" ? Precision::bf16 : Precision::fp32,
                                                   gemm_operand_elements(m_job.graph)));
  // What this rank can reduce through, refused now where --collectives
  // asks for what cannot be (before anything is allocated).
  TIERMEM_ASSIGN_OR_RETURN(m_ability, collective_ability(m_opt, *m_compute));
  TIERMEM_ASSIGN_OR_RETURN(
      m_client, Client::connect({.socket_path = m_opt.socket, .client_name = "tiermem-exec rank " + std::to_string(m_env.rank)}));
  m_dir = std::make_unique<JobDirectory>(*m_client, m_opt.job, m_env.rank, m_opt.timeout);
  if (m_opt.restart) TIERMEM_RETURN_IF_ERROR(forget_earlier_run());
  if (wants_costs(m_opt, m_job)) {
    // Every rank's device and link, then the partition by them: the same
    // figures on every rank, so the same stages.
    TIERMEM_RETURN_IF_ERROR(
        m_profiles.exchange(*m_dir, m_job.topo, *m_compute, heaviest_gemm(m_job.graph),
                            m_opt.slowdown_from == 0 ? m_opt.slowdown : 1, m_opt.budget, m_opt.quiet));
    TIERMEM_RETURN_IF_ERROR(balance_by_time(m_opt, m_profiles.stage_costs(m_job.topo), &m_job));
    if (m_env.rank == 0 && !m_opt.quiet && m_profiles.measured_now()) {
      std::printf("%s", describe_stages(m_job).c_str());
    }
  }
  if (m_opt.replan.enabled) {
    TIERMEM_RETURN_IF_ERROR(check_replan());
    TIERMEM_RETURN_IF_ERROR(adopt_generation());
    m_samples.emplace(m_profiles.region());
    if (m_env.rank == 0) m_policy.emplace(m_opt.replan, m_job);
  }
  TIERMEM_RETURN_IF_ERROR(
      m_arenas.allocate(*m_dir, m_job, m_opt, Mailboxes::bytes(m_job) + TpExchange::bytes(m_job), *m_compute));
  TIERMEM_RETURN_IF_ERROR(m_arenas.initialise(m_job, m_opt, *m_compute));
  if (Status s = attach_data(data.get(), m_opt, &m_job); !s.ok()) {
    // A dataset that does not load: what was made for the job just now goes
    // again (a resumed job's memory stays).
    if (!m_arenas.resumed()) {
      for (const Gva g : m_arenas.release()) (void)m_client->free(g);
      if (m_profiles.measured_now()) (void)m_client->free(m_profiles.take_region().gva);
    }
    return s;
  }
  if (!m_opt.quiet && (m_compute->memory_is_device() || m_job.plan.offload)) {
    std::printf("rank %d: computing on %s%s; %s\n", m_env.rank, m_compute->name().c_str(),
                m_opt.precision == "bf16" ? ", GEMMs in bf16 (fp32 sums)" : "",
                m_arenas.placement(*m_compute).c_str());
  }
  if (!m_opt.quiet && !m_job.checkpoint_note.empty()) std::printf("rank %d: %s\n", m_env.rank, m_job.checkpoint_note.c_str());
  if (!m_opt.quiet && !m_job.plan.schedule_note.empty()) {
    std::printf("rank %d: %s\n", m_env.rank, m_job.plan.schedule_note.c_str());
  }
  if (m_arenas.resumed() && m_arenas.committed() >= m_job.total_steps) {
    return Status(ErrorCode::failed_precondition,
                  "job '" + m_opt.job + "' already finished: rank " + std::to_string(m_env.rank) + " committed step " +
                      std::to_string(m_arenas.committed()) + " of " + std::to_string(m_job.total_steps) +
                      " (its memory was kept with --keep). --restart trains it again from step 0; `tiermemctl free "
                      "--name-prefix " + m_opt.job + ".` frees it");
  }
  if (!m_arenas.restored_from().is_null()) {
    std::fprintf(stderr,
                 "rank %d: resumed at step %" PRId64 " on node %u, restored from the replicated snapshot %s "
                 "(this rank's memory on its old node is gone)\n",
                 m_env.rank, m_arenas.committed(), static_cast<unsigned>(m_arenas.ctl_region().gva.node),
                 m_arenas.restored_from().to_string().c_str());
  } else if (m_arenas.resumed()) {
    std::fprintf(stderr, "rank %d: resumed at step %" PRId64 " (committed in tiermem), parameters of that step\n",
                 m_env.rank, m_arenas.committed());
  }
  publish_boundary(m_job, m_arenas);
  const uint64_t collectives[3] = {static_cast<uint64_t>(m_ability), m_job.plan.offload ? 2u : 1u,
                                   device_key(*m_compute)};
  std::memcpy(m_arenas.info().data() + k_info_collectives, collectives, sizeof collectives);
  TIERMEM_ASSIGN_OR_RETURN(m_peers, find_peers(*m_dir, m_job, m_arenas, !m_opt.quiet && !m_arenas.resumed()));
  m_mail.emplace(m_job, m_opt, *m_client, *m_dir, m_arenas, m_peers, m_trace);
  m_tp.emplace(m_job, m_opt, *m_client, *m_dir, m_arenas, m_peers, m_trace);
  TIERMEM_RETURN_IF_ERROR(check_shapes(*m_client, *m_dir, m_job));
  TIERMEM_RETURN_IF_ERROR(validate_mesh(*m_client, *m_dir, m_job, m_arenas, m_peers, m_opt, m_arenas.resumed()));
  return make_collectives();
}

Status Trainer::train_steps() {
  const int64_t first = m_arenas.resumed() ? m_arenas.committed() : 0;
  if (m_arenas.resumed()) {
    // Every step before `first` is finished here: a rank that died between
    // committing a step and raising its barrier word for it would else
    // leave the others waiting at that barrier while it waits for their
    // gradients of the next step.
    std::atomic_ref<uint64_t> barrier(m_arenas.ctl()[k_barrier]);
    if (barrier.load() < static_cast<uint64_t>(first)) barrier.store(static_cast<uint64_t>(first));
  }
  // A unique_ptr: a re-plan builds the stage again (trainer_move.cpp).
  TIERMEM_ASSIGN_OR_RETURN(auto stage, make_stage(m_arenas.resumed()));
  Progress progress(m_job, m_opt, m_trace, m_arenas.resumed());
  TIERMEM_RETURN_IF_ERROR(progress.start());
  EvalResult eval;
  const bool evaluates = m_job.topo.replica() == 0;
  if (m_arenas.resumed() && first % m_job.steps_per_epoch == 0 && evaluates) {
    // The evaluation due after the committed step may have been cut short.
    TIERMEM_RETURN_IF_ERROR(stage->evaluate(first, &eval));
  }
  m_last_compute = m_trace.seconds(SpanKind::compute);
  double seconds = 0;
  for (int64_t step = first; step < m_job.total_steps; ++step) {
    if (m_samples) {
      if (Status s = at_boundary(step, first, seconds, &stage, &progress); !s.ok()) {
        return s.with_context("the boundary before step " + std::to_string(step));
      }
    }
    const auto started = std::chrono::steady_clock::now();
    StepStats stats;
    if (Status s = stage->run_step(step, &stats); !s.ok()) return s.with_context("step " + std::to_string(step));
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if ((step + 1) % m_job.steps_per_epoch == 0 && evaluates) TIERMEM_RETURN_IF_ERROR(stage->evaluate(step + 1, &eval));
    progress.step_done(step, stats, seconds, eval);
    publish_step(step + 1, stats, seconds);
  }
  if (Status s = stage->finish(); !s.ok()) return s.with_context("step " + std::to_string(m_job.total_steps - 1));
  progress.finish(m_job.total_steps - first, eval);
  report_stage_time(m_job.total_steps - first);
  report_collectives();
  if (stage->stream().active() && !m_opt.quiet && m_job.total_steps > first) {
    const auto steps = static_cast<uint64_t>(m_job.total_steps - first);
    std::string where = stage->optimizer_placement();
    if (const uint64_t beside = stage->overlapped_updates(); beside > 0) {
      where += "; " + std::to_string(beside / steps) + " parameter updates a step beside the backward pass";
    }
    std::printf("offload: %s loaded and %s drained per step through a %s window (optimizer on the %s)\n",
                format_size(static_cast<uint64_t>(stage->stream().loaded_bytes()) / steps).c_str(),
                format_size(static_cast<uint64_t>(stage->stream().drained_bytes()) / steps).c_str(),
                format_size(static_cast<uint64_t>(m_job.plan.window_peak)).c_str(), where.c_str());
  }
  return Status();
}

void Trainer::publish_step(int64_t done, const StepStats& stats, double seconds) {
  StepReport r;
  r.steps_done = done;
  r.total_steps = m_job.total_steps;
  r.stage = m_job.topo.stage();
  r.replica = m_job.topo.replica();
  r.unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
                  .count();
  r.step_ms = 1e3 * seconds;
  r.loaded_bytes = stats.loaded_bytes;
  r.drained_bytes = stats.drained_bytes;
  r.updates_beside_backward = static_cast<int64_t>(stats.updates_beside);
  write_step_report(m_arenas.info().data() + k_step_report_offset, r);
}

Result<std::unique_ptr<StageRunner>> Trainer::make_stage(bool resumed) {
  const RankParts parts{m_job, m_opt, *m_client, *m_dir, m_arenas, *m_mail, m_peers, m_trace, *m_compute};
  TIERMEM_ASSIGN_OR_RETURN(StageSums sums, make_stage_sums(parts, *m_tp, m_collectives.dp.get(),
                                                           m_collectives.tp.get(), m_buckets));
  return std::make_unique<StageRunner>(parts, resumed, std::move(sums));
}

void Trainer::report_stage_time(int64_t steps) {
  if (m_job.costs.empty() || steps <= 0) return;
  const auto s = static_cast<size_t>(m_job.topo.stage());
  const double compute = 1e3 * m_trace.seconds(SpanKind::compute) / static_cast<double>(steps);
  const double comm = 1e3 * m_trace.seconds(SpanKind::comm) / static_cast<double>(steps);
  const double predicted = 1e3 * m_job.partition.predicted_seconds[s];
  char text[256];
  std::snprintf(text, sizeof text, "stage %zu on %s: predicted %.2f ms per step, measured %.2f ms computing and %.2f ms "
                "sending and receiving", s, m_job.costs[s].device.c_str(), predicted, compute, comm);
  m_trace.set_label(text);
  if (!m_opt.quiet) std::fprintf(stderr, "rank %d: %s\n", m_env.rank, text);
}

Status Trainer::write_trace() {
  if (m_opt.trace.empty()) return Status();
  const std::string path = m_env.world > 1 ? m_opt.trace + ".rank" + std::to_string(m_env.rank) : m_opt.trace;
  return m_trace.write(path, m_env.rank);
}

Status Trainer::run() {
  TIERMEM_RETURN_IF_ERROR(set_up());
  TIERMEM_RETURN_IF_ERROR(train_steps());
  if (!m_opt.quiet) {
    // How this rank's messages, control words and snapshots travelled: on
    // one node nothing should need the daemon to carry it.
    const AccessCounters a = m_client->access_counters();
    std::fprintf(stderr,
                 "rank %d: tiermem calls: %" PRIu64 " direct on this node, %" PRIu64
                 " direct to other nodes (mapped or one-sided), %" PRIu64 " as checked messages to other nodes, %" PRIu64
                 " with device buffers staged through host memory, %" PRIu64 " through the daemon\n",
                 m_env.rank, a.direct_local, a.direct_remote, a.message, a.staged_device, a.through_daemon);
  }
  TIERMEM_RETURN_IF_ERROR(write_trace());
  return finish();
}

int train(const TrainOptions& options, const RankEnv& env) {
  Trainer trainer(options, env);
  Status s = trainer.run();
  if (!s.ok()) {
    std::fprintf(stderr, "tiermem-exec rank %d: %s\n", env.rank, s.to_string().c_str());
    return 1;
  }
  return 0;
}

}  // namespace tiermem::exec
