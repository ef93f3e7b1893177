// One place per op (X1, X2, X12): each op kind is declared once, in the
// executor/ops/ file of its family, with everything the executor needs of
// it: its name, whether a model file may name it and with how many inputs,
// its shape rule, the outputs it saves for its backward pass, its FLOPs,
// its gradient rule (the backward ops autodiff emits for it) and how it runs
// on a Compute (compute.hpp). The kinds themselves are the graph IR's
// (proto::OpType, graph.proto).
//
// Adding an op: its type in graph.proto, its OpSpec in a family file here,
// and its kernels: an element-wise op's math is one line of
// elementwise_math.hpp, shared by the CPU and the GPU (the unary family
// below); another op a kernel in kernels.cpp and one in cuda/kernels.cu
// behind a Compute call. Nothing else names op kinds case by case (a new
// family file is listed once, in op_registry.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <tiermem/status.h>

#include "executor/elementwise_math.hpp"
#include "executor/graph.hpp"
#include "executor/compute.hpp"
#include "executor/interpreter.hpp"

namespace tiermem::exec {

// What a shape rule sees: the op as a model file writes it, and its inputs.
struct ShapeQuery {
  const proto::OpDef& def;
  std::vector<const Tensor*> in;
  std::string source;  // the model file, for errors

  const std::vector<int64_t>& shape(size_t i) const { return in[i]->shape; }
  // "'x' [4,8]" for messages.
  std::string name(size_t i) const;
  // config_error "FILE: op 'NAME' (TYPE): why".
  Status mismatch(const std::string& why) const;
};

// An output an op saves for its backward pass beside its result: its name
// is the op's name and the suffix (".mean"), its shape given.
struct SavedOutput {
  std::string suffix;
  std::vector<int64_t> shape;
};

// What a gradient rule uses to emit the backward ops of one forward op.
class GradientEmitter {
 public:
  virtual ~GradientEmitter() = default;
  virtual const Graph& graph() const = 0;
  // Whether tensor `t` needs a gradient (a PARAM depends on it), and making
  // it need one.
  virtual bool needs(int t) const = 0;
  virtual void need(int t) = 0;
  // The gradient of the forward op's output `i` (it exists when the rule runs).
  virtual int dy(size_t i = 0) const = 0;
  // A backward op `op.name + suffix` of `kind` reading `in`, adding into the
  // gradients of `targets`, costing `flops`; returned to set its fields.
  virtual Op& emit(const std::string& suffix, OpKind kind, std::vector<int> in, std::vector<int> targets,
                   double flops) = 0;
};

// What a kernel call sees: the op, its graph, its tensors' memory.
struct OpCall {
  Compute& k;
  const Graph& g;
  const Op& op;
  const TensorMemory& mem;        // where it reads and writes
  const TensorMemory& committed;  // optimizer ops: where the parameter and state are read
  bool force_accumulate;

  float* f(int t) const { return static_cast<float*>(mem(t)); }
  float* from(int t) const { return static_cast<float*>(committed(t)); }
  const int32_t* i32(int t) const { return static_cast<const int32_t*>(mem(t)); }
  const std::vector<int64_t>& shape(int t) const { return g.tensors[static_cast<size_t>(t)].shape; }
  int64_t count(int t) const { return g.tensors[static_cast<size_t>(t)].elements(); }
  bool acc(size_t out) const { return force_accumulate || op.accumulate[out]; }
};

struct OpSpec {
  OpKind kind = proto::OP_UNSPECIFIED;
  std::string_view name;  // "matmul", for traces and messages
  Phase phase = Phase::forward;
  // A model file may name it with this many inputs (-2: two or more); -1:
  // derived only (autodiff, the optimizer, tensor parallelism).
  int model_inputs = -1;
  // Of those, how many at the end a model file may leave out (LAYER_NORM's
  // beta).
  int optional_inputs = 0;
  // Inputs that are I32 rather than F32, by place, with what they are
  // ("labels", "token ids") for the error when they are not.
  std::vector<std::pair<size_t, const char*>> i32_inputs;
  // Its gradient rule runs with no gradient of its output: the loss op,
  // where the backward pass starts.
  bool starts_backward = false;
  // A GEMM: the bf16 path converts its operands (job_plan's staging size).
  bool gemm = false;
  // Takes `heads`, `kv_heads` and `context` (CAUSAL_ATTENTION, ROTARY).
  bool sequence_fields = false;
  // Takes `epsilon` (RMS_NORM), `theta` (ROTARY).
  bool takes_epsilon = false;
  bool takes_theta = false;
  // Takes `probability` (DROPOUT; CAUSAL_ATTENTION's dropout).
  bool takes_probability = false;
  // Model ops: the shape of the result, or mismatch().
  Result<std::vector<int64_t>> (*shape)(const ShapeQuery&) = nullptr;
  // Model ops: what it saves for its backward pass (none: nullptr).
  std::vector<SavedOutput> (*saved)(const Op& op, const std::vector<int64_t>& result) = nullptr;
  // Model ops: FLOPs of one run, for the partitioner (autodiff's emit()
  // gives those of derived ops).
  double (*flops)(const Graph& g, const Op& op) = nullptr;
  // Model ops: the backward ops for this op, whose output's gradient
  // exists; nullptr: nothing flows back through it.
  void (*gradient)(GradientEmitter& e, const Op& op) = nullptr;
  // Runs it (queued on the compute).
  void (*run)(const OpCall& call) = nullptr;
};

// The spec of `kind`: every kind of graph.proto has one (op_registry.cpp
// checks at its first use; a kind without is a bug, and aborts naming it).
const OpSpec& op_spec(OpKind kind);
// The spec a model file's op type names, or nullptr (a derived kind, an
// unknown number).
const OpSpec* model_op_spec(proto::OpType type);
// Every spec, in kind order (tests).
std::vector<const OpSpec*> all_op_specs();

// The families (one file each).
const std::vector<OpSpec>& dense_ops();
const std::vector<OpSpec>& activation_ops();
const std::vector<OpSpec>& normalisation_ops();
const std::vector<OpSpec>& sequence_ops();
const std::vector<OpSpec>& parallel_ops();
const std::vector<OpSpec>& optimizer_ops();

// `a` followed by `b` (a family's specs and those made for it).
std::vector<OpSpec> join(std::vector<OpSpec> a, const std::vector<OpSpec>& b);

// Shape rules several families share.
Result<std::vector<int64_t>> same_shape_as_input(const ShapeQuery& q);
// FLOPs of `per_element` per element of the op's first output.
double flops_per_output_element(const Graph& g, const Op& op, double per_element);

// The two specs of an element-wise function of elementwise_math.hpp: the
// forward op `Kind` (model files may name it: one input, same shape) and its
// gradient `GradKind` (dX (+)= dY * f'(X)), `PerElement` FLOPs each.
template <OpKind Kind, OpKind GradKind, elementwise::Unary Fn, double PerElement>
std::vector<OpSpec> unary_op_specs(std::string_view name, std::string_view grad_name) {
  OpSpec forward;
  forward.kind = Kind;
  forward.name = name;
  forward.model_inputs = 1;
  forward.shape = same_shape_as_input;
  forward.flops = [](const Graph& g, const Op& op) { return flops_per_output_element(g, op, PerElement); };
  forward.gradient = [](GradientEmitter& e, const Op& op) {
    if (!e.needs(op.in[0])) return;
    const auto n = static_cast<double>(e.graph().tensors[static_cast<size_t>(op.in[0])].elements());
    e.emit(".grad", GradKind, {op.in[0], e.dy()}, {op.in[0]}, PerElement * n);
  };
  forward.run = [](const OpCall& c) { c.k.unary(Fn, c.f(c.op.in[0]), c.f(c.op.out[0]), c.count(c.op.in[0])); };
  OpSpec backward;
  backward.kind = GradKind;
  backward.name = grad_name;
  backward.phase = Phase::backward;
  backward.run = [](const OpCall& c) {
    c.k.unary_grad(Fn, c.f(c.op.in[0]), c.f(c.op.in[1]), c.f(c.op.out[0]), c.count(c.op.in[0]), c.acc(0));
  };
  return {forward, backward};
}

}  // namespace tiermem::exec
