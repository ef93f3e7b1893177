// The executor's training graph (X1, X2): tensors with static shapes and roles,
// and ops, loaded from a model file (a ModelDef in protobuf text format),
// validated, and extended by autodiff with the backward pass and the
// optimizer. A graph is built once and never re-traced.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <tiermem/status.h>

#include "executor/optimizer_math.hpp"
#include "graph.pb.h"

namespace tiermem::exec {

enum class DType : uint8_t { f32, i32 };
enum class Role : uint8_t { activation, param, grad, optimizer_state, input, label };

// The kind of an op: the graph IR's (graph.proto), forward ones that model
// files name and those the executor derives; executor/ops/ declares what
// each is and does (op_registry.hpp).
using OpKind = proto::OpType;
enum class Phase : uint8_t { forward, backward, update };

// "matmul" (executor/ops/).
std::string_view op_kind_name(OpKind kind);
std::string_view role_name(Role role);

struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype = DType::f32;
  Role role = Role::activation;
  proto::Init init = proto::ZEROS;
  int64_t init_fan_in = 0;
  std::string init_file;  // FILE: its path (checked to hold elements() floats at load)
  // A PARAM cut out of a larger one (split_for_balance, tensor parallelism):
  // initialised as rows [init_row, init_row + rows) and the column ranges
  // `init_ranges` (in order; empty: all) of `init_name` with shape
  // `init_shape` would have been, so a split model starts where the whole
  // one does. A 1-D tensor is one row.
  std::string init_name;
  std::vector<int64_t> init_shape;
  int64_t init_row = 0;
  std::vector<std::pair<int64_t, int64_t>> init_ranges;  // (first column, columns)
  int producer = -1;   // op writing it first (-1: none, e.g. INPUT, PARAM)
  int grad = -1;       // its gradient tensor, when one exists

  int64_t elements() const;
  int64_t bytes() const { return elements() * 4; }
  // One instance per micro-batch (everything that flows), or one per step.
  bool per_micro_batch() const {
    return role == Role::activation || role == Role::input || role == Role::label ||
           (role == Role::grad && !of_param);
  }
  bool of_param = false;  // GRAD tensors: the gradient of a PARAM
  bool decay = true;      // PARAM: its optimizer applies the weight decay (false: the no-decay group)
};

struct Op {
  std::string name;
  OpKind kind = proto::OP_UNSPECIFIED;
  Phase phase = Phase::forward;
  std::vector<int> in, out;
  std::vector<bool> accumulate;  // per output: add into it instead of overwriting
  int origin = -1;               // backward/update ops: the forward op (or param) they come from
  bool recompute = false;        // a forward op run again in the backward pass (checkpointing, autodiff.cpp)
  int64_t column = 0;            // slice_grad: the first column of dY it takes
  int64_t heads = 0;             // attention, rotary (and their gradients): heads
  int64_t context = 0;           // attention, rotary: rows per sequence
  int64_t kv_heads = 0;          // attention, rotary: key/value heads (grouped-query; 0: heads)
  float theta = 0;               // rotary: the angles' base
  float epsilon = 0;             // rms norm
  float probability = 0;         // dropout, attention (its probabilities; and their gradients)
  uint64_t salt = 0;             // dropout, attention: dropout_salt of the forward op's name
  double flops = 0;
};

struct Graph {
  std::string name;
  std::string dataset;
  int64_t micro_batch = 0;
  proto::OptimizerDef optimizer;
  int loss = -1;
  // Multiplies the loss gradient beyond 1/rows of a micro-batch, so that the
  // summed gradients are those of the mean over the whole optimizer step
  // (micro-batches x data-parallel replicas).
  float grad_scale = 1;
  std::vector<Tensor> tensors;
  std::vector<Op> ops;  // forward ops in topological order, then backward, then update

  int find(std::string_view tensor) const;
  std::vector<int> ops_of(Phase phase) const;
  std::vector<int> params() const;
  // Number of float32 elements of every PARAM, in tensor order.
  int64_t param_elements() const;
};

std::string shape_text(const std::vector<int64_t>& shape);

// Makes `part` start as rows [row, row + rows of part) and the column ranges
// `columns` (first, count; in `whole`'s columns) of `whole` would, which may
// itself be a part of a larger parameter.
void init_as_part_of(const Tensor& whole, int64_t row, const std::vector<std::pair<int64_t, int64_t>>& columns,
                     Tensor* part);

// What the update of PARAM `param` reads: the optimizer's fields, the
// weight decay of the parameter's group.
OptimizerHyper optimizer_hyper(const Graph& g, int param);

// Parses and validates a model. Errors: config_error naming the file, and the
// line for syntax errors (an unknown op type is one), the op and tensors for
// everything else: wrong arity, unknown tensors, tensors written twice, writes
// to inputs or parameters, cycles, shape mismatches, a missing or non-scalar
// loss.
Result<Graph> parse_model(std::string_view text, std::string_view source);
Result<Graph> load_model(const std::string& path);

// Adds the backward pass (X2) and the optimizer's update ops and state.
// `grad_scale` multiplies the loss gradient (1 / samples per optimizer step
// beyond the micro-batch: micro-batches x data-parallel replicas).
// `checkpoint_segments` > 1: activation checkpointing over that many
// segments of the forward pass (autodiff.cpp): their inner activations are
// computed again in the backward pass instead of kept.
Status add_training(Graph& graph, float grad_scale, int checkpoint_segments = 0);

}  // namespace tiermem::exec
