// Batches (C5) against three real daemons, UCX over TCP, nodes standing for
// hosts (clients reach other nodes' memory through the data plane): mixed
// batches to several nodes with fences, errors per operation, a node killed
// in the middle of a batch failing only its own operations.
#include <signal.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include <tiermem/batch.h>

#include "tests/support/cluster_fixture.hpp"

namespace tiermem {
namespace {

using namespace std::chrono_literals;

class BatchTest : public ::testing::Test, protected test::ClusterFixture {
 protected:
  void SetUp() override {
    test::DaemonOptions o;
    o.dram = "32MiB";
    o.pmem = "16MiB";
    ASSERT_TRUE(start_cluster("tcp", 3, o));
  }
  void TearDown() override { stop_cluster(); }
};

TEST_F(BatchTest, MixedOperationsToSeveralNodesWithFences) {
  auto client = m_cluster->node(1).connect("batcher");
  ASSERT_NE(client, nullptr);
  std::vector<AllocationInfo> blocks;
  for (NodeId n : {NodeId{1}, NodeId{2}, NodeId{3}}) {
    auto a = client->alloc(256 << 10, {.tier = Tier::dram, .node = n});
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    blocks.push_back(*a);
  }
  auto counter = client->alloc(4096, {.tier = Tier::dram, .node = 2, .coherent = true});
  ASSERT_TRUE(counter.ok());
  // 16 writes of 4 KiB to each node; a fence; the same reads back; a fence;
  // 32 fetch-adds: every read sees its write, the adds sum exactly.
  std::vector<std::vector<unsigned char>> out, back;
  for (size_t i = 0; i < 48; ++i) {
    out.push_back(test::pattern(4096, static_cast<int>(i)));
    back.emplace_back(4096, 0);
  }
  Batch b(*client);
  for (size_t i = 0; i < 48; ++i) b.write(blocks[i % 3].gva.plus((i / 3) * 4096), out[i].data(), 4096);
  b.fence();
  for (size_t i = 0; i < 48; ++i) b.read(blocks[i % 3].gva.plus((i / 3) * 4096), back[i].data(), 4096);
  b.fence();
  std::vector<size_t> adds;
  for (int i = 0; i < 32; ++i) adds.push_back(b.fetch_add(counter->gva, 1));
  EXPECT_EQ(b.size(), 48u * 2 + 32);
  const Status s = b.wait(60s);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_TRUE(b.test());
  for (size_t i = 0; i < 48; ++i) EXPECT_EQ(back[i], out[i]) << "operation " << 48 + i;
  std::set<uint64_t> seen;
  for (size_t i : adds) seen.insert(b.value(i));
  EXPECT_EQ(seen.size(), 32u) << "every fetch-add saw another value";
  EXPECT_EQ(*seen.begin(), 0u);
  EXPECT_EQ(*seen.rbegin(), 31u);
  uint64_t total = 0;
  ASSERT_TRUE(client->read(counter->gva, &total, 8).ok());
  EXPECT_EQ(total, 32u);
}

TEST_F(BatchTest, EachOperationHasItsOwnOutcome) {
  auto client = m_cluster->node(1).connect("batcher");
  auto good = client->alloc(64 << 10, {.tier = Tier::dram, .node = 2});
  auto gone = client->alloc(64 << 10, {.tier = Tier::dram, .node = 3});
  ASSERT_TRUE(good.ok() && gone.ok());
  ASSERT_TRUE(client->free(gone->gva).ok());
  std::vector<unsigned char> a(4096, 1), c(4096, 0), d(4096, 0);
  Batch b(*client);
  const size_t w = b.write(good->gva, a.data(), a.size());
  const size_t bad = b.read(gone->gva, c.data(), c.size());
  const size_t past = b.read(good->gva.plus(62 << 10), d.data(), 8192);  // runs past the end
  b.fence();
  const size_t r = b.read(good->gva, d.data(), 4096);
  const Status s = b.wait(60s);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("operation 1 of the batch"), std::string::npos) << s.to_string();
  EXPECT_TRUE(b.status(w).ok());
  EXPECT_EQ(b.status(bad).code(), ErrorCode::not_allocated) << b.status(bad).to_string();
  EXPECT_EQ(b.status(past).code(), ErrorCode::out_of_range) << b.status(past).to_string();
  EXPECT_TRUE(b.status(r).ok()) << "a fence waits for failed operations too, and what follows runs";
  EXPECT_EQ(d, a);
  EXPECT_EQ(b.status(99).code(), ErrorCode::out_of_range);
}

TEST_F(BatchTest, ANodeKilledMidBatchFailsOnlyItsOperations) {
  auto client = m_cluster->node(1).connect("batcher");
  auto live = client->alloc(1 << 20, {.tier = Tier::dram, .node = 2});
  auto doomed = client->alloc(1 << 20, {.tier = Tier::dram, .node = 3});
  ASSERT_TRUE(live.ok() && doomed.ok());
  const auto data = test::pattern(1 << 20, 3);
  ASSERT_TRUE(client->write(live->gva, data.data(), data.size()).ok());
  std::vector<std::vector<unsigned char>> back(400, std::vector<unsigned char>(64 << 10));
  Batch b(*client);
  std::vector<size_t> on_live, on_doomed;
  for (size_t i = 0; i < 400; ++i) {
    const size_t off = (i / 2 % 16) * (64 << 10);
    if (i % 2 == 0) on_live.push_back(b.read(live->gva.plus(off), back[i].data(), 64 << 10));
    if (i % 2 == 1) on_doomed.push_back(b.read(doomed->gva.plus(off), back[i].data(), 64 << 10));
    if (i == 100) m_cluster->node(3).kill();
  }
  (void)b.wait(120s);
  for (size_t k = 0; k < on_live.size(); ++k) {
    ASSERT_TRUE(b.status(on_live[k]).ok()) << "node 2's operation " << on_live[k] << ": "
                                           << b.status(on_live[k]).to_string();
    const size_t off = (k % 16) * (64 << 10);
    ASSERT_TRUE(std::equal(back[2 * k].begin(), back[2 * k].end(), data.begin() + off)) << k;
  }
  size_t failed = 0;
  for (size_t i : on_doomed) {
    const Status s = b.status(i);
    if (s.ok()) continue;
    ++failed;
    EXPECT_NE(s.message().find("node 3"), std::string::npos) << "names the node: " << s.to_string();
  }
  EXPECT_GT(failed, 0u) << "node 3 was killed before most of its reads";
}

}  // namespace
}  // namespace tiermem
