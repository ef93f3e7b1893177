// Runs one op of a training graph on buffers, on a Compute (compute.hpp).
// The trainer resolves tensors to memory from its plan; tests resolve them to
// plain vectors.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "executor/graph.hpp"

namespace tiermem::exec {

class Compute;

// Memory of tensor `t` for the op being run.
using TensorMemory = std::function<void*(int tensor)>;

struct OpResult {
  float loss = 0;         // softmax_xent: mean loss of the micro-batch
  int64_t correct = 0;    // softmax_xent: rows whose arg-max is the label
};

// Runs `op` on `compute` (queued there; the loss goes to its statistics;
// Adam takes the step of compute.set_step). `force_accumulate` makes every output accumulate (the trainer
// zeroes gradient buffers and sums contributions, also those of other
// stages). An optimizer op reads the parameter and its state from
// `committed` and writes them to `memory` (nullptr: in place).
void run_op(Compute& compute, const Graph& graph, const Op& op, const TensorMemory& memory,
            bool force_accumulate = false, const TensorMemory* committed = nullptr);
// An optimizer op (sgd, adam) over `count` elements of its arrays, in
// place: arrays[i] holds that part of op.in[i] (parameter, gradient,
// state). Elementwise, so a tensor may be updated chunk by chunk
// (param_stream.hpp).
void run_update(Compute& compute, const Graph& graph, const Op& op, const std::vector<float*>& arrays, int64_t count);
// The same on the CPU, with the loss op's result; `step` is the optimizer
// step (Adam's bias correction, from 1).
OpResult run_op(const Graph& graph, const Op& op, const TensorMemory& memory, bool force_accumulate = false,
                int64_t step = 1);

// Fills a PARAM as its init says, deterministically from `seed` and its name.
void init_param(const Tensor& tensor, float* data, uint64_t seed);

}  // namespace tiermem::exec
