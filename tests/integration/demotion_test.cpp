// Demotion under capacity pressure (M7, daemon/demoter.hpp), as the
// migration stress test runs migrations: a node's DRAM passes its
// high-water mark while writers and readers on two nodes keep going; the
// daemon moves the coldest pages of demotable allocations to PMEM until
// DRAM is under its low-water mark. Every read is whole, every acknowledged
// write and every byte of the cold allocations is there, the pages written
// all along stay in DRAM, and allocations not asked demotable never move.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <regex>
#include <thread>
#include <vector>

#include "tests/support/cluster_fixture.hpp"

namespace tiermem {
namespace {

using namespace std::chrono_literals;

constexpr size_t k_page = 64 << 10;
constexpr size_t k_hot = 4 * k_page;        // written all along
constexpr size_t k_cold = 16 * k_page;      // written once
constexpr int k_colds = 5;
constexpr size_t k_kept = 16 * k_page;      // not demotable
constexpr int k_writers = 2;
constexpr size_t k_slice = k_hot / k_writers;
constexpr size_t k_words = k_slice / 8;

uint64_t word_of(int writer, uint64_t counter) { return (uint64_t(writer + 1) << 56) | counter; }
uint64_t cold_word(int allocation, size_t i) { return (uint64_t(allocation + 1) << 40) | i; }

// DRAM of 128 pages; demotion above 75 % down to 50 %. "tcp": every client
// reaches node 1's memory through the data plane, as from other hosts;
// "sm": node 1's clients map it and copy under the seqlock themselves.
class DemotionTest : public ::testing::TestWithParam<std::string>, protected test::ClusterFixture {
 protected:
  void SetUp() override {
    test::DaemonOptions o;
    o.page_size = "64KiB";
    o.dram = "8MiB";
    o.pmem = "16MiB";
    o.extra_toml = "[demotion]\nhigh_water_percent = 75\nlow_water_percent = 50\ninterval_ms = 100\n";
    ASSERT_TRUE(start_cluster(GetParam(), 2, o));
  }
  void TearDown() override { stop_cluster(); }

  // The value of `family{labels}` in node 1's metrics (-1 when absent).
  double metric(Client& c, const std::string& series) {
    auto text = c.metrics(1);
    if (!text.ok()) return -1;
    const size_t at = text->find(series + " ");
    return at == std::string::npos ? -1 : std::stod(text->substr(at + series.size() + 1));
  }
  static uint64_t dram_used(Client& c) {
    auto s = c.stat(1);
    if (!s.ok()) return ~uint64_t{0};
    for (const TierStat& t : s->tiers) {
      if (t.tier == Tier::dram) return t.used_bytes;
    }
    return ~uint64_t{0};
  }
  // Pages of `gva`'s allocation on each tier of node 1.
  static std::array<uint64_t, 4> pages_by_tier(Client& c, Gva gva) {
    std::array<uint64_t, 4> n{};
    auto t = c.translate(gva);
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    if (t.ok()) {
      for (const Extent& x : t->extents) n[static_cast<size_t>(x.tier)] += x.length / k_page;
    }
    return n;
  }
};

TEST_P(DemotionTest, ColdPagesMoveDownWhileReadersAndWritersGoOnAndNothingIsLost) {
  auto owner = m_cluster->node(1).connect("owner");
  ASSERT_NE(owner, nullptr);
  // Refused before anything is made: a coherent allocation's pages never move.
  auto both = owner->alloc(k_page, {.tier = Tier::dram, .coherent = true, .demotable = true});
  ASSERT_FALSE(both.ok());
  EXPECT_EQ(both.status().code(), ErrorCode::invalid_argument) << both.status().to_string();

  auto kept = owner->alloc(k_kept, {.tier = Tier::dram, .strict = true, .node = 1});
  auto hot = owner->alloc(k_hot, {.tier = Tier::dram, .strict = true, .node = 1, .demotable = true});
  ASSERT_TRUE(kept.ok() && hot.ok());
  EXPECT_TRUE(hot->demotable);
  EXPECT_FALSE(kept->demotable);
  std::vector<uint64_t> kept_words(k_kept / 8, 0x6b6570746b657074ull);
  ASSERT_TRUE(owner->write(kept->gva, kept_words.data(), k_kept).ok());

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> acked[k_writers] = {};
  std::atomic<uint64_t> issued[k_writers] = {};
  std::atomic<int> errors{0}, torn{0}, backwards{0}, hot_reads{0}, cold_reads{0}, cold_wrong{0};
  std::string first_error;
  std::mutex error_mutex;
  auto note_error = [&](const Status& s) {
    ++errors;
    std::lock_guard lock(error_mutex);
    if (first_error.empty()) first_error = s.to_string();
  };
  std::vector<std::thread> threads;
  // Writers of the hot allocation: one co-located, one on node 2.
  for (int w = 0; w < k_writers; ++w) {
    threads.emplace_back([&, w] {
      auto c = m_cluster->node(1 + w).connect("writer");
      std::vector<uint64_t> words(k_words);
      for (uint64_t n = 1; !stop.load(); ++n) {
        std::fill(words.begin(), words.end(), word_of(w, n));
        issued[w].store(n);
        if (Status s = c->write(hot->gva.plus(w * k_slice), words.data(), k_slice); !s.ok()) return note_error(s);
        acked[w].store(n);
      }
    });
  }
  // A reader of the hot allocation on node 2: whole slices, never back in time.
  threads.emplace_back([&] {
    auto c = m_cluster->node(2).connect("hot-reader");
    std::vector<uint64_t> all(k_hot / 8);
    uint64_t seen[k_writers] = {};
    while (!stop.load()) {
      if (Status s = c->read(hot->gva, all.data(), k_hot); !s.ok()) return note_error(s);
      ++hot_reads;
      for (int w = 0; w < k_writers; ++w) {
        const uint64_t* slice = all.data() + w * k_words;
        for (size_t i = 1; i < k_words; ++i) {
          if (slice[i] != slice[0]) {
            ++torn;
            break;
          }
        }
        if (slice[0] == 0) continue;
        const uint64_t counter = slice[0] & ((uint64_t{1} << 56) - 1);
        if ((slice[0] >> 56) != uint64_t(w + 1) || counter > issued[w].load()) ++torn;
        if (counter < seen[w]) ++backwards;
        seen[w] = counter;
      }
    }
  });

  // The hot pages are written all along from here: both writers have had
  // writes acknowledged (on a loaded machine a writer's first connection
  // may take longer than the colds below take to fill: its pages would be
  // the coldest of all, never written).
  const auto writing = std::chrono::steady_clock::now() + 20s;
  while ((acked[0].load() == 0 || acked[1].load() == 0) && errors.load() == 0 &&
         std::chrono::steady_clock::now() < writing) {
    std::this_thread::sleep_for(10ms);
  }
  if (acked[0].load() == 0 || acked[1].load() == 0) {
    stop = true;
    for (auto& t : threads) t.join();
    FAIL() << "the hot allocation's writers got no write acknowledged in 20 s: " << first_error;
  }
  // The cold allocations, filled once; DRAM passes 75 % with the last. The
  // others wait a second first (ten rounds unwritten): colder than a hot
  // page whose writer a loaded machine starved for a round or two.
  std::vector<AllocationInfo> colds;
  for (int k = 0; k < k_colds; ++k) {
    if (k == k_colds - 1) std::this_thread::sleep_for(1s);
    auto a = owner->alloc(k_cold, {.tier = Tier::dram, .strict = true, .node = 1, .demotable = true});
    ASSERT_TRUE(a.ok()) << "cold allocation " << k << ": " << a.status().to_string();
    std::vector<uint64_t> words(k_cold / 8);
    for (size_t i = 0; i < words.size(); ++i) words[i] = cold_word(k, i);
    ASSERT_TRUE(owner->write(a->gva, words.data(), k_cold).ok());
    colds.push_back(*a);
  }
  // Readers of every cold allocation, on both nodes, while their pages move.
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto c = m_cluster->node(1 + r).connect("cold-reader");
      std::vector<uint64_t> words(k_cold / 8);
      while (!stop.load()) {
        for (int k = 0; k < k_colds && !stop.load(); ++k) {
          if (Status s = c->read(colds[k].gva, words.data(), k_cold); !s.ok()) return note_error(s);
          ++cold_reads;
          for (size_t i = 0; i < words.size(); ++i) {
            if (words[i] != cold_word(k, i)) {
              ++cold_wrong;
              break;
            }
          }
        }
      }
    });
  }

  auto watcher = m_cluster->node(1).connect("watcher");
  const uint64_t dram_bytes = 128 * k_page;
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  uint64_t used = dram_used(*watcher);
  while (used > dram_bytes / 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(50ms);
    used = dram_used(*watcher);
  }
  // Readers and writers go on after the moves too: half a second, and on a
  // loaded machine (the tcp readers' first connections can take longer than
  // the moves) until every cold allocation was read twice more and the hot
  // one five times more.
  const int cold_at_moves = cold_reads.load(), hot_at_moves = hot_reads.load();
  std::this_thread::sleep_for(500ms);
  const auto after_deadline = std::chrono::steady_clock::now() + 20s;
  while ((cold_reads.load() < cold_at_moves + 2 * k_colds || hot_reads.load() < hot_at_moves + 5) &&
         errors.load() == 0 && std::chrono::steady_clock::now() < after_deadline) {
    std::this_thread::sleep_for(20ms);
  }
  stop = true;
  for (auto& t : threads) t.join();

  EXPECT_LE(used, dram_bytes / 2) << "DRAM did not come under its low-water mark (" << used << " bytes used)";
  EXPECT_EQ(errors.load(), 0) << first_error;
  EXPECT_EQ(torn.load(), 0) << "a read of the hot allocation was torn";
  EXPECT_EQ(backwards.load(), 0) << "a read of the hot allocation went back in time";
  EXPECT_EQ(cold_wrong.load(), 0) << "a read of a cold allocation did not return what it holds";
  EXPECT_GT(hot_reads.load(), 5);
  EXPECT_GT(cold_reads.load(), 5);

  // Where things are: the cold pages went to PMEM, the hot ones (written
  // every round) stayed, the one not demotable never moved.
  uint64_t cold_in_pmem = 0;
  for (const AllocationInfo& a : colds) cold_in_pmem += pages_by_tier(*owner, a.gva)[static_cast<size_t>(Tier::pmem)];
  EXPECT_GE(cold_in_pmem, 100u - 64u) << "at least the pages above the low-water mark moved";
  EXPECT_EQ(pages_by_tier(*owner, hot->gva)[static_cast<size_t>(Tier::dram)], k_hot / k_page)
      << "pages written all along are the last to go";
  EXPECT_EQ(pages_by_tier(*owner, kept->gva)[static_cast<size_t>(Tier::dram)], k_kept / k_page);
  EXPECT_GE(metric(*owner, "tiermem_demoted_pages_total{node=\"1\",from=\"dram\",to=\"pmem\"}"),
            static_cast<double>(cold_in_pmem));
  EXPECT_GE(metric(*owner, "tiermem_demotion_rounds_total{node=\"1\"}"), 1.0);
  EXPECT_EQ(metric(*owner, "tiermem_demotion_failures_total{node=\"1\"}"), 0.0);

  // Every byte: the cold ones, the last acknowledged writes, the kept ones.
  for (int k = 0; k < k_colds; ++k) {
    std::vector<uint64_t> words(k_cold / 8);
    ASSERT_TRUE(owner->read(colds[k].gva, words.data(), k_cold).ok());
    for (size_t i = 0; i < words.size(); ++i) ASSERT_EQ(words[i], cold_word(k, i)) << "cold " << k << " word " << i;
  }
  std::vector<uint64_t> final(k_hot / 8);
  ASSERT_TRUE(owner->read(hot->gva, final.data(), k_hot).ok());
  for (int w = 0; w < k_writers; ++w) {
    EXPECT_GT(acked[w].load(), 0u);
    for (size_t i = 0; i < k_words; ++i) ASSERT_EQ(final[w * k_words + i], word_of(w, acked[w].load()));
  }
  std::vector<uint64_t> kept_back(k_kept / 8);
  ASSERT_TRUE(owner->read(kept->gva, kept_back.data(), k_kept).ok());
  EXPECT_EQ(kept_back, kept_words);

  // The flag and the moved pages survive a restart of the daemon.
  owner.reset();
  watcher.reset();
  ASSERT_TRUE(m_cluster->node(1).restart()) << m_cluster->node(1).log();
  auto again = m_cluster->node(1).connect("again");
  ASSERT_NE(again, nullptr);
  auto t = again->translate(colds[0].gva);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_TRUE(t->allocation.demotable);
  for (int k = 0; k < k_colds; ++k) {
    std::vector<uint64_t> words(k_cold / 8);
    ASSERT_TRUE(again->read(colds[k].gva, words.data(), k_cold).ok());
    for (size_t i = 0; i < words.size(); ++i) ASSERT_EQ(words[i], cold_word(k, i)) << "after the restart";
  }
  std::printf("DRAM used %llu of %llu bytes; %llu cold pages in PMEM; %d hot reads, %d cold reads; writes acked %llu %llu\n",
              static_cast<unsigned long long>(used), static_cast<unsigned long long>(dram_bytes),
              static_cast<unsigned long long>(cold_in_pmem), hot_reads.load(), cold_reads.load(),
              static_cast<unsigned long long>(acked[0].load()), static_cast<unsigned long long>(acked[1].load()));
}

// A tier above its mark with nothing demotable on it is left alone: no
// page of an allocation not asked demotable moves.
TEST_P(DemotionTest, AllocationsNotAskedDemotableNeverMove) {
  auto owner = m_cluster->node(1).connect("owner");
  ASSERT_NE(owner, nullptr);
  auto full = owner->alloc(120 * k_page, {.tier = Tier::dram, .strict = true, .node = 1});
  ASSERT_TRUE(full.ok()) << full.status().to_string();
  const auto until = std::chrono::steady_clock::now() + 1500ms;
  while (std::chrono::steady_clock::now() < until && metric(*owner, "tiermem_demotion_rounds_total{node=\"1\"}") < 3) {
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_GE(metric(*owner, "tiermem_demotion_rounds_total{node=\"1\"}"), 3.0) << "the pressure was seen";
  EXPECT_GE(metric(*owner, "tiermem_demotion_idle_rounds_total{node=\"1\"}"), 3.0) << "with nothing to move";
  EXPECT_EQ(pages_by_tier(*owner, full->gva)[static_cast<size_t>(Tier::dram)], 120u);
  EXPECT_EQ(metric(*owner, "tiermem_demoted_pages_total{node=\"1\",from=\"dram\",to=\"pmem\"}"), 0.0);
}

INSTANTIATE_TEST_SUITE_P(Transports, DemotionTest, ::testing::Values("tcp", "sm"), test::ClusterFixture::param_name);

}  // namespace
}  // namespace tiermem
