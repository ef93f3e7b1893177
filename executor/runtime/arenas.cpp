#include "executor/runtime/arenas.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <tiermem/status_macros.h>

#include "executor/interpreter.hpp"

namespace tiermem::exec {
namespace {

// The placement of `tensor` in `list`, or nullptr.
const Placement* placement_of(const std::vector<Placement>& list, int tensor) {
  for (const Placement& p : list) {
    if (p.tensor == tensor) return &p;
  }
  return nullptr;
}

void dump_params(const JobPlan& job, const std::byte* params, const std::string& dir) {
  std::filesystem::create_directories(dir);
  for (const Placement& p : job.plan.params) {
    const Tensor& t = job.graph.tensors[p.tensor];
    std::ofstream out(dir + "/" + t.name + ".f32", std::ios::binary);
    out.write(reinterpret_cast<const char*>(params + p.offset), t.bytes());
  }
}

}  // namespace

Status Arenas::own(JobDirectory& dir, OwnRegion* out, const std::string& what, int64_t bytes, bool coherent,
                   Tier tier) {
  TIERMEM_ASSIGN_OR_RETURN(*out, dir.own(what, static_cast<uint64_t>(std::max<int64_t>(bytes, 64)),
                                         {.tier = tier, .coherent = coherent}));
  return Status();
}

Status Arenas::allocate(JobDirectory& dir, const JobPlan& job, const TrainOptions& options, int64_t mailbox_bytes) {
  const int64_t ctl_bytes = ((k_channels + 4 * static_cast<int64_t>(job.channels.size())) * 8 + 4095) / 4096 * 4096;
  m_params_bytes = job.arena_bytes("params");
  m_optimizer_bytes = job.arena_bytes("optimizer");
  const int64_t grads_bytes = job.arena_bytes("grads");
  TIERMEM_RETURN_IF_ERROR(own(dir, &m_ctl, "ctl", ctl_bytes, true));
  TIERMEM_RETURN_IF_ERROR(own(dir, &m_info, "info", k_info_bytes, false));
  TIERMEM_RETURN_IF_ERROR(own(dir, &m_mbox, "mbox", mailbox_bytes, false));
  if (job.topo.replicas > 1) TIERMEM_RETURN_IF_ERROR(own(dir, &m_publish, "publish", 2 * grads_bytes, false));
  TIERMEM_RETURN_IF_ERROR(own(dir, &m_params, "params", 2 * m_params_bytes, false));
  TIERMEM_RETURN_IF_ERROR(own(dir, &m_grads, "grads", grads_bytes, false));
  TIERMEM_RETURN_IF_ERROR(own(dir, &m_optimizer, "optimizer", 2 * m_optimizer_bytes, false));
  TIERMEM_RETURN_IF_ERROR(own(dir, &m_work, "work", job.plan.work_peak, false));
  if (options.snapshot_every > 0) {
    Status s = own(dir, &m_snapshot, "snapshot", k_snapshot_header + m_params_bytes + m_optimizer_bytes, false,
                   Tier::pmem);
    if (!s.ok()) return s.with_context("the PMEM snapshot (--snapshot-every)");
  }
  m_resumed = m_ctl.existed && committed() > 0;
  return Status();
}

Status Arenas::initialise(const JobPlan& job, const TrainOptions& options) {
  if (m_resumed) {
    if (!m_params.existed || !m_optimizer.existed) {
      return Status(ErrorCode::failed_precondition,
                    "job " + options.job + " has a committed step but its parameters are gone");
    }
    return Status();
  }
  for (const Placement& p : job.plan.params) {
    init_param(job.graph.tensors[p.tensor], reinterpret_cast<float*>(m_params.data() + p.offset), options.seed);
  }
  std::memset(m_optimizer.data(), 0, static_cast<size_t>(2 * m_optimizer_bytes));
  if (!options.dump.empty()) dump_params(job, m_params.data(), options.dump);
  return Status();
}

void Arenas::commit(int64_t steps) const {
  std::atomic_ref<uint64_t>(ctl()[k_committed]).store(static_cast<uint64_t>(steps));
}

void* Arenas::memory(const JobPlan& job, int t, int mb, int64_t parity) const {
  const Tensor& tensor = job.graph.tensors[t];
  if (tensor.role == Role::param) {
    const Placement* p = placement_of(job.plan.params, t);
    return p ? m_params.data() + parity * m_params_bytes + p->offset : nullptr;
  }
  if (tensor.role == Role::optimizer_state) {
    const Placement* p = placement_of(job.plan.optimizer, t);
    return p ? m_optimizer.data() + parity * m_optimizer_bytes + p->offset : nullptr;
  }
  if (tensor.role == Role::grad && tensor.of_param) {
    const Placement* p = placement_of(job.plan.grads, t);
    return p ? m_grads.data() + p->offset : nullptr;
  }
  const Placement* p = job.plan.find(t, mb);
  return p ? m_work.data() + p->offset : nullptr;
}

void Arenas::begin_update(int64_t step) const {
  const int64_t cur = step % 2, next = (step + 1) % 2;
  std::memcpy(m_params.data() + next * m_params_bytes, m_params.data() + cur * m_params_bytes,
              static_cast<size_t>(m_params_bytes));
  std::memcpy(m_optimizer.data() + next * m_optimizer_bytes, m_optimizer.data() + cur * m_optimizer_bytes,
              static_cast<size_t>(m_optimizer_bytes));
}

Status Arenas::snapshot(Client& client, int64_t committed) const {
  // Header (magic, step, sizes), then the committed parameters and optimizer
  // state, written through the client: a write to PMEM is persisted before
  // it is acknowledged. The header goes last, so a torn snapshot keeps the
  // old step number and says so.
  const int64_t parity = committed % 2;
  const Gva base = m_snapshot.gva;
  Status s = client.write(base.plus(k_snapshot_header), m_params.data() + parity * m_params_bytes,
                          static_cast<size_t>(m_params_bytes));
  if (s.ok()) {
    s = client.write(base.plus(k_snapshot_header + static_cast<uint64_t>(m_params_bytes)),
                     m_optimizer.data() + parity * m_optimizer_bytes, static_cast<size_t>(m_optimizer_bytes));
  }
  const uint64_t header[4] = {k_snapshot_magic, static_cast<uint64_t>(committed), static_cast<uint64_t>(m_params_bytes),
                              static_cast<uint64_t>(m_optimizer_bytes)};
  if (s.ok()) s = client.write(base, header, sizeof header);
  return s.ok() ? s : s.with_context("snapshot of step " + std::to_string(committed));
}

}  // namespace tiermem::exec
