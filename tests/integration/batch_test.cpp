// Batches (C5) against three real daemons, UCX over TCP, nodes standing for
// hosts (clients reach other nodes' memory through the data plane): mixed
// batches to several nodes with fences, errors per operation, a node killed
// in the middle of a batch failing only its own operations.
#include <signal.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <thread>
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
  auto counter = client->alloc(4096, {.tier = Tier::dram, .node = 3, .coherent = true});
  ASSERT_TRUE(live.ok() && doomed.ok() && counter.ok());
  const auto data = test::pattern(1 << 20, 3);
  ASSERT_TRUE(client->write(live->gva, data.data(), data.size()).ok());
  // 40 epochs of 10 reads (half to each node) and an add on node 3, on the
  // library's thread; node 3 is killed once the 5th epoch is done.
  std::vector<std::vector<unsigned char>> back(400, std::vector<unsigned char>(64 << 10));
  Batch b(*client);
  std::vector<size_t> on_live, on_doomed, adds;
  for (size_t i = 0; i < 400; ++i) {
    const size_t off = (i / 2 % 16) * (64 << 10);
    if (i % 2 == 0) on_live.push_back(b.read(live->gva.plus(off), back[i].data(), 64 << 10));
    if (i % 2 == 1) on_doomed.push_back(b.read(doomed->gva.plus(off), back[i].data(), 64 << 10));
    if (i % 10 == 9) {
      adds.push_back(b.fetch_add(counter->gva, 1));
      b.fence();
    }
  }
  b.submit();
  const auto until = std::chrono::steady_clock::now() + 60s;
  while (b.status(adds[4]).code() == ErrorCode::busy && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_TRUE(b.status(adds[4]).ok()) << b.status(adds[4]).to_string();
  m_cluster->node(3).kill();
  const Status all = b.wait(120s);
  EXPECT_FALSE(all.ok());
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
  EXPECT_GE(failed, on_doomed.size() / 2) << "node 3 was killed before most of its reads";
  for (size_t k = 0; k < 5; ++k) EXPECT_EQ(b.value(adds[k]), k) << "the adds before the kill ran once each, in order";
  EXPECT_FALSE(b.status(adds.back()).ok()) << "an add after the kill fails (never repeated)";
}

// A batch's operations between two fences that go by messages travel as one
// request per node: 64 reads and 64 writes to node 2 and as many to node 3
// are two requests per epoch, not 256.
TEST_F(BatchTest, OperationsBetweenFencesTravelAsOneRequestPerNode) {
  auto client = m_cluster->node(1).connect("batcher");
  auto two = client->alloc(256 << 10, {.tier = Tier::dram, .node = 2});
  auto three = client->alloc(256 << 10, {.tier = Tier::pmem, .node = 3});
  ASSERT_TRUE(two.ok() && three.ok());
  std::vector<unsigned char> warm(8);
  ASSERT_TRUE(client->read(two->gva, warm.data(), 8).ok());  // translations and connections made
  ASSERT_TRUE(client->read(three->gva, warm.data(), 8).ok());
  std::vector<std::vector<unsigned char>> out, back;
  for (int i = 0; i < 128; ++i) {
    out.push_back(test::pattern(4096, i + 7));
    back.emplace_back(4096, 0);
  }
  const AccessCounters before = client->access_counters();
  Batch b(*client);
  for (int i = 0; i < 128; ++i) b.write((i % 2 ? three : two)->gva.plus((i / 2) * 4096), out[i].data(), 4096);
  b.fence();
  for (int i = 0; i < 128; ++i) b.read((i % 2 ? three : two)->gva.plus((i / 2) * 4096), back[i].data(), 4096);
  const Status s = b.wait(60s);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(back, out);
  const AccessCounters after = client->access_counters();
  EXPECT_EQ(after.message - before.message, 256u) << "every operation went by the message path";
  EXPECT_EQ(after.requests_sent - before.requests_sent, 4u) << "one request per node and epoch";
}

// Fences between operations that all go to one node by messages cost no
// round trip: the epochs travel as one message with barriers, and still
// run in order (the reads after the fence see the writes before it).
TEST_F(BatchTest, FencesBetweenOperationsToOneNodeTravelInOneRequest) {
  auto client = m_cluster->node(1).connect("batcher");
  auto mbox = client->alloc(256 << 10, {.tier = Tier::dram, .node = 2});
  auto word = client->alloc(4096, {.tier = Tier::dram, .node = 2, .coherent = true});
  ASSERT_TRUE(mbox.ok() && word.ok());
  std::vector<unsigned char> warm(8);
  ASSERT_TRUE(client->read(mbox->gva, warm.data(), 8).ok());
  ASSERT_TRUE(client->read(word->gva, warm.data(), 8).ok());
  for (uint64_t round = 1; round <= 20; ++round) {
    const auto payload = test::pattern(16 * 4096, static_cast<int>(round));
    std::vector<unsigned char> back(16 * 4096, 0);
    const AccessCounters before = client->access_counters();
    Batch b(*client);
    for (int i = 0; i < 16; ++i) b.write(mbox->gva.plus(i * 4096), payload.data() + i * 4096, 4096);
    b.fence();
    for (int i = 0; i < 16; ++i) b.read(mbox->gva.plus(i * 4096), back.data() + i * 4096, 4096);
    b.fence();
    const size_t bump = b.compare_swap(word->gva, round - 1, round);
    const Status s = b.wait(60s);
    ASSERT_TRUE(s.ok()) << s.to_string();
    EXPECT_EQ(back, payload) << "round " << round << ": the reads ran after the writes";
    EXPECT_EQ(b.value(bump), round - 1);
    const AccessCounters after = client->access_counters();
    EXPECT_EQ(after.requests_sent - before.requests_sent, 1u) << "three epochs, one request";
  }
}

// Operations on an allocation freed while the batch runs either complete
// on it or fail with a clear error: none reads another allocation's bytes,
// and no write lands in memory handed to another allocation since.
TEST_F(BatchTest, AnAllocationFreedUnderABatchIsNeverWrittenThroughItsOldAddress) {
  auto client = m_cluster->node(1).connect("batcher");
  auto other = m_cluster->node(2).connect("neighbour");
  ASSERT_NE(other, nullptr);
  size_t refused = 0;
  for (int round = 0; round < 30; ++round) {
    auto victim = client->alloc(64 << 10, {.tier = Tier::dram, .node = 2});
    ASSERT_TRUE(victim.ok());
    const auto mine = test::pattern(64 << 10, round);
    ASSERT_TRUE(client->write(victim->gva, mine.data(), mine.size()).ok());
    const auto junk = test::pattern(4096, 1000 + round);
    std::vector<std::vector<unsigned char>> back(16, std::vector<unsigned char>(4096));
    Batch b(*client);
    std::vector<size_t> reads;
    for (int i = 0; i < 16; ++i) {
      b.write(victim->gva.plus(i * 4096), junk.data(), 4096);
      reads.push_back(b.read(victim->gva.plus(i * 4096), back[i].data(), 4096));
      if (i % 4 == 3) b.fence();
    }
    b.submit();
    ASSERT_TRUE(client->free(victim->gva).ok());
    // Someone else's allocation, likely on the frames just freed.
    auto theirs = other->alloc(64 << 10, {.tier = Tier::dram, .node = 2});
    ASSERT_TRUE(theirs.ok());
    const auto pattern = test::pattern(64 << 10, 500 + round);
    ASSERT_TRUE(other->write(theirs->gva, pattern.data(), pattern.size()).ok());
    (void)b.wait(60s);
    for (int i = 0; i < 16; ++i) {
      const Status s = b.status(reads[i]);
      if (!s.ok()) {
        ++refused;
        EXPECT_TRUE(s.code() == ErrorCode::not_allocated || s.code() == ErrorCode::bad_gva) << s.to_string();
        continue;
      }
      EXPECT_TRUE(back[i] == junk) << "round " << round << " read " << i << " saw bytes not its allocation's";
    }
    std::vector<unsigned char> now(64 << 10);
    ASSERT_TRUE(other->read(theirs->gva, now.data(), now.size()).ok());
    ASSERT_EQ(now, pattern) << "round " << round << ": a write through the freed address landed in another allocation";
    ASSERT_TRUE(other->free(theirs->gva).ok());
  }
  std::printf("%zu reads refused after their allocation was freed\n", refused);
}

}  // namespace
}  // namespace tiermem
