// Trainer: the groups that reduce through NCCL (collectives.hpp).
#include <xxhash.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <tiermem/units.h>

#include <tiermem/status_macros.h>

#include "executor/grad_buckets.hpp"
#include "executor/runtime/exchange/bucket_collective.hpp"
#include "executor/runtime/control/trainer_impl.hpp"

namespace tiermem::exec {
namespace {

// The plan's fingerprint of what a group reduces: the gradient buckets
// (data parallel) or the sizes of the tensor-parallel sums in order.
uint64_t dp_fingerprint(const std::vector<GradBucket>& buckets, int64_t grads_bytes) {
  std::vector<int64_t> words{grads_bytes};
  for (const GradBucket& b : buckets) words.insert(words.end(), {b.offset, b.bytes, b.ready});
  return XXH3_64bits(words.data(), words.size() * 8);
}

uint64_t tp_fingerprint(const JobPlan& job) {
  std::vector<int64_t> words;
  for (const auto& [op, mb] : job.plan.schedule) {
    const Op& o = job.graph.ops[static_cast<size_t>(op)];
    if (o.kind == proto::TP_ALL_REDUCE) words.push_back(job.graph.tensors[o.in[0]].elements());
  }
  return XXH3_64bits(words.data(), words.size() * 8);
}

}  // namespace

Result<bool> Trainer::group_decision(const GroupSpec& group, bool for_gradients) {
  std::vector<CollectiveAbility> abilities;
  std::vector<uint64_t> devices;
  const auto deadline = std::chrono::steady_clock::now() + m_opt.timeout;
  for (int r : group.ranks) {
    uint64_t words[3] = {static_cast<uint64_t>(m_ability), m_job.plan.offload ? 2u : 1u, device_key(*m_compute)};
    if (r != m_env.rank) {
      TIERMEM_ASSIGN_OR_RETURN(Gva info, m_dir->peer(r, "info"));
      for (;;) {
        TIERMEM_RETURN_IF_ERROR(m_dir->read(info.plus(k_info_collectives), words, sizeof words));
        if (words[0] != 0 && words[1] != 0) break;
        if (std::chrono::steady_clock::now() > deadline) {
          return Status(ErrorCode::timeout, "rank " + std::to_string(r) + " did not say how it reduces (its info)");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    auto ability = static_cast<CollectiveAbility>(words[0]);
    // An offloaded stage's gradients stream through a window: they are
    // all-reduced from the home tier through tiermem.
    if (for_gradients && words[1] == 2 && ability == CollectiveAbility::nccl) ability = CollectiveAbility::tiermem;
    abilities.push_back(ability);
    devices.push_back(words[2]);
  }
  return group_uses_nccl(group, abilities, devices);
}

Status Trainer::catch_up(const GroupSpec& group) {
  const int64_t mine = m_arenas.committed();
  int64_t most = mine;
  int ahead = -1;
  for (int r : group.ranks) {
    if (r == m_env.rank) continue;
    TIERMEM_ASSIGN_OR_RETURN(const uint64_t theirs, m_dir->load(m_peers.ctl_word(r, k_committed)));
    if (static_cast<int64_t>(theirs) > most) {
      most = static_cast<int64_t>(theirs);
      ahead = r;
    }
  }
  if (ahead < 0) return Status();
  if (most != mine + 1) {
    return Status(ErrorCode::failed_precondition,
                  "data-parallel group " + group.name + ": rank " + std::to_string(ahead) + " committed step " +
                      std::to_string(most) + " but this rank only " + std::to_string(mine) +
                      "; members of a group are at most a step apart (their memory is not this job's?)");
  }
  TIERMEM_ASSIGN_OR_RETURN(const Gva params, m_dir->peer(ahead, "params"));
  TIERMEM_ASSIGN_OR_RETURN(const Gva optimizer, m_dir->peer(ahead, "optimizer"));
  const int64_t parity = most % 2;  // the committed copy of `most` steps
  std::vector<std::byte> host;
  uint64_t bytes_taken = 0;
  int tensors = 0;
  for (const auto* list : {&m_job.plan.params, &m_job.plan.optimizer}) {
    const bool is_params = list == &m_job.plan.params;
    const int64_t arena = m_job.arena_bytes(is_params ? "params" : "optimizer");
    for (const Placement& p : *list) {
      const auto bytes = static_cast<size_t>(m_job.graph.tensors[p.tensor].bytes());
      host.resize(bytes);
      const Gva at = (is_params ? params : optimizer).plus(static_cast<uint64_t>(parity * arena + p.offset));
      TIERMEM_RETURN_IF_ERROR(m_dir->read(at, host.data(), bytes)
                                  .with_context("catching up: '" + m_job.graph.tensors[p.tensor].name + "'"));
      m_compute->copy(m_arenas.memory(m_job, p.tensor, -1, parity), host.data(), bytes);
      bytes_taken += bytes;
      ++tensors;
    }
  }
  TIERMEM_RETURN_IF_ERROR(m_compute->sync());
  m_arenas.commit(most);
  std::fprintf(stderr,
               "rank %d: a step behind its data-parallel group %s: took the committed state of step %" PRId64
               " from rank %d (%d tensors, %s)\n",
               m_env.rank, group.name.c_str(), most, ahead, tensors, format_size(bytes_taken).c_str());
  return Status();
}

Status Trainer::make_collectives() {
  const auto dp = dp_group(m_job.topo);
  const auto tp = tp_group(m_job.topo);
  if (dp) {
    TIERMEM_ASSIGN_OR_RETURN(const bool nccl, group_decision(*dp, true));
    const bool buckets = !nccl && m_opt.hooks.cpu_buckets &&
                         !m_compute->memory_is_device() && !m_job.plan.offload && m_opt.replicas == 0;
    // Through NCCL or bucket by bucket, no gradients are published by
    // step: a member a step behind takes the others' state instead.
    if (nccl || buckets) TIERMEM_RETURN_IF_ERROR(catch_up(*dp));
    if (nccl) {
      auto buckets = plan_grad_buckets(m_job.graph, m_job.plan, m_opt.bucket_bytes);
      const uint64_t fingerprint = dp_fingerprint(buckets, m_arenas.grads_bytes());
      TIERMEM_ASSIGN_OR_RETURN(m_collectives.dp,
                               make_group(*m_compute, *m_dir, *dp, fingerprint, m_opt.timeout));
      if (dp->me == 0 && !m_opt.quiet) {
        std::printf("rank %d: %s all-reduces the gradients of %d replicas (group %s, checked): %s\n", m_env.rank,
                    m_collectives.dp->library().c_str(), m_job.topo.replicas, dp->name.c_str(),
                    describe_buckets(buckets).c_str());
      }
      m_buckets = std::move(buckets);
    } else if (buckets) {
      // Tests: the buckets and the stage's hooks on CPU ranks, through the
      // memory service (bucket_collective.hpp). Not with --replicas: a
      // step's commit may come during the next step there, and a bucket is
      // numbered by the committed step.
      m_buckets = plan_grad_buckets(m_job.graph, m_job.plan, m_opt.bucket_bytes);
      m_collectives.dp = std::make_unique<BucketCollective>(*m_dir, m_arenas, m_peers, *dp, m_buckets.size());
      if (dp->me == 0 && !m_opt.quiet) {
        std::printf("rank %d: tiermem all-reduces the gradients of %d replicas bucket by bucket (group %s): %s\n",
                    m_env.rank, m_job.topo.replicas, dp->name.c_str(), describe_buckets(m_buckets).c_str());
      }
    }
  }
  if (tp) {
    TIERMEM_ASSIGN_OR_RETURN(const bool nccl, group_decision(*tp, false));
    if (!nccl && m_compute->memory_is_device()) {
      return Status(ErrorCode::failed_precondition,
                    "tensor-parallel group " + tp->name + ": a GPU rank sums its parts through NCCL, but a member of "
                    "its group cannot (a CPU rank, or a build without NCCL); give every member a GPU");
    }
    if (nccl) {
      TIERMEM_ASSIGN_OR_RETURN(m_collectives.tp,
                               make_group(*m_compute, *m_dir, *tp, tp_fingerprint(m_job), m_opt.timeout));
      if (tp->me == 0 && !m_opt.quiet) {
        std::printf("rank %d: %s sums the parts of %d tensor-parallel ranks (group %s, checked)\n", m_env.rank,
                    m_collectives.tp->library().c_str(), m_job.topo.tensor_parallel, tp->name.c_str());
      }
    }
  }
  return Status();
}

// The gradients' all-reduce as the group's stream timed it: the algorithm
// bandwidth (bytes over time) and the bus bandwidth (x 2(n-1)/n, what
// nccl-tests report: comparable across group sizes).
void Trainer::report_collectives() {
  if (!m_collectives.dp || m_opt.quiet) return;
  uint64_t bytes = 0;
  double seconds = 0;
  m_collectives.dp->beside_time(&bytes, &seconds);
  if (seconds <= 0) return;
  const double n = m_collectives.dp->size();
  const double algo = static_cast<double>(bytes) / seconds / 1e9;
  std::fprintf(stderr,
               "rank %d: gradient all-reduce through %s: %.1f MB in %.2f ms on its stream; algorithm bandwidth "
               "%.2f GB/s, bus bandwidth %.2f GB/s\n",
               m_env.rank, m_collectives.dp->library().c_str(), static_cast<double>(bytes) / 1e6, seconds * 1e3, algo,
               algo * 2 * (n - 1) / n);
}

}  // namespace tiermem::exec
