// What a training job tells the people watching it: a header, a line per
// epoch (or per --log-every steps) with loss, accuracy, throughput, the
// share of communication and (offloaded) the bytes streamed a step, a
// summary at the end, and the per-step losses file (--losses). Only the
// reporting rank (the loss's stage, first replica) prints; every rank may
// write its trace.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#include <tiermem/status.h>

#include "executor/runtime/plan/job_plan.hpp"
#include "executor/runtime/step/stage.hpp"
#include "executor/trace.hpp"

namespace tiermem::exec {

class Progress {
 public:
  // `resumed`: the losses file is appended to, not replaced.
  Progress(const JobPlan& job, const TrainOptions& options, const Trace& trace, bool resumed);

  // The header: model, data, topology, steps; the stage's memory and
  // partition; the split report. Errors: io_error (the losses file).
  Status start();
  // After step `step`, with the last evaluation (none yet: < 0).
  void step_done(int64_t step, const StepStats& stats, double seconds, const EvalResult& test);
  // `steps` run by this process in all.
  void finish(int64_t steps, const EvalResult& test);
  // The job moved to another cut (replan.hpp): the loss may be on another
  // stage now, whose rank reports from here on (the losses file appended
  // to). Errors: io_error.
  Status cut_changed();

 private:
  void log_window(int64_t step, bool epoch_end, const EvalResult& test);
  // The losses file, when this rank reports (replaced, or appended to).
  Status open_losses(bool append);

  struct CloseFile {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };

  const JobPlan& m_job;
  const TrainOptions& m_options;
  const Trace& m_trace;
  const bool m_resumed;
  bool m_print;  // the reporting rank, not --quiet
  std::unique_ptr<std::FILE, CloseFile> m_losses;
  std::chrono::steady_clock::time_point m_started, m_window_start;
  std::vector<double> m_step_seconds;  // for the median in the summary
  // The steps since the last progress line.
  int64_t m_window_steps = 0, m_window_correct = 0, m_window_rows = 0;
  int64_t m_window_loaded = 0, m_window_drained = 0;  // offloaded: bytes through the window
  double m_window_loss = 0, m_window_comm = 0, m_window_compute = 0;
};

}  // namespace tiermem::exec
