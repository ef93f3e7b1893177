#include "mapping/page_table.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace tiermem {
namespace {

PageEntry entry(uint64_t frame, uint32_t generation, Tier tier) {
  PageEntry e;
  e.frame_offset = frame;
  e.generation = generation;
  e.node = 7;
  e.tier = tier;
  e.flags = k_page_read | k_page_write | k_entry_present;
  return e;
}

TEST(PageTableTest, UnpopulatedPagesAreAbsent) {
  PageTable t(4096, 2 << 20);
  ASSERT_NE(t.find(0), nullptr);
  EXPECT_FALSE(t.find(0)->present());
  EXPECT_FALSE(t.find(4095)->present());
  EXPECT_EQ(t.find(4095)->generation, 0u);
  EXPECT_EQ(t.find(4096), nullptr) << "outside the table";
  t.clear(17);
  EXPECT_EQ(t.domains(), 0u) << "clearing an absent page populates nothing";
  EXPECT_EQ(t.domains(), 0u);
}

TEST(PageTableTest, SetAndFindAcrossDomains) {
  PageTable t(4096, 2 << 20);
  t.set(5, entry(0x400000, 3, Tier::dram));
  t.set(k_l2_pages + 1, entry(0x800000, 4, Tier::pmem));
  ASSERT_NE(t.find(5), nullptr);
  EXPECT_TRUE(t.find(5)->present());
  EXPECT_EQ(t.find(5)->frame_offset, 0x400000u);
  EXPECT_EQ(t.find(5)->tier, Tier::dram);
  EXPECT_EQ(t.find(k_l2_pages + 1)->tier, Tier::pmem);
  EXPECT_EQ(t.find(k_l2_pages + 1)->node, 7);
  EXPECT_FALSE(t.find(6)->present()) << "same domain, never set";
  EXPECT_EQ(t.domains(), 2u);
  EXPECT_EQ(t.page_shift(), 21u);
}

TEST(PageTableTest, ClearKeepsTheGenerationAsTombstone) {
  PageTable t(1024, 4096);
  t.set(9, entry(0, 42, Tier::dram));
  t.clear(9);
  ASSERT_NE(t.find(9), nullptr);
  EXPECT_FALSE(t.find(9)->present());
  EXPECT_EQ(t.find(9)->generation, 42u);
}

TEST(PageTableTest, SubBlockBitsTrackWrites) {
  PageTable t(64, 64 * 1024);  // sub-blocks of 1 KiB
  t.set(1, entry(0, 1, Tier::dram));
  t.mark_written(1, 0, 1);
  t.mark_written(1, 3 * 1024 + 10, 2048);  // touches blocks 3, 4, 5
  SubBlockBits b = t.sub_blocks(1);
  EXPECT_EQ(b.valid, 0b111001u);
  EXPECT_EQ(b.dirty, 0b111001u);
  t.clean(1);
  b = t.sub_blocks(1);
  EXPECT_EQ(b.valid, 0b111001u);
  EXPECT_EQ(b.dirty, 0u);
  t.mark_written(1, 0, 64 * 1024);
  EXPECT_EQ(t.sub_blocks(1).valid, ~uint64_t{0});
  t.clear(1);
  EXPECT_EQ(t.sub_blocks(1).valid, 0u) << "a freed page forgets its sub-blocks";
}

TEST(PageTableTest, SubBlockBitsLiveInTheGivenArray) {
  std::vector<uint64_t> shared(16 * k_l3_words_per_page, 0);
  PageTable t(16, 4096, shared);
  t.set(2, entry(0, 1, Tier::dram));
  // A client writing directly marks the shared words itself.
  mark_sub_blocks(&shared[2 * k_l3_words_per_page], 4096, 64, 64, true);
  EXPECT_EQ(t.sub_blocks(2).dirty, 0b10u);
  t.mark_written(3, 0, 1, /*durable=*/true);
  EXPECT_EQ(t.sub_blocks(3).valid, 1u);
  EXPECT_EQ(t.sub_blocks(3).dirty, 0u) << "a durable write leaves nothing to flush";
  EXPECT_EQ(t.sub_blocks(2).valid, 0b10u);
}

TEST(PageTableTest, TranslateBatchMatchesFind) {
  PageTable t(8192, 4096);
  for (uint64_t p = 0; p < 8192; p += 3) t.set(p, entry(p * 4096, 1, Tier::dram));
  std::vector<uint64_t> pages;
  for (uint64_t i = 0; i < 1000; ++i) pages.push_back((i * 7919) % 9000);  // some out of range
  std::vector<PageEntry> out(pages.size());
  t.translate_batch(pages, out);
  for (size_t i = 0; i < pages.size(); ++i) {
    const PageEntry* e = t.find(pages[i]);
    if (e == nullptr || !e->present()) {
      EXPECT_FALSE(out[i].present()) << pages[i];
    } else {
      EXPECT_TRUE(out[i].present());
      EXPECT_EQ(out[i].frame_offset, e->frame_offset);
    }
  }
}

}  // namespace
}  // namespace tiermem
