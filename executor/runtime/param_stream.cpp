#include "executor/runtime/param_stream.hpp"

namespace tiermem::exec {
namespace {

const std::string k_load = "offload: load";
const std::string k_drain = "offload: drain";

}  // namespace

ParamStream::ParamStream(const JobPlan& job, const Arenas& arenas, Compute& compute, Trace& trace)
    : m_job(job), m_arenas(arenas), m_compute(compute), m_trace(trace) {
  const MemoryPlan& plan = job.plan;
  m_at.assign(job.graph.tensors.size(), -1);
  if (!plan.offload) return;
  m_window = arenas.window().data();
  const size_t positions = plan.schedule.size() + 1;
  for (auto* list : {&m_load_first, &m_zero, &m_wait, &m_prefetch, &m_drain}) list->resize(positions);
  m_ticket.assign(plan.visits.size(), 0);
  for (size_t i = 0; i < plan.visits.size(); ++i) {
    const Visit& v = plan.visits[i];
    const int at = static_cast<int>(i);
    if (v.grad) {
      m_zero[static_cast<size_t>(v.first)].push_back(at);
      m_drain[static_cast<size_t>(v.last)].push_back(at);
      continue;
    }
    (v.load_at == v.first ? m_load_first : m_prefetch)[static_cast<size_t>(v.load_at)].push_back(at);
    m_wait[static_cast<size_t>(v.first)].push_back(at);
  }
}

void ParamStream::load(const Visit& v, int64_t parity, uint64_t* ticket) {
  auto span = m_trace.span(SpanKind::comm, k_load);
  const void* home = m_arenas.memory(m_job, v.tensor, -1, parity);
  *ticket = m_compute.side_copy(m_window + v.offset, home, static_cast<size_t>(m_job.graph.tensors[v.tensor].bytes()));
  m_loaded += m_job.graph.tensors[v.tensor].bytes();
}

void ParamStream::before(int pos, int64_t parity) {
  if (!active()) return;
  const auto p = static_cast<size_t>(pos);
  const std::vector<Visit>& visits = m_job.plan.visits;
  for (int i : m_load_first[p]) load(visits[static_cast<size_t>(i)], parity, &m_ticket[static_cast<size_t>(i)]);
  if (!m_zero[p].empty()) m_compute.wait_side(m_last_drain);
  for (int i : m_zero[p]) {
    const Visit& v = visits[static_cast<size_t>(i)];
    m_compute.zero(m_window + v.offset, static_cast<size_t>(m_job.graph.tensors[v.tensor].bytes()));
    m_at[static_cast<size_t>(v.tensor)] = v.offset;
  }
  for (int i : m_wait[p]) {
    const Visit& v = visits[static_cast<size_t>(i)];
    m_compute.wait_side(m_ticket[static_cast<size_t>(i)]);
    m_at[static_cast<size_t>(v.tensor)] = v.offset;
  }
  for (int i : m_prefetch[p]) load(visits[static_cast<size_t>(i)], parity, &m_ticket[static_cast<size_t>(i)]);
}

void ParamStream::after(int pos) {
  if (!active()) return;
  for (int i : m_drain[static_cast<size_t>(pos)]) {
    const Visit& v = m_job.plan.visits[static_cast<size_t>(i)];
    auto span = m_trace.span(SpanKind::comm, k_drain);
    const int64_t bytes = m_job.graph.tensors[v.tensor].bytes();
    m_last_drain = m_compute.side_copy(m_arenas.memory(m_job, v.tensor, -1, 0), m_window + v.offset,
                                       static_cast<size_t>(bytes));
    m_drained += bytes;
    m_at[static_cast<size_t>(v.tensor)] = -1;
  }
}

void ParamStream::load_for(const Op& op, int64_t parity) {
  if (!active()) return;
  // Between steps the window is free (the step's side copies are done: it
  // ended in a sync); one op's parameters fit it (they are live at once in
  // the plan).
  int64_t offset = 0;
  for (int t : op.in) {
    const Tensor& tensor = m_job.graph.tensors[static_cast<size_t>(t)];
    if (tensor.role != Role::param) continue;
    const void* home = m_arenas.memory(m_job, t, -1, parity);
    if (home == nullptr) continue;
    m_compute.copy(m_window + offset, home, static_cast<size_t>(tensor.bytes()));
    m_at[static_cast<size_t>(t)] = offset;
    offset += (tensor.bytes() + 63) / 64 * 64;
  }
}

void* ParamStream::memory(int tensor) const {
  if (!active()) return nullptr;
  const int64_t at = m_at[static_cast<size_t>(tensor)];
  return at < 0 ? nullptr : m_window + at;
}

}  // namespace tiermem::exec
