// Trainer: one step (the GPipe schedule of this stage, boundary messages,
// gradient all-reduce, optimizer, commit, barrier) and evaluation.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>

#include <tiermem/status_macros.h>

#include "executor/interpreter.hpp"
#include "executor/runtime/trainer_impl.hpp"

namespace tiermem::exec {
namespace {

int64_t align64(int64_t n) { return (n + 63) / 64 * 64; }
const std::string k_all_reduce = "all-reduce";
const std::string k_barrier_name = "barrier";
const std::string k_update = "optimizer";
const std::string k_snapshot = "snapshot";

}  // namespace

uint64_t Trainer::sequence_base(const Channel&, int64_t step) const {
  return static_cast<uint64_t>(step) * static_cast<uint64_t>(m_opt.micro_batches);
}

uint64_t Trainer::training_sequence(const Channel& c, int mb) const {
  // Messages are numbered in the order both ends handle them: forward
  // channels by ascending micro-batch, gradients flowing back by descending
  // (the backward pass runs the last micro-batch first). A receiver waiting
  // for message n then knows messages up to n are written.
  const int k = c.forward ? mb : m_opt.micro_batches - 1 - mb;
  return sequence_base(c, m_step) + static_cast<uint64_t>(k) + 1;
}

int64_t Trainer::mailbox_offset(const Channel& c, bool eval) const {
  // The receiving stage's mailbox: the training slots of every channel into
  // it, in channel order, then the evaluation slots of the forward ones.
  int64_t offset = 0;
  for (int pass = 0; pass < 2; ++pass) {
    for (const Channel& other : m_channels) {
      if (other.to != c.to || (pass == 1 && !other.forward)) continue;
      if (other.id == c.id && pass == (eval ? 1 : 0)) return offset;
      offset += m_opt.micro_batches * (k_header_bytes + align64(other.bytes));
    }
  }
  return offset;
}

std::byte* Trainer::slot(const Channel& c, uint64_t sequence, bool eval) {
  const int64_t slot_bytes = k_header_bytes + align64(c.bytes);
  return m_mbox.data() + mailbox_offset(c, eval) +
         static_cast<int64_t>((sequence - 1) % static_cast<uint64_t>(m_opt.micro_batches)) * slot_bytes;
}

void* Trainer::memory(int t, int mb, bool next_params) {
  const Tensor& tensor = m_graph.tensors[t];
  const int64_t parity = (m_step + (next_params ? 1 : 0)) % 2;
  auto in = [&](const std::vector<Placement>& list) -> const Placement* {
    for (const Placement& p : list) {
      if (p.tensor == t) return &p;
    }
    return nullptr;
  };
  if (tensor.role == Role::param) {
    const Placement* p = in(m_plan.params);
    return p ? m_params.data() + parity * m_params_bytes + p->offset : nullptr;
  }
  if (tensor.role == Role::optimizer_state) {
    const Placement* p = in(m_plan.optimizer);
    return p ? m_optimizer.data() + parity * m_optimizer_bytes + p->offset : nullptr;
  }
  if (tensor.role == Role::grad && tensor.of_param) {
    const Placement* p = in(m_plan.grads);
    return p ? m_grads.data() + p->offset : nullptr;
  }
  if (auto it = m_received_channel.find(t); it != m_received_channel.end()) return nullptr;  // see receive()
  const Placement* p = m_plan.find(t, mb);
  return p ? m_work.data() + p->offset : nullptr;
}

Status Trainer::receive(const Channel& c, uint64_t sequence, bool eval) {
  auto span = m_trace.span(SpanKind::comm, m_graph.tensors[c.tensor].name);
  auto* ctl = m_ctl.as<uint64_t>();
  Status s = wait_local(ctl + k_channels + 2 * word(c, eval), sequence, m_opt.timeout,
                        "'" + m_graph.tensors[c.tensor].name + "' from stage " + std::to_string(c.from) + " (message " +
                            std::to_string(sequence) + ")");
  if (!s.ok()) return s;
  BoundaryHeader h;
  std::memcpy(&h, slot(c, sequence, eval), sizeof h);
  return check_header(h, m_graph.tensors[c.tensor], c.from, sequence);
}

Status Trainer::send(const Channel& c, int mb, uint64_t sequence, bool eval) {
  auto span = m_trace.span(SpanKind::comm, m_graph.tensors[c.tensor].name);
  const int receiver = m_topo.rank_of(c.to, m_topo.replica());
  // The receiver's slot for this sequence is free once it consumed the
  // message micro_batches before.
  const auto slots = static_cast<uint64_t>(m_opt.micro_batches);
  if (sequence > slots) {
    Status s = wait_local(m_ctl.as<uint64_t>() + k_channels + 2 * word(c, eval) + 1, sequence - slots, m_opt.timeout,
                          "stage " + std::to_string(c.to) + " to consume '" + m_graph.tensors[c.tensor].name + "'");
    if (!s.ok()) return s;
  }
  const Tensor& t = m_graph.tensors[c.tensor];
  BoundaryHeader h;
  h.dtype = static_cast<uint8_t>(t.dtype);
  h.partition = static_cast<uint16_t>(c.from);
  h.elements = t.elements();
  h.sequence = sequence;
  h.shape_hash = shape_hash(t);
  m_staging.resize(static_cast<size_t>(k_header_bytes + t.bytes()));
  std::memcpy(m_staging.data(), &h, sizeof h);
  const void* payload = memory(c.tensor, mb, false);
  if (payload == nullptr) return Status(ErrorCode::internal, "no memory planned for '" + t.name + "'");
  std::memcpy(m_staging.data() + k_header_bytes, payload, static_cast<size_t>(t.bytes()));
  const int64_t slot_bytes = k_header_bytes + align64(c.bytes);
  const Gva at = m_peer_mbox.at(c.id).plus(static_cast<uint64_t>(
      mailbox_offset(c, eval) + static_cast<int64_t>((sequence - 1) % slots) * slot_bytes));
  if (Status s = m_client->write(at, m_staging.data(), m_staging.size()); !s.ok()) {
    return s.with_context("sending '" + t.name + "' to rank " + std::to_string(receiver));
  }
  return m_dir->raise(m_peer_ctl.at(receiver).plus(8 * (k_channels + 2 * word(c, eval))), sequence);
}

Status Trainer::merge_partials(int t, int mb) {
  auto it = m_partials.find(t);
  if (it == m_partials.end() || !m_merged.insert({t, mb}).second) return Status();
  auto* local = static_cast<float*>(memory(t, mb, false));
  const int64_t n = m_graph.tensors[t].elements();
  for (int id : it->second) {
    const Channel& c = m_channels[id];
    const uint64_t sequence = training_sequence(c, mb);
    TIERMEM_RETURN_IF_ERROR(receive(c, sequence, false));
    const auto* partial = reinterpret_cast<const float*>(slot(c, sequence, false) + k_header_bytes);
    for (int64_t i = 0; i < n; ++i) local[i] += partial[i];
  }
  return Status();
}

Status Trainer::load_batch(int t, int mb, bool eval, int64_t eval_batch) {
  if (!m_loaded.insert({t, mb}).second) return Status();
  const Tensor& tensor = m_graph.tensors[t];
  void* out = memory(t, mb, false);
  if (out == nullptr) return Status(ErrorCode::internal, "no memory planned for '" + tensor.name + "'");
  const int64_t rows = m_graph.micro_batch;
  float* x = tensor.role == Role::input ? static_cast<float*>(out) : nullptr;
  auto* y = tensor.role == Role::label ? static_cast<int32_t*>(out) : nullptr;
  if (eval) {
    fill_batch(m_data.test, m_test_order, eval_batch * rows, rows, x, y);
    return Status();
  }
  const int64_t epoch = m_step / m_steps_per_epoch;
  while (static_cast<int64_t>(m_epoch_order.size()) <= epoch) {
    std::vector<int64_t> order(static_cast<size_t>(m_data.train.rows));
    std::iota(order.begin(), order.end(), 0);
    if (m_opt.shuffle) std::shuffle(order.begin(), order.end(), std::mt19937_64(m_opt.seed * 1000003 + m_epoch_order.size()));
    m_epoch_order.push_back(std::move(order));
  }
  const int64_t global = rows * m_opt.micro_batches * m_topo.replicas;
  const int64_t start = (m_step % m_steps_per_epoch) * global + (m_topo.replica() * m_opt.micro_batches + mb) * rows;
  fill_batch(m_data.train, m_epoch_order[static_cast<size_t>(epoch)], start, rows, x, y);
  if (!m_opt.dump.empty() && m_step < m_opt.dump_batches) {
    std::ofstream f(m_opt.dump + "/batch" + std::to_string(m_step) + "_mb" + std::to_string(mb) + "." + tensor.name +
                        (x ? ".f32" : ".i32"),
                    std::ios::binary);
    f.write(static_cast<const char*>(out), tensor.bytes());
  }
  return Status();
}

void Trainer::count_correct(const float* logits, const int32_t* labels, const std::vector<int64_t>& shape,
                            int64_t eval_batch) {
  const int64_t valid = std::min<int64_t>(shape[0], m_data.test.rows - eval_batch * shape[0]);
  for (int64_t r = 0; r < valid; ++r) {
    const float* row = logits + r * shape[1];
    m_eval_correct += (std::max_element(row, row + shape[1]) - row) == labels[r];
  }
  m_eval_rows += valid;
}

Status Trainer::run_scheduled(int op_id, int mb, int pos, bool eval, uint64_t eval_sequence, int64_t eval_batch) {
  const Op& op = m_graph.ops[op_id];
  if (pos >= 0) {
    for (int w : m_zero_at[static_cast<size_t>(pos)]) {
      const Placement& p = m_plan.work[static_cast<size_t>(w)];
      std::memset(m_work.data() + p.offset, 0, static_cast<size_t>(m_graph.tensors[p.tensor].bytes()));
    }
  }
  // Everything this op reads: loaded, received, or summed from partials.
  std::vector<void*> pointers(m_graph.tensors.size(), nullptr);
  for (int t : op.in) {
    const Role role = m_graph.tensors[t].role;
    if (role == Role::input || role == Role::label) {
      TIERMEM_RETURN_IF_ERROR(load_batch(t, mb, eval, eval_batch));
    }
    if (auto it = m_received_channel.find(t); it != m_received_channel.end()) {
      const Channel& c = m_channels[it->second];
      const uint64_t sequence = eval ? eval_sequence : training_sequence(c, mb);
      TIERMEM_RETURN_IF_ERROR(receive(c, sequence, eval));
      pointers[t] = slot(c, sequence, eval) + k_header_bytes;
      continue;
    }
    TIERMEM_RETURN_IF_ERROR(merge_partials(t, mb));
  }
  auto resolve = [&](int t) -> void* {
    if (pointers[t] != nullptr) return pointers[t];
    return memory(t, mb, false);
  };
  for (const auto* list : {&op.in, &op.out}) {
    for (int t : *list) {
      if (resolve(t) == nullptr) {
        return Status(ErrorCode::internal, "no memory for '" + m_graph.tensors[t].name + "' of op '" + op.name + "'");
      }
    }
  }
  OpResult r;
  {
    auto span = m_trace.span(SpanKind::compute, op.name);
    r = run_op(m_graph, op, resolve, op.phase == Phase::backward, m_step + 1);
  }
  if (op.kind == OpKind::softmax_xent) {
    if (eval) {
      count_correct(static_cast<const float*>(resolve(op.in[0])), static_cast<const int32_t*>(resolve(op.in[1])),
                    m_graph.tensors[op.in[0]].shape, eval_batch);
    } else {
      m_loss_sum += r.loss;
      m_correct += r.correct;
      m_rows += m_graph.micro_batch;
    }
  }
  // What other stages wait for.
  for (int t : op.out) {
    for (const Channel& c : m_channels) {
      if (c.tensor != t || c.from != m_topo.stage()) continue;
      if (!c.forward && m_last_writer.at(t) != op_id) continue;
      if (eval && !c.forward) continue;
      const uint64_t sequence = eval ? eval_sequence : training_sequence(c, mb);
      TIERMEM_RETURN_IF_ERROR(send(c, mb, sequence, eval));
    }
  }
  return Status();
}

Status Trainer::all_reduce(int64_t step) {
  if (m_topo.replicas == 1) return Status();
  auto span = m_trace.span(SpanKind::comm, k_all_reduce);
  const auto bytes = static_cast<size_t>(m_grads.mapping.size());
  const int64_t half = step % 2;
  std::byte* mine = m_publish.data() + half * static_cast<int64_t>(bytes);
  std::memcpy(mine, m_grads.data(), bytes);
  std::atomic_ref<uint64_t>(m_ctl.as<uint64_t>()[k_published]).store(static_cast<uint64_t>(step + 1));
  const size_t n = bytes / 4;
  std::vector<float> sum(n, 0.0f), theirs(n);
  for (int d = 0; d < m_topo.replicas; ++d) {
    const int r = m_topo.rank_of(m_topo.stage(), d);
    const float* src = reinterpret_cast<const float*>(mine);
    if (r != m_env.rank) {
      Status s = m_dir->wait_at_least(m_peer_ctl.at(r).plus(8 * k_published), static_cast<uint64_t>(step + 1),
                                      "rank " + std::to_string(r) + "'s gradients of step " + std::to_string(step));
      if (!s.ok()) return s;
      TIERMEM_ASSIGN_OR_RETURN(auto publish, m_dir->peer(r, "publish"));
      if (s = m_client->read(publish.plus(static_cast<uint64_t>(half) * bytes), theirs.data(), bytes); !s.ok()) return s;
      src = theirs.data();
    }
    // Every replica adds in replica order: all end with the same bits.
    for (size_t i = 0; i < n; ++i) sum[i] += src[i];
  }
  std::memcpy(m_grads.data(), sum.data(), bytes);
  return Status();
}

Status Trainer::update(int64_t step) {
  auto span = m_trace.span(SpanKind::compute, k_update);
  const int64_t cur = step % 2, next = (step + 1) % 2;
  // The next copy starts as the committed one; a crash while it is being
  // written leaves the committed copy whole.
  std::memcpy(m_params.data() + next * m_params_bytes, m_params.data() + cur * m_params_bytes,
              static_cast<size_t>(m_params_bytes));
  std::memcpy(m_optimizer.data() + next * m_optimizer_bytes, m_optimizer.data() + cur * m_optimizer_bytes,
              static_cast<size_t>(m_optimizer_bytes));
  for (size_t i = 0; i < m_graph.ops.size(); ++i) {
    const Op& op = m_graph.ops[i];
    if (op.phase != Phase::update || m_partition.of_op[i] != m_topo.stage()) continue;
    run_op(m_graph, op, [&](int t) { return memory(t, -1, true); }, false, step + 1);
  }
  return Status();
}

Status Trainer::barrier(uint64_t value) {
  auto span = m_trace.span(SpanKind::sync, k_barrier_name);
  std::atomic_ref<uint64_t> own(m_ctl.as<uint64_t>()[k_barrier]);
  if (own.load() < value) own.store(value);
  for (int r = 0; r < m_env.world; ++r) {
    if (r == m_env.rank) continue;
    Status s = m_dir->wait_at_least(m_peer_ctl.at(r).plus(8 * k_barrier), value,
                                    "rank " + std::to_string(r) + " to finish step " + std::to_string(value - 1));
    if (!s.ok()) return s;
  }
  return Status();
}

Status Trainer::run_step(int64_t step) {
  m_step = step;
  m_merged.clear();
  m_loaded.clear();
  m_loss_sum = 0;
  m_correct = m_rows = 0;
  if (m_zero_at.empty()) {
    // Once: which work instances start life at each schedule position (the
    // per-micro-batch gradients, which every contribution adds into), where
    // each activation comes from, who sends partial gradients where.
    m_zero_at.resize(m_plan.schedule.size() + 1);
    for (size_t w = 0; w < m_plan.work.size(); ++w) {
      const Tensor& t = m_graph.tensors[m_plan.work[w].tensor];
      if (t.role == Role::grad && !t.of_param) m_zero_at[static_cast<size_t>(m_plan.work[w].first)].push_back(static_cast<int>(w));
    }
    for (const Channel& c : m_channels) {
      if (c.to == m_topo.stage()) {
        if (c.forward) m_received_channel[c.tensor] = c.id;
        else m_partials[c.tensor].push_back(c.id);
      }
    }
    for (size_t i = 0; i < m_graph.ops.size(); ++i) {
      if (m_graph.ops[i].phase != Phase::backward || m_partition.of_op[i] != m_topo.stage()) continue;
      for (int t : m_graph.ops[i].out) m_last_writer[t] = static_cast<int>(i);
    }
  }
  std::memset(m_grads.data(), 0, m_grads.mapping.size());
  for (size_t pos = 0; pos < m_plan.schedule.size(); ++pos) {
    const auto [op, mb] = m_plan.schedule[pos];
    TIERMEM_RETURN_IF_ERROR(run_scheduled(op, mb, static_cast<int>(pos), false, 0, 0));
  }
  // Every message of this step into this stage is used up: the senders may
  // reuse the slots.
  for (const Channel& c : m_channels) {
    if (c.to != m_topo.stage()) continue;
    const int sender = m_topo.rank_of(c.from, m_topo.replica());
    const uint64_t last = sequence_base(c, step) + static_cast<uint64_t>(m_opt.micro_batches);
    if (Status s = m_dir->raise(m_peer_ctl.at(sender).plus(8 * (k_channels + 2 * word(c, false) + 1)), last); !s.ok()) {
      return s;
    }
  }
  TIERMEM_RETURN_IF_ERROR(all_reduce(step));
  TIERMEM_RETURN_IF_ERROR(update(step));
  std::atomic_ref<uint64_t>(m_ctl.as<uint64_t>()[k_committed]).store(static_cast<uint64_t>(step + 1));
  if (m_opt.snapshot_every > 0 && (step + 1) % m_opt.snapshot_every == 0) {
    TIERMEM_RETURN_IF_ERROR(snapshot(step + 1));
  }
  return barrier(static_cast<uint64_t>(step + 1));
}

Status Trainer::snapshot(int64_t committed) {
  // Header (magic, step, sizes), then the committed parameters and optimizer
  // state, written through the client: a write to PMEM is persisted before
  // it is acknowledged. The step goes last, so a torn snapshot keeps the old
  // step number and says so.
  auto span = m_trace.span(SpanKind::comm, k_snapshot);
  const int64_t parity = committed % 2;
  const Gva base = m_snapshot.gva;
  Status s = m_client->write(base.plus(k_snapshot_header), m_params.data() + parity * m_params_bytes,
                             static_cast<size_t>(m_params_bytes));
  if (s.ok()) {
    s = m_client->write(base.plus(k_snapshot_header + static_cast<uint64_t>(m_params_bytes)),
                        m_optimizer.data() + parity * m_optimizer_bytes, static_cast<size_t>(m_optimizer_bytes));
  }
  const uint64_t header[4] = {k_snapshot_magic, static_cast<uint64_t>(committed), static_cast<uint64_t>(m_params_bytes),
                              static_cast<uint64_t>(m_optimizer_bytes)};
  if (s.ok()) s = m_client->write(base, header, sizeof header);
  return s.ok() ? s : s.with_context("snapshot of step " + std::to_string(committed));
}

Status Trainer::evaluate(int64_t evals_before, double* accuracy) {
  // Forward only, through the same stages with messages of their own, one
  // test batch after the other; the parameters are those just committed.
  m_step += 1;  // the committed copy is the next parity
  m_eval_correct = m_eval_rows = 0;
  const uint64_t base = static_cast<uint64_t>(evals_before * m_eval_batches);
  std::vector<int> forward;
  for (size_t i = 0; i < m_graph.ops.size(); ++i) {
    if (m_graph.ops[i].phase == Phase::forward && m_partition.of_op[i] == m_topo.stage()) forward.push_back(static_cast<int>(i));
  }
  // After a restart in the middle of an evaluation: batches this rank's
  // neighbours already got from it, and already took from it, are skipped.
  uint64_t done = 0;
  if (m_eval_resume) {
    done = ~uint64_t{0};
    for (const Channel& c : m_channels) {
      if (!c.forward || (c.from != m_topo.stage() && c.to != m_topo.stage())) continue;
      const bool sender = c.from == m_topo.stage();
      const int peer = m_topo.rank_of(sender ? c.to : c.from, 0);
      TIERMEM_ASSIGN_OR_RETURN(auto v,
                               m_dir->load(m_peer_ctl.at(peer).plus(8 * (k_channels + 2 * word(c, true) + (sender ? 0 : 1)))));
      done = std::min(done, v);
    }
    if (done == ~uint64_t{0}) done = 0;
    done = done > base ? done - base : 0;
    m_eval_resume = false;
  }
  Status status;
  for (int64_t b = static_cast<int64_t>(done); b < m_eval_batches && status.ok(); ++b) {
    m_loaded.clear();
    const uint64_t sequence = base + static_cast<uint64_t>(b) + 1;
    for (int op : forward) {
      status = run_scheduled(op, 0, -1, true, sequence, b);
      if (!status.ok()) break;
    }
    // Consumed at once: the slot can take the next batch.
    for (const Channel& c : m_channels) {
      if (!status.ok() || c.to != m_topo.stage() || !c.forward) continue;
      status = m_dir->raise(m_peer_ctl.at(m_topo.rank_of(c.from, 0)).plus(8 * (k_channels + 2 * word(c, true) + 1)),
                            sequence);
    }
  }
  m_step -= 1;
  if (m_eval_rows > 0) *accuracy = static_cast<double>(m_eval_correct) / static_cast<double>(m_eval_rows);
  return status;
}

}  // namespace tiermem::exec
