// The partitioner (X3) and the static memory plan (X4) on the shipped models:
// cut bytes recomputed independently, every stage used, METIS within the 5 %
// bound where the graph allows it, and a work arena whose shared memory never
// holds two live tensors at once.
#include "executor/partitioner.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>

#include "executor/interpreter.hpp"
#include "executor/memory_plan.hpp"
#include "executor/split.hpp"

namespace tiermem::exec {
namespace {

constexpr int k_micro_batches = 2;

Graph forward_graph(const std::string& name) {
  auto g = load_model(std::string(TIERMEM_SOURCE_ROOT) + "/config/models/" + name + ".pbtxt");
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  return std::move(g).value();
}

Graph training(const std::string& name) {
  Graph g = forward_graph(name);
  EXPECT_TRUE(add_training(g, 1.0f / k_micro_batches).ok());
  return g;
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

// split_for_balance cuts the heavy matmuls into column blocks: METIS then
// meets the 5 % bound where whole ops cannot, the models without a heavy op
// stay as they are, and the split graph computes what the whole one does from
// the same initial parameters.
TEST(SplitTest, ColumnBlocksLetMetisBalanceTheMlps) {
  const struct {
    const char* model;
    int parts;
  } cases[] = {{"mlp_digits", 2}, {"mlp_fashion", 2}, {"mlp_fashion", 4}, {"ffn4_fashion", 4}};
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(c.model) + " " + std::to_string(c.parts));
    Graph g = forward_graph(c.model);
    const size_t ops = g.ops.size();
    auto report = split_for_balance(g, c.parts, k_micro_batches);
    ASSERT_TRUE(report.ok()) << report.status().to_string();
    ASSERT_FALSE(report->empty());
    EXPECT_NE(report->back().find("FLOP imbalance over"), std::string::npos) << report->back();
    EXPECT_GT(g.ops.size(), ops);
    ASSERT_TRUE(add_training(g, 1.0f / k_micro_batches).ok());
    auto p = partition(g, c.parts, PartitionMethod::metis, k_micro_batches);
    ASSERT_TRUE(p.ok());
    EXPECT_LE(p->flops_imbalance, 0.05);
    EXPECT_EQ(p->cut_bytes, cut_of(g, *p));
  }
  // Two stages: one block of fc1 per stage, and a pipeline (stage 0 feeds
  // stage 1 only): the MLPs cut less than with their ops whole.
  for (const char* name : {"mlp_digits", "mlp_fashion"}) {
    SCOPED_TRACE(name);
    Graph g = forward_graph(name);
    ASSERT_TRUE(split_for_balance(g, 2, k_micro_batches).ok());
    ASSERT_TRUE(add_training(g, 1.0f / k_micro_batches).ok());
    EXPECT_GE(g.find("h1.c1"), 0);
    EXPECT_LT(g.find("h1.c2"), 0);
    auto p = partition(g, 2, PartitionMethod::metis, k_micro_batches);
    auto whole = partition(training(name), 2, PartitionMethod::metis, k_micro_batches);
    ASSERT_TRUE(p.ok() && whole.ok());
    std::vector<int> stage(g.ops.size(), -1);
    const std::vector<int> forward = g.ops_of(Phase::forward);
    for (size_t v = 0; v < forward.size(); ++v) stage[forward[v]] = p->of_forward_op[v];
    for (int op : forward) {
      for (int t : g.ops[op].in) {
        if (g.tensors[t].producer >= 0) {
          EXPECT_LE(stage[g.tensors[t].producer], stage[op]) << g.ops[op].name;
        }
      }
    }
    EXPECT_LT(p->cut_bytes, whole->cut_bytes);
  }
  // Balanced already at op granularity: nothing to do.
  Graph ffn = forward_graph("ffn4_fashion");
  const size_t ops = ffn.ops.size();
  auto report = split_for_balance(ffn, 2, k_micro_batches);
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->empty());
  EXPECT_EQ(ffn.ops.size(), ops);
  Graph one = forward_graph("mlp_digits");
  EXPECT_TRUE(split_for_balance(one, 1, k_micro_batches)->empty());
}

// A part of a part (a tensor-parallel shard split again into column blocks)
// starts as the same elements of the whole parameter would: its rows and
// column ranges map through the middle one.
TEST(SplitTest, APartOfAPartStartsAsItsElementsOfTheWhole) {
  Tensor whole;
  whole.name = "w";
  whole.shape = {4, 12};
  whole.role = Role::param;
  whole.init = proto::XAVIER_UNIFORM;
  Tensor middle = whole;
  middle.shape = {3, 6};  // rows 1..3, columns 0-1 and 6-9
  init_as_part_of(whole, 1, {{0, 2}, {6, 4}}, &middle);
  Tensor part = middle;
  part.shape = {2, 3};  // rows 1..2 of the middle one, its columns 1-3
  init_as_part_of(middle, 1, {{1, 3}}, &part);
  EXPECT_EQ(part.init_name, "w");
  EXPECT_EQ(part.init_shape, whole.shape);
  EXPECT_EQ(part.init_row, 2);
  const std::vector<std::pair<int64_t, int64_t>> columns{{1, 1}, {6, 2}};
  EXPECT_EQ(part.init_ranges, columns);
  std::vector<float> all(48), mine(6);
  init_param(whole, all.data(), 5);
  init_param(part, mine.data(), 5);
  const int64_t taken[] = {1, 6, 7};
  for (int64_t r = 0; r < 2; ++r) {
    for (int64_t c = 0; c < 3; ++c) EXPECT_EQ(mine[r * 3 + c], all[(2 + r) * 12 + taken[c]]) << r << "," << c;
  }
}

TEST(SplitTest, SplitGraphStartsFromAndComputesTheSame) {
  Graph whole = forward_graph("mlp_fashion");
  Graph split = whole;
  ASSERT_TRUE(split_for_balance(split, 2, k_micro_batches).ok());
  // Parameters: every block is its columns of the whole weight.
  auto init = [](const Graph& g, uint64_t seed) {
    std::vector<std::vector<float>> mem;
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(0, 1);
    for (const Tensor& t : g.tensors) {
      mem.emplace_back(static_cast<size_t>(t.elements()), 0.0f);
      if (t.role == Role::param) init_param(t, mem.back().data(), 5);
      if (t.role == Role::input) {
        for (float& x : mem.back()) x = u(rng);
      }
      if (t.role == Role::label) {
        for (float& x : mem.back()) {
          const int32_t label = static_cast<int32_t>(rng() % 10);
          std::memcpy(&x, &label, 4);
        }
      }
    }
    return mem;
  };
  auto a = init(whole, 3), b = init(split, 3);
  const int w1 = whole.find("w1");
  int blocks = 0;
  int64_t columns = 0;
  for (size_t t = 0; t < split.tensors.size(); ++t) {
    const Tensor& block = split.tensors[t];
    if (block.init_name != "w1") continue;
    ++blocks;
    ASSERT_EQ(block.init_ranges.size(), 1u) << block.name;
    const int64_t first = block.init_ranges[0].first;
    EXPECT_EQ(first, columns) << "blocks in column order, without gaps";
    columns += block.shape[1];
    for (int64_t r = 0; r < block.shape[0]; ++r) {
      for (int64_t c = 0; c < block.shape[1]; ++c) {
        ASSERT_EQ(b[t][r * block.shape[1] + c], a[w1][r * 256 + first + c]) << block.name;
      }
    }
  }
  EXPECT_GE(blocks, 2);
  EXPECT_EQ(columns, 256);
  EXPECT_LT(split.find("w1"), 0) << "the whole weight is gone";
  // Forward: the same logits and loss.
  auto run = [](const Graph& g, std::vector<std::vector<float>>& mem) {
    float loss = 0;
    for (const Op& op : g.ops) {
      auto r = run_op(g, op, [&](int t) -> void* { return mem[t].data(); });
      if (op.kind == proto::SOFTMAX_CROSS_ENTROPY) loss = r.loss;
    }
    return loss;
  };
  const float la = run(whole, a), lb = run(split, b);
  EXPECT_NEAR(la, lb, 1e-5 * std::abs(la));
  const std::vector<float>& za = a[whole.find("logits")];
  const std::vector<float>& zb = b[split.find("logits")];
  ASSERT_EQ(za.size(), zb.size());
  for (size_t i = 0; i < za.size(); ++i) ASSERT_NEAR(za[i], zb[i], 1e-4f) << i;
}

TEST(PartitionTest, TooManyStagesIsAClearError) {
  const Graph g = training("mlp_digits");
  auto p = partition(g, 9, PartitionMethod::metis, k_micro_batches);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("cannot split 6 forward ops into 9 stages"), std::string::npos)
      << p.status().message();
}

// 1F1B (memory_plan.hpp): after order_for_1f1b every forward tensor flows
// to the same or a later stage; each stage runs every (op, micro-batch)
// once, a micro-batch's backward after its forward, micro-batches in
// descending order, with at most (stages - stage) micro-batches between
// their first forward and last backward; and every channel's messages come
// in one order at both ends (message_index).
TEST(MemoryPlanTest, OneForwardOneBackwardRunsEveryOpOnceWithFewMicroBatchesInFlight) {
  constexpr int k_many = 6;
  for (const char* name : k_models) {
    for (int parts : {1, 2, 3}) {
      Graph g = forward_graph(name);
      ASSERT_TRUE(split_for_balance(g, parts, k_many).ok());
      ASSERT_TRUE(add_training(g, 1.0f / k_many).ok());
      auto p = partition(g, parts, PartitionMethod::metis, k_many);
      ASSERT_TRUE(p.ok());
      ASSERT_TRUE(order_for_1f1b(g, k_many, &*p).ok());
      EXPECT_EQ(flows_back(g, *p), "") << name << " over " << parts;
      for (int stage = 0; stage < parts; ++stage) {
        SCOPED_TRACE(std::string(name) + " stage " + std::to_string(stage) + " of " + std::to_string(parts));
        const MemoryPlan gpipe = plan_memory(g, *p, stage, k_many);
        const MemoryPlan plan = plan_memory(g, *p, stage, k_many, false, PipelineSchedule::one_f_one_b);
        ASSERT_EQ(plan.pipeline, PipelineSchedule::one_f_one_b);
        EXPECT_TRUE(plan.schedule_note.empty()) << plan.schedule_note;
        std::multiset<std::pair<int, int>> a(gpipe.schedule.begin(), gpipe.schedule.end());
        std::multiset<std::pair<int, int>> b(plan.schedule.begin(), plan.schedule.end());
        EXPECT_EQ(a, b) << "the same op runs, in another order";
        std::map<int, int> first_forward, last_backward;
        int previous_forward_mb = k_many;
        for (size_t pos = 0; pos < plan.schedule.size(); ++pos) {
          const auto [op, mb] = plan.schedule[pos];
          if (g.ops[op].phase == Phase::forward) {
            if (!first_forward.count(mb)) {
              EXPECT_LT(mb, previous_forward_mb) << "micro-batches descending";
              previous_forward_mb = mb;
              first_forward[mb] = static_cast<int>(pos);
            }
          } else {
            EXPECT_TRUE(first_forward.count(mb)) << "a backward of micro-batch " << mb << " before its forward";
            last_backward[mb] = static_cast<int>(pos);
          }
        }
        for (size_t pos = 0; pos < plan.schedule.size(); ++pos) {
          int in_flight = 0;
          for (const auto& [mb, start] : first_forward) {
            if (start <= static_cast<int>(pos) && (!last_backward.count(mb) || last_backward[mb] >= static_cast<int>(pos))) {
              ++in_flight;
            }
          }
          EXPECT_LE(in_flight, parts - stage) << "at position " << pos;
        }
        // Never more work memory (on a GPU, where nothing sent waits for the
        // step's end); on one stage, one micro-batch's instead of six.
        const int64_t vram_gpipe = plan_memory(g, *p, stage, k_many, true).work_peak;
        const int64_t vram_1f1b = plan_memory(g, *p, stage, k_many, true, PipelineSchedule::one_f_one_b).work_peak;
        EXPECT_LE(vram_1f1b, vram_gpipe);
        if (parts == 1) {
          EXPECT_LT(vram_1f1b * 3, vram_gpipe);
        }
        for (int mb = 0; mb < k_many; ++mb) {
          EXPECT_EQ(plan.message_index(true, mb), plan.message_index(false, mb));
          EXPECT_EQ(gpipe.message_index(false, mb), plan.message_index(false, mb)) << "gradients in GPipe's order";
        }
      }
    }
  }
}

TEST(MemoryPlanTest, SharedWorkMemoryNeverHoldsTwoLiveTensors) {
  for (const char* name : k_models) {
    for (int parts : {1, 2, 4}) {
      // With heavy matmuls split into column blocks for 2 and 4 stages.
      Graph g = forward_graph(name);
      ASSERT_TRUE(split_for_balance(g, parts, k_micro_batches).ok());
      ASSERT_TRUE(add_training(g, 1.0f / k_micro_batches).ok());
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
          if (arena.name == "snapshot") {
            EXPECT_EQ(arena.tier, Tier::pmem);
          }
          if (arena.name == "optimizer") {
            EXPECT_EQ(arena.tier, Tier::dram);
          }
        }
      }
    }
  }
}


// Offload (a budget the per-step tensors do not fit): parameters, their
// gradients and optimizer state go a tier down; every parameter an op reads
// and every parameter gradient it writes has a stay in the window covering
// the op; stays that are in the window at once never share bytes; the
// schedule is op-major and runs every (op, micro-batch) the GPipe one does.
TEST(MemoryPlanTest, OffloadedStaysCoverEveryUseAndNeverShareLiveWindowBytes) {
  int offloaded = 0;
  for (const char* name : k_models) {
    for (int parts : {1, 2}) {
      Graph g = forward_graph(name);
      ASSERT_TRUE(add_training(g, 1.0f / k_micro_batches).ok());
      auto p = partition(g, parts, PartitionMethod::metis, k_micro_batches);
      ASSERT_TRUE(p.ok());
      for (int stage = 0; stage < parts; ++stage) {
        SCOPED_TRACE(std::string(name) + " stage " + std::to_string(stage) + " of " + std::to_string(parts));
        const MemoryPlan whole = plan_memory(g, *p, stage, k_micro_batches, true);
        // Room for the activations and a little more: not for the state.
        const int64_t budget = whole.work_peak + (whole.all_in_compute - whole.work_peak) / 3;
        auto planned = plan_memory(g, *p, stage, k_micro_batches, {.vram = true, .budget = budget});
        if (!planned.ok()) {
          EXPECT_EQ(planned.status().code(), ErrorCode::tier_exhausted) << planned.status().message();
          continue;
        }
        const MemoryPlan& plan = *planned;
        ASSERT_TRUE(plan.offload);
        ++offloaded;
        EXPECT_LE(plan.in_compute_tier, budget);
        EXPECT_EQ(plan.home, Tier::dram);
        for (const ArenaPlan& a : plan.arenas) {
          if (a.name == "params" || a.name == "grads" || a.name == "optimizer") {
            EXPECT_EQ(a.tier, Tier::dram) << a.name;
          }
          if (a.name == "work" || a.name == "window") {
            EXPECT_EQ(a.tier, Tier::vram) << a.name;
          }
        }
        auto sorted = [](std::vector<std::pair<int, int>> v) {
          std::sort(v.begin(), v.end());
          return v;
        };
        EXPECT_EQ(sorted(plan.schedule), sorted(whole.schedule));
        for (size_t pos = 0; pos < plan.schedule.size(); ++pos) {
          const Op& op = g.ops[static_cast<size_t>(plan.schedule[pos].first)];
          auto covered = [&](int t, bool grad) {
            for (const Visit& v : plan.visits) {
              if (v.tensor == t && v.grad == grad && v.first <= static_cast<int>(pos) && static_cast<int>(pos) <= v.last) {
                return true;
              }
            }
            return false;
          };
          for (int t : op.in) {
            if (g.tensors[t].role == Role::param) {
              EXPECT_TRUE(covered(t, false)) << g.tensors[t].name << " at " << pos;
            }
          }
          for (int t : op.out) {
            if (g.tensors[t].role == Role::grad && g.tensors[t].of_param) {
              EXPECT_TRUE(covered(t, true)) << g.tensors[t].name << " at " << pos;
            }
          }
        }
        for (size_t i = 0; i < plan.visits.size(); ++i) {
          const Visit& a = plan.visits[i];
          EXPECT_LE(a.offset + a.bytes, plan.window_peak);
          EXPECT_LE(a.grad ? a.first : a.load_at, a.first);
          for (size_t j = i + 1; j < plan.visits.size(); ++j) {
            const Visit& b = plan.visits[j];
            const int a0 = a.grad ? a.first : a.load_at, b0 = b.grad ? b.first : b.load_at;
            const bool together = a0 <= b.last && b0 <= a.last;
            const bool share = a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
            EXPECT_FALSE(together && share) << g.tensors[a.tensor].name << " and " << g.tensors[b.tensor].name;
          }
        }
      }
    }
  }
  EXPECT_GE(offloaded, 8) << "most stages offload within a third of their state";
}


// Device-aware (partition_by_time): stages with `gflops` each, links of
// 10 GB/s and 10 us.
std::vector<StageCost> costs_of(const std::vector<double>& gflops) {
  std::vector<StageCost> out;
  for (double g : gflops) {
    out.push_back({.device = "d", .flops_per_second = g * 1e9, .link_bytes_per_second = 10e9,
                   .link_latency_seconds = 10e-6});
  }
  out.back().link_bytes_per_second = 0;
  out.back().link_latency_seconds = 0;
  return out;
}

double slowest(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }

TEST(PartitionTest, ByTimeTheSlowStageTakesLessWorkAndTheBottleneckBeatsFlopBalance) {
  for (const char* name : {"gpt_tiny", "ffn4_fashion"}) {
    const Graph g = training(name);
    const auto costs = costs_of({40, 13, 40});
    auto flops = partition(g, 3, PartitionMethod::metis, k_micro_batches);
    auto timed = partition_by_time(g, k_micro_batches, costs);
    ASSERT_TRUE(flops.ok() && timed.ok()) << name;
    EXPECT_TRUE(timed->by_time);
    ASSERT_EQ(timed->predicted_seconds.size(), 3u);
    EXPECT_EQ(timed->predicted_seconds, predict_stage_seconds(g, *timed, k_micro_batches, costs)) << name;
    const double before = slowest(predict_stage_seconds(g, *flops, k_micro_batches, costs));
    EXPECT_LE(slowest(timed->predicted_seconds), before) << name;
    EXPECT_LT(timed->part_flops[1], timed->part_flops[0]) << name;
    EXPECT_LT(timed->part_flops[1], timed->part_flops[2]) << name;
    EXPECT_EQ(timed->cut_bytes, cut_of(g, *timed)) << name;
    // A pipeline: every stage used, no op before one it reads from.
    std::set<int> used(timed->of_forward_op.begin(), timed->of_forward_op.end());
    EXPECT_EQ(used.size(), 3u) << name;
    const std::vector<int> forward = g.ops_of(Phase::forward);
    std::vector<int> stage(g.ops.size(), -1);
    for (size_t v = 0; v < forward.size(); ++v) stage[forward[v]] = timed->of_forward_op[v];
    for (int op : forward) {
      for (int t : g.ops[op].in) {
        if (g.tensors[t].producer >= 0 && stage[g.tensors[t].producer] >= 0) {
          EXPECT_LE(stage[g.tensors[t].producer], stage[op]) << name << ": " << g.ops[op].name;
        }
      }
    }
  }
  // gpt_tiny's blocks are many ops of like size: a third of the speed takes
  // well under a third of the work, and the bottleneck falls by half or more.
  const Graph g = training("gpt_tiny");
  const auto costs = costs_of({40, 13, 40});
  auto timed = partition_by_time(g, k_micro_batches, costs);
  auto flops = partition(g, 3, PartitionMethod::metis, k_micro_batches);
  ASSERT_TRUE(timed.ok() && flops.ok());
  const double total = timed->part_flops[0] + timed->part_flops[1] + timed->part_flops[2];
  EXPECT_LT(timed->part_flops[1] / total, 0.2);
  EXPECT_LT(slowest(timed->predicted_seconds), 0.6 * slowest(predict_stage_seconds(g, *flops, k_micro_batches, costs)));
}

TEST(PartitionTest, ByTimeOnOneKindOfDeviceIsAsGoodAsFlopBalanceAndPredictsExactly) {
  const Graph g = training("gpt_tiny");
  const auto costs = costs_of({40, 40, 40, 40});
  auto flops = partition(g, 4, PartitionMethod::metis, k_micro_batches);
  auto timed = partition_by_time(g, k_micro_batches, costs);
  ASSERT_TRUE(flops.ok() && timed.ok());
  EXPECT_LE(slowest(timed->predicted_seconds),
            slowest(predict_stage_seconds(g, *flops, k_micro_batches, costs)) * (1 + 1e-9));
  EXPECT_FALSE(costs_differ(costs));
  EXPECT_TRUE(costs_differ(costs_of({40, 13, 40})));
  // One stage: its FLOPs at its rate, nothing sent.
  auto one = partition(g, 1, PartitionMethod::metis, k_micro_batches);
  ASSERT_TRUE(one.ok());
  const auto alone = costs_of({40});
  const double flops_total = one->part_flops[0];
  EXPECT_NEAR(predict_stage_seconds(g, *one, k_micro_batches, alone)[0], k_micro_batches * flops_total / 40e9,
              1e-12);
  // A GPU-like stage beside slow ones takes most of the work.
  auto gpu = partition_by_time(g, k_micro_batches, costs_of({50000, 40}));
  ASSERT_TRUE(gpu.ok());
  EXPECT_GT(gpu->part_flops[0], 4 * gpu->part_flops[1]);
}

TEST(PartitionTest, ByTimeRefusesARateNotAboveZeroAndTooManyStages) {
  const Graph g = training("mlp_digits");
  auto zero = partition_by_time(g, k_micro_batches, costs_of({40, 0}));
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.status().code(), ErrorCode::invalid_argument);
  EXPECT_NE(zero.status().message().find("stage 1"), std::string::npos) << zero.status().to_string();
  auto many = partition_by_time(g, k_micro_batches, costs_of(std::vector<double>(64, 40)));
  ASSERT_FALSE(many.ok());
  EXPECT_EQ(many.status().code(), ErrorCode::invalid_argument);
  EXPECT_FALSE(partition(g, 2, PartitionMethod::time, k_micro_batches).ok());
}

}  // namespace
}  // namespace tiermem::exec
