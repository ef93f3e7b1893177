// Offload at run time (memory_plan.hpp): the stays of the plan's Visits.
// Parameters are copied from their home arena (a tier below the one the
// kernels compute in) into the window ahead of their ops, on the compute's
// side queue (the copy engines, beside the kernels); gradients start zeroed
// in the window and are copied home after their last op. Per schedule
// position, before its op is queued:
//   1. loads that nothing could overlap (the stage's first parameters);
//   2. gradients starting here: the last drain waited for (the window bytes
//      they take may still be on their way home), then zeroed;
//   3. parameters starting here: their loads waited for;
//   4. loads of the next stays, issued now so that they run while this
//      position's op computes;
// and after it, the drains of gradients whose last op it was. The window
// bytes of a stay are free before its load is issued (the plan's lifetimes;
// a side copy starts after what was queued before it), so nothing is
// overwritten while an op reads it.
#pragma once

#include <cstdint>
#include <vector>

#include "executor/compute.hpp"
#include "executor/runtime/state/arenas.hpp"
#include "executor/runtime/plan/job_plan.hpp"
#include "executor/trace.hpp"

namespace tiermem::exec {

class ParamStream {
 public:
  ParamStream(const JobPlan& job, const Arenas& arenas, Compute& compute, Trace& trace);

  bool active() const { return m_job.plan.offload; }
  // Around the op at schedule position `pos` of a step whose committed
  // parameters are copy `parity`.
  void before(int pos, int64_t parity);
  void after(int pos);
  // The tensors drained home after position `pos` (parameters' gradients),
  // and the ticket of the last drain issued (side copies run in order).
  std::vector<int> drained_at(int pos) const;
  uint64_t last_drain() const { return m_last_drain; }
  // The optimizer on the compute (its kernels, so the bits of a run that
  // fits): every parameter and its gradient and state, chunk by chunk,
  // loaded from the committed copy `parity` into one half of the window
  // while the other half's chunk is updated in place, then drained into the
  // next copy. Synced before it returns. Errors: those of the compute.
  Status update(const std::vector<int>& update_ops, int64_t parity);
  // Evaluation (ops outside the schedule): `op`'s parameters copied into
  // the window now.
  void load_for(const Op& op, int64_t parity);
  // The window memory of `tensor` (a parameter or a parameter's gradient)
  // in its current stay; nullptr for other tensors, or none there.
  void* memory(int tensor) const;
  // Bytes loaded and drained by training steps since the start (evaluation's
  // copies are not counted).
  int64_t loaded_bytes() const { return m_loaded; }
  int64_t drained_bytes() const { return m_drained; }

 private:
  void load(const Visit& v, int64_t parity, uint64_t* ticket);

  const JobPlan& m_job;
  const Arenas& m_arenas;
  Compute& m_compute;
  Trace& m_trace;
  std::byte* m_window = nullptr;
  // Visits (indices into plan.visits) by position.
  std::vector<std::vector<int>> m_load_first, m_zero, m_wait, m_prefetch, m_drain;
  std::vector<uint64_t> m_ticket;       // per visit: its load
  std::vector<int64_t> m_at;            // per tensor: its window offset now (-1: none)
  uint64_t m_last_drain = 0;
  int64_t m_loaded = 0, m_drained = 0;
};

}  // namespace tiermem::exec
