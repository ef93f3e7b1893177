// The partitioner (X3) and the static memory plan (X4) on the shipped models:
// cut bytes recomputed independently, every stage used, METIS within the 5 %
// bound where the graph allows it, and a work arena whose shared memory never
// holds two live tensors at once.
#include "executor/partitioner.hpp"

#include <gtest/gtest.h>

#include <set>

#include "executor/memory_plan.hpp"

namespace tiermem::exec {
namespace {

constexpr int k_micro_batches = 2;

Graph training(const std::string& name) {
  auto g = load_model(std::string(TIERMEM_SOURCE_ROOT) + "/config/models/" + name + ".pbtxt");
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_TRUE(add_training(*g, 1.0f / k_micro_batches).ok());
  return std::move(g).value();
}

// Bytes per micro-batch crossing between stages, from the definition: every
// activation a forward op reads from another stage, plus its gradient coming
// back.
int64_t cut_of(const Graph& g, const Partition& p) {
  const std::vector<int> forward = g.ops_of(Phase::forward);
  std::vector<int> stage(g.ops.size(), -1);
  for (size_t v = 0; v < forward.size(); ++v) stage[forward[v]] = p.of_forward_op[v];
  std::set<std::pair<int, int>> crossing;  // (tensor, consumer stage)
  for (int op : forward) {
    for (int t : g.ops[op].in) {
      const Tensor& tensor = g.tensors[t];
      if (tensor.role != Role::activation || tensor.producer < 0) continue;
      if (stage[tensor.producer] != stage[op]) crossing.insert({t, stage[op]});
    }
  }
  int64_t bytes = 0;
  for (const auto& [t, s] : crossing) bytes += g.tensors[t].bytes() * (g.tensors[t].grad >= 0 ? 2 : 1);
  return bytes;
}

const char* const k_models[] = {"mlp_digits", "mlp_fashion", "ffn_block_digits", "ffn4_fashion"};

TEST(PartitionTest, CutBytesAreWhatCrossesAndEveryStageIsUsed) {
  for (const char* name : k_models) {
    const Graph g = training(name);
    for (int parts : {2, 4}) {
      for (PartitionMethod m : {PartitionMethod::metis, PartitionMethod::greedy, PartitionMethod::random}) {
        for (uint64_t seed : {1, 2, 3}) {
          auto p = partition(g, parts, m, k_micro_batches, seed);
          ASSERT_TRUE(p.ok()) << p.status().to_string();
          SCOPED_TRACE(std::string(name) + " " + std::string(method_name(m)) + " " + std::to_string(parts));
          EXPECT_EQ(p->cut_bytes, cut_of(g, *p));
          std::set<int> used(p->of_forward_op.begin(), p->of_forward_op.end());
          EXPECT_EQ(used.size(), static_cast<size_t>(parts)) << "an empty stage";
          EXPECT_EQ(p->of_forward_op.front(), 0) << "stage 0 runs first";
        }
      }
    }
  }
  // The MLP's contiguous split: only the first hidden activation (and its
  // gradient) crosses.
  const Graph mlp = training("mlp_digits");
  auto greedy = partition(mlp, 2, PartitionMethod::greedy, k_micro_batches);
  EXPECT_EQ(greedy->cut_bytes, 2 * 32 * 128 * 4);
  EXPECT_EQ(cut_of(mlp, *greedy), greedy->cut_bytes);
}

TEST(PartitionTest, MetisBalancesWithinFivePercentAndCutsLessThanRandom) {
  const Graph g = training("ffn4_fashion");
  auto metis = partition(g, 2, PartitionMethod::metis, k_micro_batches);
  ASSERT_TRUE(metis.ok());
  EXPECT_LE(metis->flops_imbalance, 0.05);
  EXPECT_LE(metis->memory_imbalance, 0.05);
  EXPECT_EQ(flops_imbalance_floor(g, 2, k_micro_batches), 0.0);
  int64_t random_total = 0;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    random_total += partition(g, 2, PartitionMethod::random, k_micro_batches, seed)->cut_bytes;
  }
  EXPECT_LT(metis->cut_bytes * 3, random_total / 20) << "METIS should cut far less than a random split";
  // An MLP whose first matmul holds most FLOPs cannot balance: the floor says so.
  const Graph mlp = training("mlp_digits");
  const double floor = flops_imbalance_floor(mlp, 2, k_micro_batches);
  EXPECT_GT(floor, 0.5);
  EXPECT_GE(partition(mlp, 2, PartitionMethod::metis, k_micro_batches)->flops_imbalance, floor - 1e-9);
}

TEST(PartitionTest, TooManyStagesIsAClearError) {
  const Graph g = training("mlp_digits");
  auto p = partition(g, 9, PartitionMethod::metis, k_micro_batches);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("cannot split 6 forward ops into 9 stages"), std::string::npos)
      << p.status().message();
}

TEST(MemoryPlanTest, SharedWorkMemoryNeverHoldsTwoLiveTensors) {
  for (const char* name : k_models) {
    const Graph g = training(name);
    for (int parts : {1, 2}) {
      auto p = partition(g, parts, PartitionMethod::metis, k_micro_batches);
      ASSERT_TRUE(p.ok());
      for (int stage = 0; stage < parts; ++stage) {
        const MemoryPlan plan = plan_memory(g, *p, stage, k_micro_batches);
        SCOPED_TRACE(std::string(name) + " stage " + std::to_string(stage));
        EXPECT_GT(plan.work_naive, 0);
        EXPECT_LE(plan.work_peak, plan.work_naive);
        for (size_t i = 0; i < plan.work.size(); ++i) {
          const Placement& a = plan.work[i];
          EXPECT_LE(a.offset + a.bytes, plan.work_peak);
          EXPECT_LE(a.first, a.last);
          for (size_t j = i + 1; j < plan.work.size(); ++j) {
            const Placement& b = plan.work[j];
            const bool live_together = a.first <= b.last && b.first <= a.last;
            const bool share_memory = a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
            EXPECT_FALSE(live_together && share_memory)
                << g.tensors[a.tensor].name << "/" << a.micro_batch << " and " << g.tensors[b.tensor].name << "/"
                << b.micro_batch;
          }
        }
        // Parameters and optimizer state are placed in their arenas, in DRAM
        // here (no VRAM the CPU kernels could use); the snapshot in PMEM.
        for (const ArenaPlan& arena : plan.arenas) {
          if (arena.name == "snapshot") EXPECT_EQ(arena.tier, Tier::pmem);
          if (arena.name == "optimizer") EXPECT_EQ(arena.tier, Tier::dram);
        }
      }
    }
  }
}

}  // namespace
}  // namespace tiermem::exec
