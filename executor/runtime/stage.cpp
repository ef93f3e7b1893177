#include "executor/runtime/stage.hpp"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>

#include <tiermem/batch.h>
#include <tiermem/status_macros.h>

#include "executor/interpreter.hpp"

namespace tiermem::exec {
namespace {

const std::string k_all_reduce = "all-reduce";
const std::string k_barrier_name = "barrier";
const std::string k_update = "optimizer";
const std::string k_snapshot = "snapshot";
const std::string k_snapshot_wait = "snapshot wait";

}  // namespace

StageRunner::StageRunner(const JobPlan& job, const TrainOptions& options, Client& client, JobDirectory& dir,
                         Arenas& arenas, Mailboxes& mailboxes, TpExchange& tp, const RankPeers& peers, Trace& trace,
                         bool resumed, Compute& compute)
    : m_job(job), m_options(options), m_client(client), m_dir(dir), m_arenas(arenas), m_mail(mailboxes), m_tp(tp),
      m_peers(peers), m_trace(trace), m_slowdown(options.slowdown), m_compute(compute),
      m_stream(job, arenas, compute, trace),
      m_update_compute(&compute), m_eval_resume(resumed) {
  const MemoryPlan& plan = job.plan;
  if (plan.offload && compute.memory_is_device() && options.update_on_host) {
    m_host_compute = make_cpu_compute();
    m_update_compute = m_host_compute.get();
  }
  m_zero_at.resize(plan.schedule.size() + 1);
  for (size_t w = 0; w < plan.work.size(); ++w) {
    const Tensor& t = job.graph.tensors[plan.work[w].tensor];
    if (t.role == Role::grad && !t.of_param) m_zero_at[static_cast<size_t>(plan.work[w].first)].push_back(static_cast<int>(w));
  }
  for (const Channel& c : job.channels) {
    if (c.to != job.topo.stage()) continue;
    if (c.forward) {
      m_received_channel[c.tensor] = c.id;
    } else {
      m_partials[c.tensor].push_back(c.id);
    }
  }
  for (size_t i = 0; i < job.graph.ops.size(); ++i) {
    if (job.graph.ops[i].phase != Phase::backward || job.partition.of_op[i] != job.topo.stage()) continue;
    for (int t : job.graph.ops[i].out) m_last_writer[t] = static_cast<int>(i);
  }
  for (const auto& [op, mb] : plan.schedule) {
    const Op& o = job.graph.ops[op];
    if (o.kind == OpKind::softmax_xent) m_loss_rows += job.graph.tensors[o.in[0]].shape[0];  // samples, or tokens
  }
  std::set<int> updated;
  for (size_t i = 0; i < job.graph.ops.size(); ++i) {
    const Op& op = job.graph.ops[i];
    if (op.phase != Phase::update || job.partition.of_op[i] != job.topo.stage()) continue;
    m_update_ops.push_back(static_cast<int>(i));
    updated.insert(op.in.begin(), op.in.end());
  }
  for (const auto* placements : {&plan.params, &plan.optimizer}) {
    for (const Placement& p : *placements) {
      if (updated.count(p.tensor) == 0) m_carried.push_back(p.tensor);
    }
  }
  bool exchanges = job.topo.replicas > 1 || job.topo.tensor_parallel > 1;
  for (const Channel& c : job.channels) exchanges = exchanges || c.to == job.topo.stage() || c.from == job.topo.stage();
  // Offloaded steps interleave copies on a second queue, decided per step:
  // launched, not replayed.
  m_replay = compute.can_capture() && options.graphs && !exchanges && options.dump.empty() && !plan.offload;
  if (const char* e = std::getenv("TIERMEM_EXEC_STOP_AFTER_COMMIT")) m_stop_after_commit = std::atoll(e);
  if (const char* e = std::getenv("TIERMEM_EXEC_STOP_IN_SNAPSHOT")) m_stop_in_snapshot = std::atoll(e);
  if (const char* e = std::getenv("TIERMEM_EXEC_STOP_BEFORE_COMMIT")) m_stop_before_commit = std::atoll(e);
  m_test_order.resize(static_cast<size_t>(job.data.test.rows));
  std::iota(m_test_order.begin(), m_test_order.end(), 0);
}

void* StageRunner::memory(int t, int mb, bool next_params) const {
  if (m_received_channel.count(t) != 0) return nullptr;  // in the mailbox: see gather_inputs
  return m_arenas.memory(m_job, t, mb, (m_step + (next_params ? 1 : 0)) % 2);
}

Status StageRunner::merge_partials(int t, int mb) {
  auto it = m_partials.find(t);
  if (it == m_partials.end() || !m_merged.insert({t, mb}).second) return Status();
  auto* local = static_cast<float*>(memory(t, mb, false));
  const int64_t n = m_job.graph.tensors[t].elements();
  for (int id : it->second) {
    const Channel& c = m_job.channels[id];
    const uint64_t sequence = m_mail.training_sequence(c, mb, m_step);
    TIERMEM_RETURN_IF_ERROR(m_mail.receive(c, sequence, false));
    // In place in the mailbox, which is where the kernels run (Arenas).
    const auto* partial = reinterpret_cast<const float*>(m_mail.payload(c, sequence, false));
    m_compute.pass_grad(partial, local, n, true);
  }
  return Status();
}

const std::vector<int64_t>& StageRunner::epoch_order(int64_t epoch) {
  while (static_cast<int64_t>(m_epoch_order.size()) <= epoch) {
    std::vector<int64_t> order(static_cast<size_t>(m_job.data.train.rows));
    std::iota(order.begin(), order.end(), 0);
    if (m_options.shuffle) {
      std::shuffle(order.begin(), order.end(), std::mt19937_64(m_options.seed * 1000003 + m_epoch_order.size()));
    }
    m_epoch_order.push_back(std::move(order));
  }
  return m_epoch_order[static_cast<size_t>(epoch)];
}

// The rows of micro-batch `mb` (or test batch `eval_batch`) into `out` (host
// memory), and into the --dump directory when asked.
void StageRunner::fill_rows(const Tensor& tensor, int mb, bool eval, int64_t eval_batch, void* out) {
  const int64_t rows = m_job.graph.micro_batch;
  void* x = tensor.role == Role::input ? out : nullptr;
  auto* y = tensor.role == Role::label ? static_cast<int32_t*>(out) : nullptr;
  if (eval) {
    fill_batch(m_job.data.test, m_test_order, eval_batch * rows, rows, x, y);
    return;
  }
  const int64_t start = (m_step % m_job.steps_per_epoch) * m_job.rows_per_step() +
                        (m_job.topo.replica() * m_job.micro_batches + mb) * rows;
  fill_batch(m_job.data.train, epoch_order(m_step / m_job.steps_per_epoch), start, rows, x, y);
  if (!m_options.dump.empty() && m_step < m_options.dump_batches) {
    std::ofstream f(m_options.dump + "/batch" + std::to_string(m_step) + "_mb" + std::to_string(mb) + "." +
                        tensor.name + (tensor.dtype == DType::f32 ? ".f32" : ".i32"),
                    std::ios::binary);
    f.write(static_cast<const char*>(out), tensor.bytes());
  }
}

Status StageRunner::load_batch(int t, int mb, bool eval, int64_t eval_batch, bool queue_copy) {
  if (!m_loaded.insert({t, mb}).second) return Status();
  const Tensor& tensor = m_job.graph.tensors[t];
  void* const target = memory(t, mb, false);
  if (target == nullptr) return Status(ErrorCode::internal, "no memory planned for '" + tensor.name + "'");
  // On a GPU the batch goes through pinned staging of its own, one per
  // parity for replayed steps (each capture copies from its own, and the
  // next step's batch is filled while this one runs), free again once what
  // was queued ran: launched steps and evaluation wait for that.
  void* out = target;
  if (m_compute.memory_is_device()) {
    const bool replayed = m_replay && !eval;
    void*& staging = m_staging[{t, replayed ? 2 * mb + static_cast<int>(m_step % 2) : -1 - mb}];
    if (staging == nullptr) staging = m_compute.host_buffer(static_cast<size_t>(tensor.bytes()));
    if (staging == nullptr) return Status(ErrorCode::tier_exhausted, "no pinned memory for the batch of '" + tensor.name + "'");
    if (!replayed) TIERMEM_RETURN_IF_ERROR(m_compute.sync());
    out = staging;
  }
  fill_rows(tensor, mb, eval, eval_batch, out);
  if (queue_copy && out != target) m_compute.copy(target, out, static_cast<size_t>(tensor.bytes()));
  return Status();
}

void StageRunner::count_correct(const float* logits, const int32_t* labels, const std::vector<int64_t>& shape,
                                int64_t eval_batch) {
  std::vector<float> host_logits;
  std::vector<int32_t> host_labels;
  if (m_compute.memory_is_device()) {
    host_logits.resize(static_cast<size_t>(shape[0] * shape[1]));
    host_labels.resize(static_cast<size_t>(shape[0]));
    m_compute.copy(host_logits.data(), logits, host_logits.size() * 4);
    m_compute.copy(host_labels.data(), labels, host_labels.size() * 4);
    logits = host_logits.data();
    labels = host_labels.data();
  }
  // Rows past the test split's end (the last batch wraps) are not counted;
  // a sample is one row, or a sequence of rows (tokens).
  const int64_t per_sample = shape[0] / m_job.graph.micro_batch;
  const int64_t valid =
      std::min<int64_t>(shape[0], (m_job.data.test.rows - eval_batch * m_job.graph.micro_batch) * per_sample);
  for (int64_t r = 0; r < valid; ++r) {
    const float* row = logits + r * shape[1];
    m_eval_correct += (std::max_element(row, row + shape[1]) - row) == labels[r];
  }
  m_eval_rows += valid;
}

// Everything `op` reads: loaded, received, or summed from partials.
Status StageRunner::gather_inputs(const Op& op, int mb, bool eval, uint64_t eval_sequence, int64_t eval_batch,
                                  std::vector<void*>* pointers) {
  for (int t : op.in) {
    const Role role = m_job.graph.tensors[t].role;
    if (role == Role::input || role == Role::label) TIERMEM_RETURN_IF_ERROR(load_batch(t, mb, eval, eval_batch));
    if (auto it = m_received_channel.find(t); it != m_received_channel.end()) {
      const Channel& c = m_job.channels[it->second];
      const uint64_t sequence = eval ? eval_sequence : m_mail.training_sequence(c, mb, m_step);
      TIERMEM_RETURN_IF_ERROR(m_mail.receive(c, sequence, eval));
      (*pointers)[t] = const_cast<std::byte*>(m_mail.payload(c, sequence, eval));
      continue;
    }
    TIERMEM_RETURN_IF_ERROR(merge_partials(t, mb));
  }
  return Status();
}

// What other stages wait for.
Status StageRunner::send_outputs(int op_id, int mb, bool eval, uint64_t eval_sequence) {
  for (int t : m_job.graph.ops[op_id].out) {
    for (const Channel& c : m_job.channels) {
      if (c.tensor != t || c.from != m_job.topo.stage()) continue;
      if (!c.forward && m_last_writer.at(t) != op_id) continue;
      if (eval && !c.forward) continue;
      const void* data = memory(c.tensor, mb, false);
      if (data == nullptr) return Status(ErrorCode::internal, "no memory planned for '" + m_job.graph.tensors[t].name + "'");
      const uint64_t sequence = eval ? eval_sequence : m_mail.training_sequence(c, mb, m_step);
      // The library's copy does not wait for the kernels' stream.
      TIERMEM_RETURN_IF_ERROR(m_compute.sync());
      if (m_mail.in_device_memory() && !m_mail.receiver_in_device(c)) {
        // A GPU stage sending to a CPU stage (a mixed job): through pinned
        // host memory by this compute's own copy. (The library's copy from a
        // tiermem VRAM mapping into a host-memory allocation failed on the
        // H200 with CUDA's invalid value; see docs/ARCHITECTURE.md.)
        const auto bytes = static_cast<size_t>(m_job.graph.tensors[t].bytes());
        if (m_send_staging_bytes < bytes) {
          m_send_staging = m_compute.host_buffer(bytes);
          m_send_staging_bytes = m_send_staging != nullptr ? bytes : 0;
          if (m_send_staging == nullptr) {
            return Status(ErrorCode::tier_exhausted, "no pinned host memory to stage '" +
                                                         m_job.graph.tensors[t].name + "' for a CPU stage");
          }
        }
        m_compute.copy(m_send_staging, data, bytes);
        TIERMEM_RETURN_IF_ERROR(m_compute.sync());
        data = m_send_staging;
      }
      TIERMEM_RETURN_IF_ERROR(m_mail.send(c, data, sequence, eval));
    }
  }
  return Status();
}

void StageRunner::record_eval(const Op& op, const TensorMemory& memory, bool eval, int64_t eval_batch) {
  if (op.kind != OpKind::softmax_xent || !eval) return;
  count_correct(static_cast<const float*>(memory(op.in[0])), static_cast<const int32_t*>(memory(op.in[1])),
                m_job.graph.tensors[op.in[0]].shape, eval_batch);
}

Status StageRunner::run_scheduled(int op_id, int mb, int pos, bool eval, uint64_t eval_sequence, int64_t eval_batch) {
  const Op& op = m_job.graph.ops[op_id];
  if (pos >= 0) {
    for (int w : m_zero_at[static_cast<size_t>(pos)]) {
      const Placement& p = m_job.plan.work[static_cast<size_t>(w)];
      m_compute.zero(m_arenas.work().data() + p.offset, static_cast<size_t>(m_job.graph.tensors[p.tensor].bytes()));
    }
  }
  std::vector<void*> pointers(m_job.graph.tensors.size(), nullptr);
  TIERMEM_RETURN_IF_ERROR(gather_inputs(op, mb, eval, eval_sequence, eval_batch, &pointers));
  if (pos < 0) m_stream.load_for(op, m_step % 2);
  const TensorMemory resolve = [&](int t) -> void* {
    if (pointers[t] != nullptr) return pointers[t];
    void* streamed = m_stream.memory(t);
    return streamed != nullptr ? streamed : memory(t, mb, false);
  };
  for (const auto* list : {&op.in, &op.out}) {
    for (int t : *list) {
      if (resolve(t) == nullptr) {
        return Status(ErrorCode::internal, "no memory for '" + m_job.graph.tensors[t].name + "' of op '" + op.name + "'");
      }
    }
  }
  if (m_tp.handles(op_id) && m_tpc != nullptr) {
    tp_sum(static_cast<const float*>(resolve(op.in[0])), static_cast<float*>(resolve(op.out[0])),
           m_job.graph.tensors[op.in[0]].elements(), op.phase == Phase::backward);
  } else if (m_tp.handles(op_id)) {
    // The group's sum (it times itself, as communication).
    TIERMEM_RETURN_IF_ERROR(m_tp.all_reduce(op_id, pos, m_step, eval, eval_sequence,
                                            static_cast<const float*>(resolve(op.in[0])),
                                            static_cast<float*>(resolve(op.out[0])),
                                            m_job.graph.tensors[op.in[0]].elements(),
                                            op.phase == Phase::backward));
  } else {
    auto span = m_trace.span(SpanKind::compute, op.name);
    Slowdown::Scope slowed(m_slowdown, m_step >= m_options.slowdown_from);
    run_op(m_compute, m_job.graph, op, resolve, op.phase == Phase::backward);
  }
  record_eval(op, resolve, eval, eval_batch);
  return send_outputs(op_id, mb, eval, eval_sequence);
}

Status StageRunner::use_collectives(Collective* dp, Collective* tp, std::vector<GradBucket> buckets) {
  m_dp = dp;
  m_tpc = tp;
  m_buckets = std::move(buckets);
  m_buckets_at.clear();
  if (m_dp != nullptr) {
    for (size_t i = 0; i < m_buckets.size(); ++i) m_buckets_at[m_buckets[i].ready].push_back(i);
  }
  if (m_tpc == nullptr) return Status();
  int64_t most = 0;
  for (const Op& op : m_job.graph.ops) {
    if (op.kind == OpKind::tp_all_reduce) most = std::max(most, m_job.graph.tensors[op.in[0]].elements());
  }
  m_tp_scratch = static_cast<float*>(m_compute.device_buffer(static_cast<size_t>(most) * 4));
  if (m_tp_scratch == nullptr) {
    return Status(ErrorCode::tier_exhausted, "no memory on " + m_compute.name() + " for the tensor-parallel sums (" +
                                                 std::to_string(most * 4) + " bytes)");
  }
  return Status();
}

void StageRunner::reduce_buckets_after(int pos) {
  auto it = m_buckets_at.find(pos);
  if (it == m_buckets_at.end()) return;
  for (size_t i : it->second) {
    const GradBucket& b = m_buckets[i];
    m_dp_ticket = m_dp->all_reduce_beside(reinterpret_cast<float*>(m_arenas.grads().data() + b.offset), b.bytes / 4);
  }
}

void StageRunner::tp_sum(const float* part, float* out, int64_t elements, bool accumulate) {
  auto span = m_trace.span(SpanKind::comm, k_all_reduce);  // the host's part: queueing it
  if (!accumulate) {
    m_tpc->all_reduce(part, out, elements);
    return;
  }
  // Backward adds the sum to what the gradient holds already, as
  // TpExchange does: out + (the group's sum).
  m_tpc->all_reduce(part, m_tp_scratch, elements);
  m_compute.add(out, m_tp_scratch, out, elements);
}

Status StageRunner::all_reduce(int64_t step) {
  if (m_job.topo.replicas == 1) return Status();
  if (m_dp != nullptr) return Status();  // done in buckets beside the backward pass (compute_step)
  auto span = m_trace.span(SpanKind::comm, k_all_reduce);
  const auto bytes = static_cast<size_t>(m_arenas.grads_bytes());
  const int64_t half = step % 2;
  std::byte* mine = m_arenas.publish().data() + half * static_cast<int64_t>(bytes);
  m_compute.copy(mine, m_arenas.grads().data(), bytes);
  std::atomic_ref<uint64_t>(m_arenas.ctl()[k_published]).store(static_cast<uint64_t>(step + 1));
  const size_t n = bytes / 4;
  std::vector<float> sum(n, 0.0f);
  std::vector<std::vector<float>> theirs(static_cast<size_t>(m_job.topo.replicas));
  // Every replica's gradients in one batch once all are published (one
  // request per node); again one by one, following a peer that moved
  // (its rank was replaced on another node, --replicas), when it fails.
  const uint64_t moves = m_dir.moves();
  bool batched = true;
  {
    Batch b(m_client);
    for (int d = 0; d < m_job.topo.replicas && batched; ++d) {
      const int r = m_job.topo.rank_of(m_job.topo.stage(), d);
      if (r == m_job.topo.rank) continue;
      Status published = m_dir.wait_at_least(m_peers.ctl_word(r, k_published), static_cast<uint64_t>(step + 1),
                                             "rank " + std::to_string(r) + "'s gradients of step " +
                                                 std::to_string(step));
      if (!published.ok() && m_dir.moves() == moves) return published;
      auto publish = published.ok() ? m_dir.peer(r, "publish") : Result<Gva>(published);
      batched = publish.ok();
      if (!batched) break;
      theirs[static_cast<size_t>(d)].resize(n);
      b.read(publish->plus(static_cast<uint64_t>(half) * bytes), theirs[static_cast<size_t>(d)].data(), bytes);
    }
    batched = b.wait().ok() && batched && m_dir.moves() == moves;
  }
  for (int d = 0; d < m_job.topo.replicas; ++d) {
    const int r = m_job.topo.rank_of(m_job.topo.stage(), d);
    const float* src = reinterpret_cast<const float*>(mine);
    if (r != m_job.topo.rank) {
      std::vector<float>& in = theirs[static_cast<size_t>(d)];
      in.resize(n);
      for (uint64_t seen = batched ? m_dir.moves() : ~uint64_t{0}; seen != m_dir.moves();) {
        seen = m_dir.moves();
        TIERMEM_RETURN_IF_ERROR(m_dir.wait_at_least(m_peers.ctl_word(r, k_published),
                                                    static_cast<uint64_t>(step + 1),
                                                    "rank " + std::to_string(r) + "'s gradients of step " +
                                                        std::to_string(step)));
        TIERMEM_ASSIGN_OR_RETURN(auto publish, m_dir.peer(r, "publish"));
        TIERMEM_RETURN_IF_ERROR(m_dir.read(publish.plus(static_cast<uint64_t>(half) * bytes), in.data(), bytes));
      }
      src = in.data();
    }
    // Every replica adds in replica order: all end with the same bits.
    for (size_t i = 0; i < n; ++i) sum[i] += src[i];
  }
  m_compute.copy(m_arenas.grads().data(), sum.data(), bytes);
  return Status();
}

// The next copy of parameters and state from the committed one, which stays
// whole (a crash while the next is written resumes from it): the optimizer
// ops read the committed copy and write the next in one pass, and what no
// optimizer op writes is copied over.
Status StageRunner::update() {
  auto span = m_trace.span(SpanKind::compute, k_update);
  Slowdown::Scope slowed(m_slowdown, m_step >= m_options.slowdown_from);
  Compute& compute = *m_update_compute;
  for (int t : m_carried) {
    compute.copy(memory(t, -1, true), memory(t, -1, false), static_cast<size_t>(m_job.graph.tensors[t].bytes()));
  }
  // Offloaded, on the compute: chunks through the window.
  if (m_stream.active() && !m_options.update_on_host) return m_stream.update(m_update_ops, m_step % 2);
  const TensorMemory committed = [&](int t) { return memory(t, -1, false); };
  for (int i : m_update_ops) {
    run_op(compute, m_job.graph, m_job.graph.ops[static_cast<size_t>(i)], [&](int t) { return memory(t, -1, true); },
           false, &committed);
  }
  return Status();
}

Status StageRunner::barrier(uint64_t value) {
  auto span = m_trace.span(SpanKind::sync, k_barrier_name);
  std::atomic_ref<uint64_t> own(m_arenas.ctl()[k_barrier]);
  if (own.load() < value) own.store(value);
  const int world = m_job.topo.world();
  for (int r = 0; r < world; ++r) {
    if (r == m_job.topo.rank) continue;
    TIERMEM_RETURN_IF_ERROR(m_dir.wait_at_least(m_peers.ctl_word(r, k_barrier), value,
                                                "rank " + std::to_string(r) + " to finish step " +
                                                    std::to_string(value - 1)));
  }
  return Status();
}

// The ops of the step and the optimizer, queued (on a GPU) or run.
Status StageRunner::compute_step(int64_t step) {
  m_compute.reset_stats();
  // Offloaded, every gradient starts zeroed in the window and is drained
  // home whole (one never written stays as allocated: zero).
  if (!m_stream.active()) m_compute.zero(m_arenas.grads().data(), static_cast<size_t>(m_arenas.grads_bytes()));
  for (size_t pos = 0; pos < m_job.plan.schedule.size(); ++pos) {
    const auto [op, mb] = m_job.plan.schedule[pos];
    m_stream.before(static_cast<int>(pos), step % 2);
    TIERMEM_RETURN_IF_ERROR(run_scheduled(op, mb, static_cast<int>(pos), false, 0, 0));
    m_stream.after(static_cast<int>(pos));
    if (m_dp != nullptr) reduce_buckets_after(static_cast<int>(pos));
  }
  // The optimizer waits for the last bucket (and so for every one).
  if (m_dp != nullptr) {
    m_dp->wait_beside(m_dp_ticket);
    TIERMEM_RETURN_IF_ERROR(m_dp->failure());
  }
  // The last message on its way: what it sends is reused next step.
  TIERMEM_RETURN_IF_ERROR(m_mail.drain());
  if (!m_capturing) {
    TIERMEM_RETURN_IF_ERROR(m_compute.sync());
    TIERMEM_RETURN_IF_ERROR(m_mail.consumed_step(step));
    TIERMEM_RETURN_IF_ERROR(all_reduce(step));
    // The step before committed before its parameters are written over.
    TIERMEM_RETURN_IF_ERROR(settle_snapshot());
  }
  return update();
}

Status StageRunner::replay_step() {
  TIERMEM_RETURN_IF_ERROR(settle_snapshot());
  const int slot = static_cast<int>(m_step % 2);
  if (!m_compute.captured(slot)) {
    TIERMEM_RETURN_IF_ERROR(m_compute.begin_capture());
    m_capturing = true;
    Status s = compute_step(m_step);
    m_capturing = false;
    Status captured = m_compute.end_capture(slot);
    TIERMEM_RETURN_IF_ERROR(s);
    TIERMEM_RETURN_IF_ERROR(captured);
  } else if (m_prefilled != m_step) {
    TIERMEM_RETURN_IF_ERROR(fill_batches());
  }
  TIERMEM_RETURN_IF_ERROR(m_compute.replay(slot));
  // While it runs: the next step's batches into the other staging, when
  // that step is a replay too (its capture is made).
  if (!m_compute.captured(1 - slot)) return Status();
  const int64_t step = m_step;
  m_step = step + 1;
  Status s = fill_batches();
  m_step = step;
  m_prefilled = s.ok() ? step + 1 : -1;
  return s;
}

// What the host does for a replayed step: the step's batches into the
// staging its capture copies from.
Status StageRunner::fill_batches() {
  m_loaded.clear();
  for (const auto& [op, mb] : m_job.plan.schedule) {
    for (int t : m_job.graph.ops[op].in) {
      const Role role = m_job.graph.tensors[t].role;
      if (role == Role::input || role == Role::label) TIERMEM_RETURN_IF_ERROR(load_batch(t, mb, false, 0, false));
    }
  }
  return Status();
}

Status StageRunner::run_step(int64_t step, StepStats* stats) {
  m_step = step;
  m_merged.clear();
  m_loaded.clear();
  m_stats = StepStats();
  m_compute.set_step(step + 1);
  if (m_update_compute != &m_compute) m_update_compute->set_step(step + 1);
  TIERMEM_RETURN_IF_ERROR(m_replay ? replay_step() : compute_step(step));
  m_compute.take_stats(&m_stats.loss_sum, &m_stats.correct);
  m_stats.rows = m_loss_rows;
  TIERMEM_RETURN_IF_ERROR(m_compute.sync());
  // The step counts as committed once its snapshot (when one is due) is
  // whole: a rank that dies while writing it resumes from the step before
  // on its node too, as a replacement elsewhere does from the snapshot, so
  // no rank is ever committed past what it could be restored to. With
  // --replicas (data parallel) the snapshot travels while the next step
  // computes, and the step is committed before that one's optimizer writes
  // over the copy of the parameters a restart before the commit takes.
  // Meanwhile the others may pass this step's barrier: a replacement that
  // resumes at the step before finds their gradients of it still published
  // (they cannot pass the next barrier without this rank).
  const bool due = m_arenas.snapshot_every() > 0 && (step + 1) % m_arenas.snapshot_every() == 0;
  if (due && m_options.replicas > 0) {
    post_snapshot(step + 1);
  } else {
    if (due) {
      auto span = m_trace.span(SpanKind::comm, k_snapshot);
      TIERMEM_RETURN_IF_ERROR(m_arenas.snapshot(m_dir, step + 1, m_compute));
    }
    commit(step + 1);
  }
  *stats = m_stats;
  return barrier(static_cast<uint64_t>(step + 1));
}

void StageRunner::commit(int64_t steps) {
  if (steps == m_stop_before_commit) {
    // Fault injection for tests (TIERMEM_EXEC_STOP_BEFORE_COMMIT): the
    // step's gradients all-reduced with the group, its update written, and
    // not committed: this rank resumes a step behind the others.
    std::fprintf(stderr, "rank %d: stopping before committing step %" PRId64 "\n", m_job.topo.rank, steps);
    ::raise(SIGSTOP);
  }
  m_arenas.commit(steps);
  if (steps == m_stop_after_commit) {
    // Fault injection for tests (TIERMEM_EXEC_STOP_AFTER_COMMIT): a real
    // SIGSTOP where a death is hardest to resume from, the step committed
    // and its barrier not raised.
    std::fprintf(stderr, "rank %d: stopping after committing step %" PRId64 "\n", m_job.topo.rank, steps);
    ::raise(SIGSTOP);
  }
}

void StageRunner::post_snapshot(int64_t steps) {
  auto span = m_trace.span(SpanKind::comm, k_snapshot);
  m_arenas.stage_snapshot(steps, m_compute, &m_image);
  m_pending.emplace(m_client);
  m_pending->write(m_image.at, m_image.bytes.data(), m_image.bytes.size());
  m_pending->submit();
}

Status StageRunner::settle_snapshot() {
  if (!m_pending) return Status();
  if (m_image.step == m_stop_in_snapshot) {
    // Fault injection for tests (TIERMEM_EXEC_STOP_IN_SNAPSHOT): a real
    // SIGSTOP with the step's barrier raised (the others go on) and the step
    // not committed, its snapshot sent but not known whole.
    std::fprintf(stderr, "rank %d: stopping with the snapshot of step %" PRId64 " unsettled\n", m_job.topo.rank,
                 m_image.step);
    ::raise(SIGSTOP);
  }
  auto span = m_trace.span(SpanKind::sync, k_snapshot_wait);
  Status s = m_pending->wait();
  m_pending.reset();
  // A write a copy did not take (its node died, and is not dropped yet):
  // again, through the directory, which tries until the job's timeout.
  if (!s.ok()) s = m_dir.write(m_image.at, m_image.bytes.data(), m_image.bytes.size());
  if (!s.ok()) return s.with_context("snapshot of step " + std::to_string(m_image.step));
  commit(m_image.step);
  return Status();
}

Status StageRunner::evaluate(int64_t committed, EvalResult* result) {
  // Forward only, one test batch after the other; the parameters are those
  // committed, which are the current parity when m_step is `committed`.
  const int64_t saved_step = m_step;
  m_step = committed;
  m_eval_correct = m_eval_rows = 0;
  const uint64_t base = static_cast<uint64_t>((committed / m_job.steps_per_epoch - 1) * m_job.eval_batches);
  std::vector<int> forward;
  for (size_t i = 0; i < m_job.graph.ops.size(); ++i) {
    if (m_job.graph.ops[i].phase == Phase::forward && m_job.partition.of_op[i] == m_job.topo.stage()) {
      forward.push_back(static_cast<int>(i));
    }
  }
  // After a restart in the middle of an evaluation: batches this rank's
  // neighbours already got from it, and already took from it, are skipped.
  uint64_t done = 0;
  if (m_eval_resume) {
    auto messages = m_mail.eval_messages_done();
    if (!messages.ok()) {
      m_step = saved_step;
      return messages.status();
    }
    done = *messages > base ? *messages - base : 0;
    m_eval_resume = false;
  }
  Status status;
  m_compute.reset_stats();  // the loss op adds each batch's mean loss
  int64_t batches = 0;
  for (int64_t b = static_cast<int64_t>(done); b < m_job.eval_batches && status.ok(); ++b, ++batches) {
    m_loaded.clear();
    const uint64_t sequence = base + static_cast<uint64_t>(b) + 1;
    for (int op : forward) {
      status = run_scheduled(op, 0, -1, true, sequence, b);
      if (!status.ok()) break;
    }
    // The message on its way (its tensor is the next batch's memory), and
    // consumed once the kernels reading the slot in place are done: the
    // slot can take the next batch.
    if (status.ok()) status = m_mail.drain();
    if (status.ok()) status = m_compute.sync();
    if (status.ok()) status = m_mail.consumed_eval(sequence);
  }
  m_step = saved_step;
  double loss_sum = 0;
  int64_t correct = 0;
  m_compute.take_stats(&loss_sum, &correct);
  if (m_eval_rows > 0) {
    result->accuracy = static_cast<double>(m_eval_correct) / static_cast<double>(m_eval_rows);
    result->loss = batches > 0 ? loss_sum / static_cast<double>(batches) : -1;
  }
  return status;
}

}  // namespace tiermem::exec
