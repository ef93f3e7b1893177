#include "executor/interpreter.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <vector>

#include "executor/compute.hpp"
#include "executor/ops/op_registry.hpp"

namespace tiermem::exec {
namespace {

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
  op_spec(op.kind).run(OpCall{k, g, op, mem, committed != nullptr ? *committed : mem, force_accumulate});
}

void run_update(Compute& k, const Graph& g, const Op& op, const std::vector<float*>& a, int64_t count) {
  if (op.kind == proto::SGD_UPDATE) {
    k.sgd(a[0], a[0], a[1], a[2], a[2], count, optimizer_hyper(g, op.origin));
  } else if (op.kind == proto::ADAM_UPDATE) {
    k.adam(a[0], a[0], a[1], a[2], a[2], a[3], a[3], count, optimizer_hyper(g, op.origin));
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
