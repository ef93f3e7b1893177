#include "executor/runtime/state/arenas.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include <xxhash.h>

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

Status Arenas::allocate(JobDirectory& dir, const JobPlan& job, const TrainOptions& options, int64_t mailbox_bytes,
                        Compute& compute) {
  const int64_t ctl_words = k_channels + 4 * static_cast<int64_t>(job.channels.size()) + tp_ctl_words(job);
  const int64_t ctl_bytes = (ctl_words * 8 + 4095) / 4096 * 4096;
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
  // Offloaded, the per-step tensors live a tier down (the plan's home) and
  // the window is in the compute tier.
  const bool vram = compute.memory_is_device();
  const Tier tier = vram ? Tier::vram : Tier::dram, home = job.plan.offload ? job.plan.home : tier;
  m_home = home;
  auto sized = [&](int64_t bytes, Tier in) {
    return in == Tier::vram ? (std::max<int64_t>(bytes, 1) + (2 << 20) - 1) / (2 << 20) * (2 << 20) : bytes;
  };
  const struct {
    OwnRegion* region;
    const char* what;
    int64_t bytes;
    Tier tier;
  } all[] = {{&m_params, "params", 2 * m_params_bytes, home},
             {&m_grads, "grads", grads_bytes, home},
             {&m_optimizer, "optimizer", 2 * m_optimizer_bytes, home},
             {&m_work, "work", job.plan.work_peak, tier},
             {&m_window, "window", job.plan.window_peak, tier},
             {&m_mbox, "mbox", mailbox_bytes, tier}};
  auto other_device = [&](const char* what, const std::string& in) {
    return Status(ErrorCode::failed_precondition, "job " + options.job + "'s " + what + " are in " + in +
                                                      " but this run computes on " + compute.name() +
                                                      ": run it with the --device it was started with, or --restart");
  };
  for (const auto& t : all) {
    if (t.region == &m_window && !job.plan.offload) continue;
    Status s = own(dir, t.region, t.what, sized(t.bytes, t.tier), false, t.tier);
    if (s.code() == ErrorCode::already_exists) {
      // Another size: made for the other kind of device (VRAM arenas are
      // whole pages), or with another budget?
      auto found = dir.client().lookup(dir.name(job.topo.rank, t.what));
      if (found.ok() && (found->tier == Tier::vram) != (t.tier == Tier::vram)) {
        return other_device(t.what, found->tier == Tier::vram ? "VRAM" : "host memory");
      }
      if (found.ok() && t.tier != tier) {
        return Status(ErrorCode::failed_precondition,
                      "job " + options.job + "'s " + t.what + " were made for another --vram-budget (" +
                          format_size(found->size) + " in " + std::string(tier_name(found->tier)) +
                          "): run it with the budget it was started with, or --restart");
      }
    }
    if (!s.ok()) {
      return vram && t.tier == Tier::vram
                 ? s.with_context("--device " + options.device + " keeps the tensors in the VRAM tier (" + t.what + ")")
                 : s.with_context(std::string(t.what) + " in " + std::string(tier_name(t.tier)));
    }
    const int expected = t.tier == Tier::vram ? compute.device() : -1;
    if (t.region->mapping.device() == expected) continue;
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
  // Offloaded on a GPU: the home arenas page-locked for the copy engines
  // (the daemon locked its DRAM frames in its own process; a mapping here
  // is locked in this one).
  if (job.plan.offload && vram) {
    for (OwnRegion* r : {&m_params, &m_grads, &m_optimizer}) {
      if (compute.pin_host(r->data(), r->mapping.size())) {
        m_pinned.push_back(r->data());
      } else {
        std::fprintf(stderr,
                     "rank %d: could not page-lock the %s of the %s tier for %s: offloaded copies go through "
                     "pageable memory, slower and in step with the host\n",
                     job.topo.rank, format_size(r->mapping.size()).c_str(), std::string(tier_name(home)).c_str(),
                     compute.name().c_str());
      }
    }
    m_pinned_by = &compute;
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
  Status s = resume_elsewhere(dir, compute);
  if (!s.ok()) {
    // Made just now, and not to be found by a later start as a rank of this
    // job at step 0: given back.
    for (const Gva g : release()) (void)dir.client().free(g);
  }
  return s;
}

std::string Arenas::placement(const Compute& compute) const {
  if (!m_window.gva.is_null()) {
    const std::string hot = compute.memory_is_device() ? "VRAM of " + compute.name() : "host memory";
    return "offloaded: params 2 x " + format_size(static_cast<uint64_t>(m_params_bytes)) + ", grads " +
           format_size(static_cast<uint64_t>(m_grads_bytes)) + ", optimizer 2 x " +
           format_size(static_cast<uint64_t>(m_optimizer_bytes)) + " in " +
           std::string(tier_name(m_home)) + "; work " + format_size(m_work.mapping.size()) + ", window " +
           format_size(m_window.mapping.size()) + ", messages " + format_size(m_mbox.mapping.size()) + " in " + hot +
           "; control words in host memory";
  }
  return "params 2 x " + format_size(static_cast<uint64_t>(m_params_bytes)) + ", grads " +
         format_size(static_cast<uint64_t>(m_grads_bytes)) + ", optimizer 2 x " +
         format_size(static_cast<uint64_t>(m_optimizer_bytes)) + ", work " + format_size(m_work.mapping.size()) +
         ", messages " + format_size(m_mbox.mapping.size()) +
         (compute.memory_is_device() ? " in VRAM of " + compute.name() : " in " + where(m_params)) +
         "; control words in host memory";
}

namespace {

uint64_t layout_of(const JobPlan& job, bool with_optimizer) {
  std::string text;
  for (const auto* placements : {&job.plan.params, &job.plan.optimizer}) {
    if (placements == &job.plan.optimizer && !with_optimizer) break;
    for (const Placement& p : *placements) {
      text += job.graph.tensors[p.tensor].name + " " + std::to_string(p.offset) + " " + std::to_string(p.bytes) + "\n";
    }
    text += "--\n";
  }
  return XXH3_64bits(text.data(), text.size());
}

}  // namespace

uint64_t state_layout(const JobPlan& job) { return layout_of(job, true); }
uint64_t params_layout(const JobPlan& job) { return layout_of(job, false); }

Status Arenas::initialise(const JobPlan& job, const TrainOptions& options, Compute& compute) {
  const uint64_t layout[k_info_layout_words] = {k_layout_magic, state_layout(job), params_layout(job)};
  if (m_resumed && m_restored_from.is_null()) {
    if (!m_params.existed || !m_optimizer.existed) {
      return Status(ErrorCode::failed_precondition,
                    "job " + options.job + " has a committed step but its parameters are gone");
    }
    uint64_t kept[k_info_layout_words];
    std::memcpy(kept, m_info.data() + k_info_layout, sizeof kept);
    if (kept[0] != layout[0] || kept[1] != layout[1] || kept[2] != layout[2]) {
      return Status(ErrorCode::failed_precondition,
                    "job '" + options.job + "' kept its parameters and optimizer state laid out otherwise than " +
                        "this tiermem-exec lays them out for " + options.model + " (" +
                        (kept[0] != k_layout_magic ? "kept by an older tiermem-exec"
                                                   : "another model, or another version of the layout") +
                        "): resuming would read them mixed up. Run it with the model it was started with, or "
                        "--restart to train it again from step 0");
    }
    return Status();
  }
  std::memcpy(m_info.data() + k_info_layout, layout, sizeof layout);
  if (!m_restored_from.is_null()) return Status();
  // Initialised on the host, copied to where the kernels run.
  std::vector<float> host;
  for (const Placement& p : job.plan.params) {
    const Tensor& t = job.graph.tensors[p.tensor];
    host.resize(static_cast<size_t>(t.elements()));
    init_param(t, host.data(), options.seed);
    compute.copy(m_params.data() + p.offset, host.data(), static_cast<size_t>(t.bytes()));
  }
  if (m_optimizer.mapping.device() >= 0) {
    compute.zero(m_optimizer.data(), static_cast<size_t>(2 * m_optimizer_bytes));
  } else {
    std::memset(m_optimizer.data(), 0, static_cast<size_t>(2 * m_optimizer_bytes));  // offloaded: host memory
  }
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

std::vector<Gva> Arenas::release() {
  for (void* p : m_pinned) m_pinned_by->unpin_host(p);
  m_pinned.clear();
  std::vector<Gva> out;
  for (OwnRegion* r :
       {&m_ctl, &m_info, &m_mbox, &m_publish, &m_params, &m_grads, &m_optimizer, &m_work, &m_window, &m_snapshot}) {
    if (!r->gva.is_null()) out.push_back(r->gva);
    *r = OwnRegion{};  // unmaps
  }
  return out;
}

}  // namespace tiermem::exec
