// Matrices, sums and products: MATMUL, MATMUL_NT, BIAS_ADD, ADD, MUL,
// CONCAT and their gradients.
#include "executor/ops/op_registry.hpp"

namespace tiermem::exec {
namespace {

double output_elements(const Graph& g, const Op& op) {
  return static_cast<double>(g.tensors[static_cast<size_t>(op.out[0])].elements());
}

OpSpec matmul() {
  OpSpec s;
  s.kind = proto::MATMUL;
  s.name = "matmul";
  s.model_inputs = 2;
  s.gemm = true;
  s.shape = [](const ShapeQuery& q) -> Result<std::vector<int64_t>> {
    if (q.shape(0).size() != 2 || q.shape(1).size() != 2) return q.mismatch(q.name(0) + " and " + q.name(1) + " must be matrices");
    if (q.shape(0)[1] != q.shape(1)[0]) {
      return q.mismatch(q.name(0) + " times " + q.name(1) + ": the inner dimensions " + std::to_string(q.shape(0)[1]) +
                        " and " + std::to_string(q.shape(1)[0]) + " differ");
    }
    return std::vector<int64_t>{q.shape(0)[0], q.shape(1)[1]};
  };
  s.flops = [](const Graph& g, const Op& op) {
    const auto& a = g.tensors[static_cast<size_t>(op.in[0])].shape;
    return 2.0 * a[0] * a[1] * g.tensors[static_cast<size_t>(op.in[1])].shape[1];
  };
  s.gradient = [](GradientEmitter& e, const Op& op) {
    const auto& a = e.graph().tensors[static_cast<size_t>(op.in[0])].shape;
    const auto& b = e.graph().tensors[static_cast<size_t>(op.in[1])].shape;
    const double flops = 2.0 * a[0] * a[1] * b[1];
    if (e.needs(op.in[0])) e.emit(".grad_a", proto::MATMUL_GRAD_A, {e.dy(), op.in[1]}, {op.in[0]}, flops);
    if (e.needs(op.in[1])) e.emit(".grad_b", proto::MATMUL_GRAD_B, {op.in[0], e.dy()}, {op.in[1]}, flops);
  };
  s.run = [](const OpCall& c) {
    c.k.matmul(c.f(c.op.in[0]), c.f(c.op.in[1]), c.f(c.op.out[0]), c.shape(c.op.in[0])[0], c.shape(c.op.in[0])[1],
               c.shape(c.op.in[1])[1], false);
  };
  return s;
}

OpSpec matmul_grad_a() {
  OpSpec s;
  s.kind = proto::MATMUL_GRAD_A;  // in: dY [M,N], B [K,N]; out: dA [M,K]
  s.name = "matmul_grad_a";
  s.phase = Phase::backward;
  s.gemm = true;
  s.run = [](const OpCall& c) {
    const auto& b = c.shape(c.op.in[1]);
    c.k.matmul_grad_a(c.f(c.op.in[0]), c.f(c.op.in[1]), c.f(c.op.out[0]), c.shape(c.op.in[0])[0], b[0], b[1], c.acc(0));
  };
  return s;
}

OpSpec matmul_grad_b() {
  OpSpec s;
  s.kind = proto::MATMUL_GRAD_B;  // in: A [M,K], dY [M,N]; out: dB [K,N]
  s.name = "matmul_grad_b";
  s.phase = Phase::backward;
  s.gemm = true;
  s.run = [](const OpCall& c) {
    const auto& a = c.shape(c.op.in[0]);
    c.k.matmul_grad_b(c.f(c.op.in[0]), c.f(c.op.in[1]), c.f(c.op.out[0]), a[0], a[1], c.shape(c.op.in[1])[1], c.acc(0));
  };
  return s;
}

// A [M,K] times B [N,K] transposed: a head that reads the embedding table
// [V,D] it is tied to, as the table is stored. Its kernels are the GEMMs of
// MATMUL's gradients: Y = A . B^T (MATMUL_GRAD_A's), dA = dY . B (plain),
// dB = dY^T . A (MATMUL_GRAD_B's, of dY and A).
OpSpec matmul_nt() {
  OpSpec s;
  s.kind = proto::MATMUL_NT;
  s.name = "matmul_nt";
  s.model_inputs = 2;
  s.gemm = true;
  s.shape = [](const ShapeQuery& q) -> Result<std::vector<int64_t>> {
    if (q.shape(0).size() != 2 || q.shape(1).size() != 2) return q.mismatch(q.name(0) + " and " + q.name(1) + " must be matrices");
    if (q.shape(0)[1] != q.shape(1)[1]) {
      return q.mismatch(q.name(0) + " times " + q.name(1) + " transposed: the columns " +
                        std::to_string(q.shape(0)[1]) + " and " + std::to_string(q.shape(1)[1]) + " differ");
    }
    return std::vector<int64_t>{q.shape(0)[0], q.shape(1)[0]};
  };
  s.flops = [](const Graph& g, const Op& op) {
    const auto& a = g.tensors[static_cast<size_t>(op.in[0])].shape;
    return 2.0 * a[0] * a[1] * g.tensors[static_cast<size_t>(op.in[1])].shape[0];
  };
  s.gradient = [](GradientEmitter& e, const Op& op) {
    const auto& a = e.graph().tensors[static_cast<size_t>(op.in[0])].shape;
    const auto& b = e.graph().tensors[static_cast<size_t>(op.in[1])].shape;
    const double flops = 2.0 * a[0] * a[1] * b[0];
    if (e.needs(op.in[0])) e.emit(".grad_a", proto::MATMUL_NT_GRAD_A, {e.dy(), op.in[1]}, {op.in[0]}, flops);
    if (e.needs(op.in[1])) e.emit(".grad_b", proto::MATMUL_GRAD_B, {e.dy(), op.in[0]}, {op.in[1]}, flops);
  };
  s.run = [](const OpCall& c) {
    const auto& b = c.shape(c.op.in[1]);
    c.k.matmul_grad_a(c.f(c.op.in[0]), c.f(c.op.in[1]), c.f(c.op.out[0]), c.shape(c.op.in[0])[0], b[0], b[1], false);
  };
  return s;
}

OpSpec matmul_nt_grad_a() {
  OpSpec s;
  s.kind = proto::MATMUL_NT_GRAD_A;  // in: dY [M,N], B [N,K]; out: dA [M,K]
  s.name = "matmul_nt_grad_a";
  s.phase = Phase::backward;
  s.gemm = true;
  s.run = [](const OpCall& c) {
    const auto& b = c.shape(c.op.in[1]);
    c.k.matmul(c.f(c.op.in[0]), c.f(c.op.in[1]), c.f(c.op.out[0]), c.shape(c.op.in[0])[0], b[0], b[1], c.acc(0));
  };
  return s;
}

OpSpec bias_add() {
  OpSpec s;
  s.kind = proto::BIAS_ADD;
  s.name = "bias_add";
  s.model_inputs = 2;
  s.shape = [](const ShapeQuery& q) -> Result<std::vector<int64_t>> {
    if (q.shape(0).size() != 2 || q.shape(1).size() != 1 || q.shape(1)[0] != q.shape(0)[1]) {
      return q.mismatch("bias " + q.name(1) + " does not match the columns of " + q.name(0));
    }
    return q.shape(0);
  };
  s.flops = output_elements;
  s.gradient = [](GradientEmitter& e, const Op& op) {
    const double n = output_elements(e.graph(), op);
    if (e.needs(op.in[0])) e.emit(".grad_x", proto::PASS_GRAD, {e.dy()}, {op.in[0]}, n);
    if (e.needs(op.in[1])) e.emit(".grad_b", proto::BIAS_GRAD, {e.dy()}, {op.in[1]}, n);
  };
  s.run = [](const OpCall& c) {
    c.k.bias_add(c.f(c.op.in[0]), c.f(c.op.in[1]), c.f(c.op.out[0]), c.shape(c.op.in[0])[0], c.shape(c.op.in[0])[1]);
  };
  return s;
}

OpSpec bias_grad() {
  OpSpec s;
  s.kind = proto::BIAS_GRAD;
  s.name = "bias_grad";
  s.phase = Phase::backward;
  s.run = [](const OpCall& c) {
    c.k.bias_grad(c.f(c.op.in[0]), c.f(c.op.out[0]), c.shape(c.op.in[0])[0], c.shape(c.op.in[0])[1], c.acc(0));
  };
  return s;
}

OpSpec pass_grad() {
  OpSpec s;
  s.kind = proto::PASS_GRAD;
  s.name = "pass_grad";
  s.phase = Phase::backward;
  s.run = [](const OpCall& c) { c.k.pass_grad(c.f(c.op.in[0]), c.f(c.op.out[0]), c.count(c.op.in[0]), c.acc(0)); };
  return s;
}

OpSpec add() {
  OpSpec s;
  s.kind = proto::ADD;
  s.name = "add";
  s.model_inputs = 2;
  s.shape = [](const ShapeQuery& q) -> Result<std::vector<int64_t>> {
    if (q.shape(0) != q.shape(1)) return q.mismatch(q.name(0) + " and " + q.name(1) + " must have the same shape");
    return q.shape(0);
  };
  s.flops = output_elements;
  s.gradient = [](GradientEmitter& e, const Op& op) {
    const double n = output_elements(e.graph(), op);
    if (e.needs(op.in[0])) e.emit(".grad_a", proto::PASS_GRAD, {e.dy()}, {op.in[0]}, n);
    if (e.needs(op.in[1])) e.emit(".grad_b", proto::PASS_GRAD, {e.dy()}, {op.in[1]}, n);
  };
  s.run = [](const OpCall& c) {
    c.k.add(c.f(c.op.in[0]), c.f(c.op.in[1]), c.f(c.op.out[0]), c.count(c.op.in[0]));
  };
  return s;
}

OpSpec mul() {
  OpSpec s;
  s.kind = proto::MUL;  // Y = A * B element-wise (SwiGLU's silu(gate) * up)
  s.name = "mul";
  s.model_inputs = 2;
  s.shape = [](const ShapeQuery& q) -> Result<std::vector<int64_t>> {
    if (q.shape(0) != q.shape(1)) return q.mismatch(q.name(0) + " and " + q.name(1) + " must have the same shape");
    return q.shape(0);
  };
  s.flops = output_elements;
  s.gradient = [](GradientEmitter& e, const Op& op) {
    const double n = output_elements(e.graph(), op);
    if (e.needs(op.in[0])) e.emit(".grad_a", proto::MUL_GRAD, {e.dy(), op.in[1]}, {op.in[0]}, n);
    if (e.needs(op.in[1])) e.emit(".grad_b", proto::MUL_GRAD, {e.dy(), op.in[0]}, {op.in[1]}, n);
  };
  s.run = [](const OpCall& c) {
    c.k.mul(c.f(c.op.in[0]), c.f(c.op.in[1]), c.f(c.op.out[0]), c.count(c.op.in[0]), false);
  };
  return s;
}

OpSpec mul_grad() {
  OpSpec s;
  s.kind = proto::MUL_GRAD;  // dA (+)= dY * B
  s.name = "mul_grad";
  s.phase = Phase::backward;
  s.run = [](const OpCall& c) {
    c.k.mul(c.f(c.op.in[0]), c.f(c.op.in[1]), c.f(c.op.out[0]), c.count(c.op.in[0]), c.acc(0));
  };
  return s;
}

OpSpec concat() {
  OpSpec s;
  s.kind = proto::CONCAT;  // along columns; in: X0 [M,N0], X1 [M,N1], ...   out: Y [M,sum N]
  s.name = "concat";
  s.model_inputs = -2;
  s.shape = [](const ShapeQuery& q) -> Result<std::vector<int64_t>> {
    int64_t columns = 0;
    for (size_t i = 0; i < q.in.size(); ++i) {
      if (q.shape(i).size() != 2 || q.shape(i)[0] != q.shape(0)[0]) {
        return q.mismatch(q.name(i) + " must be a matrix with the " + std::to_string(q.shape(0)[0]) + " rows of " +
                          q.name(0));
      }
      columns += q.shape(i)[1];
    }
    return std::vector<int64_t>{q.shape(0)[0], columns};
  };
  s.flops = output_elements;  // a copy
  s.gradient = [](GradientEmitter& e, const Op& op) {
    int64_t column = 0;
    for (size_t i = 0; i < op.in.size(); ++i) {
      // By value: emit() may add tensors (a gradient), moving the graph's.
      const Tensor x = e.graph().tensors[static_cast<size_t>(op.in[i])];
      if (e.needs(op.in[i])) {
        e.emit(".grad" + std::to_string(i), proto::SLICE_GRAD, {e.dy()}, {op.in[i]}, static_cast<double>(x.elements()))
            .column = column;
      }
      column += x.shape[1];
    }
  };
  s.run = [](const OpCall& c) {
    const auto& y = c.shape(c.op.out[0]);
    int64_t column = 0;
    for (int t : c.op.in) {
      c.k.copy_columns(c.f(t), c.f(c.op.out[0]), y[0], c.shape(t)[1], y[1], column);
      column += c.shape(t)[1];
    }
  };
  return s;
}

OpSpec slice_grad() {
  OpSpec s;
  s.kind = proto::SLICE_GRAD;  // dX (+)= dY[:, column : column + cols(dX)]
  s.name = "slice_grad";
  s.phase = Phase::backward;
  s.run = [](const OpCall& c) {
    const auto& dy = c.shape(c.op.in[0]);
    c.k.slice_columns_grad(c.f(c.op.in[0]), c.f(c.op.out[0]), dy[0], c.shape(c.op.out[0])[1], dy[1], c.op.column,
                           c.acc(0));
  };
  return s;
}

}  // namespace

const std::vector<OpSpec>& dense_ops() {
  static const std::vector<OpSpec> ops = {
      matmul(),
      matmul_grad_a(),
      matmul_grad_b(),
      matmul_nt(),
      matmul_nt_grad_a(),
      bias_add(),
      bias_grad(),
      pass_grad(),
      add(),
      mul(),
      mul_grad(),
      concat(),
      slice_grad(),
  };
  return ops;
}

}  // namespace tiermem::exec
