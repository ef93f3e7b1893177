#include "executor/runtime/plan/schedule.hpp"

namespace tiermem::exec {

Schedule::Schedule(const JobPlan& job) : m_job(job) {
  const MemoryPlan& plan = job.plan;
  const int stage = job.topo.stage();
  m_zero_at.resize(plan.schedule.size() + 1);
  for (size_t w = 0; w < plan.work.size(); ++w) {
    const Tensor& t = job.graph.tensors[plan.work[w].tensor];
    if (t.role == Role::grad && !t.of_param) m_zero_at[static_cast<size_t>(plan.work[w].first)].push_back(static_cast<int>(w));
  }
  for (const Channel& c : job.channels) {
    if (c.to != stage) continue;
    if (c.forward) {
      m_received_channel[c.tensor] = c.id;
    } else {
      m_partials[c.tensor].push_back(c.id);
    }
  }
  for (size_t i = 0; i < job.graph.ops.size(); ++i) {
    const Op& op = job.graph.ops[i];
    if (job.partition.of_op[i] != stage) continue;
    if (op.phase == Phase::backward) {
      for (int t : op.out) m_last_writer[t] = static_cast<int>(i);
    }
    if (op.phase == Phase::forward) m_forward.push_back(static_cast<int>(i));
  }
  for (const auto& [op, mb] : plan.schedule) {
    const Op& o = job.graph.ops[op];
    if (o.kind == proto::TP_ALL_REDUCE) m_partial_sums.insert(op);
    if (o.kind == proto::SOFTMAX_CROSS_ENTROPY) m_loss_rows += job.graph.tensors[o.in[0]].shape[0];  // samples, or tokens
  }
  std::set<int> updated;
  for (size_t i = 0; i < job.graph.ops.size(); ++i) {
    const Op& op = job.graph.ops[i];
    if (op.phase != Phase::update || job.partition.of_op[i] != stage) continue;
    m_update_ops.push_back(static_cast<int>(i));
    updated.insert(op.in.begin(), op.in.end());
  }
  for (const auto* placements : {&plan.params, &plan.optimizer}) {
    for (const Placement& p : *placements) {
      if (updated.count(p.tensor) == 0) m_carried.push_back(p.tensor);
    }
  }
  m_exchanges = job.topo.replicas > 1 || job.topo.tensor_parallel > 1;
  for (const Channel& c : job.channels) m_exchanges = m_exchanges || c.to == stage || c.from == stage;
}

int Schedule::received_by(int tensor) const {
  auto it = m_received_channel.find(tensor);
  return it == m_received_channel.end() ? -1 : it->second;
}

const std::vector<int>* Schedule::partials_of(int tensor) const {
  auto it = m_partials.find(tensor);
  return it == m_partials.end() ? nullptr : &it->second;
}

int Schedule::last_writer(int tensor) const {
  auto it = m_last_writer.find(tensor);
  return it == m_last_writer.end() ? -1 : it->second;
}

}  // namespace tiermem::exec
