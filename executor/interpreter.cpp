#include "executor/interpreter.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <vector>

#include "executor/compute.hpp"

namespace tiermem::exec {
namespace {

float* f(const TensorMemory& mem, int t) { return static_cast<float*>(mem(t)); }
const int32_t* labels(const TensorMemory& mem, int t) { return static_cast<const int32_t*>(mem(t)); }

uint64_t fnv1a(const std::string& s, uint64_t seed) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

void run_op(Compute& k, const Graph& g, const Op& op, const TensorMemory& mem, bool force_accumulate,
            const TensorMemory* committed) {
  const TensorMemory& from = committed != nullptr ? *committed : mem;
  auto shape = [&](int t) -> const std::vector<int64_t>& { return g.tensors[t].shape; };
  auto acc = [&](size_t i) { return force_accumulate || op.accumulate[i]; };
  auto count = [&](int t) { return g.tensors[t].elements(); };
  switch (op.kind) {
    case OpKind::matmul:
      k.matmul(f(mem, op.in[0]), f(mem, op.in[1]), f(mem, op.out[0]), shape(op.in[0])[0], shape(op.in[0])[1],
                shape(op.in[1])[1], false);
      break;
    case OpKind::bias_add:
      k.bias_add(f(mem, op.in[0]), f(mem, op.in[1]), f(mem, op.out[0]), shape(op.in[0])[0], shape(op.in[0])[1]);
      break;
    case OpKind::relu: k.relu(f(mem, op.in[0]), f(mem, op.out[0]), count(op.in[0])); break;
    case OpKind::gelu: k.gelu(f(mem, op.in[0]), f(mem, op.out[0]), count(op.in[0])); break;
    case OpKind::add: k.add(f(mem, op.in[0]), f(mem, op.in[1]), f(mem, op.out[0]), count(op.in[0])); break;
    case OpKind::layer_norm:
      k.layer_norm(f(mem, op.in[0]), f(mem, op.in[1]), f(mem, op.in[2]), f(mem, op.out[0]), f(mem, op.out[1]),
                    f(mem, op.out[2]), shape(op.in[0])[0], shape(op.in[0])[1]);
      break;
    case OpKind::softmax_xent:
      k.softmax_xent(f(mem, op.in[0]), labels(mem, op.in[1]), f(mem, op.out[0]), shape(op.in[0])[0],
                     shape(op.in[0])[1]);
      break;
    case OpKind::concat: {
      const auto& y = shape(op.out[0]);
      int64_t column = 0;
      for (int t : op.in) {
        k.copy_columns(f(mem, t), f(mem, op.out[0]), y[0], shape(t)[1], y[1], column);
        column += shape(t)[1];
      }
      break;
    }
    case OpKind::embedding:
      k.embedding(labels(mem, op.in[0]), f(mem, op.in[1]), f(mem, op.out[0]), shape(op.in[0])[0],
                  shape(op.in[1])[1]);
      break;
    case OpKind::position_embedding:
      k.position_embedding(f(mem, op.in[0]), f(mem, op.in[1]), f(mem, op.out[0]), shape(op.in[0])[0],
                           shape(op.in[0])[1], shape(op.in[1])[0]);
      break;
    case OpKind::attention:
      k.attention(f(mem, op.in[0]), f(mem, op.out[0]), f(mem, op.out[1]), shape(op.in[0])[0], shape(op.out[0])[1],
                  op.heads, op.context);
      break;
    case OpKind::embedding_grad: {  // in: ids, dY; out: dtable
      const auto& table = shape(op.out[0]);
      k.embedding_grad(labels(mem, op.in[0]), f(mem, op.in[1]), f(mem, op.out[0]), shape(op.in[0])[0], table[1],
                       table[0], acc(0));
      break;
    }
    case OpKind::position_embedding_grad: {  // in: dY; out: dtable
      const auto& table = shape(op.out[0]);
      k.position_embedding_grad(f(mem, op.in[0]), f(mem, op.out[0]), shape(op.in[0])[0], table[1], table[0], acc(0));
      break;
    }
    case OpKind::attention_grad:  // in: QKV, P, dY; out: dQKV
      k.attention_grad(f(mem, op.in[0]), f(mem, op.in[1]), f(mem, op.in[2]), f(mem, op.out[0]), shape(op.in[0])[0],
                       shape(op.in[2])[1], op.heads, op.context, acc(0));
      break;
    case OpKind::slice_grad: {
      const auto& dy = shape(op.in[0]);
      k.slice_columns_grad(f(mem, op.in[0]), f(mem, op.out[0]), dy[0], shape(op.out[0])[1], dy[1], op.column, acc(0));
      break;
    }
    case OpKind::matmul_grad_a: {  // in: dY [M,N], B [K,N]; out: dA [M,K]
      const auto& b = shape(op.in[1]);
      k.matmul_grad_a(f(mem, op.in[0]), f(mem, op.in[1]), f(mem, op.out[0]), shape(op.in[0])[0], b[0], b[1], acc(0));
      break;
    }
    case OpKind::matmul_grad_b: {  // in: A [M,K], dY [M,N]; out: dB [K,N]
      const auto& a = shape(op.in[0]);
      k.matmul_grad_b(f(mem, op.in[0]), f(mem, op.in[1]), f(mem, op.out[0]), a[0], a[1], shape(op.in[1])[1], acc(0));
      break;
    }
    case OpKind::bias_grad:
      k.bias_grad(f(mem, op.in[0]), f(mem, op.out[0]), shape(op.in[0])[0], shape(op.in[0])[1], acc(0));
      break;
    case OpKind::pass_grad:
    // Tensor parallelism: the local part (the runtime adds the group's for
    // an all-reduce: StageRunner).
    case OpKind::tp_identity:
    case OpKind::tp_all_reduce: k.pass_grad(f(mem, op.in[0]), f(mem, op.out[0]), count(op.in[0]), acc(0)); break;
    case OpKind::relu_grad:
      k.relu_grad(f(mem, op.in[0]), f(mem, op.in[1]), f(mem, op.out[0]), count(op.in[0]), acc(0));
      break;
    case OpKind::gelu_grad:
      k.gelu_grad(f(mem, op.in[0]), f(mem, op.in[1]), f(mem, op.out[0]), count(op.in[0]), acc(0));
      break;
    case OpKind::layer_norm_grad:
      k.layer_norm_grad(f(mem, op.in[0]), f(mem, op.in[1]), f(mem, op.in[2]), f(mem, op.in[3]), f(mem, op.in[4]),
                         f(mem, op.out[0]), f(mem, op.out[1]), f(mem, op.out[2]), shape(op.in[0])[0],
                         shape(op.in[0])[1], acc(0), acc(1));
      break;
    case OpKind::softmax_xent_grad: {
      const auto& l = shape(op.in[0]);
      k.softmax_xent_grad(f(mem, op.in[0]), labels(mem, op.in[1]), f(mem, op.out[0]), l[0], l[1],
                           g.grad_scale / static_cast<float>(l[0]), acc(0));
      break;
    }
    case OpKind::sgd: {
      const auto& o = g.optimizer;
      k.sgd(f(from, op.in[0]), f(mem, op.in[0]), f(mem, op.in[1]), f(from, op.in[2]), f(mem, op.in[2]),
            count(op.in[0]), o.learning_rate(), o.momentum(), o.weight_decay());
      break;
    }
    case OpKind::adam: {
      const auto& o = g.optimizer;
      k.adam(f(from, op.in[0]), f(mem, op.in[0]), f(mem, op.in[1]), f(from, op.in[2]), f(mem, op.in[2]),
             f(from, op.in[3]), f(mem, op.in[3]), count(op.in[0]), o.learning_rate(), o.beta1(), o.beta2(),
             o.epsilon() > 0 ? o.epsilon() : 1e-8f, o.weight_decay());
      break;
    }
  }
}

void run_update(Compute& k, const Graph& g, const Op& op, const std::vector<float*>& a, int64_t count) {
  const auto& o = g.optimizer;
  if (op.kind == OpKind::sgd) {
    k.sgd(a[0], a[0], a[1], a[2], a[2], count, o.learning_rate(), o.momentum(), o.weight_decay());
  } else if (op.kind == OpKind::adam) {
    k.adam(a[0], a[0], a[1], a[2], a[2], a[3], a[3], count, o.learning_rate(), o.beta1(), o.beta2(),
           o.epsilon() > 0 ? o.epsilon() : 1e-8f, o.weight_decay());
  }
}

OpResult run_op(const Graph& graph, const Op& op, const TensorMemory& memory, bool force_accumulate, int64_t step) {
  thread_local std::unique_ptr<Compute> cpu = make_cpu_compute();
  cpu->reset_stats();
  cpu->set_step(step);
  run_op(*cpu, graph, op, memory, force_accumulate);
  OpResult result;
  double loss = 0;
  cpu->take_stats(&loss, &result.correct);
  result.loss = static_cast<float>(loss);
  return result;
}

void init_param(const Tensor& t, float* data, uint64_t seed) {
  if (!t.init_name.empty()) {
    // Part of a larger parameter: initialise that one, keep our part.
    Tensor whole = t;
    whole.name = t.init_name;
    whole.shape = t.init_shape;
    whole.init_name.clear();
    whole.init_ranges.clear();
    std::vector<float> all(static_cast<size_t>(whole.elements()));
    init_param(whole, all.data(), seed);
    const int64_t rows = t.shape.size() == 2 ? t.shape[0] : 1;
    const int64_t all_cols = whole.shape.back();
    std::vector<std::pair<int64_t, int64_t>> ranges = t.init_ranges;
    if (ranges.empty()) ranges = {{0, t.shape.back()}};
    float* out = data;
    for (int64_t r = 0; r < rows; ++r) {
      for (const auto& [first, count] : ranges) {
        out = std::copy_n(all.data() + (t.init_row + r) * all_cols + first, count, out);
      }
    }
    return;
  }
  if (t.init == proto::FILE) {
    // Checked at load to hold exactly the tensor's floats.
    std::ifstream in(t.init_file, std::ios::binary);
    in.read(reinterpret_cast<char*>(data), t.bytes());
    if (!in) {
      // Gone since the model was loaded (which checked it).
      std::fprintf(stderr, "tiermem-exec: %s: cannot read %s since the model was loaded; '%s' starts at zero\n",
                   t.name.c_str(), t.init_file.c_str(), t.name.c_str());
      std::fill(data, data + t.elements(), 0.0f);
    }
    return;
  }
  std::mt19937_64 rng(fnv1a(t.name, seed));
  const int64_t n = t.elements();
  const double fan_in = t.shape.size() == 2 ? static_cast<double>(t.shape[0]) : static_cast<double>(t.init_fan_in);
  const double fan_out = t.shape.size() == 2 ? static_cast<double>(t.shape[1]) : 1.0;
  double bound = 0;
  switch (t.init) {
    case proto::ZEROS: std::fill(data, data + n, 0.0f); return;
    case proto::ONES: std::fill(data, data + n, 1.0f); return;
    case proto::XAVIER_UNIFORM: bound = std::sqrt(6.0 / (fan_in + fan_out)); break;
    case proto::KAIMING_UNIFORM: bound = std::sqrt(1.0 / fan_in); break;  // PyTorch nn.Linear: a = sqrt(5)
    case proto::LINEAR_BIAS: bound = fan_in > 0 ? 1.0 / std::sqrt(fan_in) : 0.0; break;
    default: bound = 0;
  }
  std::uniform_real_distribution<double> u(-bound, bound);
  for (int64_t i = 0; i < n; ++i) data[i] = static_cast<float>(u(rng));
}

}  // namespace tiermem::exec
