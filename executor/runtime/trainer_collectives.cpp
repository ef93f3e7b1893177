// Trainer: the groups that reduce through NCCL (collectives.hpp).
#include <xxhash.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <tiermem/status_macros.h>

#include "executor/grad_buckets.hpp"
#include "executor/runtime/bucket_collective.hpp"
#include "executor/runtime/trainer_impl.hpp"

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
    if (o.kind == OpKind::tp_all_reduce) words.push_back(job.graph.tensors[o.in[0]].elements());
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
  TIERMEM_ASSIGN_OR_RETURN(const bool nccl, group_uses_nccl(group, abilities, devices));
  if (!nccl || !for_gradients) return nccl;
  // A member that died between the group's all-reduce of a step and its
  // commit resumes a step behind the others. NCCL would sum gradients of
  // different steps: this run reduces through tiermem, whose published
  // gradients are numbered by step (every member reads the same words, so
  // all decide alike).
  std::string steps;
  bool differ = false;
  for (int r : group.ranks) {
    uint64_t committed = static_cast<uint64_t>(m_arenas.committed());
    if (r != m_env.rank) {
      TIERMEM_ASSIGN_OR_RETURN(committed, m_dir->load(m_peers.ctl_word(r, k_committed)));
    }
    differ = differ || committed != static_cast<uint64_t>(m_arenas.committed());
    steps += (steps.empty() ? "" : ", ") + ("rank " + std::to_string(r) + " at " + std::to_string(committed));
  }
  if (!differ) return true;
  if (m_ability == CollectiveAbility::must_nccl) {
    return Status(ErrorCode::failed_precondition,
                  "data-parallel group " + group.name + " resumes from different steps (" + steps +
                      "): NCCL would sum gradients of different steps; --collectives auto finishes the resume "
                      "through tiermem");
  }
  if (!m_opt.quiet) {
    std::fprintf(stderr, "rank %d: data-parallel group %s resumes from different steps (%s): its gradients go through "
                 "tiermem in this run\n", m_env.rank, group.name.c_str(), steps.c_str());
  }
  return false;
}

Status Trainer::make_collectives() {
  const auto dp = dp_group(m_job.topo);
  const auto tp = tp_group(m_job.topo);
  if (dp) {
    TIERMEM_ASSIGN_OR_RETURN(const bool nccl, group_decision(*dp, true));
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
    } else if (const char* e = std::getenv("TIERMEM_EXEC_CPU_BUCKETS");
               e != nullptr && std::string(e) == "1" && !m_compute->memory_is_device() && !m_job.plan.offload &&
               m_opt.replicas == 0) {
      // (Not with --replicas: a step's commit may come during the next
      // step there, and a bucket is numbered by the committed step.)
      // Tests: the buckets and the stage's hooks on CPU ranks, through the
      // memory service (bucket_collective.hpp).
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
