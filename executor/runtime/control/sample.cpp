// tiermem-exec sample: text from a model of bytes (a GPT, text:... dataset)
// trained with --keep, its committed parameters read from tiermem.
#include "executor/runtime/control/sample.hpp"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include <tiermem/client.h>
#include <tiermem/status_macros.h>

#include "executor/interpreter.hpp"
#include "executor/runtime/plan/job_plan.hpp"
#include "executor/runtime/state/arenas.hpp"

namespace tiermem::exec {
namespace {

// The forward ops of `job`'s graph run on the CPU over host buffers, one
// per tensor (token ids and labels as 32-bit words too).
class Forward {
 public:
  explicit Forward(const JobPlan& job) : m_job(job) {
    for (const Tensor& t : job.graph.tensors) m_data.emplace_back(static_cast<size_t>(t.elements()), 0.0f);
  }
  std::vector<float>& operator[](int tensor) { return m_data[static_cast<size_t>(tensor)]; }
  void run() {
    const TensorMemory memory = [this](int t) -> void* { return m_data[static_cast<size_t>(t)].data(); };
    for (int i : m_job.graph.ops_of(Phase::forward)) (void)run_op(m_job.graph, m_job.graph.ops[static_cast<size_t>(i)], memory);
  }

 private:
  const JobPlan& m_job;
  std::vector<std::vector<float>> m_data;
};

// The tensor of `role` (the first).
int tensor_of(const Graph& g, Role role) {
  for (size_t i = 0; i < g.tensors.size(); ++i) {
    if (g.tensors[i].role == role) return static_cast<int>(i);
  }
  return -1;
}

Status sample_text(const SampleOptions& o) {
  TrainOptions options;
  options.model = o.model;
  options.job = o.job;
  options.stages = 1;
  RankEnv env;
  env.rank = 0;
  env.world = 1;
  TIERMEM_ASSIGN_OR_RETURN(JobPlan job, plan_model(options, env));
  const Graph& g = job.graph;
  const int ids = tensor_of(g, Role::input);
  int logits = -1;
  for (const Op& op : g.ops) {
    if (op.kind == proto::SOFTMAX_CROSS_ENTROPY) logits = op.in[0];
  }
  if (ids < 0 || g.tensors[static_cast<size_t>(ids)].dtype != DType::i32 || logits < 0 ||
      g.dataset.rfind("text:", 0) != 0) {
    return Status(ErrorCode::invalid_argument, o.model + " is not a model of text (I32 token ids in, a softmax over "
                                                         "the bytes out, a text:... dataset)");
  }
  const int64_t context = g.tensors[static_cast<size_t>(ids)].elements() / g.micro_batch;
  const int64_t vocab = g.tensors[static_cast<size_t>(logits)].shape[1];
  // Its ids are bytes: every table they index must have a row for each, and
  // every byte drawn must be one (a model file is the caller's, not checked
  // against a dataset here as training does).
  if (vocab != 256) {
    return Status(ErrorCode::invalid_argument, o.model + " draws from " + std::to_string(vocab) +
                                                   " classes; a model of bytes draws from 256");
  }
  for (const Op& op : g.ops) {
    if (op.kind == proto::EMBEDDING && op.in[0] == ids && g.tensors[static_cast<size_t>(op.in[1])].shape[0] < 256) {
      return Status(ErrorCode::invalid_argument, "op '" + op.name + "': its table has " +
                                                     std::to_string(g.tensors[static_cast<size_t>(op.in[1])].shape[0]) +
                                                     " rows, fewer than the 256 byte values it is indexed by");
    }
  }

  TIERMEM_ASSIGN_OR_RETURN(auto client, Client::connect({.socket_path = o.socket, .client_name = "tiermem-exec sample"}));
  const std::string prefix = o.job + ".r0.";
  auto ctl = client->lookup(prefix + "ctl");
  auto params = client->lookup(prefix + "params");
  if (!ctl.ok() || !params.ok()) {
    return Status(ErrorCode::not_found, "no kept job '" + o.job + "' on this node (train it with --keep and --job " +
                                            o.job + "): " + (ctl.ok() ? params : ctl).status().message());
  }
  const int64_t bytes = job.arena_bytes("params");
  if (params->size != static_cast<uint64_t>(2 * bytes)) {
    return Status(ErrorCode::failed_precondition,
                  "job '" + o.job + "' keeps " + std::to_string(params->size) + " bytes of parameters, this model " +
                      std::to_string(2 * bytes) + ": it was trained from another model, or in several stages or tensor-parallel ranks (sample reads one whole rank)");
  }
  // The parameters must lie where this model puts them (arenas.hpp,
  // k_info_layout): another model of the same sizes would be read mixed up.
  uint64_t kept[k_info_layout_words] = {};
  auto info = client->lookup(prefix + "info");
  if (info.ok()) TIERMEM_RETURN_IF_ERROR(client->read(info->gva.plus(k_info_layout), kept, sizeof kept));
  if (kept[0] != k_layout_magic || kept[2] != params_layout(job)) {
    return Status(ErrorCode::failed_precondition,
                  "job '" + o.job + "' keeps its parameters laid out otherwise than this tiermem-exec lays them out for " +
                      o.model + " (" +
                      (kept[0] != k_layout_magic ? "kept by an older tiermem-exec" : "trained from another model") +
                      "): sampling would read them mixed up. Sample it with the model it was trained from");
  }
  uint64_t committed = 0;
  TIERMEM_RETURN_IF_ERROR(client->read(ctl->gva, &committed, sizeof committed));
  if (committed == 0) return Status(ErrorCode::failed_precondition, "job '" + o.job + "' has not committed a step");
  std::vector<std::byte> host(static_cast<size_t>(bytes));
  TIERMEM_RETURN_IF_ERROR(client->read(params->gva.plus((committed % 2) * static_cast<uint64_t>(bytes)), host.data(), host.size()));

  Forward forward(job);
  for (const Placement& p : job.plan.params) {
    std::memcpy(forward[p.tensor].data(), host.data() + p.offset, static_cast<size_t>(g.tensors[static_cast<size_t>(p.tensor)].bytes()));
  }
  std::string window(static_cast<size_t>(context), '\n');
  for (char c : o.prompt) window = window.substr(1) + c;
  std::printf("%s", o.prompt.c_str());
  std::mt19937_64 rng(o.seed);
  std::vector<double> weights(static_cast<size_t>(vocab));
  for (int64_t n = 0; n < o.bytes; ++n) {
    // Every sequence of the micro-batch holds the window; the last row of
    // the first gives the next byte's logits.
    auto& in = forward[ids];
    for (int64_t i = 0; i < static_cast<int64_t>(in.size()); ++i) {
      const int32_t id = static_cast<unsigned char>(window[static_cast<size_t>(i % context)]);
      std::memcpy(&in[static_cast<size_t>(i)], &id, 4);
    }
    forward.run();
    const float* row = forward[logits].data() + (context - 1) * vocab;
    const float top = *std::max_element(row, row + vocab);
    for (int64_t v = 0; v < vocab; ++v) {
      weights[static_cast<size_t>(v)] =
          o.temperature > 0 ? std::exp((row[v] - top) / o.temperature) : (row[v] == top ? 1.0 : 0.0);
    }
    const auto next = static_cast<char>(std::discrete_distribution<int64_t>(weights.begin(), weights.end())(rng));
    std::putchar(next);
    window = window.substr(1) + next;
  }
  std::printf("\n");
  std::fprintf(stderr, "(%" PRId64 " bytes from job %s at step %llu, temperature %.2f)\n", o.bytes, o.job.c_str(),
               static_cast<unsigned long long>(committed), o.temperature);
  return Status();
}

}  // namespace

int sample(const SampleOptions& options) {
  Status s = sample_text(options);
  if (!s.ok()) {
    std::fprintf(stderr, "tiermem-exec sample: %s\n", s.to_string().c_str());
    return 1;
  }
  return 0;
}

}  // namespace tiermem::exec
