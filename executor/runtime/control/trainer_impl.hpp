// The Trainer behind train() (internal to the executor): it puts the parts
// of a rank together. The job plan (job_plan), the rank's memory (arenas),
// the boundary messages (mailboxes), the start-up checks (mesh_check), the
// stage's schedule (stage) and the report (progress) each live apart.
#pragma once

#include <memory>
#include <optional>

#include "executor/grad_buckets.hpp"
#include "executor/runtime/state/arenas.hpp"
#include "executor/runtime/exchange/collectives.hpp"
#include "executor/runtime/plan/job_plan.hpp"
#include "executor/runtime/exchange/mailboxes.hpp"
#include "executor/runtime/control/profile.hpp"
#include "executor/runtime/control/progress.hpp"
#include "executor/runtime/control/replan.hpp"
#include "executor/runtime/step/stage.hpp"
#include "executor/runtime/exchange/tp_exchange.hpp"
#include "executor/runtime/control/trainer.hpp"
#include "executor/trace.hpp"

namespace tiermem::exec {

class Trainer {
 public:
  Trainer(TrainOptions options, RankEnv env) : m_opt(std::move(options)), m_env(env), m_trace(!m_opt.trace.empty()) {}
  Status run();

 private:
  // Plan, connect, allocate, initialise, find the peers, check.
  Status set_up();
  // The stage's runner for the job as planned now, with its sums.
  Result<std::unique_ptr<StageRunner>> make_stage(bool resumed);
  // Steps from the committed one to the last, with evaluation and progress.
  Status train_steps();
  Status write_trace();
  // Each stage's predicted step time beside the one measured here (a
  // pipeline that measured its devices): on stderr and in the trace.
  void report_stage_time(int64_t steps);
  // The step report in this rank's info allocation (step_report.hpp), for
  // `tiermemctl job`: `done` steps, the last one's figures.
  void publish_step(int64_t done, const StepStats& stats, double seconds);
  // The groups that reduce through NCCL (collectives.hpp), made and
  // checked; after the mesh check, so every rank is up.
  Status make_collectives();
  // Whether `group` reduces through NCCL, from its members' published
  // abilities (`for_gradients`: an offloaded member cannot).
  Result<bool> group_decision(const GroupSpec& group, bool for_gradients);
  void report_collectives();
  // A data-parallel member a step behind its group (it died between the
  // group's all-reduce of a step and its commit) takes the committed state
  // of that step from a member that has it: replicas hold the same bits.
  // The behind member's gradients of the step went through NCCL (or the
  // bucket collective) unpublished, so it could not compute it again with
  // the others. Errors: failed_precondition (more than a step apart),
  // those of the reads.
  Status catch_up(const GroupSpec& group);
  // Runtime repartitioning (replan.hpp, trainer_move.cpp). Refuses what it
  // cannot move yet (invalid_argument).
  Status check_replan() const;
  // At start: the generation the record commits, its cut, and the
  // leftovers of others freed.
  Status adopt_generation();
  Status free_other_generations();
  // At the boundary before `step`: publishes, looks (rank 0), moves when
  // the record says so. `first`: the process's first step.
  Status at_boundary(int64_t step, int64_t first, double wall, std::unique_ptr<StageRunner>* stage,
                     Progress* progress);
  Status move_to(int64_t step, const PlanRecord& record, std::unique_ptr<StageRunner>* stage);
  // Copies the committed state of every tensor this rank holds in the new
  // plan from its owner in `old` (whose arenas are `old_arenas` here).
  Status copy_state(const JobPlan& old, const Arenas& old_arenas, int64_t step, int* moved, uint64_t* moved_bytes);
  // --restart: frees this rank's allocations of an earlier run of the job.
  Status forget_earlier_run();
  // The job's end: marks this rank done and, unless --keep, frees its
  // memory once every other rank is done too (or gone).
  Status finish();

  TrainOptions m_opt;
  RankEnv m_env;
  Trace m_trace;
  JobPlan m_job;
  std::unique_ptr<Compute> m_compute;  // before the arenas: they are its memory
  std::unique_ptr<Client> m_client;
  CollectiveAbility m_ability = CollectiveAbility::unknown;
  std::unique_ptr<JobDirectory> m_dir;
  Arenas m_arenas;
  Profiles m_profiles;  // the ranks' devices (a pipeline), for the partition
  std::optional<ReplanPolicy> m_policy;       // rank 0 of a job that re-plans
  std::optional<SamplePublisher> m_samples;   // a job that re-plans
  double m_last_compute = 0;                  // the trace's compute seconds at the last boundary
  RankPeers m_peers;
  std::optional<Mailboxes> m_mail;
  std::optional<TpExchange> m_tp;
  RankCollectives m_collectives;  // after the compute: they go first
  std::vector<GradBucket> m_buckets;  // the data-parallel group's, through NCCL
};

}  // namespace tiermem::exec
