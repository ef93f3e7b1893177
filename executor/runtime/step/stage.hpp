// One pipeline stage of a training job (X5, X7): its step as a list of
// phases, each run by a part that owns its state:
//   - Schedule (schedule.hpp): the order of the stage's ops and micro-batches;
//   - Feeder (feeder.hpp): batches, boundary activations and partial
//     gradients in, outputs out;
//   - the sums (sums.hpp): the gradients over the replicas, tensor-parallel
//     parts over their group, each chosen when the job was planned;
//   - ParamStream (param_stream.hpp): offloaded parameters through a window;
//   - Committer (committer.hpp): snapshot, commit, barrier;
//   - Evaluator (evaluator.hpp): the forward pass over the test set.
// A step: zero the gradients; run every position of the schedule (the
// gradient buckets start as they finish); wait for the sums; the optimizer
// writes the next copy of parameters and state; commit; barrier. On a GPU a
// stage that exchanges nothing captures its step once and replays it.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>

#include <tiermem/client.h>

#include "executor/compute.hpp"
#include "executor/host_adam.hpp"
#include "executor/runtime/step/host_updater.hpp"
#include "executor/runtime/state/arenas.hpp"
#include "executor/runtime/step/committer.hpp"
#include "executor/runtime/step/evaluator.hpp"
#include "executor/runtime/step/feeder.hpp"
#include "executor/runtime/plan/job_plan.hpp"
#include "executor/runtime/exchange/mailboxes.hpp"
#include "executor/runtime/exchange/rank_parts.hpp"
#include "executor/runtime/state/param_stream.hpp"
#include "executor/runtime/plan/schedule.hpp"
#include "executor/runtime/step/slowdown.hpp"
#include "executor/runtime/exchange/sums.hpp"
#include "executor/trace.hpp"

namespace tiermem::exec {

// What the loss op saw in one step (on the stage that holds it).
struct StepStats {
  double loss_sum = 0;  // over the micro-batches
  int64_t correct = 0;
  int64_t rows = 0;
  // Through the offload window (0: not offloaded): bytes loaded from the
  // home tier and written back to it, and the host updates run during the
  // backward pass.
  int64_t loaded_bytes = 0, drained_bytes = 0;
  uint64_t updates_beside = 0;
};

class StageRunner {
 public:
  // `resumed`: this rank restarted (its first evaluation may skip batches);
  // `sums`: the stage's (make_stage_sums).
  StageRunner(const RankParts& parts, bool resumed, StageSums sums);

  // Whether steps are captured once and replayed (a GPU, --graphs, a stage
  // that exchanges no messages and has no replicas).
  bool replays() const { return m_replay; }

  // Runs training step `step` and commits it: at once, or (--replicas) once
  // its snapshot, written while the next step computes, is whole on every
  // copy (finish() for the last). Errors: those of the messages, the sums,
  // the snapshot and the barrier (timeouts name the rank awaited).
  Status run_step(int64_t step, StepStats* stats);
  // Commits the last step run once its snapshot is whole.
  Status finish() { return m_committer.settle(); }
  // Offload's copies (param_stream.hpp).
  const ParamStream& stream() const { return m_stream; }
  // The host's optimizer threads (offloaded with --offload-update host or
  // auto on a GPU), or null.
  const HostAdamPool* host_adam() const { return m_host_adam.get(); }
  // Offloaded: where the optimizer ran, for the run's last line.
  std::string optimizer_placement() const;
  // Parameter updates run beside the backward pass since the start (0: none).
  uint64_t overlapped_updates() const { return m_host_updater != nullptr ? m_host_updater->ran() : 0; }
  // The evaluation of the parameters committed after `committed` steps
  // (Evaluator::evaluate).
  Status evaluate(int64_t committed, EvalResult* result);

 private:
  // The phases of a step.
  Status compute_step(int64_t step);                 // every position, the sums, the update
  Status replay_step(int64_t step);                  // the same, captured once and replayed
  Status run_position(int pos, int64_t step);        // one (op, micro-batch) of the schedule
  Status update(int64_t step);                       // the optimizer: the next parameters and state
  // Consecutive update ops as one optimizer call (update()).
  struct UpdateRun {
    OpKind kind = proto::OP_UNSPECIFIED;
    std::vector<float*> arrays;  // Compute::adam's or sgd's, in their order
    int64_t count = 0;
    OptimizerHyper hyper;
    // Takes `next` in when its arrays follow on from these and its settings
    // are the same.
    bool extend(const UpdateRun& next);
    void flush(Compute& compute) const;
  };
  UpdateRun update_run_of(const Op& op, int64_t step);
  // --offload-update auto: after the second step this process ran, the
  // parameters whose updates go through the window (update_split.hpp).
  void split_updates_by_rates();
  double measure_link();  // bytes/s of a copy to the window and back
  // Runs op `op_id` at `at`, with what it receives before and sends after.
  Status run_op_at(int op_id, const StepPoint& at);

  const JobPlan& m_job;
  const TrainOptions& m_options;
  Arenas& m_arenas;
  Mailboxes& m_mail;
  Trace& m_trace;
  Compute& m_compute;
  Slowdown m_slowdown;  // --slowdown: an emulated slower device
  Schedule m_schedule;
  bool m_replay;
  // --trace on a GPU, steps launched (--no-graphs): each op waits for its
  // kernels, so that the trace's spans are their time on the device.
  bool m_time_kernels;
  Feeder m_feeder;
  StageSums m_sums;
  // Offload: parameters and gradients through the window, and the
  // optimizer on the host (the CPU's Adam over the home tier, ZeRO-Offload's
  // way) when the kernels run on a GPU.
  ParamStream m_stream;
  std::unique_ptr<HostAdamPool> m_host_adam;  // its pinned threads (host_adam.hpp)
  std::unique_ptr<Compute> m_host_compute;
  Compute* m_update_compute;
  // Offloaded, the optimizer on the host, no clipping and one replica: each
  // parameter updated as soon as its gradient is home, beside the backward
  // pass.
  std::unique_ptr<Compute> m_overlap_compute;  // the CPU's own (a CPU rank's compute is busy with the step)
  std::unique_ptr<HostUpdater> m_host_updater;
  std::map<int, int> m_update_of_grad;  // parameter gradient -> its update op
  // Offloaded: where the optimizer runs (auto: per parameter, these ops on
  // the compute through the window, the rest on the host).
  TrainOptions::OffloadUpdate m_update_mode = TrainOptions::OffloadUpdate::device;
  std::set<int> m_device_updates;
  int m_split_in = -1;  // auto: steps until the split is chosen (-1: chosen)
  HostUpdater::Round m_split_round;  // the host's updates of the step before
  std::chrono::steady_clock::time_point m_backward_done{};  // this step's, on the host
  int64_t m_host_params = 0, m_device_params = 0;
  bool m_settled = false;               // this step: the one before committed (settle) already
  Committer m_committer;
  Evaluator m_evaluator;
  bool m_capturing = false;
  int64_t m_prefilled = -1;  // the step whose batches are in their staging already
};

}  // namespace tiermem::exec
