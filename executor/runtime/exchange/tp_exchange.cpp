#include "executor/runtime/exchange/tp_exchange.hpp"

#include <algorithm>
#include <cstring>

#include <tiermem/batch.h>
#include <tiermem/status_macros.h>

namespace tiermem::exec {
namespace {

enum Kind : int { k_train_published = 0, k_eval_published = 1, k_eval_consumed = 2 };

struct Counts {
  int64_t per_step = 0, per_eval = 0, slot_bytes = 0;
};

Counts counts(const JobPlan& job) {
  Counts c;
  for (const auto& [op, mb] : job.plan.schedule) {
    const Op& o = job.graph.ops[op];
    if (o.kind != proto::TP_ALL_REDUCE) continue;
    ++c.per_step;
    if (o.phase == Phase::forward && mb == 0) ++c.per_eval;
    c.slot_bytes = std::max(c.slot_bytes, (job.graph.tensors[o.in[0]].bytes() + 63) / 64 * 64);
  }
  return c;
}

}  // namespace

int64_t TpExchange::bytes(const JobPlan& job) {
  if (job.topo.tensor_parallel <= 1) return 0;
  const Counts c = counts(job);
  return (c.per_step + c.per_eval) * job.topo.tensor_parallel * c.slot_bytes;
}

TpExchange::TpExchange(const JobPlan& job, const TrainOptions& options, Client& client, JobDirectory& dir,
                       const Arenas& arenas, const RankPeers& peers, Trace& trace)
    : m_job(job), m_options(options), m_client(client), m_dir(dir), m_arenas(arenas), m_peers(peers), m_trace(trace),
      m_ways(job.topo.tensor_parallel) {
  m_base_word = k_channels + 4 * job.channels.size();
  m_area = Mailboxes::bytes(job);
  const Counts c = counts(job);
  m_slot_bytes = c.slot_bytes;
  m_per_step = c.per_step;
  int64_t train = 0, eval = 0;
  for (size_t pos = 0; pos < job.plan.schedule.size(); ++pos) {
    const auto [op, mb] = job.plan.schedule[pos];
    const Op& o = job.graph.ops[op];
    if (o.kind != proto::TP_ALL_REDUCE) continue;
    m_ops.insert(op);
    m_train_index[static_cast<int>(pos)] = train++;
    if (o.phase == Phase::forward && mb == 0) m_eval_index[op] = eval++;
  }
  m_per_eval = eval;
}

int64_t TpExchange::slot_offset(bool eval, int64_t index, int from) const {
  const int64_t slot = (eval ? m_per_step : 0) + index;
  return m_area + (slot * m_ways + from) * m_slot_bytes;
}

Status TpExchange::all_reduce(int op, int pos, int64_t step, bool eval, uint64_t eval_sequence, const float* part,
                              float* out, int64_t elements, bool accumulate) {
  const Op& o = m_job.graph.ops[op];
  auto span = m_trace.span(SpanKind::comm, o.name);
  const int me = m_job.topo.tp();
  const int64_t per_eval = m_per_eval;
  int64_t index = 0;
  uint64_t number = 0;
  if (eval) {
    index = m_eval_index.at(op);
    number = (eval_sequence - 1) * static_cast<uint64_t>(per_eval) + static_cast<uint64_t>(index) + 1;
  } else {
    index = m_train_index.at(pos);
    number = static_cast<uint64_t>(step * m_per_step + index) + 1;
  }
  const auto bytes = static_cast<size_t>(elements) * 4;
  const Kind published = eval ? k_eval_published : k_train_published;
  const std::string what = "'" + o.name + "'";
  uint64_t* ctl = m_arenas.ctl();
  // This rank's part into every other rank's slot, and their word for it up.
  {
    Batch b(m_client);
    std::vector<std::pair<size_t, Gva>> bumps;
    for (int u = 0; u < m_ways; ++u) {
      if (u == me) continue;
      const int rank = m_job.topo.tp_peer(u);
      if (eval && number > static_cast<uint64_t>(per_eval)) {
        // Its slot holds the batch before until it took it.
        TIERMEM_RETURN_IF_ERROR(wait_local(ctl + word(k_eval_consumed, u), number - static_cast<uint64_t>(per_eval),
                                           m_options.timeout, "rank " + std::to_string(rank) + " to take " + what));
      }
      const Gva at = m_peers.tp_mbox.at(rank).plus(static_cast<uint64_t>(slot_offset(eval, index, me)));
      b.write(at, part, bytes);
      b.fence();
      const Gva w = m_peers.ctl_word(rank, word(published, me));
      bumps.emplace_back(b.compare_swap(w, number - 1, number), w);
    }
    Status s = b.wait();
    // A word not at number - 1: a restarted rank sending again what it sent
    // (higher: nothing to do), or behind (a restart of the receiver's).
    for (const auto& [i, w] : bumps) {
      if (s.ok() && b.value(i) != number - 1 && b.value(i) < number) s = m_dir.raise(w, number);
    }
    if (!s.ok()) {
      // Moved memory, a node restarting: the directory's calls follow and wait.
      s = Status();
      for (int u = 0; u < m_ways && s.ok(); ++u) {
        if (u == me) continue;
        const int rank = m_job.topo.tp_peer(u);
        s = m_dir.write(m_peers.tp_mbox.at(rank).plus(static_cast<uint64_t>(slot_offset(eval, index, me))), part, bytes);
        if (s.ok()) s = m_dir.raise(m_peers.ctl_word(rank, word(published, me)), number);
      }
      if (!s.ok()) return s.with_context("sending " + what + " to the tensor-parallel group");
    }
  }
  // The parts in rank order.
  if (accumulate) m_sum.assign(static_cast<size_t>(elements), 0.0f);
  float* sum = accumulate ? m_sum.data() : out;
  for (int u = 0; u < m_ways; ++u) {
    const float* from = part;
    if (u != me) {
      TIERMEM_RETURN_IF_ERROR(wait_local(ctl + word(published, u), number, m_options.timeout,
                                         "rank " + std::to_string(m_job.topo.tp_peer(u)) + "'s part of " + what));
      from = reinterpret_cast<const float*>(m_arenas.mbox().data() + slot_offset(eval, index, u));
    }
    if (u == 0) {
      std::memcpy(sum, from, bytes);
    } else {
      for (int64_t i = 0; i < elements; ++i) sum[i] += from[i];
    }
  }
  if (accumulate) {
    for (int64_t i = 0; i < elements; ++i) out[i] += sum[i];
  }
  if (eval) {
    for (int u = 0; u < m_ways; ++u) {
      if (u == me) continue;
      TIERMEM_RETURN_IF_ERROR(m_dir.raise(m_peers.ctl_word(m_job.topo.tp_peer(u), word(k_eval_consumed, me)), number));
    }
  }
  return Status();
}

}  // namespace tiermem::exec
