// What each rank runs on, published into tiermem for the device-aware
// partition (X3): every rank of a pipeline measures its device's GEMM rate
// (a short calibration on its compute) and its link to the next stage (reads
// of that rank's profile allocation through the memory service), writes them
// into its own allocation "<job>.r<rank>.profile" and reads everyone's. Every
// rank then computes the same partition from the same figures.
//
// A rank that restarts finds its profile and keeps it (the plan it resumes
// must be the one its arenas were laid out for); --restart measures again.
//
// The profile allocation (DRAM, 64 KiB, mapped):
//   word 0   phase: 1 rate measured, 2 link measured too (readers wait for 2)
//   word 1   magic "TMPROF01"
//   16..39   doubles: GEMM FLOP/s, link bytes/s, link latency (s)
//   40..55   the rank's --vram-budget (bytes) and flags (1: tensors in
//            device memory), so that any rank can compute any other's
//            memory plan (runtime repartitioning copies from it)
//   128..    the step sample, 256..4 KiB rank 0's plan record (replan.hpp)
//   64..127  the device's name, NUL-terminated
//   4 KiB..  the bytes the previous stage reads to time the link
#pragma once

#include <string>
#include <vector>

#include <tiermem/client.h>

#include "executor/compute.hpp"
#include "executor/partitioner.hpp"
#include "executor/runtime/plan/channels.hpp"
#include "executor/runtime/state/job.hpp"
#include "executor/runtime/plan/job_plan.hpp"

namespace tiermem::exec {

inline constexpr int64_t k_profile_bytes = 64 << 10;

// A rank's figures as published.
struct RankProfile {
  std::string device;  // Compute::name(), with the emulated slowdown if any
  double flops_per_second = 0;
  double link_bytes_per_second = 0;  // to the next stage's rank; 0 for the last stage
  double link_latency_seconds = 0;
  int64_t budget = 0;          // --vram-budget
  bool device_memory = false;  // its tensors are in VRAM
};

// A GEMM's shape: [m, k] x [k, n].

// The GEMM rate of `compute` (FLOP/s) at `shape` (the model's heaviest
// GEMM: the rate its ops will see, not the device's peak), in the precision
// set, the median of five runs of 5 ms after a warm-up; stretched by
// `slowdown`.
// Errors: tier_exhausted when no buffer for the operands was had.
Result<double> measure_gemm_rate(Compute& compute, GemmShape shape, double slowdown);

class Profiles {
 public:
  // Finds (a restart) or creates and fills this rank's profile, then waits
  // for every rank's. `gemm`: the shape to calibrate at. Errors: those of the
  // allocation, of reading the others', timeout naming the rank awaited.
  Status exchange(JobDirectory& dir, const Topology& topo, Compute& compute, GemmShape gemm, double slowdown,
                  int64_t budget, bool quiet);

  const std::vector<RankProfile>& ranks() const { return m_ranks; }
  // Every stage's cost for partition_by_time: a device's rate is the median
  // over the ranks that publish that device's name (so ranks of one kind
  // agree exactly and a homogeneous job balances as FLOPs do), a stage's the
  // slowest of its ranks (replicas and tensor-parallel peers), its link the
  // slowest of theirs.
  std::vector<StageCost> stage_costs(const Topology& topo) const;
  // The allocation (freed with the job's memory; null before exchange()).
  const OwnRegion& region() const { return m_region; }
  OwnRegion take_region() { return std::move(m_region); }
  bool measured_now() const { return m_measured_now; }

 private:
  OwnRegion m_region;
  std::vector<RankProfile> m_ranks;
  bool m_measured_now = false;
};

}  // namespace tiermem::exec
