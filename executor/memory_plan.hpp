// The static memory plan of one pipeline stage (X4). The stage's schedule is
// GPipe's: the forward ops for every micro-batch in flight, then the backward
// ops in reverse micro-batch order. Every tensor instance (a tensor of one
// micro-batch) lives from its first write to its last read in that schedule;
// instances whose lifetimes do not overlap share memory. Per-step tensors
// (parameters, their gradients, optimizer state) have arenas of their own.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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

struct MemoryPlan {
  int part = 0;
  int micro_batches = 1;
  std::vector<std::pair<int, int>> schedule;  // (op, micro-batch)
  std::vector<Placement> work;     // per-micro-batch instances in the work arena
  std::vector<Placement> params, grads, optimizer;
  std::vector<ArenaPlan> arenas;
  int64_t work_peak = 0;    // the work arena with reuse
  int64_t work_naive = 0;   // every instance its own memory
  std::vector<int> received;  // tensors arriving from other stages (live in mailboxes)

  // The placement of an instance, or nullptr.
  const Placement* find(int tensor, int micro_batch) const;
  int64_t total_bytes() const;
};

// Plans stage `part`. `vram`: the kernels run on a GPU, and every tensor
// goes to the VRAM tier (so do the messages; control words stay in DRAM).
MemoryPlan plan_memory(const Graph& graph, const Partition& partition, int part, int micro_batches, bool vram = false);

std::string format_plan(const Graph& graph, const MemoryPlan& plan);

}  // namespace tiermem::exec
