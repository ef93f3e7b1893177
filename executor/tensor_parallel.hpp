// Tensor parallelism (X7): Megatron-style splits of a forward graph over a
// group of `ways` ranks, each computing part of every split block.
//
// A block is column-parallel matmuls X . W (W: PARAM [K,N], with its bias;
// all reading the same X) whose outputs reach a row-parallel matmul H . W2
// (W2: PARAM [N or D, K2]) through
//   - an element-wise activation (an MLP);
//   - an activation of one and a MUL with the other (SwiGLU: gate and up);
//   - a causal attention, optionally after ROTARY, of one matmul with q, k
//     and v side by side or of three (q, k, v) joined by a CONCAT;
// every tensor between them used only on that path and every parameter read
// by its op alone (a tied weight keeps its block whole). Rank t of the group
// keeps:
//   - an MLP or SwiGLU: columns [t N/T, (t+1) N/T) of each W and its bias,
//     the same rows of W2;
//   - an attention: heads [t h/T, (t+1) h/T) - their columns of Q and those
//     of their key/value heads (grouped-query: key/value heads
//     [t kv/T, (t+1) kv/T)) in W (or Wq, Wk, Wv) and its bias, their rows of W2.
// The block's input goes through a tp_identity (Shard on the way in: the
// backward pass sums every rank's part of its gradient) and the row matmul's
// output through a tp_all_reduce (Partial -> Replicate: the sum over the
// group, before the bias). Everything else is replicated: every rank of the
// group computes it whole, on the same bits (the sums run in rank order on
// every rank), so the replicated parameters stay equal without a reduction.
// Each part starts as the same elements of the whole parameter would
// (init_as_part_of): a split model starts where the whole one does; it
// computes the same up to the order of the row matmul's sums.
#pragma once

#include <string>
#include <vector>

#include <tiermem/status.h>

#include "executor/graph.hpp"

namespace tiermem::exec {

// Rewrites `forward` (a graph without its training ops) for rank `index` of
// a group of `ways`. Returns one line per split block, for people. Errors:
// invalid_argument when no block can be split, or a block's width or heads
// are not divisible by `ways` (naming it).
Result<std::vector<std::string>> shard_for_tensor_parallel(Graph& forward, int ways, int index);

}  // namespace tiermem::exec
