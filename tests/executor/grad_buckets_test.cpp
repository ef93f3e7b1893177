// Gradient buckets (grad_buckets.hpp, issue 25): on the shipped models and
// every stage of 1, 2 and 4, each gradient in exactly one bucket, each
// bucket a contiguous range no larger than the cap unless it is one
// gradient, ready no earlier than the last op writing any gradient in it,
// and in ready order.
#include "executor/grad_buckets.hpp"

#include <gtest/gtest.h>

#include <map>
#include <set>

#include "executor/interpreter.hpp"
#include "executor/partitioner.hpp"

namespace tiermem::exec {
namespace {

constexpr int k_micro_batches = 2;

Graph training(const std::string& name) {
  auto g = load_model(std::string(TIERMEM_SOURCE_ROOT) + "/config/models/" + name + ".pbtxt");
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_TRUE(add_training(*g, 1.0f / k_micro_batches).ok());
  return std::move(g).value();
}

// The last schedule position writing each gradient, from the schedule.
std::map<int, int> last_writes(const Graph& g, const MemoryPlan& plan) {
  std::map<int, int> last;
  for (size_t pos = 0; pos < plan.schedule.size(); ++pos) {
    for (int t : g.ops[static_cast<size_t>(plan.schedule[pos].first)].out) last[t] = static_cast<int>(pos);
  }
  return last;
}

void check(const Graph& g, const MemoryPlan& plan, int64_t cap) {
  const auto buckets = plan_grad_buckets(g, plan, cap);
  const auto last = last_writes(g, plan);
  std::map<int, const Placement*> grads;
  for (const Placement& p : plan.grads) grads[p.tensor] = &p;
  std::set<int> seen;
  int ready = -1;
  size_t written = 0;
  for (const Placement& p : plan.grads) written += last.count(p.tensor);
  EXPECT_EQ(written, plan.grads.size()) << "a gradient no op of the schedule writes";
  for (const GradBucket& b : buckets) {
    ASSERT_FALSE(b.tensors.empty());
    EXPECT_GE(b.ready, ready) << "buckets out of ready order";
    ready = b.ready;
    int64_t lo = INT64_MAX, hi = 0, sum = 0;
    for (int t : b.tensors) {
      ASSERT_TRUE(grads.count(t)) << g.tensors[t].name << " is not a gradient of the plan";
      EXPECT_TRUE(seen.insert(t).second) << g.tensors[t].name << " in two buckets";
      const Placement& p = *grads[t];
      lo = std::min(lo, p.offset);
      hi = std::max(hi, p.offset + p.bytes);
      sum += p.bytes;
      if (auto it = last.find(t); it != last.end()) {
        EXPECT_GE(b.ready, it->second) << g.tensors[t].name << " is still written after its bucket goes";
      }
    }
    EXPECT_EQ(b.offset, lo);
    EXPECT_EQ(b.bytes, hi - lo);
    if (b.tensors.size() > 1) {
      EXPECT_LE(b.bytes, cap);
    }
    EXPECT_GE(b.bytes, sum);
    EXPECT_LE(b.ready, static_cast<int>(plan.schedule.size()) - 1);
  }
  EXPECT_EQ(seen.size(), grads.size()) << "a gradient in no bucket";
}

TEST(GradBucketsTest, EveryGradientOnceContiguousAndReadyAfterItsLastWrite) {
  for (const char* name : {"mlp_digits", "ffn4_fashion", "gpt_tiny"}) {
    const Graph g = training(name);
    for (int parts : {1, 2, 4}) {
      auto p = partition(g, parts, PartitionMethod::metis, k_micro_batches);
      ASSERT_TRUE(p.ok()) << p.status().to_string();
      for (int stage = 0; stage < parts; ++stage) {
        SCOPED_TRACE(std::string(name) + " stage " + std::to_string(stage) + " of " + std::to_string(parts));
        const MemoryPlan plan = plan_memory(g, *p, stage, k_micro_batches, true);
        for (int64_t cap : {int64_t{1}, int64_t{4} << 10, int64_t{64} << 10, int64_t{25} << 20}) check(g, plan, cap);
      }
    }
  }
}

TEST(GradBucketsTest, ASmallCapGivesOneBucketPerGradientALargeOneFewerThatStartBeforeTheEnd) {
  const Graph g = training("ffn4_fashion");
  auto p = partition(g, 1, PartitionMethod::metis, k_micro_batches);
  ASSERT_TRUE(p.ok());
  const MemoryPlan plan = plan_memory(g, *p, 0, k_micro_batches, true);
  EXPECT_EQ(plan_grad_buckets(g, plan, 1).size(), plan.grads.size());
  const auto few = plan_grad_buckets(g, plan, 64 << 10);
  EXPECT_LT(few.size(), plan.grads.size());
  EXPECT_GT(few.size(), 1u);
  // The first bucket goes before the backward pass ends: that is the overlap.
  EXPECT_LT(few.front().ready, static_cast<int>(plan.schedule.size()) - 1);
  // The whole arena in one bucket goes at the last write of any gradient.
  const auto one = plan_grad_buckets(g, plan, int64_t{1} << 40);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one.front().tensors.size(), plan.grads.size());
}

}  // namespace
}  // namespace tiermem::exec
