#include "executor/runtime/state/param_stream.hpp"

#include <algorithm>

#include "executor/interpreter.hpp"

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

std::vector<int> ParamStream::drained_at(int pos) const {
  std::vector<int> out;
  if (!active()) return out;
  for (int i : m_drain[static_cast<size_t>(pos)]) out.push_back(m_job.plan.visits[static_cast<size_t>(i)].tensor);
  return out;
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
    m_compute.copy(m_window + offset, home, static_cast<size_t>(tensor.bytes()));  // not counted: a step's figures
    m_at[static_cast<size_t>(t)] = offset;
    offset += (tensor.bytes() + 63) / 64 * 64;
  }
}

Status ParamStream::update(const std::vector<int>& update_ops, int64_t parity) {
  const MemoryPlan& plan = m_job.plan;
  const Graph& g = m_job.graph;
  struct Chunk {
    const Op* op;
    int64_t first, count;  // elements
  };
  std::vector<Chunk> chunks;
  for (int i : update_ops) {
    const Op& op = g.ops[static_cast<size_t>(i)];
    const int64_t n = g.tensors[static_cast<size_t>(op.in[0])].elements();
    for (int64_t at = 0; at < n; at += plan.update_chunk) chunks.push_back({&op, at, std::min(plan.update_chunk, n - at)});
  }
  const int64_t array_bytes = (plan.update_chunk * 4 + 63) / 64 * 64;
  const int64_t half = plan.update_arrays * array_bytes;
  auto array = [&](size_t c, size_t a) {
    return reinterpret_cast<float*>(m_window + static_cast<int64_t>(c % 2) * half + static_cast<int64_t>(a) * array_bytes);
  };
  // The home memory of array `a` of chunk `c`: the committed copy, or
  // (`next`) the one being written; a gradient has one.
  auto home = [&](const Chunk& c, size_t a, bool next) {
    const int t = c.op->in[a];
    const int64_t copy = g.tensors[static_cast<size_t>(t)].role == Role::grad ? 0 : (next ? 1 - parity : parity);
    return static_cast<float*>(m_arenas.memory(m_job, t, -1, copy)) + c.first;
  };
  std::vector<uint64_t> loaded(chunks.size(), 0);
  auto load = [&](size_t c) {
    auto span = m_trace.span(SpanKind::comm, k_load);
    for (size_t a = 0; a < chunks[c].op->in.size(); ++a) {
      loaded[c] = m_compute.side_copy(array(c, a), home(chunks[c], a, false), static_cast<size_t>(chunks[c].count) * 4);
      m_loaded += chunks[c].count * 4;
    }
  };
  if (!chunks.empty()) load(0);
  for (size_t c = 0; c < chunks.size(); ++c) {
    m_compute.wait_side(loaded[c]);
    // The next chunk's half was last read by chunk c - 1's kernel and
    // drained after it: both queued before this load.
    if (c + 1 < chunks.size()) load(c + 1);
    std::vector<float*> arrays;
    for (size_t a = 0; a < chunks[c].op->in.size(); ++a) arrays.push_back(array(c, a));
    run_update(m_compute, g, *chunks[c].op, arrays, chunks[c].count);
    auto span = m_trace.span(SpanKind::comm, k_drain);
    for (size_t a = 0; a < chunks[c].op->in.size(); ++a) {
      if (g.tensors[static_cast<size_t>(chunks[c].op->in[a])].role == Role::grad) continue;
      m_compute.side_copy(home(chunks[c], a, true), array(c, a), static_cast<size_t>(chunks[c].count) * 4);
      m_drained += chunks[c].count * 4;
    }
  }
  return m_compute.sync();
}

void* ParamStream::memory(int tensor) const {
  if (!active()) return nullptr;
  const int64_t at = m_at[static_cast<size_t>(tensor)];
  return at < 0 ? nullptr : m_window + at;
}

}  // namespace tiermem::exec
