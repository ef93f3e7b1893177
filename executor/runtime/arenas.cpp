#include "executor/runtime/arenas.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include <tiermem/status_macros.h>
#include <tiermem/units.h>

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

void dump_params(const JobPlan& job, const std::byte* params, const std::string& dir, Compute& compute) {
  std::filesystem::create_directories(dir);
  for (const Placement& p : job.plan.params) {
    const Tensor& t = job.graph.tensors[p.tensor];
    std::vector<char> host(static_cast<size_t>(t.bytes()));
    compute.copy(host.data(), params + p.offset, host.size());
    std::ofstream out(dir + "/" + t.name + ".f32", std::ios::binary);
    out.write(host.data(), static_cast<std::streamsize>(host.size()));
  }
}

std::string where(const OwnRegion& r) {
  return r.mapping.device() >= 0 ? "VRAM of cuda:" + std::to_string(r.mapping.device()) : "host memory";
}

}  // namespace

Status Arenas::own(JobDirectory& dir, OwnRegion* out, const std::string& what, int64_t bytes, bool coherent,
                   Tier tier, uint32_t replicas) {
  // A replicated allocation is written through the client (copies first),
  // never mapped.
  TIERMEM_ASSIGN_OR_RETURN(*out, dir.own(what, static_cast<uint64_t>(std::max<int64_t>(bytes, 64)),
                                         {.tier = tier, .coherent = coherent, .replicas = replicas}, replicas == 0));
  return Status();
}

int64_t Arenas::snapshot_slot_bytes() const {
  return (k_snapshot_header + m_params_bytes + m_optimizer_bytes + m_published_bytes + 63) / 64 * 64;
}

std::pair<Gva, int64_t> Arenas::newest_snapshot(JobDirectory& dir, const std::vector<Gva>& candidates) const {
  std::pair<Gva, int64_t> best{Gva{}, 0};
  for (const Gva& g : candidates) {
    for (int64_t slot = 0; slot < 2; ++slot) {
      const Gva at = g.plus(static_cast<uint64_t>(slot * snapshot_slot_bytes()));
      uint64_t header[5] = {};
      Status s = dir.read(at, header, sizeof header);
      if (!s.ok()) {
        std::fprintf(stderr, "rank snapshot %s unreadable: %s\n", at.to_string().c_str(), s.to_string().c_str());
        continue;
      }
      if (header[0] != k_snapshot_magic || header[2] != static_cast<uint64_t>(m_params_bytes) ||
          header[3] != static_cast<uint64_t>(m_optimizer_bytes) || header[4] != static_cast<uint64_t>(m_published_bytes)) {
        continue;
      }
      if (static_cast<int64_t>(header[1]) > best.second) best = {at, static_cast<int64_t>(header[1])};
    }
  }
  return best;
}

Status Arenas::restore(JobDirectory& dir, Gva slot, int64_t step) {
  const int64_t parity = step % 2;
  TIERMEM_RETURN_IF_ERROR(dir.read(slot.plus(k_snapshot_header), m_params.data() + parity * m_params_bytes,
                                   static_cast<size_t>(m_params_bytes)));
  TIERMEM_RETURN_IF_ERROR(dir.read(slot.plus(static_cast<uint64_t>(k_snapshot_header + m_params_bytes)),
                                   m_optimizer.data() + parity * m_optimizer_bytes,
                                   static_cast<size_t>(m_optimizer_bytes)));
  if (m_published_bytes > 0 && step > 0) {
    // The gradients this rank published for step - 1: a rank still reading
    // them when the old rank died reads them here now.
    TIERMEM_RETURN_IF_ERROR(
        dir.read(slot.plus(static_cast<uint64_t>(k_snapshot_header + m_params_bytes + m_optimizer_bytes)),
                 m_publish.data() + ((step - 1) % 2) * m_published_bytes, static_cast<size_t>(m_published_bytes)));
  }
  // Where a rank that finished `step` stands: committed, past the barrier,
  // its gradients of the step before published (the other ranks have read
  // them, or read them again from this rank's new arena).
  for (const CtlWord w : {k_committed, k_barrier, k_published}) {
    std::atomic_ref<uint64_t>(ctl()[w]).store(static_cast<uint64_t>(step));
  }
  m_resumed = true;
  m_restored_from = slot;
  return Status();
}

Status Arenas::allocate(JobDirectory& dir, const JobPlan& job, const TrainOptions& options, int64_t mailbox_bytes,
                        const Compute& compute) {
  const int64_t ctl_bytes = ((k_channels + 4 * static_cast<int64_t>(job.channels.size())) * 8 + 4095) / 4096 * 4096;
  m_params_bytes = job.arena_bytes("params");
  m_optimizer_bytes = job.arena_bytes("optimizer");
  const int64_t grads_bytes = m_grads_bytes = job.arena_bytes("grads");
  TIERMEM_RETURN_IF_ERROR(own(dir, &m_ctl, "ctl", ctl_bytes, true));
  TIERMEM_RETURN_IF_ERROR(own(dir, &m_info, "info", k_info_bytes, false));
  if (job.topo.replicas > 1) TIERMEM_RETURN_IF_ERROR(own(dir, &m_publish, "publish", 2 * grads_bytes, false));
  // The tensors where the kernels run: VRAM for a GPU (whole pages, so
  // every arena maps as device memory of its own), else DRAM. The mailbox
  // too: a stage on the same GPU writes its boundary tensors into it device
  // to device (the copy engines), and the kernels read them in place.
  const bool vram = compute.memory_is_device();
  const Tier tier = vram ? Tier::vram : Tier::dram;
  auto sized = [&](int64_t bytes) {
    return vram ? (std::max<int64_t>(bytes, 1) + (2 << 20) - 1) / (2 << 20) * (2 << 20) : bytes;
  };
  const struct {
    OwnRegion* region;
    const char* what;
    int64_t bytes;
  } tensors[] = {{&m_params, "params", 2 * m_params_bytes},
                 {&m_grads, "grads", grads_bytes},
                 {&m_optimizer, "optimizer", 2 * m_optimizer_bytes},
                 {&m_work, "work", job.plan.work_peak},
                 {&m_mbox, "mbox", mailbox_bytes}};
  auto other_device = [&](const char* what, const std::string& in) {
    return Status(ErrorCode::failed_precondition, "job " + options.job + "'s " + what + " are in " + in +
                                                      " but this run computes on " + compute.name() +
                                                      ": run it with the --device it was started with, or --restart");
  };
  for (const auto& t : tensors) {
    Status s = own(dir, t.region, t.what, sized(t.bytes), false, tier);
    if (s.code() == ErrorCode::already_exists) {
      // Another size: made for the other kind of device (VRAM arenas are
      // whole pages)?
      auto found = dir.client().lookup(dir.name(job.topo.rank, t.what));
      if (found.ok() && (found->tier == Tier::vram) != vram) {
        return other_device(t.what, found->tier == Tier::vram ? "VRAM" : "host memory");
      }
    }
    if (!s.ok()) {
      return vram ? s.with_context("--device " + options.device + " keeps the tensors in the VRAM tier (" + t.what + ")")
                  : s;
    }
    if (t.region->mapping.device() == compute.device()) continue;
    if (t.region->existed) return other_device(t.what, where(*t.region));
    // Made just now, but not where asked: the daemon has no VRAM tier (or
    // no room in it) and placed it elsewhere. Given back.
    const Gva made = t.region->gva;
    *t.region = OwnRegion{};
    (void)dir.client().free(made);
    return Status(ErrorCode::tier_unavailable,
                  "--device " + options.device + " keeps the tensors in the VRAM tier, but the node's daemon placed the " +
                      t.what + " in host memory: it has no VRAM tier, or no room in it (`tiermemctl status`)");
  }
  // With --replicas the snapshot also keeps the gradients this rank
  // published for the step (data parallel): another rank may still be
  // reading them when this one dies, and reads them from the replacement.
  m_published_bytes = options.replicas > 0 && job.topo.replicas > 1 ? m_grads_bytes : 0;
  m_snapshot_every = options.replicas > 0 ? 1 : options.snapshot_every;
  if (m_snapshot_every > 0) {
    Status s = own(dir, &m_snapshot, "snapshot", 2 * snapshot_slot_bytes(), false, Tier::pmem, options.replicas);
    if (!s.ok()) return s.with_context(options.replicas > 0 ? "the replicated snapshot (--replicas)" : "the PMEM snapshot (--snapshot-every)");
  }
  m_resumed = m_ctl.existed && committed() > 0;
  if (m_ctl.existed || options.replicas == 0) return Status();
  // New on this node: a first start, or the replacement of a rank whose node
  // died. Its snapshot elsewhere (a copy, if its home died with the rank)
  // says which.
  const auto [slot, step] = newest_snapshot(dir, dir.elsewhere("snapshot", m_snapshot.gva));
  if (step == 0) return Status();
  TIERMEM_RETURN_IF_ERROR(restore(dir, slot, step));
  // Our own snapshot holds the step before we go on.
  return snapshot(dir, step);
}

std::string Arenas::placement(const Compute& compute) const {
  return "params 2 x " + format_size(static_cast<uint64_t>(m_params_bytes)) + ", grads " +
         format_size(static_cast<uint64_t>(m_grads_bytes)) + ", optimizer 2 x " +
         format_size(static_cast<uint64_t>(m_optimizer_bytes)) + ", work " + format_size(m_work.mapping.size()) +
         ", messages " + format_size(m_mbox.mapping.size()) +
         (compute.memory_is_device() ? " in VRAM of " + compute.name() : " in " + where(m_params)) +
         "; control words in host memory";
}

Status Arenas::initialise(const JobPlan& job, const TrainOptions& options, Compute& compute) {
  if (!m_restored_from.is_null()) return Status();
  if (m_resumed) {
    if (!m_params.existed || !m_optimizer.existed) {
      return Status(ErrorCode::failed_precondition,
                    "job " + options.job + " has a committed step but its parameters are gone");
    }
    return Status();
  }
  // Initialised on the host, copied to where the kernels run.
  std::vector<float> host;
  for (const Placement& p : job.plan.params) {
    const Tensor& t = job.graph.tensors[p.tensor];
    host.resize(static_cast<size_t>(t.elements()));
    init_param(t, host.data(), options.seed);
    compute.copy(m_params.data() + p.offset, host.data(), static_cast<size_t>(t.bytes()));
  }
  compute.zero(m_optimizer.data(), static_cast<size_t>(2 * m_optimizer_bytes));
  if (!options.dump.empty()) dump_params(job, m_params.data(), options.dump, compute);
  return compute.sync();
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

Status Arenas::snapshot(JobDirectory& dir, int64_t committed) const {
  // Into slot (committed / every) % 2, the other one holding the snapshot
  // before: header cleared, the committed parameters and optimizer state,
  // then the header (magic, step, sizes), written through the client (a
  // write to PMEM is persisted, and one to a replicated allocation is on
  // every copy, before it is acknowledged). A write a copy did not take
  // (its node died, and is not dropped yet) is tried again.
  const int64_t parity = committed % 2;
  const Gva base = m_snapshot.gva.plus(
      static_cast<uint64_t>(((committed / std::max<int64_t>(m_snapshot_every, 1)) % 2) * snapshot_slot_bytes()));
  uint64_t header[5] = {};
  Status s = dir.write(base, header, sizeof header);
  if (s.ok()) {
    s = dir.write(base.plus(k_snapshot_header), m_params.data() + parity * m_params_bytes,
                     static_cast<size_t>(m_params_bytes));
  }
  if (s.ok()) {
    s = dir.write(base.plus(k_snapshot_header + static_cast<uint64_t>(m_params_bytes)),
                     m_optimizer.data() + parity * m_optimizer_bytes, static_cast<size_t>(m_optimizer_bytes));
  }
  if (s.ok() && m_published_bytes > 0 && committed > 0) {
    s = dir.write(base.plus(static_cast<uint64_t>(k_snapshot_header + m_params_bytes + m_optimizer_bytes)),
                  m_publish.data() + ((committed - 1) % 2) * m_published_bytes, static_cast<size_t>(m_published_bytes));
  }
  header[0] = k_snapshot_magic;
  header[1] = static_cast<uint64_t>(committed);
  header[2] = static_cast<uint64_t>(m_params_bytes);
  header[3] = static_cast<uint64_t>(m_optimizer_bytes);
  header[4] = static_cast<uint64_t>(m_published_bytes);
  if (s.ok()) s = dir.write(base, header, sizeof header);
  return s.ok() ? s : s.with_context("snapshot of step " + std::to_string(committed));
}

std::vector<Gva> Arenas::release() {
  std::vector<Gva> out;
  for (OwnRegion* r : {&m_ctl, &m_info, &m_mbox, &m_publish, &m_params, &m_grads, &m_optimizer, &m_work, &m_snapshot}) {
    if (!r->gva.is_null()) out.push_back(r->gva);
    *r = OwnRegion{};  // unmaps
  }
  return out;
}

}  // namespace tiermem::exec
