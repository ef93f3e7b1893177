#include "executor/ops/op_registry.hpp"

#include <cstdio>
#include <cstdlib>
#include <map>

namespace tiermem::exec {
namespace {

struct Table {
  std::map<int, const OpSpec*> by_kind;
};

[[noreturn]] void broken(const std::string& why) {
  std::fprintf(stderr, "tiermem-exec: the op registry is broken (a bug): %s\n", why.c_str());
  std::abort();
}

const Table& table() {
  static const Table t = [] {
    Table built;
    // The families: a new family file is listed here once.
    for (const std::vector<OpSpec>* family : {&dense_ops(), &activation_ops(), &normalisation_ops(), &sequence_ops(),
                                              &parallel_ops(), &optimizer_ops()}) {
      for (const OpSpec& spec : *family) {
        if (spec.run == nullptr) broken("op " + std::string(spec.name) + " has no kernel");
        if (spec.model_inputs != -1 && spec.shape == nullptr) broken("model op " + std::string(spec.name) + " has no shape rule");
        if (!built.by_kind.emplace(static_cast<int>(spec.kind), &spec).second) {
          broken("two specs of " + proto::OpType_Name(spec.kind));
        }
      }
    }
    const auto* kinds = proto::OpType_descriptor();
    for (int i = 0; i < kinds->value_count(); ++i) {
      const int kind = kinds->value(i)->number();
      if (kind != proto::OP_UNSPECIFIED && built.by_kind.count(kind) == 0) {
        broken(kinds->value(i)->name() + " has no spec in executor/ops/");
      }
    }
    return built;
  }();
  return t;
}

}  // namespace

std::string ShapeQuery::name(size_t i) const { return "'" + in[i]->name + "' " + shape_text(in[i]->shape); }

Status ShapeQuery::mismatch(const std::string& why) const {
  return Status(ErrorCode::config_error,
                source + ": op '" + def.name() + "' (" + proto::OpType_Name(def.type()) + "): " + why);
}

const OpSpec& op_spec(OpKind kind) {
  const Table& t = table();
  auto it = t.by_kind.find(static_cast<int>(kind));
  if (it == t.by_kind.end()) broken("no spec of op kind " + std::to_string(static_cast<int>(kind)));
  return *it->second;
}

const OpSpec* model_op_spec(proto::OpType type) {
  const Table& t = table();
  auto it = t.by_kind.find(static_cast<int>(type));
  return it == t.by_kind.end() || it->second->model_inputs == -1 ? nullptr : it->second;
}

std::vector<const OpSpec*> all_op_specs() {
  std::vector<const OpSpec*> out;
  for (const auto& [kind, spec] : table().by_kind) out.push_back(spec);
  return out;
}

std::string_view op_kind_name(OpKind kind) { return op_spec(kind).name; }

std::vector<OpSpec> join(std::vector<OpSpec> a, const std::vector<OpSpec>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

Result<std::vector<int64_t>> same_shape_as_input(const ShapeQuery& q) { return q.shape(0); }

double flops_per_output_element(const Graph& g, const Op& op, double per_element) {
  return per_element * static_cast<double>(g.tensors[static_cast<size_t>(op.out[0])].elements());
}

}  // namespace tiermem::exec
