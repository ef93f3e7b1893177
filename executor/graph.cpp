#include "executor/graph.hpp"

#include <algorithm>
#include <functional>
#include <fstream>
#include <filesystem>
#include <map>
#include <sstream>

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <tiermem/status_macros.h>

#include "executor/dropout_math.hpp"
#include "executor/ops/op_registry.hpp"

namespace tiermem::exec {
namespace {

// Collects protobuf's parse errors with their line numbers.
class Errors final : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column, const std::string& message) override {
    if (first.empty()) first = std::to_string(line + 1) + ":" + std::to_string(column + 1) + ": " + message;
  }
  std::string first;
};

class Builder {
 public:
  Builder(const proto::ModelDef& def, std::string_view source) : m_def(def), m_source(source) {}

  Result<Graph> build() {
    m_graph.name = m_def.name();
    m_graph.dataset = m_def.dataset();
    m_graph.micro_batch = m_def.micro_batch();
    m_graph.optimizer = m_def.optimizer();
    if (m_graph.micro_batch <= 0) return fail("micro_batch must be set to the rows of a micro-batch");
    TIERMEM_RETURN_IF_ERROR(check_optimizer(m_def.optimizer()));
    for (const proto::TensorDef& t : m_def.tensor()) {
      TIERMEM_RETURN_IF_ERROR(declare(t));
    }
    if (m_def.op_size() == 0) return fail("the model has no ops");
    std::vector<int> order;
    TIERMEM_RETURN_IF_ERROR(topological_order(&order));
    for (int index : order) {
      TIERMEM_RETURN_IF_ERROR(add_op(m_def.op(index)));
    }
    m_graph.loss = m_graph.find(m_def.loss());
    if (m_def.loss().empty() || m_graph.loss < 0) return fail("loss '" + m_def.loss() + "' is not a tensor of the model");
    if (m_graph.tensors[m_graph.loss].elements() != 1) {
      return fail("loss '" + m_def.loss() + "' must be a scalar, it is " + shape_text(m_graph.tensors[m_graph.loss].shape));
    }
    return std::move(m_graph);
  }

 private:
  Status fail(const std::string& why) const {
    return Status(ErrorCode::config_error, std::string(m_source) + ": " + why);
  }

  Status check_optimizer(const proto::OptimizerDef& o) const {
    if (o.warmup_steps() < 0 || o.decay_steps() < 0) return fail("optimizer: warmup_steps and decay_steps count steps (>= 0)");
    if (o.decay_steps() > 0 && o.decay_steps() <= o.warmup_steps()) {
      return fail("optimizer: decay_steps (" + std::to_string(o.decay_steps()) + ") must be past warmup_steps (" +
                  std::to_string(o.warmup_steps()) + ")");
    }
    if (!(o.min_learning_rate() >= 0) || o.min_learning_rate() > o.learning_rate()) {
      return fail("optimizer: min_learning_rate must be in [0, learning_rate]");
    }
    if (o.min_learning_rate() > 0 && o.decay_steps() == 0) return fail("optimizer: min_learning_rate needs decay_steps");
    if (!(o.weight_decay() >= 0)) return fail("optimizer: weight_decay must be >= 0");
    if (!(o.max_grad_norm() >= 0)) return fail("optimizer: max_grad_norm must be >= 0 (0: no clipping)");
    return Status();
  }

  Status declare(const proto::TensorDef& t) {
    if (t.name().empty()) return fail("a tensor has no name");
    if (m_graph.find(t.name()) >= 0) return fail("tensor '" + t.name() + "' is declared twice");
    if (t.shape_size() == 0) return fail("tensor '" + t.name() + "' has no shape");
    for (int64_t d : t.shape()) {
      if (d <= 0) return fail("tensor '" + t.name() + "' has a dimension of " + std::to_string(d));
    }
    Tensor tensor;
    tensor.name = t.name();
    tensor.shape.assign(t.shape().begin(), t.shape().end());
    tensor.dtype = t.dtype() == proto::I32 ? DType::i32 : DType::f32;
    tensor.role = static_cast<Role>(t.role());
    tensor.init = t.init();
    tensor.init_fan_in = t.init_fan_in();
    tensor.decay = !t.no_weight_decay();
    if (t.no_weight_decay() && tensor.role != Role::param) {
      return fail("tensor '" + t.name() + "': no_weight_decay is for PARAMs");
    }
    if (tensor.init == proto::FILE || !t.init_file().empty()) TIERMEM_RETURN_IF_ERROR(init_file(t, &tensor));
    if (tensor.role == Role::grad || tensor.role == Role::optimizer_state) {
      return fail("tensor '" + t.name() + "' is " + std::string(role_name(tensor.role)) +
                  ": those are derived, not declared");
    }
    // A micro-batch is micro_batch samples; a sample is one row (features,
    // a class), or a sequence of rows (tokens).
    if ((tensor.role == Role::input || tensor.role == Role::label) && tensor.shape[0] % m_graph.micro_batch != 0) {
      return fail("tensor '" + t.name() + "' is " + shape_text(tensor.shape) + ", but a micro-batch has " +
                  std::to_string(m_graph.micro_batch) + " samples (rows, or sequences of rows)");
    }
    if (tensor.role == Role::label && tensor.dtype != DType::i32) {
      return fail("tensor '" + t.name() + "': labels are I32");
    }
    if (tensor.dtype == DType::i32 && tensor.role != Role::label && tensor.role != Role::input) {
      return fail("tensor '" + t.name() + "': only labels and inputs (token ids) are I32");
    }
    m_graph.tensors.push_back(std::move(tensor));
    return Status();
  }

  // A FILE-initialised tensor's file: found (relative to the model file),
  // and holding exactly its values.
  Status init_file(const proto::TensorDef& t, Tensor* tensor) {
    if (tensor->init != proto::FILE || t.init_file().empty()) {
      return fail("tensor '" + t.name() + "': init FILE and init_file go together");
    }
    std::filesystem::path path(t.init_file());
    if (path.is_relative()) path = std::filesystem::path(std::string(m_source)).parent_path() / path;
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    if (ec) return fail("tensor '" + t.name() + "': its initial values " + path.string() + ": " + ec.message());
    if (size != static_cast<uintmax_t>(tensor->elements() * 4)) {
      return fail("tensor '" + t.name() + "' " + shape_text(tensor->shape) + " needs " +
                  std::to_string(tensor->elements() * 4) + " bytes of float32, " + path.string() + " holds " +
                  std::to_string(size));
    }
    tensor->init_file = path.string();
    return Status();
  }

  // Orders the ops so that every op comes after the producers of its inputs;
  // a cycle is an error that names it.
  Status topological_order(std::vector<int>* order) {
    std::map<std::string, int> producer;
    for (int i = 0; i < m_def.op_size(); ++i) {
      for (const std::string& out : m_def.op(i).output()) {
        if (auto it = producer.find(out); it != producer.end()) {
          return fail("tensor '" + out + "' is written by both '" + m_def.op(it->second).name() + "' and '" +
                      m_def.op(i).name() + "'");
        }
        producer[out] = i;
      }
    }
    std::vector<int> state(m_def.op_size(), 0);  // 0 new, 1 on the stack, 2 done
    std::vector<int> stack;
    std::function<Status(int)> visit = [&](int i) -> Status {
      if (state[i] == 2) return Status();
      if (state[i] == 1) {
        std::string cycle;
        auto from = std::find(stack.begin(), stack.end(), i);
        for (auto it = from; it != stack.end(); ++it) cycle += m_def.op(*it).name() + " -> ";
        return fail("the ops form a cycle: " + cycle + m_def.op(i).name());
      }
      state[i] = 1;
      stack.push_back(i);
      for (const std::string& in : m_def.op(i).input()) {
        if (auto it = producer.find(in); it != producer.end()) {
          TIERMEM_RETURN_IF_ERROR(visit(it->second));
        }
      }
      stack.pop_back();
      state[i] = 2;
      order->push_back(i);
      return Status();
    };
    for (int i = 0; i < m_def.op_size(); ++i) {
      TIERMEM_RETURN_IF_ERROR(visit(i));
    }
    return Status();
  }

  // The shape an op produces from its inputs (its spec's rule), or a
  // mismatch error.
  Result<std::vector<int64_t>> infer(const proto::OpDef& op, const OpSpec& spec, const std::vector<int>& in) {
    ShapeQuery q{op, {}, std::string(m_source)};
    for (int t : in) q.in.push_back(&m_graph.tensors[static_cast<size_t>(t)]);
    for (size_t i = 0; i < in.size(); ++i) {
      const char* i32 = nullptr;
      for (const auto& [place, what] : spec.i32_inputs) {
        if (place == i) i32 = what;
      }
      if ((q.in[i]->dtype == DType::i32) != (i32 != nullptr)) {
        return q.mismatch(q.name(i) + (i32 != nullptr ? " must be I32 " + std::string(i32) : std::string(" must be F32")));
      }
    }
    if (!spec.sequence_fields && (op.heads() != 0 || op.context() != 0 || op.kv_heads() != 0)) {
      return q.mismatch("only CAUSAL_ATTENTION and ROTARY take heads, kv_heads and context");
    }
    if (op.theta() != 0 && !spec.takes_theta) return q.mismatch("only ROTARY takes theta");
    if (op.epsilon() != 0 && !spec.takes_epsilon) return q.mismatch("only RMS_NORM takes epsilon");
    if (!(op.epsilon() >= 0) || op.epsilon() > 1) return q.mismatch("epsilon must be in [0, 1]");
    if (op.probability() != 0 && !spec.takes_probability) {
      return q.mismatch("only DROPOUT and CAUSAL_ATTENTION take a probability");
    }
    if (!(op.probability() >= 0) || !(op.probability() < 1)) return q.mismatch("probability must be in [0, 1)");
    return spec.shape(q);
  }

  int output(const std::string& name, const std::vector<int64_t>& shape, int op, Role role) {
    int t = m_graph.find(name);
    if (t < 0) {
      Tensor tensor;
      tensor.name = name;
      tensor.shape = shape;
      tensor.role = role;
      m_graph.tensors.push_back(std::move(tensor));
      t = static_cast<int>(m_graph.tensors.size()) - 1;
    }
    m_graph.tensors[t].producer = op;
    return t;
  }

  Status add_op(const proto::OpDef& def) {
    const OpSpec* spec = model_op_spec(def.type());
    if (spec == nullptr) {
      if (def.type() == proto::OP_UNSPECIFIED || !proto::OpType_IsValid(def.type())) {
        return fail("op '" + def.name() + "' has no type");
      }
      return fail("op '" + def.name() + "' is of type " + proto::OpType_Name(def.type()) +
                  ", which the executor derives (backward, optimizer, tensor-parallel ops): a model file holds "
                  "forward ops only");
    }
    const int fewest = spec->model_inputs == -2 ? 2 : spec->model_inputs - spec->optional_inputs;
    const bool arity = spec->model_inputs == -2 ? def.input_size() >= 2
                                                : def.input_size() >= fewest && def.input_size() <= spec->model_inputs;
    if (!arity || def.output_size() != 1) {
      const std::string takes = spec->model_inputs == -2 ? std::string("two or more")
                                : fewest == spec->model_inputs
                                    ? std::to_string(spec->model_inputs)
                                    : std::to_string(fewest) + " to " + std::to_string(spec->model_inputs);
      return fail("op '" + def.name() + "' (" + proto::OpType_Name(def.type()) + ") takes " + takes +
                  " input(s) and 1 output, not " + std::to_string(def.input_size()) + " and " +
                  std::to_string(def.output_size()));
    }
    Op op;
    op.name = def.name();
    op.kind = spec->kind;
    op.phase = Phase::forward;
    op.heads = def.heads();
    op.context = def.context();
    op.kv_heads = def.kv_heads();
    op.theta = def.theta();
    op.epsilon = def.epsilon();
    op.probability = def.probability();
    op.salt = dropout_salt(op.name.data(), op.name.size());
    for (const std::string& in : def.input()) {
      const int t = m_graph.find(in);
      if (t < 0 || (m_graph.tensors[t].role == Role::activation && m_graph.tensors[t].producer < 0)) {
        return fail("op '" + def.name() + "' reads '" + in + "', which no op writes" +
                    (t < 0 ? " and no tensor declares" : ""));
      }
      op.in.push_back(t);
    }
    TIERMEM_ASSIGN_OR_RETURN(auto shape, infer(def, *spec, op.in));
    const int id = static_cast<int>(m_graph.ops.size());
    const std::string& out = def.output(0);
    if (const int existing = m_graph.find(out); existing >= 0) {
      const Tensor& t = m_graph.tensors[existing];
      if (t.role != Role::activation) {
        return fail("op '" + def.name() + "' writes '" + out + "', which is " + std::string(role_name(t.role)));
      }
      if (t.shape != shape) {
        return fail("tensor '" + out + "' is declared " + shape_text(t.shape) + " but op '" + def.name() +
                    "' produces " + shape_text(shape));
      }
    }
    op.out.push_back(output(out, shape, id, Role::activation));
    if (spec->saved != nullptr) {
      for (const SavedOutput& saved : spec->saved(op, shape)) {
        op.out.push_back(output(def.name() + saved.suffix, saved.shape, id, Role::activation));
      }
    }
    op.accumulate.assign(op.out.size(), false);
    m_graph.ops.push_back(std::move(op));
    return Status();
  }

  const proto::ModelDef& m_def;
  std::string_view m_source;
  Graph m_graph;
};

}  // namespace

std::string_view role_name(Role role) {
  switch (role) {
    case Role::activation: return "ACTIVATION";
    case Role::param: return "PARAM";
    case Role::grad: return "GRAD";
    case Role::optimizer_state: return "OPTIMIZER_STATE";
    case Role::input: return "INPUT";
    case Role::label: return "LABEL";
  }
  return "?";
}

int64_t Tensor::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int Graph::find(std::string_view tensor) const {
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].name == tensor) return static_cast<int>(i);
  }
  return -1;
}

std::vector<int> Graph::ops_of(Phase phase) const {
  std::vector<int> out;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].phase == phase) out.push_back(static_cast<int>(i));
  }
  return out;
}

std::vector<int> Graph::params() const {
  std::vector<int> out;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].role == Role::param) out.push_back(static_cast<int>(i));
  }
  return out;
}

int64_t Graph::param_elements() const {
  int64_t n = 0;
  for (int p : params()) n += tensors[p].elements();
  return n;
}

OptimizerHyper optimizer_hyper(const Graph& g, int param) {
  const proto::OptimizerDef& o = g.optimizer;
  OptimizerHyper h;
  h.lr = o.learning_rate();
  h.beta1 = o.beta1();
  h.beta2 = o.beta2();
  h.epsilon = o.epsilon() > 0 ? o.epsilon() : 1e-8f;
  h.momentum = o.momentum();
  h.weight_decay = g.tensors[static_cast<size_t>(param)].decay ? o.weight_decay() : 0.0f;
  h.decoupled = o.type() == proto::OptimizerDef::ADAMW;
  h.warmup = o.warmup_steps();
  h.decay = o.decay_steps();
  h.min_lr = o.min_learning_rate();
  h.max_grad_norm = o.max_grad_norm();
  return h;
}

void init_as_part_of(const Tensor& whole, int64_t row, const std::vector<std::pair<int64_t, int64_t>>& columns,
                     Tensor* part) {
  const bool nested = !whole.init_name.empty();
  part->init_name = nested ? whole.init_name : whole.name;
  part->init_shape = nested ? whole.init_shape : whole.shape;
  part->init_row = (nested ? whole.init_row : 0) + row;
  // Columns of `whole` as columns of the largest parameter.
  std::vector<std::pair<int64_t, int64_t>> base = whole.init_ranges;
  if (base.empty()) base = {{0, whole.shape.back()}};
  part->init_ranges.clear();
  for (auto [first, count] : columns) {
    int64_t start = 0;  // of the current base range, in whole's columns
    for (const auto& [b_first, b_count] : base) {
      const int64_t lo = std::max(first, start), hi = std::min(first + count, start + b_count);
      if (lo < hi) {
        const int64_t mapped = b_first + (lo - start);
        if (!part->init_ranges.empty() &&
            part->init_ranges.back().first + part->init_ranges.back().second == mapped) {
          part->init_ranges.back().second += hi - lo;
        } else {
          part->init_ranges.emplace_back(mapped, hi - lo);
        }
      }
      start += b_count;
    }
  }
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? "," : "") + std::to_string(shape[i]);
  return out + "]";
}

Result<Graph> parse_model(std::string_view text, std::string_view source) {
  proto::ModelDef def;
  google::protobuf::TextFormat::Parser parser;
  Errors errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(std::string(text), &def)) {
    return Status(ErrorCode::config_error, std::string(source) + ":" + errors.first);
  }
  return Builder(def, source).build();
}

Result<Graph> load_model(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status(ErrorCode::config_error, "cannot read model file " + path);
  std::stringstream text;
  text << in.rdbuf();
  return parse_model(text.str(), path);
}

}  // namespace tiermem::exec
