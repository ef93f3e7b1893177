// What a training rank tells anyone watching its job, in its own memory:
// after each step it writes a StepReport into its info allocation
// (`<job>.r<rank>.info`, at k_step_report_offset), and `tiermemctl job`
// reads it one-sided beside the job's allocations (which tier each tensor
// class lives in). Header-only and dependency-free: tiermemctl includes it
// without linking the executor.
//
// The record is guarded by a sequence word at both ends, odd while the rank
// writes it (a seqlock for readers on other hosts, who copy it twice).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>

namespace tiermem::exec {

inline constexpr int64_t k_step_report_offset = 35 << 10;  // in the 64 KiB info allocation
inline constexpr uint64_t k_step_report_magic = 0x31'4b'50'54'53'4d'54ULL;  // "TMSTPK1", little-endian

struct StepReport {
  uint64_t seq = 0;  // odd while written
  uint64_t magic = 0;
  int64_t steps_done = 0;   // committed steps (the next step's index)
  int64_t total_steps = 0;
  int64_t stage = 0, replica = 0;
  int64_t unix_ms = 0;      // when written
  double step_ms = 0;       // the last step, wall clock
  // The last step's bytes through the offload window (0: not offloaded):
  // parameters and optimizer state loaded from the home tier, gradients,
  // parameters and optimizer state written back to it.
  int64_t loaded_bytes = 0, drained_bytes = 0;
  int64_t updates_beside_backward = 0;  // host parameter updates run during the backward pass
  uint64_t seq_after = 0;   // == seq when the copy is whole
};

// Writes `report` at `to` (the rank's own mapping of its info allocation):
// the sequence word odd, the rest, then both words even.
inline void write_step_report(void* at, StepReport report) {
  auto* to = static_cast<unsigned char*>(at);
  auto* seq = reinterpret_cast<std::atomic<uint64_t>*>(to);
  const uint64_t odd = (seq->load(std::memory_order_relaxed) | 1) + 2;
  seq->store(odd, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  report.seq = report.seq_after = odd + 1;
  report.magic = k_step_report_magic;
  std::memcpy(to + sizeof(uint64_t), reinterpret_cast<const unsigned char*>(&report) + sizeof(uint64_t),
              sizeof report - sizeof(uint64_t));
  seq->store(report.seq, std::memory_order_release);
}

// Whether a copied record is whole and was written by a rank. A reader
// copies it twice and takes it when both copies are the same bytes and
// valid (a copy made while the rank wrote differs from the next, or has
// the odd word).
inline bool step_report_valid(const StepReport& r) {
  return r.magic == k_step_report_magic && r.seq == r.seq_after && r.seq % 2 == 0 && r.seq != 0;
}

}  // namespace tiermem::exec
