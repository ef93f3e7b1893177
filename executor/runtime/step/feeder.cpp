#include "executor/runtime/step/feeder.hpp"

#include <algorithm>
#include <fstream>
#include <numeric>
#include <random>

#include <tiermem/status_macros.h>

namespace tiermem::exec {

Feeder::Feeder(const JobPlan& job, const Schedule& schedule, const TrainOptions& options, Arenas& arenas,
               Mailboxes& mail, Compute& compute, bool replay)
    : m_job(job), m_schedule(schedule), m_options(options), m_arenas(arenas), m_mail(mail), m_compute(compute),
      m_replay(replay) {
  m_test_order.resize(static_cast<size_t>(job.data.test.rows));
  std::iota(m_test_order.begin(), m_test_order.end(), 0);
}

void Feeder::begin_pass() {
  m_merged.clear();
  m_loaded.clear();
}

void* Feeder::memory(int t, int mb, int64_t step, bool next_params) const {
  if (m_schedule.received_by(t) >= 0) return nullptr;  // in the mailbox: see gather_inputs
  return m_arenas.memory(m_job, t, mb, (step + (next_params ? 1 : 0)) % 2);
}

Status Feeder::merge_partials(int t, int mb, int64_t step) {
  const std::vector<int>* channels = m_schedule.partials_of(t);
  if (channels == nullptr || !m_merged.insert({t, mb}).second) return Status();
  auto* local = static_cast<float*>(memory(t, mb, step));
  const int64_t n = m_job.graph.tensors[t].elements();
  for (int id : *channels) {
    const Channel& c = m_job.channels[id];
    const uint64_t sequence = m_mail.training_sequence(c, mb, step);
    TIERMEM_RETURN_IF_ERROR(m_mail.receive(c, sequence, false));
    // In place in the mailbox, which is where the kernels run (Arenas).
    const auto* partial = reinterpret_cast<const float*>(m_mail.payload(c, sequence, false));
    m_compute.pass_grad(partial, local, n, true);
  }
  return Status();
}

const std::vector<int64_t>& Feeder::epoch_order(int64_t epoch) {
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

// The rows of micro-batch `at.mb` (or test batch `at.eval_batch`) into
// `out` (host memory), and into the --dump directory when asked.
void Feeder::fill_rows(const Tensor& tensor, const StepPoint& at, void* out) {
  const int64_t rows = m_job.graph.micro_batch;
  void* x = tensor.role == Role::input ? out : nullptr;
  auto* y = tensor.role == Role::label ? static_cast<int32_t*>(out) : nullptr;
  if (at.eval) {
    fill_batch(m_job.data.test, m_test_order, at.eval_batch * rows, rows, x, y);
    return;
  }
  const int64_t start = (at.step % m_job.steps_per_epoch) * m_job.rows_per_step() +
                        (m_job.topo.replica() * m_job.micro_batches + at.mb) * rows;
  fill_batch(m_job.data.train, epoch_order(at.step / m_job.steps_per_epoch), start, rows, x, y);
  if (!m_options.dump.empty() && at.step < m_options.dump_batches) {
    std::ofstream f(m_options.dump + "/batch" + std::to_string(at.step) + "_mb" + std::to_string(at.mb) + "." +
                        tensor.name + (tensor.dtype == DType::f32 ? ".f32" : ".i32"),
                    std::ios::binary);
    f.write(static_cast<const char*>(out), tensor.bytes());
  }
}

Status Feeder::load_batch(int t, const StepPoint& at, bool queue_copy) {
  if (!m_loaded.insert({t, at.mb}).second) return Status();
  const Tensor& tensor = m_job.graph.tensors[t];
  void* const target = memory(t, at.mb, at.step);
  if (target == nullptr) return Status(ErrorCode::internal, "no memory planned for '" + tensor.name + "'");
  // On a GPU the batch goes through pinned staging of its own, one per
  // parity for replayed steps (each capture copies from its own, and the
  // next step's batch is filled while this one runs), free again once what
  // was queued ran: launched steps and evaluation wait for that.
  void* out = target;
  if (m_compute.memory_is_device()) {
    const bool replayed = m_replay && !at.eval;
    void*& staging = m_staging[{t, replayed ? 2 * at.mb + static_cast<int>(at.step % 2) : -1 - at.mb}];
    if (staging == nullptr) staging = m_compute.host_buffer(static_cast<size_t>(tensor.bytes()));
    if (staging == nullptr) return Status(ErrorCode::tier_exhausted, "no pinned memory for the batch of '" + tensor.name + "'");
    if (!replayed) TIERMEM_RETURN_IF_ERROR(m_compute.sync());
    out = staging;
  }
  fill_rows(tensor, at, out);
  if (queue_copy && out != target) m_compute.copy(target, out, static_cast<size_t>(tensor.bytes()));
  return Status();
}

Status Feeder::gather_inputs(const Op& op, const StepPoint& at, std::vector<void*>* pointers) {
  for (int t : op.in) {
    const Role role = m_job.graph.tensors[t].role;
    if (role == Role::input || role == Role::label) TIERMEM_RETURN_IF_ERROR(load_batch(t, at));
    if (const int channel = m_schedule.received_by(t); channel >= 0) {
      const Channel& c = m_job.channels[channel];
      const uint64_t sequence = at.eval ? at.eval_sequence : m_mail.training_sequence(c, at.mb, at.step);
      TIERMEM_RETURN_IF_ERROR(m_mail.receive(c, sequence, at.eval));
      (*pointers)[t] = const_cast<std::byte*>(m_mail.payload(c, sequence, at.eval));
      continue;
    }
    TIERMEM_RETURN_IF_ERROR(merge_partials(t, at.mb, at.step));
  }
  return Status();
}

Status Feeder::send_outputs(int op_id, const StepPoint& at) {
  for (int t : m_job.graph.ops[op_id].out) {
    for (const Channel& c : m_job.channels) {
      if (c.tensor != t || c.from != m_job.topo.stage()) continue;
      if (!c.forward && m_schedule.last_writer(t) != op_id) continue;
      if (at.eval && !c.forward) continue;
      const void* data = memory(c.tensor, at.mb, at.step);
      if (data == nullptr) return Status(ErrorCode::internal, "no memory planned for '" + m_job.graph.tensors[t].name + "'");
      const uint64_t sequence = at.eval ? at.eval_sequence : m_mail.training_sequence(c, at.mb, at.step);
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
      TIERMEM_RETURN_IF_ERROR(m_mail.send(c, data, sequence, at.eval));
    }
  }
  return Status();
}

Status Feeder::fill_batches(int64_t step) {
  m_loaded.clear();
  for (const auto& [op, mb] : m_schedule.positions()) {
    for (int t : m_job.graph.ops[op].in) {
      const Role role = m_job.graph.tensors[t].role;
      if (role != Role::input && role != Role::label) continue;
      TIERMEM_RETURN_IF_ERROR(load_batch(t, StepPoint{.step = step, .mb = mb}, false));
    }
  }
  return Status();
}

}  // namespace tiermem::exec
