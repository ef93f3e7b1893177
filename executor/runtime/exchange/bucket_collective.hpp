// The data-parallel group's gradient buckets reduced through the memory
// service on CPU ranks, one bucket at a time (TIERMEM_EXEC_CPU_BUCKETS=1;
// tests). It runs what NCCL runs on GPUs — the bucket plan
// (grad_buckets.hpp) and the stage's hooks that reduce each bucket after
// the last op writing it — where NCCL cannot run, so that a bucket reduced
// too early shows in the losses: a call publishes this rank's bucket in its
// publish arena (the step's half, the bucket's offset), raises k_buckets to
// the call's number (step x buckets + bucket + 1), waits for every member's
// word to reach it, reads their parts and sums them in member order, as the
// tiermem all-reduce does: the same bits. The CPU computes at once, so a
// call is done when it returns (no overlap).
#pragma once

#include <cstdint>
#include <vector>

#include <tiermem/client.h>

#include "executor/compute.hpp"
#include "executor/runtime/state/arenas.hpp"
#include "executor/runtime/exchange/collectives.hpp"
#include "executor/runtime/state/job.hpp"
#include "executor/runtime/exchange/mailboxes.hpp"

namespace tiermem::exec {

class BucketCollective final : public Collective {
 public:
  BucketCollective(JobDirectory& dir, const Arenas& arenas, const RankPeers& peers, GroupSpec group, size_t buckets)
      : m_dir(dir), m_arenas(arenas), m_peers(peers), m_group(std::move(group)), m_buckets(buckets) {}

  int size() const override { return static_cast<int>(m_group.ranks.size()); }
  int rank() const override { return m_group.me; }
  Result<bool> joined() override { return true; }
  void abort() override {}
  void all_reduce(const float*, float*, int64_t) override { fail("a tensor-parallel sum"); }
  uint64_t all_reduce_beside(float* data, int64_t count) override;
  void wait_beside(uint64_t) override {}
  Result<std::vector<uint64_t>> sum_words(const std::vector<uint64_t>&) override {
    return Status(ErrorCode::not_supported, "the bucket collective sums gradients only");
  }
  void beside_time(uint64_t* bytes, double* seconds) override {
    *bytes = m_bytes;
    *seconds = m_seconds;
  }
  std::string library() const override { return "tiermem (buckets)"; }
  Status failure() const override { return m_status; }

 private:
  void fail(const char* what) {
    if (m_status.ok()) m_status = Status(ErrorCode::internal, std::string("the bucket collective cannot do ") + what);
  }

  JobDirectory& m_dir;
  const Arenas& m_arenas;
  const RankPeers& m_peers;
  GroupSpec m_group;
  size_t m_buckets;
  int64_t m_step = -1;
  size_t m_index = 0;  // the next bucket of m_step
  std::vector<float> m_part;
  Status m_status;
  uint64_t m_bytes = 0;
  double m_seconds = 0;
};

}  // namespace tiermem::exec
