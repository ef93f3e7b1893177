// Gradient buckets for data parallelism on GPUs (X7): the parameter
// gradients of a stage, cut into contiguous ranges of its gradient arena,
// each all-reduced as soon as the backward pass has finished every
// gradient in it, while the rest of the backward pass runs (PyTorch DDP's
// buckets; 25 MiB by default, as there). A bucket is whole gradients: a
// gradient larger than the cap is a bucket of its own.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "executor/graph.hpp"
#include "executor/memory_plan.hpp"

namespace tiermem::exec {

struct GradBucket {
  int64_t offset = 0;  // in the gradient arena
  int64_t bytes = 0;   // from offset to the end of its last gradient (gaps between them included)
  int ready = 0;       // the schedule position after whose op every gradient in it is final
  std::vector<int> tensors;
};

// The buckets of `plan`'s gradients in the order they are ready (ties: the
// higher offset first), the same on every replica. Gradients are taken from
// the arena's end (backward meets the last layers first).
std::vector<GradBucket> plan_grad_buckets(const Graph& graph, const MemoryPlan& plan, int64_t bucket_bytes);

// "3 buckets of up to 25 MiB: 1.0 MiB ready after op 12 ...", for logs.
std::string describe_buckets(const std::vector<GradBucket>& buckets);

}  // namespace tiermem::exec
