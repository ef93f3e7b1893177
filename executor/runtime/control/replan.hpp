// Runtime repartitioning (X11): a pipeline whose ranks stop running at the
// speeds it was cut for (a noisy neighbour, a throttled GPU, a co-located
// job taking cores) is cut again while it trains.
//
// - Every rank publishes a step sample into its profile allocation
//   (profile.hpp) after each step: its compute seconds per step (a moving
//   average), the P99 of its last 64 step times and its host's CPU use.
// - Rank 0 looks at every rank's sample every ReplanOptions::every_ms. The
//   first look at a cut takes each stage's compute time as its baseline; a
//   stage that computes f times slower (or faster) than that since (f
//   beyond 1.25) has a device f times slower: its rate divided by f. When
//   the step time and the CPU stay over their thresholds for `patience`
//   looks, and the cut by those rates predicts a slowest stage `min_gain`
//   faster than the current cut under them, it writes a
//   plan record into its profile: the next generation's cut and the step to
//   move at (the next boundary, which no rank can pass before reading it).
// - At that boundary every rank builds the new generation's memory under new
//   names ("<job>.r<rank>.g<N>.*"), copies the committed parameters and
//   optimizer state of the tensors it now holds from their old owners'
//   arenas (one-sided reads through the memory service, never files),
//   starts its control words where the old ones were, and waits for every
//   rank to have copied; rank 0 then commits the generation in the record,
//   and only then does every rank free the old one.
//
// A rank that dies during a move leaves the old generation whole and
// committed: the job restarted resumes from it at the last committed step
// (the new generation's leftovers are freed at start).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <tiermem/status.h>

#include "executor/runtime/state/job.hpp"
#include "executor/runtime/plan/job_plan.hpp"
#include "executor/runtime/options.hpp"

namespace tiermem::exec {

// What a rank publishes after its steps (byte 128 of its profile).
struct StepSample {
  uint64_t steps = 0;              // the step count it was taken after
  double compute_seconds = 0;      // per step, moving average
  double step_p99_seconds = 0;     // of the last 64 steps
  double cpu_busy = 0;             // the host's CPU use, 0..1, over the last look
};

// The plan record (byte 256 of rank 0's profile): the generation in use and
// its cut, and the one decided and not yet committed.
struct PlanRecord {
  uint64_t committed = 0;   // the generation in use (0: the cut made at start)
  uint64_t pending = 0;     // > committed: decided, moving at switch_step
  int64_t switch_step = -1;
  std::vector<int> cut, next_cut;        // stage of each forward op: committed (> 0), pending
  std::vector<double> rates, next_rates;  // each stage's GEMM rate they were cut for (FLOP/s)
};

// This rank's publishing side: keeps the last step times and the CPU
// counters between looks.
class SamplePublisher {
 public:
  explicit SamplePublisher(const OwnRegion& profile) : m_profile(profile) {}
  // After step `steps` - 1, which took `wall` seconds of which `compute`
  // computing.
  void step_done(uint64_t steps, double wall, double compute);

 private:
  const OwnRegion& m_profile;
  std::vector<double> m_walls;
  double m_compute = -1;
  uint64_t m_cpu_busy = 0, m_cpu_total = 0;
  double m_cpu = 0;
  int64_t m_cpu_at = 0;
};

Result<StepSample> read_sample(JobDirectory& dir, int rank);
// The record in rank 0's profile (`own`: rank 0's own mapping, else null:
// read through the directory). `with_cuts`: the cuts and rates too.
Result<PlanRecord> read_record(JobDirectory& dir, const OwnRegion* own, bool with_cuts);
// Rank 0 only: writes the record (the cuts first, the generations last).
void write_record(const OwnRegion& own, const PlanRecord& record);
// Whether the job's cut fits the record (16 stages, 880 forward ops).
bool record_fits(const JobPlan& job);

// Rank 0's decision.
class ReplanPolicy {
 public:
  ReplanPolicy(const ReplanOptions& options, const JobPlan& job) : m_opt(options), m_job(job) {}
  struct Decision {
    Partition partition;
    std::vector<StageCost> costs;  // as measured: what the cut was made for
    std::string cause;  // for the log: what was seen, what is predicted
  };
  // At the boundary before `step`: looks when it is time and decides.
  // Errors: those of reading the samples.
  Result<std::optional<Decision>> look(JobDirectory& dir, int64_t step);
  // The job moved at `step`: samples from before it are of the old cut.
  void moved(int64_t step);

 private:
  const ReplanOptions& m_opt;
  const JobPlan& m_job;
  int64_t m_last_look_ms = 0;
  int64_t m_fresh_from = 0;  // samples taken after this many steps count
  int m_over = 0;            // looks in a row over the thresholds
  std::vector<double> m_baseline;  // each stage's compute seconds per step at the first look at this cut
};

}  // namespace tiermem::exec
