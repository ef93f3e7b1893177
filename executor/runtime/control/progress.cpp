#include "executor/runtime/control/progress.hpp"

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstring>

#include <tiermem/status_macros.h>
#include <tiermem/units.h>

namespace tiermem::exec {
namespace {

double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

void print_header(const JobPlan& job) {
  const MemoryPlan& plan = job.plan;
  std::printf("training %s on %s: %" PRId64 " train / %" PRId64 " test rows, %d stage(s) x %d replica(s)"
              "%s%d micro-batch(es) of %" PRId64 ", %" PRId64 " steps (%" PRId64 " per epoch)\n",
              job.graph.name.c_str(), job.data.name.c_str(), job.data.train.rows, job.data.test.rows, job.topo.stages,
              job.topo.replicas,
              job.topo.tensor_parallel > 1 ? (" x " + std::to_string(job.topo.tensor_parallel) + " tensor-parallel, ").c_str()
                                           : ", ", job.micro_batches, job.graph.micro_batch, job.total_steps, job.steps_per_epoch);
  std::printf("stage %d: %s in tiermem (%s work arena, %.1fx reuse); partition cut %s per micro-batch, "
              "imbalance flops %.1f%% memory %.1f%%\n",
              job.topo.stage(), format_size(static_cast<uint64_t>(plan.total_bytes())).c_str(),
              format_size(static_cast<uint64_t>(plan.work_peak)).c_str(),
              plan.work_peak > 0 ? static_cast<double>(plan.work_naive) / static_cast<double>(plan.work_peak) : 1.0,
              format_size(static_cast<uint64_t>(job.partition.cut_bytes)).c_str(), 100 * job.partition.flops_imbalance,
              100 * job.partition.memory_imbalance);
  for (const std::string& line : job.split_report) std::printf("%s\n", line.c_str());
  for (const std::string& line : job.tp_report) std::printf("tensor parallel: %s\n", line.c_str());
  std::fflush(stdout);
}

}  // namespace

Progress::Progress(const JobPlan& job, const TrainOptions& options, const Trace& trace, bool resumed)
    : m_job(job), m_options(options), m_trace(trace), m_resumed(resumed), m_print(job.reporter() && !options.quiet) {}

Status Progress::open_losses(bool append) {
  if (m_options.losses.empty() || !m_job.reporter()) return Status();
  m_losses.reset(std::fopen(m_options.losses.c_str(), append ? "a" : "w"));
  if (!m_losses) {
    return Status(ErrorCode::io_error, "cannot open the losses file " + m_options.losses + ": " + std::strerror(errno));
  }
  return Status();
}

Status Progress::start() {
  if (m_print) print_header(m_job);
  TIERMEM_RETURN_IF_ERROR(open_losses(m_resumed));
  m_started = m_window_start = std::chrono::steady_clock::now();
  m_step_seconds.reserve(static_cast<size_t>(m_job.total_steps));
  return Status();
}

Status Progress::cut_changed() {
  const bool reporter = m_job.reporter();
  m_print = reporter && !m_options.quiet;
  // The progress line's window starts again on the rank that reports now.
  m_window_start = std::chrono::steady_clock::now();
  m_window_steps = m_window_correct = m_window_rows = m_window_loaded = m_window_drained = 0;
  m_window_loss = 0;
  m_window_comm = m_trace.seconds(SpanKind::comm) + m_trace.seconds(SpanKind::sync);
  m_window_compute = m_trace.seconds(SpanKind::compute);
  if (!reporter) {
    m_losses.reset();
    return Status();
  }
  return m_losses ? Status() : open_losses(true);
}

void Progress::step_done(int64_t step, const StepStats& stats, double seconds, const EvalResult& test) {
  m_step_seconds.push_back(seconds);
  const double loss = stats.loss_sum / m_job.micro_batches;
  if (m_losses) {
    std::fprintf(m_losses.get(), "%a\n", loss);
    std::fflush(m_losses.get());
  }
  ++m_window_steps;
  m_window_loss += loss;
  m_window_correct += stats.correct;
  m_window_rows += stats.rows;
  m_window_loaded += stats.loaded_bytes;
  m_window_drained += stats.drained_bytes;
  const bool epoch_end = (step + 1) % m_job.steps_per_epoch == 0;
  const bool last = step + 1 == m_job.total_steps;
  const bool log = m_options.log_every > 0 ? (step + 1) % m_options.log_every == 0 || last : epoch_end || last;
  if (log && m_print) log_window(step, epoch_end, test);
}

void Progress::log_window(int64_t step, bool epoch_end, const EvalResult& test) {
  const double secs = since(m_window_start);
  const double comm = m_trace.seconds(SpanKind::comm) + m_trace.seconds(SpanKind::sync);
  const double compute = m_trace.seconds(SpanKind::compute);
  const int64_t epochs = (m_job.total_steps + m_job.steps_per_epoch - 1) / m_job.steps_per_epoch;
  std::printf("epoch %" PRId64 "/%" PRId64 "  step %" PRId64 "  loss %.4f  train acc %.1f%%  ",
              step / m_job.steps_per_epoch + 1, epochs, step + 1, m_window_loss / static_cast<double>(m_window_steps),
              100.0 * static_cast<double>(m_window_correct) / static_cast<double>(std::max<int64_t>(1, m_window_rows)));
  if (test.accuracy >= 0 && epoch_end) std::printf("test acc %.1f%%  test loss %.4f  ", 100 * test.accuracy, test.loss);
  std::printf("%.0f samples/s  step %.2f ms (communication %.0f%%)",
              static_cast<double>(m_window_steps * m_job.rows_per_step()) / secs,
              1e3 * secs / static_cast<double>(m_window_steps),
              100 * (comm - m_window_comm) / std::max(1e-9, comm - m_window_comm + compute - m_window_compute));
  if (m_window_loaded + m_window_drained > 0) {
    // Offloaded: what crossed between the home tier and the window.
    std::printf("  offload %s in, %s out a step",
                format_size(static_cast<uint64_t>(m_window_loaded / m_window_steps)).c_str(),
                format_size(static_cast<uint64_t>(m_window_drained / m_window_steps)).c_str());
  }
  std::printf("\n");
  std::fflush(stdout);
  m_window_start = std::chrono::steady_clock::now();
  m_window_steps = m_window_correct = m_window_rows = m_window_loaded = m_window_drained = 0;
  m_window_loss = 0;
  m_window_comm = comm;
  m_window_compute = compute;
}

void Progress::finish(int64_t steps, const EvalResult& test) {
  m_losses.reset();
  if (!m_print) return;
  const double secs = since(m_started);
  const double comm = m_trace.seconds(SpanKind::comm) + m_trace.seconds(SpanKind::sync);
  const double busy = comm + m_trace.seconds(SpanKind::compute);
  std::printf("summary: %" PRId64 " steps in %.2f s, %.2f ms per step (median %.2f ms), communication %.0f%% of step time",
              steps, secs, steps > 0 ? 1e3 * secs / static_cast<double>(steps) : 0.0, 1e3 * median(m_step_seconds),
              busy > 0 ? 100 * comm / busy : 0.0);
  if (test.accuracy >= 0) std::printf(", test accuracy %.2f%%, test loss %.4f", 100 * test.accuracy, test.loss);
  std::printf("\n");
}

}  // namespace tiermem::exec
