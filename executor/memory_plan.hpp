// The static memory plan of one pipeline stage (X4). The stage's schedule is
// GPipe's: the forward ops for every micro-batch in flight, then the backward
// ops in reverse micro-batch order; or 1F1B (PipelineSchedule): stage s of S
// runs the forwards of min(S - s, M) micro-batches, then alternates one
// backward and one forward, so at most S - s micro-batches' activations are
// alive at once (one on a single stage: gradient accumulation) instead of M.
// 1F1B takes the micro-batches in descending order, forward and backward, so
// every parameter gradient sums its micro-batches in GPipe's order: the same
// bits. 1F1B needs the forward pass to flow from lower stages to higher ones
// (else the plan stays GPipe's and says why). Every tensor instance (a tensor of one
// micro-batch) lives from its first write to its last read in that schedule;
// instances whose lifetimes do not overlap share memory. Per-step tensors
// (parameters, their gradients, optimizer state) have arenas of their own.
//
// Beyond the compute tier (offload): given a budget for the tier the kernels
// compute in (VRAM on a GPU, DRAM on the CPU) that the per-step tensors and
// the work arena do not fit, the plan keeps parameters (both copies), their
// gradients and optimizer state one tier down (the home tier: DRAM under
// VRAM, PMEM under DRAM), and the kernels read parameters and write their
// gradients in a window arena of the compute tier. The schedule is then
// op-major: each op for every micro-batch in a row (forward, micro-batches
// ascending; backward, ops in reverse, micro-batches descending), so that a
// parameter is loaded once per phase and a gradient drained once per step;
// every tensor of every micro-batch is computed from the same inputs and a
// gradient sums its micro-batches in the same order as GPipe's schedule,
// so the mathematics, to the bit, are the same. A parameter's stay (Visit)
// is loaded ahead of it, before the ops of the stay prefetch_depth stays
// earlier run (the copy overlaps them; 1, deeper while the budget has room,
// up to 4), and a gradient's is drained after its last op; stays share the window
// as the work arena's instances share it, over their lifetimes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <tiermem/status.h>
#include <tiermem/types.h>

#include "executor/graph.hpp"
#include "executor/partitioner.hpp"

namespace tiermem::exec {

struct Placement {
  int tensor = -1;
  int micro_batch = -1;  // -1: one instance per step
  int64_t offset = 0;    // in its arena
  int64_t bytes = 0;
  int first = 0, last = 0;  // schedule positions (per-micro-batch instances)
};

struct ArenaPlan {
  std::string name;  // work, params, grads, optimizer, snapshot
  Tier tier = Tier::dram;
  int64_t bytes = 0;
  int copies = 1;  // params and optimizer state are double-buffered (commit)
  std::string purpose;
};

// Offload: a stay in the window of a parameter (loaded from the home tier)
// or of a parameter's gradient (zeroed at its first op, drained home after
// its last).
struct Visit {
  int tensor = -1;
  bool grad = false;
  int load_at = 0;           // a parameter: the position before whose op the load is issued
  int first = 0, last = 0;   // positions of the ops that use it
  int64_t offset = 0, bytes = 0;  // in the window
};

enum class PipelineSchedule { gpipe, one_f_one_b };
const char* schedule_name(PipelineSchedule s);

struct MemoryOptions {
  bool vram = false;   // the kernels run on a GPU (the compute tier is VRAM, else DRAM)
  int64_t budget = 0;  // bytes of the compute tier for this stage's tensors; 0: no limit
  // 1F1B bounds the activations alive at once (an offloaded plan stays
  // op-major: each parameter loaded once per phase).
  PipelineSchedule schedule = PipelineSchedule::gpipe;
};

struct MemoryPlan {
  int part = 0;
  int micro_batches = 1;
  PipelineSchedule pipeline = PipelineSchedule::gpipe;  // what `schedule` follows (op-major when offloaded)
  std::string schedule_note;  // why 1F1B was asked and not run (stages out of order), or ""
  std::vector<std::pair<int, int>> schedule;  // (op, micro-batch)
  std::vector<Placement> work;     // per-micro-batch instances in the work arena
  std::vector<Placement> params, grads, optimizer;
  std::vector<ArenaPlan> arenas;
  int64_t work_peak = 0;    // the work arena with reuse
  int64_t work_naive = 0;   // every instance its own memory
  std::vector<int> received;  // tensors arriving from other stages (live in mailboxes)
  // Offload (MemoryOptions::budget): per-step tensors in `home`, streamed
  // through the window arena of `compute`.
  Tier compute = Tier::dram, home = Tier::dram;
  bool offload = false;
  int64_t budget = 0;
  int64_t in_compute_tier = 0;  // bytes the plan puts in the compute tier
  int64_t all_in_compute = 0;   // what it would put there without offload
  std::vector<Visit> visits;
  int64_t window_peak = 0;
  int prefetch_depth = 1;  // loads are issued this many stays ahead (the most the budget has room for, up to 4)
  // The optimizer in the window: elements per chunk, arrays per op (the
  // most of any: parameter, gradient and the state).
  int64_t update_chunk = 0;
  int update_arrays = 0;

  // Where micro-batch `mb`'s message comes in the order every stage handles
  // a channel's messages of one step (0 first): forward and backward alike
  // in 1F1B (descending micro-batches), backward reversed in GPipe's.
  int message_index(bool forward, int mb) const;
  // The placement of an instance, or nullptr.
  const Placement* find(int tensor, int micro_batch) const;
  int64_t total_bytes() const;
};

// Plans stage `part`. `vram`: the kernels run on a GPU, and every tensor
// goes to the VRAM tier (so do the messages; control words stay in DRAM).
MemoryPlan plan_memory(const Graph& graph, const Partition& partition, int part, int micro_batches, bool vram = false,
                       PipelineSchedule schedule = PipelineSchedule::gpipe);
// The same within options.budget: everything in the compute tier when it
// fits, else offloaded. Errors: tier_exhausted when
// even the work arena and the window of one op's parameters exceed the
// budget (says the least budget that runs).
Result<MemoryPlan> plan_memory(const Graph& graph, const Partition& partition, int part, int micro_batches,
                               const MemoryOptions& options);

std::string format_plan(const Graph& graph, const MemoryPlan& plan);

}  // namespace tiermem::exec
