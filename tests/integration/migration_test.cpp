// Migration under load (M7): pages of one allocation move between tiers and
// nodes while writers and readers on every node keep going. Every read must be
// whole (never torn), never go back in time, and at the end every
// acknowledged write must be there.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include <tiermem/batch.h>

#include "tests/support/cluster_fixture.hpp"

namespace tiermem {
namespace {

using namespace std::chrono_literals;

constexpr int k_writers = 3;
constexpr size_t k_size = 256 << 10;          // four 64 KiB pages
// Word-aligned slices that straddle page boundaries.
constexpr size_t k_slice = (k_size / k_writers) & ~size_t{7};
constexpr size_t k_words = k_slice / 8;

uint64_t word_of(int writer, uint64_t counter) { return (uint64_t(writer + 1) << 56) | counter; }

// "tcp": clients reach other nodes through the data plane, as from other
// hosts; "sm": they map the memory of the daemons of their host. "ofi-tcp",
// "ofi-shm": the same over libfabric.
class MigrationTest : public ::testing::TestWithParam<std::string>, protected test::ClusterFixture {
 protected:
  void SetUp() override {
    test::DaemonOptions o;
    o.page_size = "64KiB";
    o.dram = "16MiB";
    o.pmem = "16MiB";
    ASSERT_TRUE(start_cluster(GetParam(), 3, o));
  }
  void TearDown() override { stop_cluster(); }
};

TEST_P(MigrationTest, NoTornReadAndNoLostAcknowledgedWriteWhilePagesMove) {
  auto owner = m_cluster->node(1).connect("owner");
  auto a = owner->alloc(k_size, {.tier = Tier::dram});
  ASSERT_TRUE(a.ok());
  const Gva base = a->gva;
  // A second allocation, moved with the first, that a batch user on node 3
  // writes and reads back in mixed batches with fences, and a counter it
  // adds to in the same batches.
  auto batched = owner->alloc(k_size, {.tier = Tier::dram, .node = 2});
  auto counter = owner->alloc(4096, {.tier = Tier::dram, .node = 1, .coherent = true});
  ASSERT_TRUE(batched.ok() && counter.ok());
  std::atomic<int> batch_errors{0}, batch_mismatches{0}, batch_rounds{0};

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> acked[k_writers] = {};
  std::atomic<uint64_t> issued[k_writers] = {};
  std::atomic<int> write_errors{0}, torn{0}, backwards{0}, read_errors{0}, reads{0};
  std::string first_error;
  std::mutex error_mutex;
  auto note_error = [&](const Status& s) {
    std::lock_guard lock(error_mutex);
    if (first_error.empty()) first_error = s.to_string();
  };

  std::vector<std::thread> threads;
  for (int w = 0; w < k_writers; ++w) {
    threads.emplace_back([&, w] {
      auto c = m_cluster->node(1 + w).connect("writer");  // one writer per node
      std::vector<uint64_t> words(k_words);
      for (uint64_t n = 1; !stop.load(); ++n) {
        std::fill(words.begin(), words.end(), word_of(w, n));
        issued[w].store(n);
        Status s = c->write(base.plus(w * k_slice), words.data(), k_slice);
        if (!s.ok()) {
          ++write_errors;
          note_error(s);
          return;
        }
        acked[w].store(n);
      }
    });
  }
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto c = m_cluster->node(r == 0 ? 2 : 3).connect("reader");
      std::vector<uint64_t> all(k_size / 8);
      uint64_t seen[k_writers] = {};
      while (!stop.load()) {
        Status s = c->read(base, all.data(), k_size);
        if (!s.ok()) {
          ++read_errors;
          note_error(s);
          return;
        }
        ++reads;
        for (int w = 0; w < k_writers; ++w) {
          const uint64_t* slice = all.data() + w * k_words;
          const uint64_t first = slice[0];
          for (size_t i = 1; i < k_words; ++i) {
            if (slice[i] != first) {
              if (torn++ == 0) {
                std::lock_guard lock(error_mutex);
                std::fprintf(stderr, "reader %d: writer %d's slice torn at word %zu of %zu: %016llx then %016llx\n", r,
                             w, i, k_words, static_cast<unsigned long long>(first),
                             static_cast<unsigned long long>(slice[i]));
              }
              break;
            }
          }
          if (first == 0) continue;  // not written yet
          const uint64_t counter = first & ((uint64_t{1} << 56) - 1);
          if ((first >> 56) != uint64_t(w + 1) || counter > issued[w].load()) ++torn;
          if (counter < seen[w]) ++backwards;
          seen[w] = counter;
        }
      }
    });
  }
  threads.emplace_back([&] {
    auto c = m_cluster->node(3).connect("batcher");
    constexpr size_t k_chunk = 4096, k_chunks = k_size / k_chunk;
    std::vector<uint64_t> out(k_size / 8), back(k_size / 8);
    for (uint64_t n = 1; !stop.load(); ++n) {
      std::fill(out.begin(), out.end(), word_of(7, n));
      std::fill(back.begin(), back.end(), 0);
      Batch b(*c);
      for (size_t i = 0; i < k_chunks; ++i) b.write(batched->gva.plus(i * k_chunk), out.data() + i * k_chunk / 8, k_chunk);
      b.fetch_add(counter->gva, 1);
      b.fence();
      for (size_t i = 0; i < k_chunks; ++i) b.read(batched->gva.plus(i * k_chunk), back.data() + i * k_chunk / 8, k_chunk);
      b.fetch_add(counter->gva, 1);
      if (Status s = b.wait(60s); !s.ok()) {
        ++batch_errors;
        note_error(s);
        return;
      }
      if (back != out) ++batch_mismatches;
      ++batch_rounds;
    }
  });
  struct Target {
    Tier tier;
    NodeId node;
  };
  const Target targets[] = {{Tier::pmem, 1}, {Tier::dram, 2}, {Tier::pmem, 3}, {Tier::dram, 1},
                            {Tier::dram, 3}, {Tier::pmem, 2}};
  int migrations = 0;
  // At least 4 s, 6 migrations and 11 full reads (readers starve while
  // every page keeps moving, more so on a loaded machine: the migrations go
  // on until the readers got that many through, at most 20 s).
  const auto until = std::chrono::steady_clock::now() + 4s;
  const auto hard_stop = std::chrono::steady_clock::now() + 20s;
  auto mover = m_cluster->node(2).connect("migrator");
  for (size_t i = 0; (std::chrono::steady_clock::now() < until || migrations < 6 || reads.load() <= 10) &&
                     std::chrono::steady_clock::now() < hard_stop;
       ++i) {
    const Target& t = targets[i % std::size(targets)];
    auto m = mover->migrate(base, t.tier, t.node);
    auto mb = mover->migrate(batched->gva, t.tier, t.node);
    EXPECT_TRUE(mb.ok()) << mb.status().to_string();
    EXPECT_TRUE(m.ok()) << "migration " << i << " to " << tier_name(t.tier) << " on node " << t.node << ": "
                        << m.status().to_string();
    auto tr = mover->translate(base);
    if (!m.ok() || !tr.ok()) break;
    for (const Extent& x : tr->extents) {
      EXPECT_EQ(x.node, t.node);
      EXPECT_EQ(x.tier, t.tier);
    }
    ++migrations;
    if (migrations > 60 && reads.load() > 10) break;
  }
  stop = true;
  for (auto& t : threads) t.join();

  EXPECT_EQ(write_errors.load(), 0) << first_error;
  EXPECT_EQ(read_errors.load(), 0) << first_error;
  EXPECT_EQ(torn.load(), 0) << "a read returned a torn or impossible slice";
  EXPECT_EQ(backwards.load(), 0) << "a read went back in time";
  EXPECT_GT(reads.load(), 10);
  EXPECT_GE(migrations, 6);
  EXPECT_EQ(batch_errors.load(), 0) << first_error;
  EXPECT_EQ(batch_mismatches.load(), 0) << "a read after a fence did not see the batch's own writes";
  EXPECT_GT(batch_rounds.load(), 0);
  uint64_t adds = 0;
  ASSERT_TRUE(owner->read(counter->gva, &adds, 8).ok());
  EXPECT_GE(adds, 2u * static_cast<uint64_t>(batch_rounds.load())) << "every acknowledged fetch-add is there";
  EXPECT_LE(adds, 2u * static_cast<uint64_t>(batch_rounds.load()) + 2);
  std::vector<uint64_t> final(k_size / 8);
  ASSERT_TRUE(owner->read(base, final.data(), k_size).ok());
  for (int w = 0; w < k_writers; ++w) {
    EXPECT_GT(acked[w].load(), 0u) << "writer " << w << " never got a write acknowledged";
    for (size_t i = 0; i < k_words; ++i) {
      ASSERT_EQ(final[w * k_words + i], word_of(w, acked[w].load()))
          << "writer " << w << " word " << i << ": the last acknowledged write is not there";
    }
  }
  std::printf("%d migrations, %d full reads, %d batch rounds, writes acknowledged: %llu %llu %llu\n", migrations,
              reads.load(), batch_rounds.load(),
              static_cast<unsigned long long>(acked[0].load()), static_cast<unsigned long long>(acked[1].load()),
              static_cast<unsigned long long>(acked[2].load()));
}

// Pages move in runs of 32 (daemon/migrator.hpp): a run moves whole or not
// at all. A destination that fills up part way leaves the allocation split
// at a run boundary, every byte readable where it is; the next migration
// moves only what is not there yet; and runs between nodes land whole too.
TEST_P(MigrationTest, RunsMoveWholeAndAMigrationThatRanOutOfRoomResumes) {
  auto c = m_cluster->node(1).connect("runs");
  constexpr uint64_t k_page = 64 << 10, k_pages = 160;  // five runs
  auto a = c->alloc(k_pages * k_page, {.tier = Tier::dram, .strict = true});
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  std::vector<uint64_t> data(k_pages * k_page / 8), back(data.size());
  for (size_t i = 0; i < data.size(); ++i) data[i] = i * 0x9e3779b97f4a7c15ull;
  ASSERT_TRUE(c->write(a->gva, data.data(), data.size() * 8).ok());
  // PMEM with room for two and a half runs.
  auto pmem_free = [&] {
    auto stat = c->stat();
    EXPECT_TRUE(stat.ok());
    uint64_t free = 0;
    for (const TierStat& t : stat.ok() ? stat->tiers : std::vector<TierStat>{}) {
      if (t.tier == Tier::pmem) free = t.free_bytes;
    }
    return free;
  };
  ASSERT_GT(pmem_free(), 80 * k_page);
  auto filler = c->alloc(pmem_free() - 80 * k_page, {.tier = Tier::pmem, .strict = true});
  ASSERT_TRUE(filler.ok()) << filler.status().to_string();

  auto pages_in = [&](Tier tier, NodeId node) {
    auto t = c->translate(a->gva);
    EXPECT_TRUE(t.ok());
    uint64_t pages = 0;
    for (const Extent& x : t.ok() ? t->extents : std::vector<Extent>{}) {
      if (x.tier == tier && x.node == node) pages += x.length / k_page;
    }
    return pages;
  };
  auto m = c->migrate(a->gva, Tier::pmem);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), ErrorCode::tier_exhausted) << m.status().to_string();
  EXPECT_NE(m.status().message().find("64 pages moved before the failure"), std::string::npos)
      << m.status().to_string();
  EXPECT_EQ(pages_in(Tier::pmem, 1), 64u);
  EXPECT_EQ(pages_in(Tier::dram, 1), k_pages - 64);
  ASSERT_TRUE(c->read(a->gva, back.data(), back.size() * 8).ok());
  EXPECT_EQ(back, data) << "split across DRAM and PMEM";

  ASSERT_TRUE(c->free(filler->gva).ok());
  m = c->migrate(a->gva, Tier::pmem);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(pages_in(Tier::pmem, 1), k_pages);
  std::fill(back.begin(), back.end(), 0);
  ASSERT_TRUE(c->read(a->gva, back.data(), back.size() * 8).ok());
  EXPECT_EQ(back, data) << "after the rest moved";
  // Already there, the destination full: nothing to reserve, nothing moves.
  auto full = c->alloc(pmem_free(), {.tier = Tier::pmem, .strict = true});
  ASSERT_TRUE(full.ok()) << full.status().to_string();
  EXPECT_EQ(pmem_free(), 0u);
  m = c->migrate(a->gva, Tier::pmem);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  ASSERT_TRUE(c->free(full->gva).ok());

  // To another node's DRAM (runs of 4 MiB there: every one whole), back.
  m = c->migrate(a->gva, Tier::dram, 2);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(pages_in(Tier::dram, 2), k_pages);
  std::fill(back.begin(), back.end(), 0);
  ASSERT_TRUE(c->read(a->gva, back.data(), back.size() * 8).ok());
  EXPECT_EQ(back, data) << "on node 2";
  m = c->migrate(a->gva, Tier::dram, 1);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(pages_in(Tier::dram, 1), k_pages);
  std::fill(back.begin(), back.end(), 0);
  ASSERT_TRUE(c->read(a->gva, back.data(), back.size() * 8).ok());
  EXPECT_EQ(back, data) << "back on node 1";
}

INSTANTIATE_TEST_SUITE_P(Transports, MigrationTest, ::testing::Values("tcp", "sm", "ofi-tcp", "ofi-shm"),
                         test::ClusterFixture::param_name);

}  // namespace
}  // namespace tiermem
