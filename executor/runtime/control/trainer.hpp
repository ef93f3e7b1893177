// One rank of a training job (X5-X10): a pipeline stage of one data-parallel
// replica. Every parameter, gradient, optimizer state, activation and message
// lives in tiermem memory: arenas on the rank's node, mapped into the process
// (the kernels compute in them directly), and mailboxes that the neighbouring
// stages write one-sided.
//
// A step: for every micro-batch the stage's forward ops (receiving boundary
// activations, sending its own), then for every micro-batch in reverse the
// backward ops (sending partial gradients back); all-reduce of the parameter
// gradients across replicas through the memory service (each replica
// publishes, each sums all in replica order: the replicas stay bit-identical);
// the optimizer writes the next copy of parameters and state; the step is
// committed; a barrier closes it. A restarted rank finds its arenas and the
// committed step by name and goes on from there (X10).
#pragma once

#include "executor/runtime/env.hpp"
#include "executor/runtime/options.hpp"

namespace tiermem::exec {

// Runs training for this rank. Returns the process exit code (0 success).
int train(const TrainOptions& options, const RankEnv& env);

}  // namespace tiermem::exec
