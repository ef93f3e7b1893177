// Splitting heavy ops for balance (X3, X7 Shard(1)): when one op holds more
// FLOPs than a stage can balance at op granularity - the first matmul of an
// MLP does ~80 % of its work - no partition of the ops meets the 5 % bound.
// split_for_balance() rewrites such a matmul Y = X . W (W a PARAM [K,N]) into
// column blocks Y_j = X . W_j (W_j: consecutive columns of W) joined by a
// CONCAT, before autodiff: the blocks are ops like any other, so METIS places
// them on stages, and the gradients follow (CONCAT's backward slices dY).
// First into k equal blocks, each at most k_split_block_share of a stage's
// FLOPs; then the blocks METIS puts on one stage become one block (one
// transfer per stage, not per block), kept where that still balances.
// Each W_j starts as the same columns of W would: a split model computes what
// the whole one does, up to the order of floating-point sums.
#pragma once

#include <string>
#include <vector>

#include <tiermem/status.h>

#include "executor/graph.hpp"

namespace tiermem::exec {

// A block is at most this share of a stage's mean FLOPs.
inline constexpr double k_split_block_share = 0.25;

// Rewrites `forward` (a graph without its training ops) for `parts` stages.
// Does nothing when a partition at op granularity can reach a 5 % FLOP
// imbalance already. Returns one line per split op, for people.
Result<std::vector<std::string>> split_for_balance(Graph& forward, int parts, int micro_batches);

}  // namespace tiermem::exec
