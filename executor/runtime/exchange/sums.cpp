#include "executor/runtime/exchange/sums.hpp"

#include <algorithm>
#include <atomic>

#include <tiermem/batch.h>
#include <tiermem/status_macros.h>

namespace tiermem::exec {
namespace {

const std::string k_all_reduce = "all-reduce";

// One replica: nothing to sum.
class NoGradientSum final : public GradientSum {
 public:
  void after_position(int) override {}
  Status all_queued() override { return Status(); }
  Status after_sync(int64_t) override { return Status(); }
};

// Bucket by bucket beside the backward pass, on a collective (NCCL, or the
// memory service's buckets on CPU ranks).
class BucketGradientSum final : public GradientSum {
 public:
  BucketGradientSum(Collective& group, std::vector<GradBucket> buckets, Arenas& arenas)
      : m_group(group), m_buckets(std::move(buckets)), m_arenas(arenas) {
    for (size_t i = 0; i < m_buckets.size(); ++i) m_at[m_buckets[i].ready].push_back(i);
  }
  void after_position(int pos) override {
    auto it = m_at.find(pos);
    if (it == m_at.end()) return;
    for (size_t i : it->second) {
      const GradBucket& b = m_buckets[i];
      m_ticket = m_group.all_reduce_beside(reinterpret_cast<float*>(m_arenas.grads().data() + b.offset), b.bytes / 4);
    }
  }
  Status all_queued() override {
    // The optimizer waits for the last bucket (and so for every one).
    m_group.wait_beside(m_ticket);
    return m_group.failure();
  }
  Status after_sync(int64_t) override { return Status(); }

 private:
  Collective& m_group;
  std::vector<GradBucket> m_buckets;
  Arenas& m_arenas;
  std::map<int, std::vector<size_t>> m_at;  // schedule position -> buckets ready after it
  uint64_t m_ticket = 0;
};

// Whole, through the memory service, once the step's compute is done.
class PublishedGradientSum final : public GradientSum {
 public:
  explicit PublishedGradientSum(const RankParts& p)
      : m_job(p.job), m_compute(p.compute), m_client(p.client), m_dir(p.dir), m_arenas(p.arenas), m_peers(p.peers),
        m_trace(p.trace) {}
  void after_position(int) override {}
  Status all_queued() override { return Status(); }
  Status after_sync(int64_t step) override;

 private:
  const JobPlan& m_job;
  Compute& m_compute;
  Client& m_client;
  JobDirectory& m_dir;
  Arenas& m_arenas;
  const RankPeers& m_peers;
  Trace& m_trace;
};

Status PublishedGradientSum::after_sync(int64_t step) {
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

// No tensor parallelism: a graph without TP_ALL_REDUCE ops never asks.
class NoPartialSum final : public PartialSum {
 public:
  Status sum(int op, const StepPoint&, const float*, float*, int64_t, bool) override {
    return Status(ErrorCode::internal, "op " + std::to_string(op) + " sums over a tensor-parallel group of one");
  }
};

// Through the memory service (tp_exchange.hpp; it times itself, as communication).
class ExchangePartialSum final : public PartialSum {
 public:
  explicit ExchangePartialSum(TpExchange& tp) : m_tp(tp) {}
  Status sum(int op, const StepPoint& at, const float* part, float* out, int64_t elements, bool accumulate) override {
    return m_tp.all_reduce(op, at.pos, at.step, at.eval, at.eval_sequence, part, out, elements, accumulate);
  }

 private:
  TpExchange& m_tp;
};

// Through NCCL, queued on the compute's stream.
class CollectivePartialSum final : public PartialSum {
 public:
  CollectivePartialSum(Collective& group, Compute& compute, Trace& trace, float* scratch)
      : m_group(group), m_compute(compute), m_trace(trace), m_scratch(scratch) {}
  Status sum(int, const StepPoint&, const float* part, float* out, int64_t elements, bool accumulate) override {
    auto span = m_trace.span(SpanKind::comm, k_all_reduce);  // the host's part: queueing it
    if (!accumulate) {
      m_group.all_reduce(part, out, elements);
      return Status();
    }
    // Backward adds the sum to what the gradient holds already, as
    // TpExchange does: out + (the group's sum).
    m_group.all_reduce(part, m_scratch, elements);
    m_compute.add(out, m_scratch, out, elements);
    return Status();
  }

 private:
  Collective& m_group;
  Compute& m_compute;
  Trace& m_trace;
  float* m_scratch;  // a backward sum before it is added
};

}  // namespace

Result<StageSums> make_stage_sums(const RankParts& p, TpExchange& tp, Collective* dp_group, Collective* tp_group,
                                  std::vector<GradBucket> buckets) {
  StageSums sums;
  if (p.job.topo.replicas == 1) {
    sums.gradients = std::make_unique<NoGradientSum>();
  } else if (dp_group != nullptr) {
    sums.gradients = std::make_unique<BucketGradientSum>(*dp_group, std::move(buckets), p.arenas);
  } else {
    sums.gradients = std::make_unique<PublishedGradientSum>(p);
  }
  if (p.job.topo.tensor_parallel == 1) {
    sums.parts = std::make_unique<NoPartialSum>();
  } else if (tp_group != nullptr) {
    int64_t most = 0;
    for (const Op& op : p.job.graph.ops) {
      if (op.kind == proto::TP_ALL_REDUCE) most = std::max(most, p.job.graph.tensors[op.in[0]].elements());
    }
    auto* scratch = static_cast<float*>(p.compute.device_buffer(static_cast<size_t>(most) * 4));
    if (scratch == nullptr) {
      return Status(ErrorCode::tier_exhausted, "no memory on " + p.compute.name() +
                                                   " for the tensor-parallel sums (" + std::to_string(most * 4) +
                                                   " bytes)");
    }
    sums.parts = std::make_unique<CollectivePartialSum>(*tp_group, p.compute, p.trace, scratch);
  } else {
    sums.parts = std::make_unique<ExchangePartialSum>(tp);
  }
  return sums;
}

}  // namespace tiermem::exec
