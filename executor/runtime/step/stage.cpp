#include "executor/runtime/step/stage.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <set>

#include <tiermem/status_macros.h>

#include "executor/interpreter.hpp"
#include "executor/update_split.hpp"

namespace tiermem::exec {
namespace {

const std::string k_update = "optimizer";

// Offloaded steps interleave copies on a second queue, decided per step:
// launched, not replayed.
bool captures_steps(const JobPlan& job, const TrainOptions& options, const Schedule& schedule, const Compute& compute) {
  return compute.can_capture() && options.graphs && !schedule.exchanges() && options.dump.empty() && !job.plan.offload;
}

}  // namespace

StageRunner::StageRunner(const RankParts& p, bool resumed, StageSums sums)
    : m_job(p.job), m_options(p.options), m_arenas(p.arenas), m_mail(p.mail), m_trace(p.trace), m_compute(p.compute),
      m_slowdown(p.options.slowdown), m_schedule(p.job),
      m_replay(captures_steps(p.job, p.options, m_schedule, p.compute)),
      m_time_kernels(!p.options.trace.empty() && p.compute.memory_is_device() && !p.options.graphs),
      m_feeder(p.job, m_schedule, p.options, p.arenas, p.mail, p.compute, m_replay), m_sums(std::move(sums)),
      m_stream(p.job, p.arenas, p.compute, p.trace), m_update_compute(&p.compute),
      m_committer(p.job, p.options, p.client, p.dir, p.arenas, p.peers, p.trace, p.compute),
      m_evaluator(p.job, m_schedule, m_feeder, p.mail, p.compute, resumed) {
  using Where = TrainOptions::OffloadUpdate;
  m_update_mode = p.options.offload_update;
  // Beside the backward pass: not with clipping (the norm needs every
  // gradient first), nor with data-parallel replicas (their gradients are
  // summed after the step's sync, and an update may start only from the
  // sum).
  const bool beside = p.job.graph.optimizer.max_grad_norm() <= 0 && p.job.topo.replicas == 1;
  if (!p.job.plan.offload) m_update_mode = Where::device;
  if (m_update_mode == Where::automatic && !beside) {
    // Nothing to hide host work in: the compute's kernels, the bits of a run
    // that fits.
    m_update_mode = Where::device;
    if (!p.options.quiet) {
      std::printf("rank %d: --offload-update auto: the optimizer on the compute through the window (%s)\n",
                  p.job.topo.rank,
                  p.job.topo.replicas > 1 ? "data-parallel replicas update from the sum, after the step"
                                          : "gradient clipping needs every gradient before any update");
    }
  }
  if (m_update_mode == Where::automatic) m_split_in = 2;
  if (m_update_mode != Where::device && p.compute.memory_is_device()) {
    m_host_adam = std::make_unique<HostAdamPool>();
    m_host_compute = make_cpu_compute(m_host_adam.get());
    m_update_compute = m_host_compute.get();
  }
  if (m_update_mode != Where::device && beside) {
    Compute* host = m_host_compute.get();
    if (host == nullptr) {
      m_overlap_compute = make_cpu_compute();
      host = m_overlap_compute.get();
    }
    m_host_updater = std::make_unique<HostUpdater>(p.job.graph, p.compute, *host);
    for (int i : m_schedule.update_ops()) {
      const Op& op = p.job.graph.ops[static_cast<size_t>(i)];
      if (op.in.size() >= 2) m_update_of_grad[op.in[1]] = i;
    }
  }
}

Status StageRunner::run_op_at(int op_id, const StepPoint& at) {
  const Op& op = m_job.graph.ops[op_id];
  if (at.pos >= 0) {
    for (int w : m_schedule.zero_at(at.pos)) {
      const Placement& p = m_job.plan.work[static_cast<size_t>(w)];
      m_compute.zero(m_arenas.work().data() + p.offset, static_cast<size_t>(m_job.graph.tensors[p.tensor].bytes()));
    }
  }
  std::vector<void*> pointers(m_job.graph.tensors.size(), nullptr);
  TIERMEM_RETURN_IF_ERROR(m_feeder.gather_inputs(op, at, &pointers));
  // Dropout draws per micro-batch of the whole step: this replica's
  // micro-batches after those of the replicas before it.
  m_compute.set_draw(static_cast<uint64_t>(m_job.topo.replica()) * static_cast<uint64_t>(m_job.micro_batches) +
                     static_cast<uint64_t>(std::max(at.mb, 0)));
  if (at.pos < 0) m_stream.load_for(op, at.step % 2);
  const TensorMemory resolve = [&](int t) -> void* {
    if (pointers[t] != nullptr) return pointers[t];
    void* streamed = m_stream.memory(t);
    return streamed != nullptr ? streamed : m_feeder.memory(t, at.mb, at.step);
  };
  for (const auto* list : {&op.in, &op.out}) {
    for (int t : *list) {
      if (resolve(t) == nullptr) {
        return Status(ErrorCode::internal, "no memory for '" + m_job.graph.tensors[t].name + "' of op '" + op.name + "'");
      }
    }
  }
  if (m_schedule.is_partial_sum(op_id)) {
    TIERMEM_RETURN_IF_ERROR(m_sums.parts->sum(op_id, at, static_cast<const float*>(resolve(op.in[0])),
                                              static_cast<float*>(resolve(op.out[0])),
                                              m_job.graph.tensors[op.in[0]].elements(), op.phase == Phase::backward));
  } else {
    auto span = m_trace.span(SpanKind::compute, op.name);
    Slowdown::Scope slowed(m_slowdown, at.step >= m_options.slowdown_from);
    // Gradients sum their contributions; a recomputed forward op writes.
    run_op(m_compute, m_job.graph, op, resolve, op.phase == Phase::backward && !op.recompute);
    if (m_time_kernels) TIERMEM_RETURN_IF_ERROR(m_compute.sync());
  }
  m_evaluator.ran(op, resolve, at);
  return m_feeder.send_outputs(op_id, at);
}

Status StageRunner::run_position(int pos, int64_t step) {
  const auto [op, mb] = m_job.plan.schedule[static_cast<size_t>(pos)];
  m_stream.before(pos, step % 2);
  TIERMEM_RETURN_IF_ERROR(run_op_at(op, StepPoint{.step = step, .pos = pos, .mb = mb}));
  m_stream.after(pos);
  if (m_host_updater != nullptr) {
    for (int grad : m_stream.drained_at(pos)) {
      auto it = m_update_of_grad.find(grad);
      if (it == m_update_of_grad.end() || m_device_updates.count(it->second) != 0) continue;
      // The update writes the copy the step before last committed from:
      // the step before committed first.
      if (!m_settled) {
        TIERMEM_RETURN_IF_ERROR(m_committer.settle());
        m_settled = true;
      }
      m_host_updater->queue(
          it->second, m_stream.last_drain(), [this, step](int t) { return m_feeder.memory(t, -1, step, true); },
          [this, step](int t) { return m_feeder.memory(t, -1, step, false); });
    }
  }
  m_sums.gradients->after_position(pos);
  return Status();
}

// The next copy of parameters and state from the committed one, which stays
// whole (a crash while the next is written resumes from it): the optimizer
// ops read the committed copy and write the next in one pass, and what no
// optimizer op writes is copied over.
Status StageRunner::update(int64_t step) {
  auto span = m_trace.span(SpanKind::compute, k_update);
  Slowdown::Scope slowed(m_slowdown, step >= m_options.slowdown_from);
  Compute& compute = *m_update_compute;
  for (int t : m_schedule.carried()) {
    compute.copy(m_feeder.memory(t, -1, step, true), m_feeder.memory(t, -1, step, false),
                 static_cast<size_t>(m_job.graph.tensors[t].bytes()));
  }
  // Offloaded, on the compute: chunks through the window (auto: those
  // parameters, while the host finishes the others).
  if (m_stream.active() && m_update_mode == TrainOptions::OffloadUpdate::device) {
    return m_stream.update(m_schedule.update_ops(), step % 2);
  }
  if (m_stream.active() && !m_device_updates.empty()) {
    std::vector<int> through;
    for (int i : m_schedule.update_ops()) {
      if (m_device_updates.count(i) != 0) through.push_back(i);
    }
    TIERMEM_RETURN_IF_ERROR(m_stream.update(through, step % 2));
  }
  // On the host beside the backward pass: what it did not update yet.
  std::set<int> done = m_device_updates;
  if (m_host_updater != nullptr) {
    HostUpdater::Round round;
    for (int op : m_host_updater->finish(&round)) done.insert(op);
    // The step before the split is chosen: its rates.
    if (m_split_in == 1) m_split_round = round;
  }
  // Clipping: the norm of every gradient of the step (the stage's, which
  // plan_model checked is the job's), before any update reads one.
  if (const float max_norm = m_job.graph.optimizer.max_grad_norm(); max_norm > 0) {
    compute.clip_gradients(m_arenas.grads().as<float>(), m_arenas.grads_bytes() / 4, max_norm);
  }
  // Update ops whose arrays lie back to back in every arena (the plan lays
  // parameters and their state out in one order) and whose settings agree
  // go to the compute as one call: one kernel over all of them on a GPU (a
  // multi-tensor optimizer), the same arithmetic element by element.
  UpdateRun run;
  for (int i : m_schedule.update_ops()) {
    if (done.count(i) != 0) continue;
    const Op& op = m_job.graph.ops[static_cast<size_t>(i)];
    if (op.kind != proto::ADAM_UPDATE && op.kind != proto::SGD_UPDATE) {
      run.flush(compute);
      run = UpdateRun();
      const TensorMemory committed = [&](int t) { return m_feeder.memory(t, -1, step, false); };
      run_op(compute, m_job.graph, op, [&](int t) { return m_feeder.memory(t, -1, step, true); }, false, &committed);
      continue;
    }
    UpdateRun next = update_run_of(op, step);
    if (!run.extend(next)) {
      run.flush(compute);
      run = next;
    }
  }
  run.flush(compute);
  return m_time_kernels ? compute.sync() : Status();
}

StageRunner::UpdateRun StageRunner::update_run_of(const Op& op, int64_t step) {
  UpdateRun r;
  r.kind = op.kind;
  r.count = m_job.graph.tensors[op.in[0]].elements();
  r.hyper = optimizer_hyper(m_job.graph, op.origin);
  auto next = [&](int t) { return static_cast<float*>(m_feeder.memory(t, -1, step, true)); };
  auto committed = [&](int t) { return static_cast<float*>(m_feeder.memory(t, -1, step, false)); };
  // The order of Compute::adam's and sgd's arrays: param_in, param, grad,
  // then each state's in and out.
  r.arrays = {committed(op.in[0]), next(op.in[0]), next(op.in[1])};
  for (size_t k = 2; k < op.in.size(); ++k) {
    r.arrays.push_back(committed(op.in[k]));
    r.arrays.push_back(next(op.in[k]));
  }
  return r;
}

bool StageRunner::UpdateRun::extend(const UpdateRun& next) {
  const OptimizerHyper &a = hyper, &b = next.hyper;
  const bool same = kind == next.kind && arrays.size() == next.arrays.size() && a.lr == b.lr && a.beta1 == b.beta1 &&
                    a.beta2 == b.beta2 && a.epsilon == b.epsilon && a.momentum == b.momentum &&
                    a.weight_decay == b.weight_decay && a.decoupled == b.decoupled && a.warmup == b.warmup &&
                    a.decay == b.decay && a.min_lr == b.min_lr && a.max_grad_norm == b.max_grad_norm;
  if (count == 0 || !same) return false;
  for (size_t k = 0; k < arrays.size(); ++k) {
    if (arrays[k] + count != next.arrays[k]) return false;
  }
  count += next.count;
  return true;
}

void StageRunner::UpdateRun::flush(Compute& compute) const {
  if (count == 0) return;
  const auto& x = arrays;
  if (kind == proto::ADAM_UPDATE) {
    compute.adam(x[0], x[1], x[2], x[3], x[4], x[5], x[6], count, hyper);
  } else {
    compute.sgd(x[0], x[1], x[2], x[3], x[4], count, hyper);
  }
}

// The ops of the step and the optimizer, queued (on a GPU) or run.
Status StageRunner::compute_step(int64_t step) {
  m_compute.reset_stats();
  m_settled = false;
  // Offloaded, every gradient starts zeroed in the window and is drained
  // home whole (one never written stays as allocated: zero).
  if (!m_stream.active()) m_compute.zero(m_arenas.grads().data(), static_cast<size_t>(m_arenas.grads_bytes()));
  for (size_t pos = 0; pos < m_schedule.positions().size(); ++pos) {
    TIERMEM_RETURN_IF_ERROR(run_position(static_cast<int>(pos), step));
  }
  TIERMEM_RETURN_IF_ERROR(m_sums.gradients->all_queued());
  // The last message on its way: what it sends is reused next step.
  TIERMEM_RETURN_IF_ERROR(m_mail.drain());
  if (!m_capturing) {
    TIERMEM_RETURN_IF_ERROR(m_compute.sync());
    m_backward_done = std::chrono::steady_clock::now();
    TIERMEM_RETURN_IF_ERROR(m_mail.consumed_step(step));
    TIERMEM_RETURN_IF_ERROR(m_sums.gradients->after_sync(step));
    // The step before committed before its parameters are written over.
    TIERMEM_RETURN_IF_ERROR(m_committer.settle());
  }
  return update(step);
}

Status StageRunner::replay_step(int64_t step) {
  TIERMEM_RETURN_IF_ERROR(m_committer.settle());
  const int slot = static_cast<int>(step % 2);
  if (!m_compute.captured(slot)) {
    TIERMEM_RETURN_IF_ERROR(m_compute.begin_capture());
    m_capturing = true;
    Status s = compute_step(step);
    m_capturing = false;
    Status captured = m_compute.end_capture(slot);
    TIERMEM_RETURN_IF_ERROR(s);
    TIERMEM_RETURN_IF_ERROR(captured);
  } else if (m_prefilled != step) {
    TIERMEM_RETURN_IF_ERROR(m_feeder.fill_batches(step));
  }
  TIERMEM_RETURN_IF_ERROR(m_compute.replay(slot));
  // While it runs: the next step's batches into the other staging, when
  // that step is a replay too (its capture is made).
  if (!m_compute.captured(1 - slot)) return Status();
  Status s = m_feeder.fill_batches(step + 1);
  m_prefilled = s.ok() ? step + 1 : -1;
  return s;
}

Status StageRunner::run_step(int64_t step, StepStats* stats) {
  m_feeder.begin_pass();
  m_compute.set_dropout(m_options.seed, true);
  m_compute.set_step(step + 1);
  if (m_update_compute != &m_compute) m_update_compute->set_step(step + 1);
  if (m_overlap_compute != nullptr) m_overlap_compute->set_step(step + 1);
  const int64_t loaded = m_stream.loaded_bytes(), drained = m_stream.drained_bytes();
  const uint64_t beside = overlapped_updates();
  TIERMEM_RETURN_IF_ERROR(m_replay ? replay_step(step) : compute_step(step));
  StepStats taken;
  taken.loaded_bytes = m_stream.loaded_bytes() - loaded;
  taken.drained_bytes = m_stream.drained_bytes() - drained;
  taken.updates_beside = overlapped_updates() - beside;
  m_compute.take_stats(&taken.loss_sum, &taken.correct);
  taken.rows = m_schedule.loss_rows();
  TIERMEM_RETURN_IF_ERROR(m_compute.sync());
  *stats = taken;
  TIERMEM_RETURN_IF_ERROR(m_committer.end_step(step));
  if (m_split_in > 0 && --m_split_in == 0) split_updates_by_rates();
  return Status();
}

double StageRunner::measure_link() {
  // The gradients' home, copied into the window and back (the same bytes:
  // nothing reads them between steps), as the updates' chunks would cross.
  const int64_t bytes = std::min<int64_t>({m_job.plan.window_peak, m_arenas.grads_bytes(), int64_t{64} << 20});
  if (bytes <= 0) return 0;
  std::byte* window = m_arenas.window().data();
  std::byte* home = m_arenas.grads().data();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 2; ++i) {
    m_compute.host_wait_side(m_compute.side_copy(window, home, static_cast<size_t>(bytes)));
    m_compute.host_wait_side(m_compute.side_copy(home, window, static_cast<size_t>(bytes)));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return seconds > 0 ? 4.0 * static_cast<double>(bytes) / seconds : 0;
}

void StageRunner::split_updates_by_rates() {
  m_split_in = -1;
  // In the order their gradients come home.
  std::vector<UpdateOpCost> ops;
  std::set<int> seen;
  for (size_t pos = 0; pos < m_schedule.positions().size(); ++pos) {
    for (int grad : m_stream.drained_at(static_cast<int>(pos))) {
      auto it = m_update_of_grad.find(grad);
      if (it == m_update_of_grad.end() || !seen.insert(it->second).second) continue;
      const Op& op = m_job.graph.ops[static_cast<size_t>(it->second)];
      ops.push_back({it->second, m_job.graph.tensors[static_cast<size_t>(op.in[0])].elements(),
                     static_cast<int>(op.in.size())});
    }
  }
  const HostUpdater::Round& round = m_split_round;
  UpdateRates rates;
  rates.host_params_per_s = round.busy_s > 0 ? static_cast<double>(round.elements) / round.busy_s : 0;
  rates.link_bytes_per_s = measure_link();
  if (round.elements > 0 && m_backward_done > round.first_home) {
    rates.hidden_s = std::chrono::duration<double>(m_backward_done - round.first_home).count();
  }
  if (ops.empty() || rates.host_params_per_s <= 0 || rates.link_bytes_per_s <= 0) return;  // all on the host
  const UpdateSplit split = split_updates(ops, rates, m_options.host_share);
  m_device_updates = split.device_ops;
  m_host_params = split.host_params;
  m_device_params = split.device_params;
  if (!m_options.quiet) {
    std::printf("rank %d: %s\n", m_job.topo.rank, describe(split, rates, m_options.host_share >= 0).c_str());
    std::fflush(stdout);
  }
}

std::string StageRunner::optimizer_placement() const {
  const std::string host = m_host_adam != nullptr ? "host (" + m_host_adam->describe() + ")" : "host";
  if (m_update_mode == TrainOptions::OffloadUpdate::device) return "compute";
  if (m_update_mode == TrainOptions::OffloadUpdate::host) return host;
  if (m_device_updates.empty()) return host + ", every parameter (auto)";
  char text[128];
  std::snprintf(text, sizeof text, " for %.1f M parameters and the compute for %.1f M (auto)",
                static_cast<double>(m_host_params) / 1e6, static_cast<double>(m_device_params) / 1e6);
  return host + text;
}

Status StageRunner::evaluate(int64_t committed, EvalResult* result) {
  m_compute.set_dropout(m_options.seed, false);  // evaluation drops nothing (the next step turns it on)
  return m_evaluator.evaluate(committed, result, [this](int op, const StepPoint& at) { return run_op_at(op, at); });
}

}  // namespace tiermem::exec
